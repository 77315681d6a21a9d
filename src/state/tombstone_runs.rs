//! Tombstone runs: the tombstones of a transaction that deleted many keys of one per-row table
//! with one token, written as one run instead of one `row_tombstone` row per key (docs/design.md,
//! "Tombstone runs"; `sql/pg_fencing.sql`, `_pg_fencing.tombstone_run`).
//!
//! Invariants:
//! * A run holds only keys identified by their text (`pg/key_identity.rs`), each once, each with
//!   a mark: the run's `high_water`, or in a merged run its own (`marks`, the run's mark being
//!   their highest). A key's mark is the highest of its `row_tombstone` row and of every run that
//!   holds its text (`state::tombstones`).
//! * A protection has few small runs: when 8 runs of about the same size (the same power of 8
//!   of 64-key chunks, below 32,768 keys) exist, they are merged into one (`compact`, right after
//!   a run is written, by the transaction that wrote it; one merger per protection at a time),
//!   dropping the keys whose mark is at most the tombstone floor (the floor fences them).
//! * A run's row and its chunks are written in one transaction and removed in one (prune, a key
//!   form changed, a protection replaced, the table dropped), never updated but for the run's
//!   mark (`fencing_reset_rows` turns runs into rows first).
//! * A run is found by its protection (`tombstone_run_pkey`); a key in it by the 64-bit FNV-1a
//!   hash of its text, the same on every platform (a dump restored elsewhere finds its keys):
//!   the chunk of a run whose bucket is the hash's leading `bucket_bits` bits (as the run
//!   recorded them) holds it if the run does (one equality read, which stops at that chunk), its keys sorted by hash.
//! * A reader reads a key's runs and rows with one snapshot (`state::tombstones::read_tombstone`,
//!   `pg::process::with_one_snapshot`): a merge or a run turned into rows (each one transaction)
//!   is seen wholly or not at all.
//! * A run's keys never change (a merge writes a new run), so a backend keeps a Bloom filter of
//!   each run's key hashes it has read (`BLOOMS`, dropped on any relcache invalidation) and reads
//!   a run's chunk only when the filter holds the key's hash.

use crate::error::Token;
use crate::pg::index::{
    first_rows_hold, int8_array_datum, read_triples_by_index, text_array_datum, Held, UniqueIndex,
};
use crate::pg::spi::exec_internal;
use crate::state::marks::as_token;
use pgrx::prelude::*;

/// A transaction's tombstones of one protection and one token become a run from this many keys
/// on; fewer are written as `row_tombstone` rows (a one-row DELETE keeps its cost).
pub const RUN_MIN_KEYS: usize = 64;
/// A run's keys are spread over buckets of 32 to 64 keys on average (fewer than 65 keys: one),
/// so that a chunk is stored in its row (below PostgreSQL's TOAST threshold of about 2 kB for
/// the usual keys) and read whole.
const CHUNK_KEYS: usize = 64;

const RUN_INDEX: UniqueIndex = UniqueIndex {
    table: c"tombstone_run",
    index: c"tombstone_run_pkey",
    value: c"high_water",
};

/// This many runs of one size class are merged into one.
const MERGE_FANOUT: usize = 8;
/// Runs of this size class and above (64 × 8³ = 32,768 keys or more) are not merged: a lookup
/// passes them by their Bloom filters, and a merge's rewrite (and the space it leaves for
/// VACUUM) stays below that many keys.
const MAX_MERGE_CLASS: u32 = 3;

const RUN_HIGH_INDEX: UniqueIndex = UniqueIndex {
    table: c"tombstone_run",
    index: c"tombstone_run_high_water",
    value: c"high_water",
};

const CHUNK_INDEX: UniqueIndex = UniqueIndex {
    table: c"tombstone_chunk",
    index: c"tombstone_chunk_pkey",
    value: c"bucket",
};

