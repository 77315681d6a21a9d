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
//! * Any other key also has a 64-bit hash over its columns that have hash support consistent
//!   with the primary key's ordering: the type's hash support function (the one hash joins and
//!   hash partitioning use), called with the column's collation, combined as `hash_combine64`
//!   does; for `citext`, whose own hash ignores the column's collation, the text hash of its
//!   lower-cased value under that collation (what `citext_cmp` compares); under a
//!   nondeterministic collation only `text`, `varchar` and `bpchar` hash by it, other columns
//!   are left out of the hash. A tombstone with the same hash but other text counts if the
//!   primary key's comparison function (the B-tree support function of its default operator
//!   class, with the column's collation: what the unique index uses) finds every column equal;
//!   the stored text is parsed back with the column types' input functions. Columns whose text
//!   may name another value later (enums, whose labels can be renamed; `reg*` types, whose
//!   objects can be) are taken as equal when the hash matched, and so is stored text that no
//!   longer parses: on the safe side, a refusal.
//! * A key with no column that has such hash support still gets a hash, the same (0) for every
//!   key: each of its tombstones is compared with the new key.

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
const PRINT_EXACT: [pg_sys::Oid; 14] = [
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
    pg_sys::BITOID,
    pg_sys::VARBITOID,
    pg_sys::TEXTOID,
];

/// How a column goes into the key's hash.
enum Hasher {
    /// The type's extended (64-bit, seeded) hash support function.
    Extended(Box<pg_sys::FmgrInfo>),
    /// The type's 32-bit hash support function.
    Standard(Box<pg_sys::FmgrInfo>),
    /// `citext`: `hashtextextended(lower(value))`, lower-cased under the database's default
    /// collation and hashed under the column's, as `citext_cmp` lower-cases and compares.
    Citext {
        lower: Box<pg_sys::FmgrInfo>,
        hash: Box<pg_sys::FmgrInfo>,
    },
}

struct Column {
    spec: KeyColumn,
    /// `None`: left out of the hash (no hash support consistent with the key's ordering).
    hash: Option<Hasher>,
    /// The B-tree comparison support function (boxed: the function manager may keep a pointer
    /// to it); equal iff it returns 0.
    cmp: Box<pg_sys::FmgrInfo>,
    /// The column's text may name another value later (enum labels, `reg*` names): a matching
    /// hash counts as equal, whatever the stored text parses to now.
    trust_hash: bool,
    input: pg_sys::Oid,
    ioparam: pg_sys::Oid,
}

/// How the keys of one protected table are identified (see the module's header).
pub struct KeyIdentity {
    cols: Vec<Column>,
    /// Identified by hash (else by text).
    hashed: bool,
    signature: String,
}

/// Types whose values print as the names of objects that can be renamed.
const REG_TYPES: [pg_sys::Oid; 11] = [
    pg_sys::REGCLASSOID,
    pg_sys::REGTYPEOID,
    pg_sys::REGPROCOID,
    pg_sys::REGPROCEDUREOID,
    pg_sys::REGOPEROID,
    pg_sys::REGOPERATOROID,
    pg_sys::REGNAMESPACEOID,
    pg_sys::REGROLEOID,
    pg_sys::REGCONFIGOID,
    pg_sys::REGDICTIONARYOID,
    pg_sys::REGCOLLATIONOID,
];

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

