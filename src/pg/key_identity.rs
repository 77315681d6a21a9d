//! Which tombstone a per-row key meets: the primary key's own equality, not its printed text.
//!
//! Keys the primary key treats as equal may print differently (`numeric` 1.0 and 1.00, `float8`
//! 0 and -0, `interval` '1 day' and '24:00:00', `citext`, text under a nondeterministic
//! collation), so a tombstone matched by text alone would let a stale writer re-create a deleted
//! key under another spelling. docs/design.md, "Tombstone keys":
//!
//! * A key whose columns all print one way per value ([`PRINT_EXACT`]: integers, `uuid`,
//!   `bool`, dates and timestamps under the pinned output settings, `bytea`, text and varchar
//!   under a deterministic collation) is identified by its text: equal text iff equal key.
//! * Any other key also has a 64-bit hash: per column, the type's hash support function (the
//!   one hash joins and hash partitioning use, which PostgreSQL requires to give equal values
//!   equal hashes under the type's default equality, the primary key's), called with the
//!   column's collation, combined as `hash_combine64` does. A tombstone with the same hash but
//!   other text counts only if the key's equality operator says the keys are equal; the stored
//!   text is parsed back with the column types' input functions.
//! * A column type with no hash support or no default equality keeps text identity.

use pgrx::pg_sys;
use std::ffi::{CStr, CString};

/// Type, type modifier and collation of one primary key column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyColumn {
    pub typid: pg_sys::Oid,
    pub typmod: i32,
    pub collation: pg_sys::Oid,
}

/// Types whose output under the pinned settings (`pg/spi.rs`, `PINNED_SETTINGS`) is one text per
/// value of the type's default equality. Text and varchar only under a deterministic collation.
const PRINT_EXACT: [pg_sys::Oid; 12] = [
    pg_sys::INT2OID,
    pg_sys::INT4OID,
    pg_sys::INT8OID,
    pg_sys::OIDOID,
    pg_sys::BOOLOID,
    pg_sys::UUIDOID,
    pg_sys::DATEOID,
    pg_sys::TIMESTAMPOID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::BYTEAOID,
    pg_sys::CHAROID,
    pg_sys::TEXTOID,
];

struct Column {
    spec: KeyColumn,
    /// The hash support function (boxed: the function manager may keep a pointer to it).
    hash: Box<pg_sys::FmgrInfo>,
    /// `hash` takes a seed and returns 64 bits (else: 32 bits, no seed).
    extended: bool,
    /// The default equality operator's function.
    eq: Box<pg_sys::FmgrInfo>,
    input: pg_sys::Oid,
    ioparam: pg_sys::Oid,
}

/// How the keys of one protected table are identified (see the module's header).
pub struct KeyIdentity {
    /// Empty: text identity.
    hashed: Vec<Column>,
    signature: String,
}

fn prints_exactly(c: &KeyColumn) -> bool {
    match c.typid {
        pg_sys::TEXTOID | pg_sys::VARCHAROID => {
            // SAFETY: a catalog lookup by OID on the main thread inside a transaction; ERROR
            // (a collation that vanished) becomes a panic through pgrx's FFI guard.
            c.collation == pg_sys::Oid::INVALID
                || unsafe { pg_sys::get_collation_isdeterministic(c.collation) }
        }
        t => PRINT_EXACT.contains(&t),
    }
}