const SQL_NEW_RUN: &str =
    "INSERT INTO _pg_fencing.tombstone_run (protection_id, high_water, key_count, bucket_bits, bloom) \
     VALUES ($1, $2, $3, $4, $5) RETURNING run";
const SQL_NEW_CHUNK: &str = "INSERT INTO _pg_fencing.tombstone_chunk (protection_id, run, bucket, key_hashes, keys, marks) \
     VALUES ($1, $2, $3, $4, $5, $6)";

/// The 64-bit FNV-1a hash of a key's text (the project's `pg_fencing_core::hash::fnv1a`, the
/// same on every platform): where it sorts in a run.
pub fn key_hash(text: &str) -> i64 {
    pg_fencing_core::hash::fnv1a(&[text.as_bytes()]) as i64
}

/// How many leading hash bits a run of `keys` keys buckets its keys by: 32 to 64 keys a bucket
/// on average.
fn bucket_bits(keys: i64) -> u32 {
    let mut bits = 0;
    while bits < 48 && (keys.max(0) >> bits) > CHUNK_KEYS as i64 {
        bits += 1;
    }
    bits
}

/// The bucket of `hash` in a run bucketed by `bits` leading bits.
fn bucket_of(hash: i64, bits: u32) -> i64 {
    if bits == 0 {
        0
    } else {
        ((hash as u64) >> (64 - bits)) as i64
    }
}

/// Does this schema have the run tables (0.2.0's; not the schema of 0.1.0)?
pub fn available() -> bool {
    crate::pg::index::exists(&RUN_INDEX)
        && crate::pg::index::exists(&RUN_HIGH_INDEX)
        && crate::pg::index::exists(&CHUNK_INDEX)
}

/// Write `keys` (texts of keys identified by text) as one run of `protection` with mark `token`,
/// then merge runs where 8 of one size exist (`compact`; the keys at or below `floor`, the
/// protection's tombstone floor, left out). False (nothing written) where the
/// schema has no run tables: the caller writes rows.
pub fn store(protection: i64, token: Token, keys: &[&str], floor: Option<Token>) -> bool {
    if keys.is_empty() || token <= 0 || !available() {
        return false;
    }
    let entries: Vec<(i64, &str, Token)> = keys.iter().map(|k| (key_hash(k), *k, token)).collect();
    let entries = order_for_run(entries);
    if !write_run(protection, &entries, true) {
        return false;
    }
    compact(protection, floor.unwrap_or(0));
    true
}

/// `entries` ordered as a run stores them: each text once (with its highest mark), by bucket
/// (`bucket_of` with `bucket_bits` of their number), within a bucket by hash as a lookup
/// searches it. A counting sort by bucket (a bucket holds 64 keys or fewer on average), then
/// each bucket sorted; if dropping repeated texts changed the number of bucket bits, everything
/// is ordered again for the new number.
fn order_for_run(entries: Vec<(i64, &str, Token)>) -> Vec<(i64, &str, Token)> {
    let by_key = |a: &(i64, &str, Token), b: &(i64, &str, Token)| {
        a.0.cmp(&b.0)
            .then_with(|| a.1.cmp(b.1))
            .then_with(|| b.2.cmp(&a.2))
    };
    let bits = bucket_bits(entries.len() as i64);
    let mut out = if bits == 0 || entries.is_empty() {
        let mut e = entries;
        e.sort_unstable_by(by_key);
        e
    } else {
        let buckets = 1usize << bits;
        let mut start = vec![0usize; buckets + 1];
        for e in &entries {
            start[bucket_of(e.0, bits) as usize + 1] += 1;
        }
        for i in 0..buckets {
            start[i + 1] += start[i];
        }
        let mut next = start.clone();
        let mut out = vec![entries[0]; entries.len()];
        for e in entries {
            let b = bucket_of(e.0, bits) as usize;
            out[next[b]] = e;
            next[b] += 1;
        }
        for b in 0..buckets {
            sort_bucket(&mut out[start[b]..start[b + 1]], by_key);
        }
        out
    };
    // Equal texts have equal hashes, so they are neighbours now; the first has the highest mark.
    out.dedup_by(|a, b| a.1 == b.1);
    if bucket_bits(out.len() as i64) != bits {
        return order_for_run(out);
    }
    out
}