/// Does the hash support of type `typid` agree with its B-tree comparison under `collation`,
/// everywhere inside the type (array elements, composite fields, range subtypes)? Not where a
/// nondeterministic collation meets a type other than `text`, `varchar` and `bpchar`, whose hash
/// functions hash by the collation: `citext`'s hash, say, ignores it while its comparison uses
/// it. (A `citext` column itself gets its own hasher, see `Hasher::Citext`.)
fn hash_agrees(typid: pg_sys::Oid, collation: pg_sys::Oid, depth: u32) -> bool {
    if depth > 16 {
        return false;
    }
    // SAFETY: catalog and type cache lookups by OID on the main thread inside a transaction;
    // lookup_rowtype_tupdesc_noerror returns NULL (checked) or a reference-counted descriptor,
    // released with DecrTupleDescRefCount after its attributes are read.
    unsafe {
        let base = pg_sys::getBaseType(typid);
        let element = pg_sys::get_element_type(base);
        if element != pg_sys::Oid::INVALID {
            return hash_agrees(element, collation, depth + 1);
        }
        match pg_sys::get_typtype(base) as u8 {
            b'c' => {
                let td = pg_sys::lookup_rowtype_tupdesc_noerror(base, -1, true);
                if td.is_null() {
                    return false;
                }
                let natts = (*td).natts.max(0) as usize;
                let ok = (0..natts).all(|i| {
                    let a = crate::pg::compat::tuple_desc_attr(td, i);
                    a.attisdropped || hash_agrees(a.atttypid, a.attcollation, depth + 1)
                });
                pg_sys::DecrTupleDescRefCount(td);
                ok
            }
            b'r' => hash_agrees(
                pg_sys::get_range_subtype(base),
                pg_sys::get_range_collation(base),
                depth + 1,
            ),
            b'm' => hash_agrees(pg_sys::get_multirange_range(base), collation, depth + 1),
            _ => {
                collation == pg_sys::Oid::INVALID
                    || pg_sys::get_collation_isdeterministic(collation)
                    || [pg_sys::TEXTOID, pg_sys::VARCHAROID, pg_sys::BPCHAROID].contains(&base)
            }
        }
    }
}

