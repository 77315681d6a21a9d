//! FNV-1a, 64 bit, over a sequence of byte strings (each one followed by a separator byte, so
//! `["a", "b"]` and `["ab"]` differ): stable across builds and processes, so every backend (even
//! one still running an older build during an upgrade) maps a resource name to the same lock.
//! Collisions only make two resources share a lock (more waiting), never a wrong decision.

/// The hash of `parts` (see the module comment).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in *p {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_hash_is_stable() {
        // Pinned value: changing the hash would let old and new backends lock different keys.
        assert_eq!(fnv1a(&[b"settlement"]), 0x6ff1_9ec9_efcf_9b4f);
        assert_ne!(fnv1a(&[b"a", b"b"]), fnv1a(&[b"ab"]));
    }
}
