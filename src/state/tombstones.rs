//! Tombstones of per-row mode: the mark a deleted key leaves, so that a stale writer cannot
//! re-create it. Written in batches at the end of a statement's work (see `record_row_delete`),
//! read through the unique index, and carried to logical-replication subscribers by table name
//! (`_pg_fencing.tombstone_feed`).

use crate::backend_event::BackendEvent;
use crate::error::{Domain, FenceError, Token};
use crate::pg::index::{read_by_index, UniqueIndex};
use crate::pg::key_identity::{key_columns_of, KeyIdentity};
use crate::pg::plan;
use crate::pg::spi::{exec_internal, text_datum};
use crate::state::marks::as_token;
use crate::state::stats;
use crate::state::tombstone_runs;
use pgrx::prelude::*;
use rustc_hash::FxHashMap;
use std::cell::RefCell;

/// Tombstones of protections that no longer exist (`fencing_unprotect` earlier in the
/// transaction) are left out before these run (`flush_tombstones`).
const SQL_STORE_TOMBS: &str = "INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, key_hash, high_water) \
     SELECT u.p, u.k, u.h, u.t FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4)) AS u(p, k, t, h) \
     ON CONFLICT (protection_id, key) DO UPDATE \
     SET high_water = GREATEST(h.high_water, excluded.high_water), key_hash = excluded.key_hash \
     WHERE h.high_water OPERATOR(pg_catalog.<) excluded.high_water \
        OR h.key_hash IS DISTINCT FROM excluded.key_hash";
/// The same without `key_hash`: for a batch of keys identified by text alone (`key_hash` stays
/// NULL), and for the schema of 0.1.0 (no `key_hash`), which the library serves until `ALTER
/// EXTENSION pg_fencing UPDATE` (tombstones are matched by text there).
const SQL_STORE_TOMBS_0_1: &str = "INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water) \
     SELECT u.p, u.k, u.t FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS u(p, k, t) \
     ON CONFLICT (protection_id, key) DO UPDATE \
     SET high_water = excluded.high_water WHERE h.high_water OPERATOR(pg_catalog.<) excluded.high_water";
/// One tombstone (the usual flush of a transaction that deleted one row): the same as
/// `SQL_STORE_TOMBS` and `SQL_STORE_TOMBS_0_1` without arrays ($1 protection, $2 key, $3 mark,
/// $4 hash).
const SQL_STORE_TOMB: &str =
    "INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, key_hash, high_water) \
     VALUES ($1, $2, $4, $3) ON CONFLICT (protection_id, key) DO UPDATE \
     SET high_water = GREATEST(h.high_water, excluded.high_water), key_hash = excluded.key_hash \
     WHERE h.high_water OPERATOR(pg_catalog.<) excluded.high_water \
        OR h.key_hash IS DISTINCT FROM excluded.key_hash";
const SQL_STORE_TOMB_0_1: &str = "INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water) \
     VALUES ($1, $2, $3) ON CONFLICT (protection_id, key) DO UPDATE \
     SET high_water = excluded.high_water WHERE h.high_water OPERATOR(pg_catalog.<) excluded.high_water";
/// Logical replication: while `_pg_fencing.tombstone_feed` is in a publication
/// (`feed_published`), every tombstone written is also put in it under its table's qualified name
/// (protection ids differ between servers, names do not), as a new row; the key's lower rows are
/// deleted. The feed holds every tombstone at rest, so a subscription's initial copy brings those
/// written before it (`sql/pg_fencing.sql`, `_pg_fencing.tombstone_feed`).
const SQL_FEED_TOMBS: &str = "WITH n AS (INSERT INTO _pg_fencing.tombstone_feed (relation, key, high_water) \
     SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname), u.k, u.t \
     FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS u(p, k, t) \
     JOIN _pg_fencing.protected_table pt ON pt.id OPERATOR(pg_catalog.=) u.p \
     JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pt.relid::pg_catalog.oid \
     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
     ON CONFLICT DO NOTHING RETURNING relation, key, high_water) \
     DELETE FROM _pg_fencing.tombstone_feed f USING n \
     WHERE f.relation OPERATOR(pg_catalog.=) n.relation AND f.key OPERATOR(pg_catalog.=) n.key \
       AND f.high_water OPERATOR(pg_catalog.<) n.high_water";

thread_local! {
    /// Is `_pg_fencing.tombstone_feed` in a publication (`None`: not known since the last relcache
    /// invalidation)? Adding a table to a publication or dropping it from one invalidates that
    /// table's relcache entry; a publication of all tables or of a schema invalidates every entry
    /// or the schema's. `_pg_fencing.fill_feed` locks the protected tables when the feed joins a
    /// publication, so a writer cannot act on a stale `false` (`forget_floors` clears it).
    static FEED_PUBLISHED: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Is the tombstone feed published (see `FEED_PUBLISHED`)?
fn feed_published() -> bool {
    if let Some(known) = FEED_PUBLISHED.with(|f| f.get()) {
        return known;
    }
    let published = exec_internal(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables pt \
             WHERE pt.schemaname OPERATOR(pg_catalog.=) '_pg_fencing' \
               AND pt.tablename OPERATOR(pg_catalog.=) 'tombstone_feed') THEN 1 ELSE 0 END::pg_catalog.int8",
        true,
        &[],
        &mut [],
        true,
        as_token,
    ) == Some(1);
    FEED_PUBLISHED.with(|f| f.set(Some(published)));
    published
}

const SQL_READ_TOMB: &str = "SELECT high_water FROM _pg_fencing.row_tombstone \
     WHERE protection_id OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2";

const TOMB_INDEX: UniqueIndex = UniqueIndex {
    table: c"row_tombstone",
    index: c"row_tombstone_pkey",
    value: c"high_water",
};

/// Tombstones of keys identified by hash (`pg/key_identity.rs`), by (protection, hash); a
/// partial index (`WHERE key_hash IS NOT NULL`). Missing in the schema of 0.1.0.
const TOMB_HASH_INDEX: UniqueIndex = UniqueIndex {
    table: c"row_tombstone",
    index: c"row_tombstone_key_hash",
    value: c"high_water",
};

/// Tombstones by (protection, mark): the highest of a protection read backwards. Missing before
/// 0.2.0's schema.
const TOMB_HIGH_INDEX: UniqueIndex = UniqueIndex {
    table: c"row_tombstone",
    index: c"row_tombstone_high_water",
    value: c"high_water",
};

/// Protections by id (the id itself read: is there such a protection?).
const PROTECTION_INDEX: UniqueIndex = UniqueIndex {
    table: c"protected_table",
    index: c"protected_table_pkey",
    value: c"id",
};

const FLOOR_INDEX: UniqueIndex = UniqueIndex {
    table: c"protected_table",
    index: c"protected_table_pkey",
    value: c"tombstone_floor",
};