/// The column of `c`, or `None` if its type has no default B-tree comparison (it cannot be in
/// a primary key then).
fn column(c: &KeyColumn) -> Option<Column> {
    // SAFETY: main thread inside a transaction. lookup_type_cache returns a pointer to a type
    // cache entry, which lives as long as the backend; only read here. The FmgrInfo boxes are
    // zeroed plain C structs that fmgr_info_cxt fills, with their extra state in
    // TopMemoryContext (an identity is cached for the backend's life or until a relcache
    // invalidation). get_func_name returns a palloc'd NUL-terminated name or NULL (checked);
    // getTypeInputInfo writes two OIDs; the other lookups take OIDs by value.
    unsafe {
        let flags = pg_sys::TYPECACHE_CMP_PROC
            | pg_sys::TYPECACHE_HASH_PROC
            | pg_sys::TYPECACHE_HASH_EXTENDED_PROC;
        let tce = pg_sys::lookup_type_cache(c.typid, flags as i32);
        if tce.is_null() || (*tce).cmp_proc == pg_sys::Oid::INVALID {
            return None;
        }
        let mut cmp = Box::new(std::mem::zeroed::<pg_sys::FmgrInfo>());
        pg_sys::fmgr_info_cxt((*tce).cmp_proc, &mut *cmp, pg_sys::TopMemoryContext);
        let cmp_name = {
            let n = pg_sys::get_func_name((*tce).cmp_proc);
            if n.is_null() {
                String::new()
            } else {
                CStr::from_ptr(n).to_string_lossy().into_owned()
            }
        };
        let base = pg_sys::getBaseType(c.typid);
        let function = |proc_: pg_sys::Oid| {
            let mut f = Box::new(std::mem::zeroed::<pg_sys::FmgrInfo>());
            pg_sys::fmgr_info_cxt(proc_, &mut *f, pg_sys::TopMemoryContext);
            f
        };
        let hash = if cmp_name == "citext_cmp" {
            Some(Hasher::Citext {
                lower: function(pg_sys::Oid::from(pg_sys::F_LOWER_TEXT)),
                hash: function(pg_sys::Oid::from(pg_sys::F_HASHTEXTEXTENDED)),
            })
        } else if !hash_agrees(c.typid, c.collation, 0) {
            None
        } else if (*tce).hash_extended_proc != pg_sys::Oid::INVALID {
            Some(Hasher::Extended(function((*tce).hash_extended_proc)))
        } else if (*tce).hash_proc != pg_sys::Oid::INVALID {
            Some(Hasher::Standard(function((*tce).hash_proc)))
        } else {
            None
        };
        let element = pg_sys::get_element_type(base);
        let names_objects = |t: pg_sys::Oid| {
            t != pg_sys::Oid::INVALID && {
                let b = pg_sys::getBaseType(t);
                REG_TYPES.contains(&b) || pg_sys::type_is_enum(b)
            }
        };
        let trust_hash = names_objects(base) || names_objects(element);
        let mut input = pg_sys::Oid::INVALID;
        let mut ioparam = pg_sys::Oid::INVALID;
        pg_sys::getTypeInputInfo(c.typid, &mut input, &mut ioparam);
        Some(Column {
            spec: *c,
            hash,
            cmp,
            trust_hash,
            input,
            ioparam,
        })
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
        let built: Option<Vec<Column>> = cols.iter().map(column).collect();
        let Some(built) = built.filter(|b| !b.is_empty()) else {
            return KeyIdentity {
                cols: Vec::new(),
                hashed: false,
                signature: "text".to_string(),
            };
        };
        // A key with no column to hash still needs its equality: all its tombstones share one
        // hash (0) and each is compared.
        let hashed = !cols.iter().all(prints_exactly);
        let signature = if hashed {
            let mut s = format!("hash {endian}");
            for c in &built {
                let how = match &c.hash {
                    None => "-",
                    Some(Hasher::Extended(_)) => "64",
                    Some(Hasher::Standard(_)) => "32",
                    Some(Hasher::Citext { .. }) => "citext",
                };
                s.push_str(&format!(
                    " {}:{}:{how}",
                    c.spec.typid.to_u32(),
                    c.spec.collation.to_u32()
                ));
            }
            s
        } else {
            let types: Vec<String> = built
                .iter()
                .map(|c| c.spec.typid.to_u32().to_string())
                .collect();
            format!("text {}", types.join(":"))
        };
        KeyIdentity {
            cols: built,
            hashed,
            signature,
        }
    }

    /// Identified by hash and equality (else by text alone).
    pub fn is_hashed(&self) -> bool {
        self.hashed
    }

    /// Are `values` a key of these columns: as many, each non-NULL and of its column's type?
    pub fn is_key(&self, values: &[(Option<pg_sys::Datum>, pg_sys::Oid)]) -> bool {
        values.len() == self.cols.len()
            && values
                .iter()
                .zip(&self.cols)
                .all(|((v, typid), c)| v.is_some() && *typid == c.spec.typid)
    }

    /// What the stored tombstones depend on: text identity and the key's types, or hash
    /// identity with the columns' types, collations and hash functions, and the byte order.
    /// Tombstones written under another signature must be brought up to date
    /// (`_pg_fencing.rehash_tombstones`).
    pub fn signature(&self) -> &str {
        &self.signature
    }

    /// The key's hash (`None`: text identity). `values`: the key's columns, in key order, of
    /// the types this identity was made for, none NULL (a primary key has no NULLs).
    pub fn hash(&self, values: &[pg_sys::Datum]) -> Option<i64> {
        if !self.hashed || values.len() != self.cols.len() {
            return None;
        }
        let mut h: u64 = 0;
        for (c, v) in self.cols.iter().zip(values) {
            let Some(hasher) = &c.hash else {
                continue;
            };
            // SAFETY: main thread inside a transaction; `v` is a value of the column's type (the
            // caller's duty), which its hash support function takes, with the column's
            // collation (and a zero seed for an extended one); for citext, a text-compatible
            // value, lower-cased by lower(text) and hashed by hashtextextended, both builtins
            // called with the column's collation. The FmgrInfos were filled by fmgr_info_cxt. A
            // NULL result would raise ERROR in the function manager, not UB.
            let part = unsafe {
                let coll = c.spec.collation;
                match hasher {
                    Hasher::Extended(f) => pg_sys::FunctionCall2Coll(
                        &**f as *const _ as *mut _,
                        coll,
                        *v,
                        pg_sys::Datum::from(0i64),
                    )
                    .value() as u64,
                    Hasher::Standard(f) => {
                        pg_sys::FunctionCall1Coll(&**f as *const _ as *mut _, coll, *v).value()
                            as u32 as u64
                    }
                    Hasher::Citext { lower, hash } => {
                        let lowered = pg_sys::FunctionCall1Coll(
                            &**lower as *const _ as *mut _,
                            pg_sys::DEFAULT_COLLATION_OID,
                            *v,
                        );
                        pg_sys::FunctionCall2Coll(
                            &**hash as *const _ as *mut _,
                            coll,
                            lowered,
                            pg_sys::Datum::from(0i64),
                        )
                        .value() as u64
                    }
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

    /// Are columns `a` and `b` equal under the key's B-tree comparison?
    fn column_equal(c: &Column, a: pg_sys::Datum, b: pg_sys::Datum) -> bool {
        // SAFETY: `a` and `b` are values of the column's type; its B-tree comparison function
        // takes two of them and the column's collation, and returns an int4 datum.
        unsafe {
            pg_sys::FunctionCall2Coll(&*c.cmp as *const _ as *mut _, c.spec.collation, a, b).value()
                as i32
                == 0
        }
    }

    /// Are keys `a` and `b` (values as for [`KeyIdentity::hash`]) equal under the primary key's
    /// comparison? Only for an identity by hash (text identity: compare the texts).
    pub fn equal(&self, a: &[pg_sys::Datum], b: &[pg_sys::Datum]) -> bool {
        self.hashed
            && a.len() == self.cols.len()
            && b.len() == self.cols.len()
            && self
                .cols
                .iter()
                .zip(a)
                .zip(b)
                .all(|((c, x), y)| Self::column_equal(c, *x, *y))
    }

    /// Is the tombstone printed as `text`, whose hash equals that of key `values`, a tombstone of
    /// that key? Yes if the text parses to a key equal to it under the primary key's
    /// comparison, its columns that may name another value now (`trust_hash`) aside; and yes
    /// if the text no longer parses (a domain's new constraint, a renamed object): the hash
    /// matched and nothing else can tell, so the safe answer.
    pub fn equals_text(&self, values: &[pg_sys::Datum], text: &str) -> bool {
        let Some(parsed) = crate::pg::spi::with_pinned_settings(|| self.parse(text)) else {
            return true;
        };
        self.cols
            .iter()
            .zip(values)
            .zip(&parsed)
            .all(|((c, a), b)| c.trust_hash || Self::column_equal(c, *a, *b))
    }

    /// The key's hash from values with their types (`None`: text identity, a NULL, or values
    /// that are not of the key's column types, which the caller then identifies otherwise).
    pub fn hash_of_typed(&self, values: &[(Option<pg_sys::Datum>, pg_sys::Oid)]) -> Option<i64> {
        if !self.hashed || values.len() != self.cols.len() {
            return None;
        }
        let mut datums = Vec::with_capacity(values.len());
        for ((value, typid), c) in values.iter().zip(&self.cols) {
            if *typid != c.spec.typid {
                return None;
            }
            datums.push((*value)?);
        }
        self.hash(&datums)
    }

    /// The hash of the key printed as `text` (`None`: text identity, or text that is not a key
    /// of these types: it can equal no key, and keeps text identity).
    pub fn hash_of_text(&self, text: &str) -> Option<i64> {
        if !self.hashed {
            return None;
        }
        let values = crate::pg::spi::with_pinned_settings(|| self.parse(text))?;
        self.hash(&values)
    }

    /// The key printed as `text`, printed again as a key of these types prints
    /// (`trigger_event::key_text_of`): after a change of the key's types its text may differ
    /// (`numeric` 5.0 is `int` 5). `None`: text that is not a key of these types.
    pub fn reprint(&self, text: &str) -> Option<String> {
        crate::pg::spi::with_pinned_settings(|| {
            let values = self.parse(text)?;
            let typed: Vec<(Option<pg_sys::Datum>, pg_sys::Oid)> = values
                .iter()
                .zip(&self.cols)
                .map(|(v, c)| (Some(*v), c.spec.typid))
                .collect();
            Some(crate::pg::trigger_event::key_text_of(&typed))
        })
    }

    /// The key's values from its text (`None` for text of another shape, or one an input
    /// function refuses: see [`input_soft`]).
    fn parse(&self, text: &str) -> Option<Vec<pg_sys::Datum>> {
        let fields = split_key_text(text)?;
        if fields.is_empty() || fields.len() != self.cols.len() {
            return None;
        }
        let mut out = Vec::with_capacity(fields.len());
        for (c, f) in self.cols.iter().zip(fields) {
            let f = CString::new(f?).ok()?;
            out.push(input_soft(c, &f)?);
        }
        Some(out)
    }
}

/// The type's input function on `text`, in a subtransaction: `None` if it raises an error of
/// the classes bad input raises (22 data exception, 23 integrity constraint violation: a
/// domain's CHECK, 42 e.g. an undefined object for `reg*`), which are taken back as PL/pgSQL's
/// EXCEPTION blocks do (the caller's memory context and resource owner restored); any other
/// error (a cancel, out of memory) is raised again.
fn input_soft(c: &Column, text: &CStr) -> Option<pg_sys::Datum> {
    // SAFETY: main thread inside a transaction. The subtransaction is begun and then either
    // released (success) or rolled back (ERROR caught by PgTryBuilder, which has already
    // copied and flushed the error state), and each path restores the memory context and
    // resource owner saved before it began, as PL/pgSQL's exception blocks do; an error of
    // another class is raised again after the rollback. The input function (found by
    // getTypeInputInfo) gets its I/O parameter and the column's type modifier, on a
    // NUL-terminated string that outlives the call; its value is made in the caller's memory
    // context, which outlives the subtransaction.
    unsafe {
        let cxt = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(cxt);
        pgrx::PgTryBuilder::new(|| {
            let v = pg_sys::OidInputFunctionCall(
                c.input,
                text.as_ptr().cast_mut(),
                c.ioparam,
                c.spec.typmod,
            );
            pg_sys::ReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::CurrentResourceOwner = owner;
            Some(v)
        })
        .catch_others(|e| {
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::CurrentResourceOwner = owner;
            let class = match &e {
                pg_sys::panic::CaughtError::PostgresError(r)
                | pg_sys::panic::CaughtError::ErrorReport(r) => {
                    (r.sql_error_code() as i32) & ((1 << 12) - 1)
                }
                pg_sys::panic::CaughtError::RustPanic { .. } => -1,
            };
            // MAKE_SQLSTATE's category of classes 22, 23 and 42.
            let sixbit = |a: u8, b: u8| i32::from(a - b'0') | (i32::from(b - b'0') << 6);
            if [sixbit(b'2', b'2'), sixbit(b'2', b'3'), sixbit(b'4', b'2')].contains(&class) {
                None
            } else {
                e.rethrow()
            }
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
        let pk = crate::pg::compat::primary_key_index(rel);
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
            let natts = (*tupdesc).natts.max(0) as usize;
            out = attnums
                .iter()
                .map(|a| {
                    let i = (*a as usize).checked_sub(1).filter(|i| *i < natts)?;
                    let a = crate::pg::compat::tuple_desc_attr(tupdesc, i);
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
