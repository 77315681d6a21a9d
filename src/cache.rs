//! Bounded per-backend caches.
#![forbid(unsafe_code)]

/// Insert into one of the per-backend caches, emptying it first once it holds `cap` entries:
/// every cache here refills cheaply on a miss, so this only bounds its memory.
pub(crate) fn cache_insert<K: std::hash::Hash + Eq, V, S: std::hash::BuildHasher>(
    map: &mut std::collections::HashMap<K, V, S>,
    key: K,
    value: V,
    cap: usize,
) {
    if map.len() >= cap {
        map.clear();
    }
    map.insert(key, value);
}