/// Also right for the schema of 0.1.0 (no floor column, so no floor), which the library serves
/// until `ALTER EXTENSION pg_fencing UPDATE`.
const SQL_READ_FLOOR: &str =
    "SELECT (pg_catalog.to_jsonb(p) OPERATOR(pg_catalog.->>) 'tombstone_floor')::pg_catalog.int8 \
     FROM _pg_fencing.protected_table p WHERE p.id OPERATOR(pg_catalog.=) $1";

thread_local! {
    /// Protections found to exist by a tombstone flush, dropped on any relcache invalidation
    /// (`fencing_unprotect` drops the table's triggers, and dropping the table invalidates it).
    static PROTECTIONS_SEEN: RefCell<rustc_hash::FxHashSet<i64>> =
        RefCell::new(rustc_hash::FxHashSet::default());
}

/// Is there (still) a protection `protection`? Read through its index with the latest committed
/// snapshot (true if it cannot be read this way: a tombstone too many is harmless).
fn protection_exists(protection: i64) -> bool {
    if PROTECTIONS_SEEN.with(|m| m.borrow().contains(&protection)) {
        return true;
    }
    let id = pg_sys::Datum::from(protection);
    let exists = read_by_index(&PROTECTION_INDEX, &[(1, pg_sys::F_INT8EQ, id)]) != Some(None);
    if exists {
        PROTECTIONS_SEEN.with(|m| {
            let mut m = m.borrow_mut();
            if m.len() >= 10_000 {
                m.clear();
            }
            m.insert(protection);
        });
    }
    exists
}

thread_local! {
    /// Tombstone floor per protection, cached per backend and dropped on any relcache
    /// invalidation (see [`prune`] for why a cached floor is never older than a prune that
    /// committed before the write that uses it).
    static FLOORS: RefCell<FxHashMap<i64, Option<Token>>> = RefCell::new(FxHashMap::default());
}

/// The tombstone floor of `protection` (`fencing_prune_tombstones`): the high-water mark of
/// every key that has no tombstone. `None`: no floor.
pub fn tombstone_floor(protection: i64) -> Option<Token> {
    if let Some(f) = FLOORS.with(|m| m.borrow().get(&protection).copied()) {
        return f;
    }
    let id = pg_sys::Datum::from(protection);
    let floor = read_by_index(&FLOOR_INDEX, &[(1, pg_sys::F_INT8EQ, id)]).unwrap_or_else(|| {
        exec_internal(
            SQL_READ_FLOOR,
            true,
            &[pg_sys::INT8OID],
            &mut [id],
            true,
            as_token,
        )
    });
    FLOORS.with(|m| crate::cache::cache_insert(&mut m.borrow_mut(), protection, floor, 10_000));
    floor
}

/// Relcache invalidation (`backend.rs`): floors, tables' keys, and whether the tombstone feed is
/// published may have changed.
fn forget_floors() {
    FEED_PUBLISHED.with(|f| f.set(None));
    PROTECTIONS_SEEN.with(|m| m.borrow_mut().clear());
    FLOORS.with(|m| m.borrow_mut().clear());
    IDENTITIES.with(|m| m.borrow_mut().clear());
}

/// Does `row_tombstone` have `key_hash` (not in the schema of 0.1.0)?
fn has_key_hash() -> bool {
    crate::pg::index::exists(&TOMB_HASH_INDEX)
}

/// The protection id of `relid` (the protected table itself, not a partition) if it is
/// protected in per-row mode (`FT004` if it does not exist or is not protected, `22023` in
/// resource mode).
fn per_row_protection(relid: pg_sys::Oid) -> Result<i64, FenceError> {
    if !crate::pg::lock_manager::relation_exists(relid) {
        return Err(gone(relid));
    }
    let protection = exec_internal(
        "SELECT CASE WHEN p.resource IS NULL THEN p.id ELSE 0 END FROM _pg_fencing.protected_table p \
         WHERE p.relid OPERATOR(pg_catalog.=) $1 AND p.protected",
        false,
        &[pg_sys::REGCLASSOID],
        &mut [pg_sys::Datum::from(relid)],
        true,
        as_token,
    );
    let table = || crate::pg::trigger_event::relation_name(relid);
    match protection {
        None => Err(FenceError::NotProtected(crate::error::Text {
            message: format!("table {} is not protected by pg_fencing", table()),
            detail: None,
            hint: Some(
                "Tombstones belong to the table that fencing_protect was called with (for \
                     partitions, the partitioned table)."
                    .into(),
            ),
        })),
        Some(0) => Err(FenceError::InvalidArgument(format!(
            "table {} is protected in resource mode, which keeps no tombstones",
            table()
        ))),
        Some(id) => Ok(id),
    }
}

/// `fencing_tombstone_retention`: set (or, `None`, clear) the automatic retention of the
/// per-row protection of `relid`; `retention` is an `interval` datum.
pub fn set_retention(
    relid: pg_sys::Oid,
    retention: Option<pg_sys::Datum>,
) -> Result<(), FenceError> {
    // As a DROP TABLE would (its protection goes with it): wait for one in flight.
    crate::pg::lock_manager::lock_relation_share_update(relid);
    if !crate::pg::lock_manager::relation_exists(relid) {
        return Err(gone(relid));
    }
    let protection = pg_sys::Datum::from(per_row_protection(relid)?);
    match retention {
        Some(r) => exec_internal(
            "UPDATE _pg_fencing.protected_table SET tombstone_retention = $2 \
             WHERE id OPERATOR(pg_catalog.=) $1",
            false,
            &[pg_sys::INT8OID, pg_sys::INTERVALOID],
            &mut [protection, r],
            false,
            |_| (),
        ),
        None => exec_internal(
            "UPDATE _pg_fencing.protected_table SET tombstone_retention = NULL \
             WHERE id OPERATOR(pg_catalog.=) $1",
            false,
            &[pg_sys::INT8OID],
            &mut [protection],
            false,
            |_| (),
        ),
    };
    Ok(())
}