impl KeyIdentity {
    /// The identity of keys made of `cols`.
    pub fn new(cols: &[KeyColumn]) -> KeyIdentity {
        let endian = if cfg!(target_endian = "little") {
            "le"
        } else {
            "be"
        };
        let text = || KeyIdentity {
            hashed: Vec::new(),
            signature: "text".to_string(),
        };
        if cols.is_empty() || cols.iter().all(prints_exactly) {
            return text();
        }
        let mut hashed = Vec::with_capacity(cols.len());
        let mut signature = format!("hash {endian}");
        for c in cols {
            // SAFETY: main thread inside a transaction. lookup_type_cache returns a pointer to
            // a type cache entry, which lives as long as the backend; only read here. The
            // FmgrInfo boxes are zeroed plain C structs that fmgr_info_cxt fills, with their
            // extra state in TopMemoryContext (this identity is cached for the backend's life
            // or until a relcache invalidation). getTypeInputInfo writes two OIDs.
            unsafe {
                let flags = pg_sys::TYPECACHE_EQ_OPR
                    | pg_sys::TYPECACHE_HASH_PROC
                    | pg_sys::TYPECACHE_HASH_EXTENDED_PROC;
                let tce = pg_sys::lookup_type_cache(c.typid, flags as i32);
                if tce.is_null() || (*tce).eq_opr == pg_sys::Oid::INVALID {
                    return text();
                }
                let (hash_fn, extended) = if (*tce).hash_extended_proc != pg_sys::Oid::INVALID {
                    ((*tce).hash_extended_proc, true)
                } else if (*tce).hash_proc != pg_sys::Oid::INVALID {
                    ((*tce).hash_proc, false)
                } else {
                    return text();
                };
                let eq_fn = pg_sys::get_opcode((*tce).eq_opr);
                if eq_fn == pg_sys::Oid::INVALID {
                    return text();
                }
                let mut hash = Box::new(std::mem::zeroed::<pg_sys::FmgrInfo>());
                let mut eq = Box::new(std::mem::zeroed::<pg_sys::FmgrInfo>());
                pg_sys::fmgr_info_cxt(hash_fn, &mut *hash, pg_sys::TopMemoryContext);
                pg_sys::fmgr_info_cxt(eq_fn, &mut *eq, pg_sys::TopMemoryContext);
                let mut input = pg_sys::Oid::INVALID;
                let mut ioparam = pg_sys::Oid::INVALID;
                pg_sys::getTypeInputInfo(c.typid, &mut input, &mut ioparam);
                signature.push_str(&format!(
                    " {}:{}:{}",
                    c.typid.to_u32(),
                    c.collation.to_u32(),
                    if extended { 64 } else { 32 }
                ));
                hashed.push(Column {
                    spec: *c,
                    hash,
                    extended,
                    eq,
                    input,
                    ioparam,
                });
            }
        }
        KeyIdentity { hashed, signature }
    }

    /// Identified by hash and equality (else by text alone).
    pub fn is_hashed(&self) -> bool {
        !self.hashed.is_empty()
    }

    /// What the stored hashes depend on: the columns' types, collations and hash widths, and
    /// the byte order. Tombstone hashes computed under another signature must be computed again.
    pub fn signature(&self) -> &str {
        &self.signature
    }

    /// The key's hash (`None`: text identity). `values`: the key's columns, in key order, of
    /// the types this identity was made for, none NULL (a primary key has no NULLs).
    pub fn hash(&self, values: &[pg_sys::Datum]) -> Option<i64> {
        if self.hashed.is_empty() || values.len() != self.hashed.len() {
            return None;
        }
        let mut h: u64 = 0;
        for (c, v) in self.hashed.iter().zip(values) {
            // SAFETY: main thread inside a transaction; `v` is a value of the column's type (the
            // caller's duty), which its hash support function takes, with the column's
            // collation (and a zero seed for an extended one). The FmgrInfo was filled by
            // fmgr_info_cxt for that function. A NULL result would raise ERROR in the
            // function manager, not UB.
            let part = unsafe {
                if c.extended {
                    pg_sys::FunctionCall2Coll(
                        &*c.hash as *const _ as *mut _,
                        c.spec.collation,
                        *v,
                        pg_sys::Datum::from(0i64),
                    )
                    .value() as u64
                } else {
                    pg_sys::FunctionCall1Coll(&*c.hash as *const _ as *mut _, c.spec.collation, *v)
                        .value() as u32 as u64
                }
            };
            // hash_combine64 (PostgreSQL's common/hashfn.h).
            h ^= part
                .wrapping_add(0x49a0_f4dd_15e5_a8e3)
                .wrapping_add(h << 54)
                .wrapping_add(h >> 7);
        }
        Some(h as i64)
    }