/// Sort `bucket` by `by_key` (hash, text, highest mark first): by hash alone first (integers),
/// then each range of equal hashes (two texts' hashes are rarely equal; a text deleted twice
/// in a batch has its hash twice) by the whole of `by_key`.
fn sort_bucket(
    bucket: &mut [(i64, &str, Token)],
    by_key: impl Fn(&(i64, &str, Token), &(i64, &str, Token)) -> std::cmp::Ordering,
) {
    bucket.sort_unstable_by_key(|e| e.0);
    let mut i = 0;
    while i < bucket.len() {
        let mut j = i + 1;
        while j < bucket.len() && bucket[j].0 == bucket[i].0 {
            j += 1;
        }
        if j - i > 1 {
            bucket[i..j].sort_unstable_by(&by_key);
        }
        i = j;
    }
}

/// Write `entries` (ordered by `order_for_run`) as one run; `uniform`: every
/// entry has the same mark (no `marks` stored).
fn write_run(protection: i64, entries: &[(i64, &str, Token)], uniform: bool) -> bool {
    let Some(high) = entries.iter().map(|e| e.2).max() else {
        return true;
    };
    let p = pg_sys::Datum::from(protection);
    let hashes: Vec<i64> = entries.iter().map(|e| e.0).collect();
    let Some(bloom) = Bloom::new(&hashes).to_bytes().as_slice().into_datum() else {
        return false;
    };
    let Some(run) = exec_internal(
        SQL_NEW_RUN,
        true,
        &[
            pg_sys::INT8OID,
            pg_sys::INT8OID,
            pg_sys::INT8OID,
            pg_sys::INT8OID,
            pg_sys::BYTEAOID,
        ],
        &mut [
            p,
            pg_sys::Datum::from(high),
            pg_sys::Datum::from(entries.len() as i64),
            pg_sys::Datum::from(i64::from(bucket_bits(entries.len() as i64))),
            bloom,
        ],
        false,
        as_token,
    ) else {
        return false;
    };
    let bits = bucket_bits(entries.len() as i64);
    for chunk in entries.chunk_by(|a, b| bucket_of(a.0, bits) == bucket_of(b.0, bits)) {
        store_chunk(p, run, bucket_of(chunk[0].0, bits), chunk, uniform);
    }
    true
}

fn store_chunk(
    p: pg_sys::Datum,
    run: i64,
    bucket: i64,
    entries: &[(i64, &str, Token)],
    uniform: bool,
) {
    let hashes: Vec<i64> = entries.iter().map(|e| e.0).collect();
    let texts: Vec<&str> = entries.iter().map(|e| e.1).collect();
    let marks: Option<pg_sys::Datum> = if uniform {
        None
    } else {
        Some(int8_array_datum(
            &entries.iter().map(|e| e.2).collect::<Vec<i64>>(),
        ))
    };
    let hashes = int8_array_datum(&hashes);
    let texts = text_array_datum(&texts);
    let run = pg_sys::Datum::from(run);
    let last = pg_sys::Datum::from(bucket);
    let direct = crate::pg::index::insert_direct(
        &CHUNK_INDEX,
        &[
            (c"protection_id", Some(p)),
            (c"run", Some(run)),
            (c"bucket", Some(last)),
            (c"key_hashes", Some(hashes)),
            (c"keys", Some(texts)),
            (c"marks", marks),
        ],
        c"",
        &|| false,
    );
    if !direct {
        let sql = if marks.is_some() {
            SQL_NEW_CHUNK.to_string()
        } else {
            SQL_NEW_CHUNK.replace("$6", "NULL")
        };
        let mut args = vec![p, run, last, hashes, texts];
        let mut types = vec![
            pg_sys::INT8OID,
            pg_sys::INT8OID,
            pg_sys::INT8OID,
            pg_sys::INT8ARRAYOID,
            pg_sys::TEXTARRAYOID,
        ];
        if let Some(m) = marks {
            args.push(m);
            types.push(pg_sys::INT8ARRAYOID);
        }
        exec_internal(&sql, false, &types, &mut args, false, as_token);
    }
}