/// `fencing_prune_tombstones`: raise the tombstone floor of the per-row protection of `relid`
/// (the protected table itself, not a partition) to `floor` and delete its tombstones at or
/// below the floor, at most `max` of them. Returns how many were deleted.
///
/// Why a pruned key stays fenced: a tombstone `h <= F` refused tokens below `h`; the floor `F`
/// refuses, for every key without a tombstone, tokens below `F`, which includes them. The floor
/// and the deletes commit together. Writers read the floor from a per-backend cache, so before
/// anything changes this takes a SHARE lock on the table and all its partitions (conflicting
/// with the ROW EXCLUSIVE lock of every INSERT, UPDATE, DELETE, MERGE and COPY) and queues a
/// relcache invalidation of each: transactions that wrote the table before have ended, and a
/// later writer gets its lock only after this commits, when PostgreSQL processes the
/// invalidation for it and its cached floor is dropped.
///
/// `wait`: wait for the table's lock (`fencing_prune_tombstones`); else (the pruner worker)
/// return `Ok(None)` at once if a writer holds it, to try again in a later round.
pub fn prune(
    relid: pg_sys::Oid,
    floor: Token,
    max: Option<i64>,
    wait: bool,
) -> Result<Option<i64>, FenceError> {
    let protection = per_row_protection(relid)?;
    let table = || crate::pg::trigger_event::relation_name(relid);
    if !crate::pg::lock_manager::lock_tree_share_and_invalidate(relid, wait) {
        if crate::pg::lock_manager::relation_exists(relid) {
            return Ok(None);
        }
        return Err(gone(relid));
    }
    // This transaction's own deletes first, so that they are pruned like the others.
    flush_tombstones();
    let floor = exec_internal(
        "UPDATE _pg_fencing.protected_table \
         SET tombstone_floor = GREATEST(COALESCE(tombstone_floor, 0), $2) \
         WHERE id OPERATOR(pg_catalog.=) $1 RETURNING tombstone_floor",
        false,
        &[pg_sys::INT8OID, pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection), pg_sys::Datum::from(floor)],
        false,
        as_token,
    )
    .unwrap_or(floor);
    forget_floors();
    if feed_published() {
        // The floor goes to subscribers as the table's row with key '', replacing the lower
        // ones, and the table's pruned tombstones leave the feed.
        exec_internal(
            "WITH t AS (SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname) AS relation \
                 FROM _pg_fencing.protected_table pt \
                 JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pt.relid::pg_catalog.oid \
                 JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
                 WHERE pt.id OPERATOR(pg_catalog.=) $1), \
             i AS (INSERT INTO _pg_fencing.tombstone_feed (relation, key, high_water) \
                 SELECT t.relation, '', $2 FROM t ON CONFLICT DO NOTHING) \
             DELETE FROM _pg_fencing.tombstone_feed f USING t \
             WHERE f.relation OPERATOR(pg_catalog.=) t.relation AND f.high_water OPERATOR(pg_catalog.<=) $2 \
               AND NOT (f.key OPERATOR(pg_catalog.=) '' AND f.high_water OPERATOR(pg_catalog.=) $2)",
            false,
            &[pg_sys::INT8OID, pg_sys::INT8OID],
            &mut [pg_sys::Datum::from(protection), pg_sys::Datum::from(floor)],
            false,
            as_token,
        );
    }
    let deleted = exec_internal(
        "WITH d AS (DELETE FROM _pg_fencing.row_tombstone t WHERE t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY( \
             SELECT s.ctid FROM _pg_fencing.row_tombstone s \
             WHERE s.protection_id OPERATOR(pg_catalog.=) $1 AND s.high_water OPERATOR(pg_catalog.<=) $2 \
             LIMIT $3)) RETURNING 1) \
         SELECT pg_catalog.count(*) FROM d",
        false,
        &[pg_sys::INT8OID, pg_sys::INT8OID, pg_sys::INT8OID],
        &mut [
            pg_sys::Datum::from(protection),
            pg_sys::Datum::from(floor),
            pg_sys::Datum::from(max.unwrap_or(i64::MAX)),
        ],
        false,
        as_token,
    )
    .unwrap_or(0);
    let deleted = deleted
        + tombstone_runs::prune(
            protection,
            floor,
            max.unwrap_or(i64::MAX).saturating_sub(deleted),
        );
    pgrx::log!(
        "pg_fencing: tombstones of table {} pruned at or below floor {floor}: {deleted} deleted",
        table()
    );
    Ok(Some(deleted))
}

/// `FT004` unless relation `relid` exists (a regclass argument can name a dropped table by OID).
pub fn require_table(relid: pg_sys::Oid) -> Result<(), FenceError> {
    if crate::pg::lock_manager::relation_exists(relid) {
        Ok(())
    } else {
        Err(gone(relid))
    }
}

/// `FT004` for a table dropped while a call waited for it.
fn gone(relid: pg_sys::Oid) -> FenceError {
    FenceError::NotProtected(crate::error::Text::new(format!(
        "table with OID {} does not exist (it was dropped)",
        relid.to_u32()
    )))
}

/// A key as tombstones know it (`pg/key_identity.rs`): its text, and for a key identified by
/// hash, its hash and a test whether another key's text is the same key.
pub struct TombKey<'a> {
    pub text: &'a str,
    pub hash: Option<i64>,
    pub same: &'a dyn Fn(&str) -> bool,
}

/// The tombstone mark of `key` in protection `protection` (`None`: never deleted): the highest
/// of its tombstone by text and, for a key identified by hash, of every tombstone of an equal
/// key printed otherwise.
pub fn read_tombstone(protection: i64, key: &TombKey) -> Option<Token> {
    flush_tombstones();
    // One snapshot for the runs and the rows (`state/tombstone_runs.rs`): a transaction that
    // merged runs or turned a run into rows meanwhile is seen wholly or not at all.
    crate::pg::process::with_one_snapshot(|| read_tombstone_now(protection, key))
}