    /// Are keys `a` and `b` (values as for [`KeyIdentity::hash`]) equal under the columns'
    /// equality? Only for an identity by hash (text identity: compare the texts).
    pub fn equal(&self, a: &[pg_sys::Datum], b: &[pg_sys::Datum]) -> bool {
        !self.hashed.is_empty()
            && a.len() == self.hashed.len()
            && b.len() == self.hashed.len()
            && self.hashed.iter().zip(a).zip(b).all(|((c, x), y)| {
                // SAFETY: as in `equals_text`: two values of the column's type.
                unsafe {
                    pg_sys::FunctionCall2Coll(
                        &*c.eq as *const _ as *mut _,
                        c.spec.collation,
                        *x,
                        *y,
                    )
                    .value()
                        != 0
                }
            })
    }

    /// Is the key printed as `text` (as `trigger_event::key_text_of` prints keys) equal to the
    /// key `values` under the columns' equality? False for text that does not parse as a key of
    /// these types (parsing may raise ERROR for text a key of these types never prints; the
    /// tombstones compared here were hashed from a key of these types, so their text parses).
    pub fn equals_text(&self, values: &[pg_sys::Datum], text: &str) -> bool {
        let Some(parsed) = crate::pg::spi::with_pinned_settings(|| self.parse(text, false)) else {
            return false;
        };
        self.hashed
            .iter()
            .zip(values)
            .zip(&parsed)
            .all(|((c, a), b)| {
                // SAFETY: `a` and `b` are values of the column's type (`b` made by its input
                // function); the equality operator's function takes two of them and the column's
                // collation, and returns a bool datum.
                unsafe {
                    pg_sys::FunctionCall2Coll(
                        &*c.eq as *const _ as *mut _,
                        c.spec.collation,
                        *a,
                        *b,
                    )
                    .value()
                        != 0
                }
            })
    }

    /// The hash of the key printed as `text` (`None`: text identity, or text that is not a key
    /// of these types: it can equal no key, and keeps text identity). Input errors are caught.
    pub fn hash_of_text(&self, text: &str) -> Option<i64> {
        if self.hashed.is_empty() {
            return None;
        }
        let values = crate::pg::spi::with_pinned_settings(|| self.parse(text, true))?;
        self.hash(&values)
    }

    /// The key's values from its text; `soft`: an input function's ERROR gives `None` (run in a
    /// subtransaction), else it is raised.
    fn parse(&self, text: &str, soft: bool) -> Option<Vec<pg_sys::Datum>> {
        let fields = split_key_text(text)?;
        if fields.len() != self.hashed.len() {
            return None;
        }
        let mut out = Vec::with_capacity(fields.len());
        for (c, f) in self.hashed.iter().zip(fields) {
            let f = CString::new(f?).ok()?;
            let v = if soft {
                input_soft(c, &f)?
            } else {
                input(c, &f)
            };
            out.push(v);
        }
        Some(out)
    }
}

fn input(c: &Column, text: &CStr) -> pg_sys::Datum {
    // SAFETY: main thread inside a transaction; the type's input function (found by
    // getTypeInputInfo) with its I/O parameter and the column's type modifier, on a
    // NUL-terminated string that outlives the call. The result is palloc'd in the current
    // memory context. An ERROR becomes a panic through pgrx's FFI guard.
    unsafe {
        pg_sys::OidInputFunctionCall(c.input, text.as_ptr().cast_mut(), c.ioparam, c.spec.typmod)
    }
}

/// [`input`] in a subtransaction: `None` if the input function raises ERROR (as PL/pgSQL's
/// EXCEPTION blocks do it: the caller's memory context and resource owner are restored).
fn input_soft(c: &Column, text: &CStr) -> Option<pg_sys::Datum> {
    // SAFETY: main thread inside a transaction. The subtransaction is begun and then either
    // released (success) or rolled back (ERROR caught by PgTryBuilder, which has already
    // copied and flushed the error state), and each path restores the memory context and
    // resource owner saved before it began, as PL/pgSQL's exception blocks do. The value is
    // made in the caller's memory context, which outlives the subtransaction.
    unsafe {
        let cxt = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(cxt);
        pgrx::PgTryBuilder::new(|| {
            let v = input(c, text);
            pg_sys::ReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::CurrentResourceOwner = owner;
            Some(v)
        })
        .catch_others(|_| {
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::CurrentResourceOwner = owner;
            None
        })
        .execute()
    }
}