/// A run's size class: the power of 8 of its 64-key chunks.
fn size_class(keys: i64) -> u32 {
    let mut chunks = (keys.max(1) as u64).div_ceil(CHUNK_KEYS as u64);
    let mut class = 0;
    while chunks >= MERGE_FANOUT as u64 {
        chunks /= MERGE_FANOUT as u64;
        class += 1;
    }
    class
}

/// Merge `MERGE_FANOUT` runs of `protection` of one size class (the oldest of the smallest class
/// that has that many) into one, until no class below `MAX_MERGE_CLASS` has that many. Only
/// one transaction merges or expands a protection's runs at a time (a lock of pg_fencing's own
/// that no SQL advisory lock call can take, `pg::lock_manager::try_lock_runs`, tried without
/// waiting: another merger will see these runs); the runs it reads are committed or its own
/// (the latest snapshot), and nothing else changes them while its writes hold the table
/// (pruning, a protection replaced or reset and a dropped table all lock the table against
/// writers). Not in a SERIALIZABLE transaction (see the body).
fn compact(protection: i64, floor: Token) {
    // A SERIALIZABLE transaction's reads of the runs take predicate locks: its merges would
    // make concurrent bulk deletes fail (40001). A later writer merges them.
    if crate::pg::process::serializable() || !crate::pg::lock_manager::try_lock_runs(protection) {
        return;
    }
    let p = pg_sys::Datum::from(protection);
    loop {
        let Some(runs) = read_triples_by_index(
            &RUN_INDEX,
            c"run",
            c"key_count",
            &[(1, pg_sys::F_INT8EQ, p)],
        ) else {
            return;
        };
        let mut classes: std::collections::BTreeMap<u32, Vec<(i64, Token)>> = Default::default();
        for (run, keys, mark) in runs {
            classes
                .entry(size_class(keys))
                .or_default()
                .push((run, mark));
        }
        let Some((_, mut merge)) = classes
            .into_iter()
            .find(|(class, runs)| *class < MAX_MERGE_CLASS && runs.len() >= MERGE_FANOUT)
        else {
            return;
        };
        merge.sort_unstable();
        merge.truncate(MERGE_FANOUT);
        pgrx::check_for_interrupts!();
        if !merge_runs(protection, &merge, floor) {
            return;
        }
    }
}