fn read_tombstone_now(protection: i64, key: &TombKey) -> Option<Token> {
    let in_runs = tombstone_runs::mark_of(protection, key.text);
    let k = text_datum(key.text);
    let p = pg_sys::Datum::from(protection);
    let exact = read_by_index(
        &TOMB_INDEX,
        &[(1, pg_sys::F_INT8EQ, p), (2, pg_sys::F_TEXTEQ, k)],
    )
    .unwrap_or_else(|| {
        exec_internal(
            SQL_READ_TOMB,
            true,
            &[pg_sys::INT8OID, pg_sys::TEXTOID],
            &mut [p, k],
            true,
            as_token,
        )
    });
    let exact = exact.max(in_runs);
    let Some(hash) = key.hash else {
        return exact;
    };
    let attnum = crate::pg::index::column_number(&TOMB_HASH_INDEX, c"key_hash");
    let equal = attnum
        .and_then(|a| {
            crate::pg::index::read_all_by_index(
                &TOMB_HASH_INDEX,
                c"key",
                &[
                    (1, pg_sys::F_INT8EQ, p),
                    (a, pg_sys::F_INT8EQ, pg_sys::Datum::from(hash)),
                ],
            )
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|(text, _)| {
            // Many equal spellings of one key (or a key with no column to hash) make this
            // loop long: a cancel must reach it.
            pgrx::check_for_interrupts!();
            text != key.text && (key.same)(text)
        })
        .map(|(_, h)| h)
        .max();
    exact.max(equal)
}

/// The lowest token a new key of protection `protection` may carry without a look at its own
/// tombstone: the highest of the protection's tombstones (this transaction's pending ones
/// included) and its tombstone floor. A key's mark is its tombstone or else the floor, so a
/// token at least this high passes every key's. `None` if it cannot be read this way (the schema
/// before 0.2.0 has no index for it, or it is not valid): then each key is looked up. The
/// highest tombstone is the protection's last entry in `row_tombstone_high_water`, whatever its
/// row's visibility: never below the highest committed tombstone, so it is authoritative for
/// rows already in the unique index (see `rule`); an entry of an uncommitted, aborted or dead
/// row can only raise it, and then each key is looked up.
pub fn new_key_threshold(protection: i64) -> Option<Option<Token>> {
    flush_tombstones();
    let p = pg_sys::Datum::from(protection);
    let highest =
        crate::pg::index::upper_bound_by_index(&TOMB_HIGH_INDEX, &[(1, pg_sys::F_INT8EQ, p)])?;
    let in_runs = tombstone_runs::highest(protection)?;
    Some(highest.max(in_runs).max(tombstone_floor(protection)))
}

/// Does the key whose columns have `values` (in key order) equal the key printed as `text`, by
/// the key's own equality (`pg/key_identity.rs`)? For keys identified by hash; true when it
/// cannot tell (as `KeyIdentity::equals_text`: a tombstone that may be the key's counts).
pub fn equals_text_typed(
    protection: i64,
    values: &[(Option<pg_sys::Datum>, pg_sys::Oid)],
    text: &str,
) -> bool {
    let Some(identity) = identity_of(protection) else {
        return true;
    };
    if values.iter().any(|(d, _)| d.is_none()) {
        return true;
    }
    let datums: Vec<pg_sys::Datum> = values.iter().filter_map(|(d, _)| *d).collect();
    identity.equals_text(&datums, text)
}

thread_local! {
    /// Key identity per protection, for the SQL functions below; dropped with the floors.
    static IDENTITIES: RefCell<FxHashMap<i64, Option<std::rc::Rc<KeyIdentity>>>> =
        RefCell::new(FxHashMap::default());
}

fn identity_of(protection: i64) -> Option<std::rc::Rc<KeyIdentity>> {
    if let Some(i) = IDENTITIES.with(|m| m.borrow().get(&protection).cloned()) {
        return i;
    }
    let relid = exec_internal(
        "SELECT relid::pg_catalog.oid::pg_catalog.int8 FROM _pg_fencing.protected_table \
         WHERE id OPERATOR(pg_catalog.=) $1 AND resource IS NULL",
        true,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection)],
        true,
        as_token,
    );
    let identity = relid
        .and_then(|r| key_columns_of(pg_sys::Oid::from(r as u32)))
        .map(|cols| std::rc::Rc::new(KeyIdentity::new(&cols)));
    IDENTITIES.with(|m| {
        crate::cache::cache_insert(&mut m.borrow_mut(), protection, identity.clone(), 1_000)
    });
    identity
}

/// `_pg_fencing.tombstone_key_hash(protection_id, key)`: the `key_hash` of a tombstone of
/// protection `protection` whose key prints as `key` (`None`: text identity, an unknown
/// protection, or text that is no key of the table's key types).
pub fn key_hash_of_text(protection: i64, key: &str) -> Option<i64> {
    identity_of(protection)?.hash_of_text(key)
}

/// Are `values` a key of protection `protection`'s table (its key's number of columns, each
/// non-NULL and of its column's type)? False if it cannot tell.
pub fn is_key_of(protection: i64, values: &[(Option<pg_sys::Datum>, pg_sys::Oid)]) -> bool {
    identity_of(protection).is_some_and(|i| i.is_key(values))
}

/// Are the keys of protection `protection` identified by their text (not by hash)? False if
/// it cannot tell (an unknown protection, no primary key).
pub fn keys_identified_by_text(protection: i64) -> bool {
    identity_of(protection).is_some_and(|i| !i.is_hashed())
}

/// `_pg_fencing.tombstone_key_hash_of(protection_id, VARIADIC key)`: the `key_hash` of the key
/// whose columns have these values (`None`: text identity, an unknown protection, or values not
/// of the key's column types). No parsing: for TRUNCATE, which has the rows' values.
pub fn key_hash_of_values(
    protection: i64,
    values: &[(Option<pg_sys::Datum>, pg_sys::Oid)],
) -> Option<i64> {
    // Keys identified by text (the usual case; this runs for every row a DELETE deletes): told
    // by the cached identity, borrowed rather than cloned.
    let by_text = IDENTITIES.with(|m| {
        m.borrow()
            .get(&protection)
            .is_some_and(|i| i.as_ref().is_none_or(|i| !i.is_hashed()))
    });
    if by_text {
        return None;
    }
    identity_of(protection)?.hash_of_typed(values)
}

/// `_pg_fencing.tombstone_key_text(protection_id, key)`: the key printed as `key`, printed as a
/// key of the table's key types prints now (`None`: an unknown protection, or text that is no
/// key of those types).
pub fn key_text_of_text(protection: i64, key: &str) -> Option<String> {
    identity_of(protection)?.reprint(key)
}

/// `_pg_fencing.tombstone_key_signature(relation)`: what the stored hashes of the table's
/// tombstones depend on (`KeyIdentity::signature`); `None` without a primary key. Writes this
/// transaction's pending tombstones first, so that a recomputation that follows sees them.
pub fn key_signature(relid: pg_sys::Oid) -> Option<String> {
    flush_tombstones();
    key_columns_of(relid).map(|cols| KeyIdentity::new(&cols).signature().to_string())
}

/// Per-row mode, DELETE of `key` (already admitted by [`admit_row`], under the row lock): leave a
/// tombstone so that a stale writer cannot re-create the key.
///
/// Tombstones are written in batches, not one statement per row: they are kept in this backend
/// and written by [`flush_tombstones`] before any tombstone is read, before TRUNCATE writes its
/// own, when 10,000 are pending, and before the transaction commits or prepares (the xact
/// callback in `backend.rs`). Only the deleting transaction could see them earlier, and its reads
/// flush first; other transactions see them at its commit, as before: a concurrent insert of the
/// same key waits in the unique index for this transaction's end, then reads the tombstone.
pub fn record_row_delete(protection: i64, key: impl Into<String>, hash: Option<i64>, token: Token) {
    let subxact = crate::pg::process::current_subxact();
    record_row_delete_in(protection, key, hash, token, subxact);
}

/// [`record_row_delete`] of a row deleted in subtransaction `subxact` (this one or one around it:
/// the tombstone is taken back only if that one aborts).
fn record_row_delete_in(
    protection: i64,
    key: impl Into<String>,
    hash: Option<i64>,
    token: Token,
    subxact: pg_sys::SubTransactionId,
) {
    let full = PENDING_TOMBSTONES.with(|p| {
        let mut p = p.borrow_mut();
        p.push(PendingTombstone {
            protection,
            key: key.into(),
            hash,
            token,
            subxact,
        });
        p.len() >= 10_000
    });
    if full {
        flush_tombstones();
    }
}