/// The fields of a key printed as `(v1,v2,...)` with `record_out`'s quoting (what
/// `trigger_event::key_text_of` prints): `None` for a field printed as nothing (NULL), `Err`-like
/// outer `None` for text of another shape.
fn split_key_text(text: &str) -> Option<Vec<Option<String>>> {
    let inner = text.strip_prefix('(')?.strip_suffix(')')?;
    let mut fields = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        let mut value = String::new();
        let mut quoted_any = false;
        while let Some(&ch) = chars.peek() {
            match ch {
                ',' => break,
                '"' => {
                    quoted_any = true;
                    chars.next();
                    loop {
                        match chars.next()? {
                            '"' if chars.peek() == Some(&'"') => {
                                chars.next();
                                value.push('"');
                            }
                            '"' => break,
                            '\\' => value.push(chars.next()?),
                            other => value.push(other),
                        }
                    }
                }
                '\\' => {
                    chars.next();
                    value.push(chars.next()?);
                }
                other => {
                    chars.next();
                    value.push(other);
                }
            }
        }
        fields.push((quoted_any || !value.is_empty()).then_some(value));
        if chars.next().is_none() {
            break;
        }
    }
    Some(fields)
}

/// The primary key columns of relation `relid` (`None`: no such relation, or no primary key).
pub fn key_columns_of(relid: pg_sys::Oid) -> Option<Vec<KeyColumn>> {
    // SAFETY: main thread inside a transaction. try_relation_open returns NULL for a relation
    // that does not exist (checked); the relation is open with AccessShareLock (kept to the end
    // of the transaction) while its descriptor and primary key index are read; the index's
    // pg_index row (`indkey` has `indnkeyatts` entries) and the attributes are copied before the
    // relations are closed. Attribute indexes are bounds-checked.
    unsafe {
        let rel = pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        if rel.is_null() {
            return None;
        }
        let pk = pg_sys::RelationGetPrimaryKeyIndex(rel);
        let mut out = None;
        if pk != pg_sys::Oid::INVALID {
            let idx = pg_sys::index_open(pk, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            let form = &*(*idx).rd_index;
            let attnums = form
                .indkey
                .values
                .as_slice(form.indnkeyatts as usize)
                .to_vec();
            pg_sys::index_close(idx, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            let tupdesc = (*rel).rd_att;
            let attrs = (*tupdesc).attrs.as_slice((*tupdesc).natts as usize);
            out = attnums
                .iter()
                .map(|a| {
                    let a = attrs.get((*a as usize).checked_sub(1)?)?;
                    Some(KeyColumn {
                        typid: a.atttypid,
                        typmod: a.atttypmod,
                        collation: a.attcollation,
                    })
                })
                .collect::<Option<Vec<_>>>();
        }
        pg_sys::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        out
    }
}

#[cfg(test)]
mod unit {
    use super::split_key_text;

    fn s(v: &[Option<&str>]) -> Option<Vec<Option<String>>> {
        Some(v.iter().map(|x| x.map(str::to_string)).collect())
    }

    #[test]
    fn splits_what_record_out_prints() {
        assert_eq!(split_key_text("(1.0)"), s(&[Some("1.0")]));
        assert_eq!(split_key_text("(1,abc)"), s(&[Some("1"), Some("abc")]));
        assert_eq!(split_key_text("(\"\")"), s(&[Some("")]));
        assert_eq!(
            split_key_text("(\"a,b\",\"x\"\"y\")"),
            s(&[Some("a,b"), Some("x\"y")])
        );
        assert_eq!(split_key_text("(\"a\\\\b\")"), s(&[Some("a\\b")]));
        assert_eq!(
            split_key_text("(\"2026-01-01 00:00:00+00\")"),
            s(&[Some("2026-01-01 00:00:00+00")])
        );
        assert_eq!(split_key_text("(,1)"), s(&[None, Some("1")]));
        assert_eq!(split_key_text("1"), None);
        assert_eq!(split_key_text("(\"open)"), None);
    }
}