/// Replace `runs` of `protection` by one run of their keys (each with its highest mark; the
/// keys at or below the tombstone floor left out). False if nothing could be read.
fn merge_runs(protection: i64, runs: &[(i64, Token)], floor: Token) -> bool {
    let p = pg_sys::Datum::from(protection);
    // Read through the chunks' index (the runs' lock keeps other mergers and expanders away, and
    // pruning, resets and drops lock the table against this transaction's writes).
    let mut read: Vec<(i64, String, Token)> = Vec::new();
    for (run, mark) in runs {
        let Some(entries) = crate::pg::index::read_entries(
            &CHUNK_INDEX,
            &[
                (1, pg_sys::F_INT8EQ, p),
                (2, pg_sys::F_INT8EQ, pg_sys::Datum::from(*run)),
            ],
            c"key_hashes",
            c"keys",
            c"marks",
        ) else {
            // A run that cannot be read as written is left as it is (it keeps fencing).
            return false;
        };
        read.extend(
            entries
                .into_iter()
                .map(|(h, k, m)| (h, k, m.unwrap_or(*mark)))
                .filter(|e| e.2 > floor),
        );
    }
    let ids: Vec<i64> = runs.iter().map(|r| r.0).collect();
    let Some(run_ids) = ids.into_datum() else {
        return false;
    };
    exec_internal(
        "WITH r AS (DELETE FROM _pg_fencing.tombstone_run r \
             WHERE r.protection_id OPERATOR(pg_catalog.=) $1 AND r.run OPERATOR(pg_catalog.=) ANY ($2) \
             RETURNING r.run) \
         DELETE FROM _pg_fencing.tombstone_chunk c USING r \
         WHERE c.protection_id OPERATOR(pg_catalog.=) $1 AND c.run OPERATOR(pg_catalog.=) r.run",
        true,
        &[pg_sys::INT8OID, pg_sys::INT8ARRAYOID],
        &mut [p, run_ids],
        false,
        as_token,
    );
    let entries: Vec<(i64, &str, Token)> =
        read.iter().map(|(h, k, m)| (*h, k.as_str(), *m)).collect();
    let entries = order_for_run(entries);
    let uniform = entries.windows(2).all(|w| w[0].2 == w[1].2);
    write_run(protection, &entries, uniform)
}

/// Bits of a run's Bloom filter per key, and its hash functions (about 1 % false positives).
const BLOOM_BITS_PER_KEY: usize = 10;
const BLOOM_HASHES: u64 = 5;
/// At most this many bytes of Bloom filters per backend; runs beyond it are read chunk by chunk.
const BLOOM_BUDGET: usize = 16 << 20;

/// A Bloom filter of a run's key hashes.
struct Bloom {
    bits: Vec<u64>,
}

impl Bloom {
    fn positions(&self, hash: i64) -> impl Iterator<Item = usize> + '_ {
        // splitmix64's finalizer, then double hashing (Kirsch and Mitzenmacher).
        let mut z = (hash as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let (h1, h2) = (z & 0xffff_ffff, (z >> 32) | 1);
        let n = (self.bits.len() * 64) as u64;
        (0..BLOOM_HASHES).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % n) as usize)
    }

    fn new(hashes: &[i64]) -> Bloom {
        let words = (hashes.len() * BLOOM_BITS_PER_KEY).div_ceil(64).max(1);
        let mut b = Bloom {
            bits: vec![0; words],
        };
        for h in hashes {
            let pos: Vec<usize> = b.positions(*h).collect();
            for p in pos {
                b.bits[p / 64] |= 1 << (p % 64);
            }
        }
        b
    }

    /// Stored form: the words, least significant byte first.
    fn to_bytes(&self) -> Vec<u8> {
        self.bits.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// `None` for a length that is no whole number of words (or none).
    fn from_bytes(bytes: &[u8]) -> Option<Bloom> {
        if bytes.is_empty() || !bytes.len().is_multiple_of(8) {
            return None;
        }
        let bits = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0xff; 8])))
            .collect();
        Some(Bloom { bits })
    }

    fn may_hold(&self, hash: i64) -> bool {
        self.positions(hash)
            .all(|p| self.bits[p / 64] & (1 << (p % 64)) != 0)
    }
}