#[derive(Clone)]
struct PendingTombstone {
    protection: i64,
    key: String,
    /// `row_tombstone.key_hash` (`pg/key_identity.rs`).
    hash: Option<i64>,
    token: Token,
    /// The subtransaction that deleted the row: its abort takes the tombstone back.
    subxact: pg_sys::SubTransactionId,
}

thread_local! {
    static PENDING_TOMBSTONES: RefCell<Vec<PendingTombstone>> = const { RefCell::new(Vec::new()) };
    /// Tombstones written by a flush in a subtransaction younger than the one that deleted the
    /// row (e.g. a read inside an EXCEPTION block), with the subtransaction that wrote them: if
    /// that one aborts, the write is undone but the delete is not, so they are pending again.
    static FLUSHED_LATER: RefCell<Vec<(PendingTombstone, pg_sys::SubTransactionId)>> =
        const { RefCell::new(Vec::new()) };
}

/// A row version a per-row DELETE on the fast path checked (`guard/fast_path.rs`, `drop_row`),
/// whose key leaves its tombstone once the DELETE is known to have deleted it.
pub struct NotedDelete {
    /// The version (None: not known; then it counts as deleted).
    pub version: Option<plan::RowVersion>,
    pub key: String,
    pub hash: Option<i64>,
    pub token: Token,
}

/// The row versions a running per-row DELETE on the fast path checked and did not yet confirm
/// deleted. `drop_row` runs in the plan under the DELETE, before the DELETE deletes the version
/// (which it may then leave alone: changed or deleted concurrently, skipped by a BEFORE DELETE
/// trigger; under READ COMMITTED `drop_row` runs again on a concurrently changed row's latest
/// version). Every version the DELETE deletes was checked, last right before its deletion, so
/// the versions noted since the row count was last read are at least as many as the rows it
/// deleted since: when they are as many, each of them was deleted; else each is looked at
/// (`RowVersion::deleted_by`, with the statement's command id). Noted versions are settled:
/// * at the statement's next `drop_row` call (the DELETE checks a version only once it is done
///   with the previous one), by the row count: one at a time, two after a re-check;
/// * before any tombstone is read or written (`flush_tombstones`), by looking at each: a version
///   deleted already leaves its tombstone at once, so no write inside the statement (a function
///   in its WHERE clause, a trigger) re-creates a key it deleted below its token; one not
///   deleted yet stays noted;
/// * when the statement finished, before its AFTER triggers and unread WITH queries run
///   (`finish_unconfirmed`), by the final row count.
///
/// A DELETE that does not set the row count (a rule's added action) looks at each.
struct Unconfirmed {
    /// The statement's memory context (0 once it ended or its context may be another's).
    statement: usize,
    protection: i64,
    /// The subtransaction the DELETE deletes in: its tombstones are pending for it, whichever
    /// subtransaction settles them (a flush inside an EXCEPTION block of a function in the
    /// DELETE's WHERE clause must not take them back when that block rolls back).
    subxact: pg_sys::SubTransactionId,
    /// The command id the DELETE deletes with.
    command: pg_sys::CommandId,
    count: Option<plan::DeleteCount>,
    /// The statement's row count when the noted versions were last settled by it.
    confirmed: u64,
    noted: Vec<NotedDelete>,
}

thread_local! {
    /// Running per-row DELETEs on the fast path (a few at most: nested statements).
    static UNCONFIRMED: RefCell<Vec<Unconfirmed>> = const { RefCell::new(Vec::new()) };
}

/// A per-row DELETE on the fast path whose memory context is `statement` starts (its row count
/// read through `count`, if it sets one).
pub fn begin_unconfirmed(
    statement: usize,
    protection: i64,
    command: pg_sys::CommandId,
    count: Option<plan::DeleteCount>,
) {
    let subxact = crate::pg::process::current_subxact();
    UNCONFIRMED.with(|u| {
        let mut u = u.borrow_mut();
        // An entry left with this context is an earlier statement's (its context reused): it
        // is settled by looking at its versions.
        for e in u.iter_mut().filter(|e| e.statement == statement) {
            e.statement = 0;
        }
        u.push(Unconfirmed {
            statement,
            protection,
            subxact,
            command,
            count,
            confirmed: 0,
            noted: Vec::new(),
        });
    });
}

/// Versions taken out to be settled, with their DELETE (protection, subtransaction, command)
/// and whether each of them is known deleted.
enum Settle {
    None,
    One(Deleter, bool, NotedDelete),
    Many(Deleter, bool, Vec<NotedDelete>),
}

/// The DELETE that noted versions: its protection, subtransaction and command id.
#[derive(Clone, Copy)]
struct Deleter {
    protection: i64,
    subxact: pg_sys::SubTransactionId,
    command: pg_sys::CommandId,
}

impl Deleter {
    /// Did this DELETE delete `d`'s version (looked at; one not known counts as deleted)?
    fn deleted(self, d: &NotedDelete) -> bool {
        d.version.is_none_or(|v| v.deleted_by(self.command))
    }

    /// Record `d`'s tombstone, for this DELETE's subtransaction.
    fn keep(self, d: NotedDelete) {
        record_row_delete_in(self.protection, d.key, d.hash, d.token, self.subxact);
    }

    /// Record `d`'s tombstone if `known` deleted or if the version was deleted by this DELETE.
    fn record(self, known: bool, d: NotedDelete) {
        if known || self.deleted(&d) {
            self.keep(d);
        }
    }
}

impl Unconfirmed {
    /// The noted versions, now that the statement deleted `rows` rows in all (None: not known).
    fn take(&mut self, rows: Option<u64>) -> Settle {
        let all =
            rows.is_some_and(|r| r.checked_sub(self.confirmed) == Some(self.noted.len() as u64));
        if let Some(r) = rows {
            self.confirmed = r;
        }
        let by = self.deleter();
        // (one version, the usual case: taken without a new allocation)
        match (self.noted.len(), self.noted.pop()) {
            (1, Some(d)) => Settle::One(by, all, d),
            (_, Some(d)) => {
                let mut many = std::mem::take(&mut self.noted);
                many.push(d);
                Settle::Many(by, all, many)
            }
            (_, None) => Settle::None,
        }
    }

    fn deleter(&self) -> Deleter {
        Deleter {
            protection: self.protection,
            subxact: self.subxact,
            command: self.command,
        }
    }
}

impl Settle {
    /// Record the tombstones of the versions deleted (outside the borrow of `UNCONFIRMED`:
    /// recording may write tombstones).
    fn record(self) {
        match self {
            Settle::None => {}
            Settle::One(by, all, d) => {
                by.record(all, d);
            }
            Settle::Many(by, all, noted) => {
                for d in noted {
                    by.record(all, d);
                }
            }
        }
    }
}

/// `drop_row` checked version `d` of the running DELETE whose memory context is one of
/// `contexts`: note it, settling the versions noted before it by the row count (`rows_of` reads
/// it). Returns `d` back if no such DELETE runs (a call by hand: its tombstone is recorded at
/// once).
pub fn note_unconfirmed(
    mut contexts: impl Iterator<Item = usize>,
    rows_of: impl Fn(&plan::DeleteCount) -> Option<u64>,
    d: NotedDelete,
) -> Option<NotedDelete> {
    let settle = UNCONFIRMED.with(|u| {
        let mut u = u.borrow_mut();
        if u.is_empty() {
            return Err(d);
        }
        let Some(cxt) = contexts.find(|c| u.iter().any(|e| e.statement == *c)) else {
            return Err(d);
        };
        let Some(e) = u.iter_mut().rev().find(|e| e.statement == cxt) else {
            return Err(d);
        };
        let settle = if e.noted.is_empty() {
            Settle::None
        } else {
            let rows = e.count.as_ref().and_then(&rows_of);
            e.take(rows)
        };
        e.noted.push(d);
        Ok(settle)
    });
    match settle {
        Err(d) => Some(d),
        Ok(s) => {
            s.record();
            None
        }
    }
}

/// The per-row DELETE whose memory context is `statement` finished, having deleted `rows` rows:
/// its last noted versions are settled.
pub fn finish_unconfirmed(statement: usize, rows: u64) {
    let settle = UNCONFIRMED.with(|u| {
        let mut u = u.borrow_mut();
        let at = u.iter().rposition(|e| e.statement == statement)?;
        let mut e = u.remove(at);
        let rows = e.count.is_some().then_some(rows);
        Some(e.take(rows))
    });
    if let Some(s) = settle {
        s.record();
    }
}

/// Before tombstones are read or written: every noted version deleted by now leaves its
/// tombstone; the others stay noted (their DELETE is still dealing with them). Entries of
/// statements that ended are settled and dropped.
fn settle_unconfirmed() {
    let taken: Vec<(usize, Deleter, Vec<NotedDelete>)> = UNCONFIRMED.with(|u| {
        let mut u = u.borrow_mut();
        if u.iter().all(|e| e.noted.is_empty() && e.statement != 0) {
            return Vec::new();
        }
        let taken = u
            .iter_mut()
            .filter(|e| !e.noted.is_empty())
            .map(|e| (e.statement, e.deleter(), std::mem::take(&mut e.noted)))
            .collect();
        u.retain(|e| e.statement != 0);
        taken
    });
    for (statement, by, noted) in taken {
        let mut left = Vec::new();
        let mut deleted = 0u64;
        for d in noted {
            if by.deleted(&d) {
                by.keep(d);
                deleted += 1;
            } else if statement != 0 {
                left.push(d);
            }
        }
        if statement == 0 {
            continue;
        }
        // Those recorded are no longer counted against the row count: it has grown by them.
        UNCONFIRMED.with(|u| {
            if let Some(e) = u
                .borrow_mut()
                .iter_mut()
                .rev()
                .find(|e| e.statement == statement)
            {
                e.confirmed += deleted;
                left.append(&mut e.noted);
                e.noted = left;
            }
        });
    }
}

/// Subtransaction `sub` aborted: the DELETEs it (or one inside it) started failed with it.
fn forget_unconfirmed_of(sub: pg_sys::SubTransactionId) {
    UNCONFIRMED.with(|u| u.borrow_mut().retain(|e| e.subxact < sub));
}

/// ExecutorEnd of the statement whose memory context is `statement`: if it is still noted (it
/// ended without ExecutorFinish), its versions are settled by looking at them, at the next
/// flush at the latest.
pub fn end_unconfirmed(statement: usize) {
    UNCONFIRMED.with(|u| {
        for e in u
            .borrow_mut()
            .iter_mut()
            .filter(|e| e.statement == statement)
        {
            e.statement = 0;
        }
    });
}

/// Write the pending tombstones (one statement; the highest token per key).
pub fn flush_tombstones() {
    settle_unconfirmed();
    let pending = PENDING_TOMBSTONES.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if pending.is_empty() {
        return;
    }
    // DROP EXTENSION in the same transaction: its tables, and what they would keep, are gone.
    if !crate::pg::process::extension_schema_exists() {
        return;
    }
    let writer = crate::pg::process::current_subxact();
    // The deletes were allowed, so their tombstones must be written even if the transaction was
    // switched to read-only since (SET transaction_read_only = on after the DELETE).
    let lifted = crate::pg::process::ReadOnlyLifted::new();
    let published = feed_published();
    // Many keys identified by text of one protection and one token: one run
    // (`state/tombstone_runs.rs`), unless the feed is published (it carries rows, key by key).
    let rest: Vec<&PendingTombstone> =
        if !published && pending.len() >= tombstone_runs::RUN_MIN_KEYS {
            store_runs(&pending)
        } else {
            pending.iter().collect()
        };
    // Tombstones of a protection removed since (`fencing_unprotect` earlier in the transaction)
    // are not kept.
    let mut rows: Vec<(i64, &str, Token, Option<i64>)> = Vec::with_capacity(rest.len());
    if let [t] = &rest[..] {
        // One deleted row (the usual transaction of a job queue): nothing to merge.
        if protection_exists(t.protection) {
            rows.push((t.protection, t.key.as_str(), t.token, t.hash));
        }
    } else if !rest.is_empty() {
        let mut highest: FxHashMap<(i64, &str), (Token, Option<i64>)> =
            FxHashMap::with_capacity_and_hasher(rest.len(), Default::default());
        for t in &rest {
            let e = highest
                .entry((t.protection, t.key.as_str()))
                .or_insert((t.token, t.hash));
            if e.0 < t.token {
                e.0 = t.token;
            }
        }
        let mut exists: FxHashMap<i64, bool> = FxHashMap::default();
        for ((p, k), (t, h)) in highest {
            if *exists.entry(p).or_insert_with(|| protection_exists(p)) {
                rows.push((p, k, t, h));
            }
        }
    }
    match rows[..] {
        [] => {}
        [(p, k, t, h)] if !published => store_one(p, k, t, h),
        _ => store_batch(&rows, published),
    }
    drop(lifted);
    // Written in the deleting subtransaction itself (the usual case): they stand or fall with
    // it. Written in a younger one: remember them until the transaction ends.
    let mut pending = pending;
    let later: Vec<(PendingTombstone, pg_sys::SubTransactionId)> = pending
        .drain(..)
        .filter(|t| t.subxact < writer)
        .map(|t| (t, writer))
        .collect();
    if !later.is_empty() {
        FLUSHED_LATER.with(|f| f.borrow_mut().extend(later));
    }
    // The allocation serves the transaction's next tombstones (a bulk DELETE flushes every
    // 10,000: growing a new one each time cost about 400 instructions a key); dropped when the
    // transaction ends (`forget_tombstones`).
    PENDING_TOMBSTONES.with(|p| {
        let mut p = p.borrow_mut();
        if p.is_empty() && p.capacity() < pending.capacity() {
            *p = pending;
        }
    });
}