thread_local! {
    /// Bloom filters of runs by (protection, run), and their bytes; dropped on any relcache
    /// invalidation (a re-created extension numbers its runs again).
    static BLOOMS: std::cell::RefCell<rustc_hash::FxHashMap<(i64, i64), std::rc::Rc<Bloom>>> =
        std::cell::RefCell::new(rustc_hash::FxHashMap::default());
    static BLOOM_BYTES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Per-backend state's life (`backend.rs`).
pub fn on_event(ev: crate::backend_event::BackendEvent) {
    if let crate::backend_event::BackendEvent::Relcache(_) = ev {
        BLOOMS.with(|b| b.borrow_mut().clear());
        BLOOM_BYTES.with(|b| b.set(0));
    }
}

/// The Bloom filter of run `run` of `protection`, as the run stored it, read with
/// the snapshot of the lookup; `None`: none stored, or beyond the budget (the chunk is read).
fn bloom_of(protection: i64, run: i64) -> Option<std::rc::Rc<Bloom>> {
    if let Some(b) = BLOOMS.with(|b| b.borrow().get(&(protection, run)).cloned()) {
        return Some(b);
    }
    if BLOOM_BYTES.with(|b| b.get()) >= BLOOM_BUDGET {
        return None;
    }
    let stored: Option<Vec<u8>> = crate::pg::spi::exec_internal_row(
        "SELECT r.bloom FROM _pg_fencing.tombstone_run r \
         WHERE r.protection_id OPERATOR(pg_catalog.=) $1 AND r.run OPERATOR(pg_catalog.=) $2",
        true,
        &[pg_sys::INT8OID, pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection), pg_sys::Datum::from(run)],
        true,
        |row| {
            // SAFETY: the statement's one column is a bytea (or NULL), copied before SPI frees
            // it.
            row.first()
                .copied()
                .flatten()
                .and_then(|d| unsafe { Vec::<u8>::from_datum(d, false) })
        },
    )
    .flatten();
    let bloom = std::rc::Rc::new(Bloom::from_bytes(&stored?)?);
    BLOOM_BYTES.with(|b| b.set(b.get() + bloom.bits.len() * 8));
    BLOOMS.with(|b| b.borrow_mut().insert((protection, run), bloom.clone()));
    Some(bloom)
}

/// The highest mark of the runs of `protection` that hold the key printed as `text` (`None`:
/// none does, or the schema has no runs).
pub fn mark_of(protection: i64, text: &str) -> Option<Token> {
    if !available() {
        return None;
    }
    let p = pg_sys::Datum::from(protection);
    let mut runs = read_triples_by_index(
        &RUN_INDEX,
        c"run",
        c"bucket_bits",
        &[(1, pg_sys::F_INT8EQ, p)],
    )?;
    if runs.is_empty() {
        return None;
    }
    runs.sort_unstable_by_key(|r| std::cmp::Reverse(r.2));
    let hash = key_hash(text);
    // Only the runs whose Bloom filter may hold the key (or that have none) are read.
    runs.retain(|(run, _, _)| bloom_of(protection, *run).is_none_or(|b| b.may_hold(hash)));
    if runs.is_empty() {
        return None;
    }
    let probes: Vec<Vec<(i16, u32, pg_sys::Datum)>> = runs
        .iter()
        .map(|(run, bits, _)| {
            vec![
                (1, pg_sys::F_INT8EQ, p),
                (2, pg_sys::F_INT8EQ, pg_sys::Datum::from(*run)),
                (
                    3,
                    pg_sys::F_INT8EQ,
                    pg_sys::Datum::from(bucket_of(hash, (*bits).clamp(0, 48) as u32)),
                ),
            ]
        })
        .collect();
    let held = first_rows_hold(
        &CHUNK_INDEX,
        &probes,
        c"key_hashes",
        c"keys",
        c"marks",
        hash,
        text,
    )?;
    runs.iter()
        .zip(held)
        .filter_map(|((_, _, mark), h)| match h {
            Held::Yes(own) => Some(own.unwrap_or(*mark)),
            Held::No => None,
        })
        .max()
}

/// An upper bound of the marks of `protection`'s runs, read from the index alone (as
/// `row_tombstone_high_water`, `state::tombstones::new_key_threshold`): `Some(None)` if it has
/// none (or the schema has no runs), `None` if it cannot be read this way.
pub fn highest(protection: i64) -> Option<Option<Token>> {
    if !crate::pg::index::exists(&RUN_HIGH_INDEX) {
        return (!crate::pg::index::exists(&RUN_INDEX)).then_some(None);
    }
    let p = pg_sys::Datum::from(protection);
    crate::pg::index::upper_bound_by_index(&RUN_HIGH_INDEX, &[(1, pg_sys::F_INT8EQ, p)])
}