/// The table of protection `protection` (`None`: no such protection, or its table is gone).
pub fn protected_relation(protection: i64) -> Option<pg_sys::Oid> {
    exec_internal(
        "SELECT p.relid::pg_catalog.oid::pg_catalog.int8 FROM _pg_fencing.protected_table p \
         JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.relid::pg_catalog.oid \
         WHERE p.id OPERATOR(pg_catalog.=) $1",
        true,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection)],
        true,
        as_token,
    )
    .map(|r| pg_sys::Oid::from(r as u32))
}

/// `_pg_fencing.expand_tombstone_runs(protection)`: this transaction's pending tombstones
/// written, then the protection's runs turned into rows (`tombstone_runs::expand`).
pub fn expand_runs(protection: i64) -> i64 {
    flush_tombstones();
    tombstone_runs::expand(protection)
}

/// Write the pending tombstones of each (protection, token) with at least `RUN_MIN_KEYS` keys
/// identified by text as a run (a protection removed since keeps none); returns the others, to
/// be written one by one.
fn store_runs(pending: &[PendingTombstone]) -> Vec<&PendingTombstone> {
    let mut groups: FxHashMap<(i64, Token), Vec<&str>> = FxHashMap::default();
    for t in pending {
        if t.hash.is_none() {
            groups
                .entry((t.protection, t.token))
                .or_default()
                .push(t.key.as_str());
        }
    }
    let mut stored: rustc_hash::FxHashSet<(i64, Token)> = Default::default();
    for ((p, t), keys) in groups {
        if keys.len() < tombstone_runs::RUN_MIN_KEYS {
            continue;
        }
        if !protection_exists(p) || tombstone_runs::store(p, t, &keys, tombstone_floor(p)) {
            stored.insert((p, t));
        }
    }
    pending
        .iter()
        .filter(|t| t.hash.is_some() || !stored.contains(&(t.protection, t.token)))
        .collect()
}

/// Write one tombstone, as `store_batch` writes many. A key without a tombstone yet (the usual
/// case: a row deleted once) gets its row written straight into the table and its indexes
/// (`insert_direct`: no statement to plan, start and end, which cost a one-row DELETE's
/// transaction more than the DELETE); a key that has one (or a row being written by another
/// transaction), or a table that cannot be written this way, gets `SQL_STORE_TOMB`.
fn store_one(protection: i64, key: &str, token: Token, hash: Option<i64>) {
    let k = text_datum(key);
    let p = pg_sys::Datum::from(protection);
    let t = pg_sys::Datum::from(token);
    // With wal_level = logical, a key that has a tombstone is found by a read first: logical
    // decoding would send a subscriber of row_tombstone (a publication of all tables) the
    // direct write's insert and delete of the conflicting row.
    let probe_first = || {
        crate::pg::process::logical_wal()
            && read_by_index(
                &TOMB_INDEX,
                &[(1, pg_sys::F_INT8EQ, p), (2, pg_sys::F_TEXTEQ, k)],
            ) != Some(None)
    };
    let direct = token > 0
        && crate::pg::index::exists(&TOMB_HIGH_INDEX)
        && has_key_hash()
        && crate::pg::index::insert_direct(
            &TOMB_INDEX,
            &[
                (c"protection_id", Some(p)),
                (c"key", Some(k)),
                (c"high_water", Some(t)),
                (c"key_hash", hash.map(pg_sys::Datum::from)),
            ],
            c"row_tombstone_high_water_check",
            &probe_first,
        );
    if direct {
        return;
    }
    let store_hashed = |h: i64| {
        exec_internal(
            SQL_STORE_TOMB,
            true,
            &[
                pg_sys::INT8OID,
                pg_sys::TEXTOID,
                pg_sys::INT8OID,
                pg_sys::INT8OID,
            ],
            &mut [p, k, t, pg_sys::Datum::from(h)],
            false,
            as_token,
        )
    };
    match hash {
        Some(h) if has_key_hash() => {
            store_hashed(h);
        }
        _ => {
            exec_internal(
                SQL_STORE_TOMB_0_1,
                true,
                &[pg_sys::INT8OID, pg_sys::TEXTOID, pg_sys::INT8OID],
                &mut [p, k, t],
                false,
                as_token,
            );
            // As in `store_batch`: the schema may have been updated meanwhile.
            if let Some(h) = hash.filter(|_| has_key_hash()) {
                store_hashed(h);
            }
        }
    }
}

/// Write the tombstones `rows` (protection, key, mark, hash) in one statement, and where the
/// feed is `published`, put them in it by table name (`SQL_FEED_TOMBS`).
fn store_batch(rows: &[(i64, &str, Token, Option<i64>)], published: bool) {
    let protections: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let keys: Vec<String> = rows.iter().map(|r| r.1.to_string()).collect();
    let tokens: Vec<i64> = rows.iter().map(|r| r.2).collect();
    let hashes: Vec<Option<i64>> = rows.iter().map(|r| r.3).collect();
    let hashed = hashes.iter().any(|h| h.is_some());
    let (Some(p), Some(k), Some(t), Some(h)) = (
        protections.into_datum(),
        keys.into_datum(),
        tokens.into_datum(),
        hashes.into_datum(),
    ) else {
        crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(
            "could not build the tombstone batch".to_string(),
        ));
    };
    // A batch of keys identified by text alone (no hashes) needs no key_hash: NULL by default.
    const THREE: [pg_sys::Oid; 3] = [
        pg_sys::INT8ARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::INT8ARRAYOID,
    ];
    const FOUR: [pg_sys::Oid; 4] = [
        pg_sys::INT8ARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::INT8ARRAYOID,
        pg_sys::INT8ARRAYOID,
    ];
    let store_hashed = || {
        exec_internal(
            SQL_STORE_TOMBS,
            true,
            &FOUR,
            &mut [p, k, t, h],
            false,
            as_token,
        )
    };
    if has_key_hash() && hashed {
        store_hashed();
    } else {
        exec_internal(
            SQL_STORE_TOMBS_0_1,
            true,
            &THREE,
            &mut [p, k, t],
            false,
            as_token,
        );
        // The schema may have been updated (ALTER EXTENSION pg_fencing UPDATE) while this
        // statement waited for its lock: then write the hashes too.
        if hashed && has_key_hash() {
            store_hashed();
        }
    }
    if published {
        exec_internal(
            SQL_FEED_TOMBS,
            true,
            &THREE,
            &mut [p, k, t],
            false,
            as_token,
        );
    }
}

/// Subtransaction abort: its rows were not deleted after all, and tombstones it wrote for older
/// subtransactions' deletes are gone, so those are pending again. (Subtransaction ids grow, and
/// every subtransaction younger than `subxact` that exists when it aborts is inside it.)
fn forget_tombstones_of(subxact: pg_sys::SubTransactionId) {
    let requeue: Vec<PendingTombstone> = FLUSHED_LATER.with(|f| {
        let mut f = f.borrow_mut();
        let mut back = Vec::new();
        f.retain(|(t, writer)| {
            if *writer < subxact {
                return true;
            }
            if t.subxact < subxact {
                back.push(t.clone());
            }
            false
        });
        back
    });
    PENDING_TOMBSTONES.with(|p| {
        let mut p = p.borrow_mut();
        p.retain(|t| t.subxact < subxact);
        p.extend(requeue);
    });
}

/// Transaction end (commit after the pre-commit flush, or abort).
fn forget_tombstones() {
    PENDING_TOMBSTONES.with(|p| *p.borrow_mut() = Vec::new());
    UNCONFIRMED.with(|u| u.borrow_mut().clear());
    FLUSHED_LATER.with(|f| f.borrow_mut().clear());
}

/// Per-row mode TRUNCATE of relation `relid`: refuse if any row carries a higher token than
/// `token`, else leave a tombstone for every row. `pk_names` and `token_col` are quoted.
pub fn truncate_rows(
    protection: i64,
    relid: pg_sys::Oid,
    table: &str,
    pk_names: &[String],
    token_col: &str,
    token: Token,
) -> Result<(), FenceError> {
    flush_tombstones();
    let row_key = format!("ROW({})::text", pk_names.join(", "));
    let from = format!("ONLY {table}");
    let check = format!(
        "SELECT {row_key} || ' ' || {token_col} FROM {from} WHERE {token_col} > $1 ORDER BY {token_col} DESC LIMIT 1"
    );
    let newest = exec_internal(
        &check,
        false,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(token)],
        true,
        crate::pg::spi::text_of,
    );
    if let Some(found) = newest {
        let (key, hw) = found.rsplit_once(' ').unwrap_or((&found, "0"));
        let high_water = hw.parse().unwrap_or_default();
        stats::rejected(
            stats::Kind::Table,
            &protection.to_string(),
            token,
            high_water,
        );
        return Err(FenceError::StaleToken {
            domain: Domain::Row {
                table: table.to_string(),
                key: key.to_string(),
            },
            token,
            high_water,
        });
    }
    // Keys identified by their text, the feed not published: pending, as a DELETE's keys are
    // (`record_row_delete`), so that many become runs (`tombstone_runs.rs`), not a row each. Read
    // a range of blocks at a time (a TID range scan), so that no more than one range's keys are
    // held at once besides the pending ones.
    if keys_identified_by_text(protection) && !feed_published() {
        let blocks = exec_internal(
            "SELECT pg_catalog.pg_relation_size($1::pg_catalog.oid::pg_catalog.regclass) \
             OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8",
            false,
            &[pg_sys::INT8OID],
            &mut [pg_sys::Datum::from(i64::from(relid.to_u32()))],
            true,
            as_token,
        )
        .unwrap_or(0);
        let read = format!(
            "SELECT pg_catalog.array_agg({row_key}) FROM {from} \
             WHERE ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', $1)::pg_catalog.tid \
               AND ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', $2)::pg_catalog.tid"
        );
        const BLOCKS_AT_ONCE: i64 = 256;
        let mut start = 0;
        while start < blocks {
            pgrx::check_for_interrupts!();
            let end = start + BLOCKS_AT_ONCE;
            let keys = exec_internal(
                &read,
                false,
                &[pg_sys::INT8OID, pg_sys::INT8OID],
                &mut [pg_sys::Datum::from(start), pg_sys::Datum::from(end)],
                true,
                crate::pg::spi::text_array_of,
            )
            .unwrap_or_default();
            for key in keys {
                record_row_delete(protection, key, None, token);
            }
            start = end;
        }
        return Ok(());
    }
    // Keys identified by hash get it from the rows' values (their text only where those are not
    // of the key's types: `tombstone_key_hash_of` says NULL, as for text identity, where parsing
    // says NULL at once).
    let columns = pk_names.join(", ");
    let store = if has_key_hash() {
        format!(
            "INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, key_hash, high_water) \
             SELECT $1, r.k, COALESCE(r.h, _pg_fencing.tombstone_key_hash($1, r.k)), $2 \
             FROM (SELECT {row_key} AS k, _pg_fencing.tombstone_key_hash_of($1, {columns}) AS h FROM {from}) r \
             ON CONFLICT (protection_id, key) DO UPDATE \
             SET high_water = GREATEST(h.high_water, excluded.high_water), key_hash = excluded.key_hash \
             WHERE h.high_water < excluded.high_water OR h.key_hash IS DISTINCT FROM excluded.key_hash"
        )
    } else {
        format!(
            "INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water) \
             SELECT $1, {row_key}, $2 FROM {from} ON CONFLICT (protection_id, key) DO UPDATE \
             SET high_water = excluded.high_water WHERE h.high_water < excluded.high_water"
        )
    };
    exec_internal(
        &store,
        false,
        &[pg_sys::INT8OID, pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection), pg_sys::Datum::from(token)],
        false,
        as_token,
    );
    if feed_published() {
        // For subscribers, as in `flush_tombstones` (see `SQL_FEED_TOMBS`).
        // Under the protected (root) table's name, as the subscriber's protection knows it.
        let feed = format!(
            "WITH n AS (INSERT INTO _pg_fencing.tombstone_feed (relation, key, high_water) \
             SELECT (SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname) \
                     FROM _pg_fencing.protected_table pt \
                     JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pt.relid::pg_catalog.oid \
                     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
                     WHERE pt.id OPERATOR(pg_catalog.=) $1), \
                    {row_key}, $2 FROM {from} \
             ON CONFLICT DO NOTHING RETURNING relation, key, high_water) \
             DELETE FROM _pg_fencing.tombstone_feed f USING n \
             WHERE f.relation OPERATOR(pg_catalog.=) n.relation AND f.key OPERATOR(pg_catalog.=) n.key \
               AND f.high_water OPERATOR(pg_catalog.<) n.high_water"
        );
        exec_internal(
            &feed,
            false,
            &[pg_sys::INT8OID, pg_sys::INT8OID],
            &mut [pg_sys::Datum::from(protection), pg_sys::Datum::from(token)],
            false,
            as_token,
        );
    }
    Ok(())
}

/// Per-backend state's life (`backend.rs`): a transaction's end drops its pending tombstones
/// (flushed at pre-commit); an abort, a rolled-back savepoint or a changed relation drops the
/// cached floors (and the feed's publication state); a rolled-back savepoint drops its own
/// pending tombstones.
pub fn on_event(ev: BackendEvent) {
    match ev {
        BackendEvent::SubAbort(sub) => {
            forget_unconfirmed_of(sub);
            forget_tombstones_of(sub);
            forget_floors();
        }
        BackendEvent::Relcache(_) => forget_floors(),
        _ => {}
    }
    if ev.ends_transaction() {
        forget_tombstones();
    }
    if ev == BackendEvent::Abort {
        forget_floors();
    }
}