/// `fencing_prune_tombstones`: delete the runs of `protection` whose mark is at most `floor`
/// (whole runs, in the order of their ids, while their keys add up to at most `max`); returns how many
/// keys they held.
pub fn prune(protection: i64, floor: Token, max: i64) -> i64 {
    if !available() || max <= 0 {
        return 0;
    }
    exec_internal(
        "WITH r AS (DELETE FROM _pg_fencing.tombstone_run r WHERE r.protection_id OPERATOR(pg_catalog.=) $1 \
             AND r.run OPERATOR(pg_catalog.=) ANY (ARRAY( \
                 SELECT x.run FROM (SELECT s.run, pg_catalog.sum(s.key_count) OVER (ORDER BY s.run) AS upto \
                     FROM _pg_fencing.tombstone_run s \
                     WHERE s.protection_id OPERATOR(pg_catalog.=) $1 AND s.high_water OPERATOR(pg_catalog.<=) $2) x \
                 WHERE x.upto OPERATOR(pg_catalog.<=) $3)) \
             RETURNING r.run, r.key_count), \
         c AS (DELETE FROM _pg_fencing.tombstone_chunk c USING r \
             WHERE c.protection_id OPERATOR(pg_catalog.=) $1 AND c.run OPERATOR(pg_catalog.=) r.run) \
         SELECT COALESCE(pg_catalog.sum(r.key_count), 0)::pg_catalog.int8 FROM r",
        false,
        &[pg_sys::INT8OID, pg_sys::INT8OID, pg_sys::INT8OID],
        &mut [
            pg_sys::Datum::from(protection),
            pg_sys::Datum::from(floor),
            pg_sys::Datum::from(max),
        ],
        false,
        as_token,
    )
    .unwrap_or(0)
}

/// `_pg_fencing.expand_tombstone_runs(protection)`: the runs of `protection` turned into
/// `row_tombstone` rows (the highest mark per key), for the paths that work on tombstones one
/// by one; returns how many keys they held. The caller writes this transaction's pending
/// tombstones first (`state::tombstones::expand_runs`), so that none becomes a run after this.
pub fn expand(protection: i64) -> i64 {
    if !available() {
        return 0;
    }
    // No merge of these runs runs at the same time (nor starts until this transaction ends).
    crate::pg::lock_manager::lock_runs(protection);
    exec_internal(
        "WITH r AS (DELETE FROM _pg_fencing.tombstone_run r WHERE r.protection_id OPERATOR(pg_catalog.=) $1 \
             RETURNING r.run, r.high_water, r.key_count), \
         c AS (DELETE FROM _pg_fencing.tombstone_chunk c USING r \
             WHERE c.protection_id OPERATOR(pg_catalog.=) $1 AND c.run OPERATOR(pg_catalog.=) r.run \
             RETURNING c.keys, c.marks, r.high_water), \
         i AS (INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water, key_hash) \
             SELECT $1, u.k, pg_catalog.max(COALESCE(u.m, c.high_water)), _pg_fencing.tombstone_key_hash($1, u.k) \
             FROM c, ROWS FROM (pg_catalog.unnest(c.keys), pg_catalog.unnest(c.marks)) AS u(k, m) GROUP BY u.k \
             ON CONFLICT (protection_id, key) DO UPDATE SET high_water = excluded.high_water \
             WHERE h.high_water OPERATOR(pg_catalog.<) excluded.high_water) \
         SELECT COALESCE(pg_catalog.sum(r.key_count), 0)::pg_catalog.int8 FROM r",
        false,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection)],
        false,
        as_token,
    )
    .unwrap_or(0)
}
