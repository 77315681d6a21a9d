//! A trigger call as safe values: the event, its arguments, the relation and the row versions
//! (`TriggerEvent`, `Relation`, `Row`). The guard (`guard/trigger.rs`) decides with these and
//! never touches PostgreSQL's trigger structures itself. Everything here is valid for the one
//! trigger call it was made from (the lifetime `'a`), on the backend's main thread.

use crate::error::Token;
use pgrx::pg_sys;
use std::ffi::CStr;
use std::marker::PhantomData;

/// Which statement fired the trigger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TriggerOp {
    Insert,
    Update,
    Delete,
    Truncate,
}

/// One trigger call (PostgreSQL's `TriggerData`).
pub struct TriggerEvent<'a> {
    td: &'a pg_sys::TriggerData,
}

impl<'a> TriggerEvent<'a> {
    /// The trigger call of `fcinfo`, or `None` if the function was not called as a trigger.
    ///
    /// # Safety
    /// `fcinfo` must be the function manager's, for this call, and the result must not outlive
    /// the call.
    pub unsafe fn from_call(fcinfo: pg_sys::FunctionCallInfo) -> Option<TriggerEvent<'a>> {
        // SAFETY: `fcinfo` is the function manager's (this function's contract).
        // called_as_trigger checks that `context` is a TriggerData node before it is read as
        // one; the trigger manager keeps that TriggerData valid for the whole call.
        unsafe {
            if !pgrx::trigger_support::called_as_trigger(fcinfo) {
                return None;
            }
            Some(TriggerEvent {
                td: &*((*fcinfo).context as *const pg_sys::TriggerData),
            })
        }
    }

    fn event(&self) -> u32 {
        self.td.tg_event
    }

    /// The statement that fired the trigger.
    pub fn op(&self) -> TriggerOp {
        match self.event() & pg_sys::TRIGGER_EVENT_OPMASK {
            pg_sys::TRIGGER_EVENT_INSERT => TriggerOp::Insert,
            pg_sys::TRIGGER_EVENT_UPDATE => TriggerOp::Update,
            pg_sys::TRIGGER_EVENT_DELETE => TriggerOp::Delete,
            _ => TriggerOp::Truncate,
        }
    }

    /// FOR EACH ROW (else FOR EACH STATEMENT).
    pub fn row_level(&self) -> bool {
        self.event() & pg_sys::TRIGGER_EVENT_ROW != 0
    }

    /// BEFORE (else AFTER or INSTEAD OF).
    pub fn before(&self) -> bool {
        self.event() & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE
    }

    /// The firing trigger's OID.
    pub fn trigger_oid(&self) -> u32 {
        // SAFETY: `tg_trigger` points to the firing trigger's Trigger, valid for the call.
        unsafe { (*self.td.tg_trigger).tgoid.to_u32() }
    }

    /// The firing trigger's function (its `tgfoid`).
    pub fn function_oid(&self) -> pg_sys::Oid {
        // SAFETY: `tg_trigger` points to the firing trigger's Trigger, valid for the call.
        unsafe { (*self.td.tg_trigger).tgfoid }
    }

    /// The trigger's arguments (`CREATE TRIGGER ... EXECUTE FUNCTION f(args)`).
    pub fn args(&self) -> Vec<&'a CStr> {
        // SAFETY: `tg_trigger` is valid for the call; `tgargs` is NULL or an array of `tgnargs`
        // NUL-terminated strings in the relcache's trigger data, which outlives the call.
        unsafe {
            let t = &*self.td.tg_trigger;
            if t.tgargs.is_null() {
                return Vec::new();
            }
            (0..t.tgnargs.max(0) as usize)
                .map(|i| CStr::from_ptr(*t.tgargs.add(i)))
                .collect()
        }
    }

    /// The relation the trigger fires on.
    pub fn relation(&self) -> Relation<'a> {
        Relation {
            rel: self.td.tg_relation,
            _call: PhantomData,
        }
    }

    /// The row a row-level trigger fires for: the inserted row (INSERT), the old row (UPDATE,
    /// DELETE). `None` for statement-level events.
    pub fn row(&self) -> Option<Row<'a>> {
        self.row_of(self.td.tg_trigtuple)
    }

    /// The new row of a row-level UPDATE. `None` otherwise.
    pub fn new_row(&self) -> Option<Row<'a>> {
        if self.op() == TriggerOp::Update {
            self.row_of(self.td.tg_newtuple)
        } else {
            None
        }
    }

    fn row_of(&self, tuple: pg_sys::HeapTuple) -> Option<Row<'a>> {
        (self.row_level() && !tuple.is_null()).then(|| Row {
            tuple,
            // SAFETY: `tg_relation` is open (and locked) for the call; its descriptor describes
            // the tuples handed to the trigger.
            tupdesc: unsafe { (*self.td.tg_relation).rd_att },
            _call: PhantomData,
        })
    }

    /// Does the UPDATE's SET list name column `attnum`?
    pub fn updates_column(&self, attnum: i16) -> bool {
        // SAFETY: `tg_updatedcols` is a valid (possibly NULL = empty) Bitmapset for UPDATE
        // events; bms_is_member only reads it.
        self.op() == TriggerOp::Update
            && unsafe {
                pg_sys::bms_is_member(
                    attnum as i32 - pg_sys::FirstLowInvalidHeapAttributeNumber,
                    self.td.tg_updatedcols,
                )
            }
    }
}

/// Why a column cannot be the token column.
pub enum ColumnProblem {
    Missing,
    NotBigint,
}

/// An open relation (valid for the trigger call it came from).
#[derive(Clone, Copy)]
pub struct Relation<'a> {
    rel: pg_sys::Relation,
    _call: PhantomData<&'a ()>,
}

impl<'a> Relation<'a> {
    /// The relation's OID.
    pub fn id(&self) -> pg_sys::Oid {
        // SAFETY: the relation is open for the call.
        unsafe { (*self.rel).rd_id }
    }

    /// `schema.table`, quoted as needed.
    pub fn name(&self) -> String {
        relation_name(self.id())
    }

    /// The relation of an open relation pointer (the planner's target, a result relation).
    ///
    /// # Safety
    /// `rel` must be an open relation that stays open (and locked) for the lifetime `'a`.
    pub unsafe fn from_open(rel: pg_sys::Relation) -> Relation<'a> {
        Relation {
            rel,
            _call: PhantomData,
        }
    }

    /// The trigger named `name` (row or statement, any firing mode), as plain values.
    pub fn trigger_named(&self, name: &CStr) -> Option<TriggerInfo> {
        // SAFETY: the relation is open, so is its relcache trigger descriptor (NULL when it has
        // no triggers) with `numtriggers` entries whose names and arguments are NUL-terminated
        // strings owned by the relcache entry; everything is copied out.
        unsafe { trigger_named_in((*self.rel).trigdesc, name) }
    }

    /// The names of the relation's CHECK constraints that start with `prefix`.
    pub fn check_constraint_names(&self, prefix: &str) -> Vec<String> {
        // SAFETY: the relation is open, so are its pg_class row and tuple descriptor; `constr`
        // is NULL or holds `num_check` ConstrCheck entries (loaded with the relcache entry when
        // the table has CHECK constraints) whose names are NUL-terminated strings it owns,
        // copied out.
        unsafe {
            if (*(*self.rel).rd_rel).relchecks == 0 {
                return Vec::new();
            }
            let constr = (*(*self.rel).rd_att).constr;
            if constr.is_null() || (*constr).check.is_null() {
                return Vec::new();
            }
            std::slice::from_raw_parts((*constr).check, (*constr).num_check as usize)
                .iter()
                .filter(|c| !c.ccname.is_null())
                .map(|c| CStr::from_ptr(c.ccname).to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        }
    }

    /// Is this a plain table (not partitioned) with inheritance children?
    pub fn has_inheritance_children(&self) -> bool {
        // SAFETY: the open relation's pg_class row, valid while it is open.
        unsafe {
            let form = &*(*self.rel).rd_rel;
            form.relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char && form.relhassubclass
        }
    }

    /// Is this a plain table without inheritance children (not partitioned, not foreign)?
    pub fn is_plain_table(&self) -> bool {
        // SAFETY: the open relation's pg_class row, valid while it is open.
        unsafe {
            let form = &*(*self.rel).rd_rel;
            form.relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char && !form.relhassubclass
        }
    }

    /// Does the table have a BEFORE INSERT row trigger of another function than `function`?
    pub fn other_before_insert_triggers(&self, function: pg_sys::Oid) -> bool {
        // SAFETY: the open relation's trigger descriptor (NULL or valid with `numtriggers`
        // entries), read only.
        unsafe {
            let td = (*self.rel).trigdesc;
            if td.is_null() || (*td).triggers.is_null() {
                return false;
            }
            std::slice::from_raw_parts((*td).triggers, (*td).numtriggers.max(0) as usize)
                .iter()
                .any(|t| {
                    let ty = t.tgtype as u32;
                    t.tgfoid != function
                        && ty & pg_sys::TRIGGER_TYPE_ROW != 0
                        && ty & (pg_sys::TRIGGER_TYPE_BEFORE | pg_sys::TRIGGER_TYPE_INSTEAD)
                            == pg_sys::TRIGGER_TYPE_BEFORE
                        && ty & pg_sys::TRIGGER_TYPE_INSERT != 0
                })
        }
    }

    /// Is any of columns `attnums` generated (stored or virtual)?
    pub fn any_generated(&self, attnums: &[i16]) -> bool {
        attnums.iter().any(|a| self.attribute(*a).attgenerated != 0)
    }

    /// Does the table have stored generated columns?
    pub fn has_stored_generated(&self) -> bool {
        // SAFETY: the open relation's descriptor; `constr` is NULL or valid with it.
        unsafe {
            let constr = (*(*self.rel).rd_att).constr;
            !constr.is_null() && (*constr).has_generated_stored
        }
    }

    /// Type, type modifier and collation of column `attnum`.
    pub fn column_type(&self, attnum: i16) -> (pg_sys::Oid, i32, pg_sys::Oid) {
        let a = self.attribute(attnum);
        (a.atttypid, a.atttypmod, a.attcollation)
    }

    fn attribute(&self, attnum: i16) -> &pg_sys::FormData_pg_attribute {
        // SAFETY: the relation is open for the call, so is its descriptor with `natts`
        // attributes; the slice index is bounds-checked (a bad `attnum` panics, never reads
        // out of bounds).
        unsafe {
            let tupdesc = (*self.rel).rd_att;
            crate::pg::compat::tuple_desc_attr(tupdesc, (attnum - 1) as usize)
        }
    }

    /// The function of column `attnum`'s default if that default is a call of it without
    /// arguments (as a set-based table's token column has: `_pg_fencing.stamp_default()`).
    pub fn default_call(&self, attnum: i16) -> Option<pg_sys::Oid> {
        if !self.attribute(attnum).atthasdef {
            return None;
        }
        // SAFETY: the open relation's descriptor; `constr` is NULL or valid with `num_defval`
        // entries in `defval`, whose `adbin` is a NUL-terminated node string (stringToNode
        // raises an ERROR, not UB, on a malformed one). The parsed node is only read.
        unsafe {
            let constr = (*(*self.rel).rd_att).constr;
            if constr.is_null() || (*constr).defval.is_null() {
                return None;
            }
            let defs = std::slice::from_raw_parts((*constr).defval, (*constr).num_defval as usize);
            let def = defs.iter().find(|d| d.adnum == attnum)?;
            if def.adbin.is_null() {
                return None;
            }
            let node = pg_sys::stringToNode(def.adbin).cast::<pg_sys::Node>();
            if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_FuncExpr {
                return None;
            }
            let call = node.cast::<pg_sys::FuncExpr>();
            (*call).args.is_null().then_some((*call).funcid)
        }
    }

    /// The 1-based attribute number of bigint column `name`.
    pub fn bigint_column(&self, name: &CStr) -> Result<i16, ColumnProblem> {
        let n = self.column_number(name).ok_or(ColumnProblem::Missing)?;
        if self.attribute(n).atttypid != pg_sys::INT8OID {
            return Err(ColumnProblem::NotBigint);
        }
        Ok(n)
    }

    /// The 1-based attribute number of column `name`, if it has one.
    pub fn column_number(&self, name: &CStr) -> Option<i16> {
        // SAFETY: the relation's descriptor is valid for the call; SPI_fnumber only reads it and
        // the NUL-terminated name.
        let (n, natts) = unsafe {
            let tupdesc = (*self.rel).rd_att;
            (
                pg_sys::SPI_fnumber(tupdesc, name.as_ptr()),
                (*tupdesc).natts,
            )
        };
        (n > 0 && n <= natts).then_some(n as i16)
    }

    /// The name of column `attnum`.
    pub fn column_name(&self, attnum: i16) -> String {
        let att = self.attribute(attnum);
        // SAFETY: `attname` is a NUL-terminated NameData inside the descriptor.
        unsafe { CStr::from_ptr(att.attname.data.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// What the relation's row triggers say about key changes that the guard (whose trigger
    /// function is `guard`) cannot see in its `BEFORE UPDATE` call: whether another `BEFORE
    /// UPDATE FOR EACH ROW` trigger may change the row (before or after the guard), and whether the
    /// guard's `AFTER UPDATE` trigger `rekey` (by name) is the column-list form (`AFTER UPDATE OF
    /// key columns`, no `WHEN`), which fires only for UPDATEs that set a key column.
    pub fn update_triggers(&self, guard: pg_sys::Oid, rekey: &CStr) -> UpdateTriggers {
        let mut out = UpdateTriggers {
            others_before: false,
            rekey_by_column: false,
            rekey_columns: Vec::new(),
        };
        // SAFETY: the relation is open for the call, so is its relcache trigger descriptor
        // (`trigdesc`, NULL when it has no triggers) with `numtriggers` entries; each Trigger's
        // name is a NUL-terminated string and `tgqual` NULL or a string, all owned by the
        // relcache entry, which outlives the call. Only read here.
        unsafe {
            let td = (*self.rel).trigdesc;
            if td.is_null() || (*td).triggers.is_null() {
                return out;
            }
            let n = (*td).numtriggers.max(0) as usize;
            for t in std::slice::from_raw_parts((*td).triggers, n) {
                let ty = t.tgtype as u32;
                let row = ty & pg_sys::TRIGGER_TYPE_ROW != 0;
                let before = ty & (pg_sys::TRIGGER_TYPE_BEFORE | pg_sys::TRIGGER_TYPE_INSTEAD)
                    == pg_sys::TRIGGER_TYPE_BEFORE;
                let update = ty & pg_sys::TRIGGER_TYPE_UPDATE != 0;
                if row && before && update && t.tgfoid != guard {
                    out.others_before = true;
                }
                if row
                    && !before
                    && update
                    && t.tgfoid == guard
                    && CStr::from_ptr(t.tgname) == rekey
                {
                    out.rekey_by_column = t.tgqual.is_null() && t.tgnattr > 0;
                    if out.rekey_by_column && !t.tgattr.is_null() {
                        out.rekey_columns =
                            std::slice::from_raw_parts(t.tgattr, t.tgnattr as usize).to_vec();
                    }
                }
            }
        }
        out
    }

    /// Primary key columns, in key order, and whether the key is checked immediately (not
    /// DEFERRABLE). No columns: no primary key.
    pub fn primary_key(&self) -> (Vec<i16>, bool) {
        // SAFETY: RelationGetPrimaryKeyIndex reads the open relation's relcache entry. The index
        // is opened (ERROR, not UB, if it vanished), its pg_index row read through `rd_index`
        // (valid while open; `indkey` has at least `indnkeyatts` entries) and copied before
        // index_close; main thread inside the trigger's transaction.
        unsafe {
            let pk = crate::pg::compat::primary_key_index(self.rel);
            if pk == pg_sys::Oid::INVALID {
                return (Vec::new(), true);
            }
            let idx = pg_sys::index_open(pk, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            let form = &*(*idx).rd_index;
            let n = form.indnkeyatts as usize;
            let cols = form.indkey.values.as_slice(n).to_vec();
            let immediate = form.indimmediate;
            pg_sys::index_close(idx, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            (cols, immediate)
        }
    }
}

/// See [`Relation::update_triggers`].
#[derive(Clone, Debug)]
pub struct UpdateTriggers {
    /// Another `BEFORE UPDATE FOR EACH ROW` trigger than the guard's own.
    pub others_before: bool,
    /// The guard's rekey trigger is `AFTER UPDATE OF <key columns>` without `WHEN`.
    pub rekey_by_column: bool,
    /// Its column list then (attribute numbers).
    pub rekey_columns: Vec<i16>,
}

/// A row version handed to the trigger (valid for the call).
#[derive(Clone, Copy)]
pub struct Row<'a> {
    tuple: pg_sys::HeapTuple,
    tupdesc: pg_sys::TupleDesc,
    _call: PhantomData<&'a ()>,
}

/// Types whose text form depends on no setting (keys of these need no pinned settings).
const SETTING_FREE_TYPES: [pg_sys::Oid; 12] = [
    pg_sys::INT2OID,
    pg_sys::INT4OID,
    pg_sys::INT8OID,
    pg_sys::TEXTOID,
    pg_sys::VARCHAROID,
    pg_sys::BPCHAROID,
    pg_sys::UUIDOID,
    pg_sys::BOOLOID,
    pg_sys::OIDOID,
    pg_sys::NUMERICOID,
    pg_sys::NAMEOID,
    pg_sys::CHAROID,
];

impl<'a> Row<'a> {
    fn type_of(&self, attnum: i16) -> pg_sys::Oid {
        // SAFETY: the descriptor is valid for the call with `natts` attributes; the slice index
        // is bounds-checked.
        unsafe { crate::pg::compat::tuple_desc_attr(self.tupdesc, (attnum - 1) as usize).atttypid }
    }

    /// The value of bigint column `attnum` (None if NULL).
    pub fn bigint(&self, attnum: i16) -> Option<Token> {
        debug_assert_eq!(self.type_of(attnum), pg_sys::INT8OID);
        let mut isnull = false;
        // SAFETY: the tuple is a valid tuple of the descriptor for the call; a bigint is passed
        // by value, so the datum is the value.
        let d =
            unsafe { pg_sys::heap_getattr(self.tuple, attnum as i32, self.tupdesc, &mut isnull) };
        (!isnull).then(|| d.value() as i64)
    }

    /// The value of text column `attnum` (None if NULL).
    pub fn text(&self, attnum: i16) -> Option<String> {
        debug_assert_eq!(self.type_of(attnum), pg_sys::TEXTOID);
        let mut isnull = false;
        // SAFETY: the tuple is a valid tuple of the descriptor for the call and `attnum` one of
        // its text attributes; text_to_cstring detoasts the varlena and returns a palloc'd
        // NUL-terminated copy, copied again at once.
        unsafe {
            let d = pg_sys::heap_getattr(self.tuple, attnum as i32, self.tupdesc, &mut isnull);
            if isnull {
                return None;
            }
            let c = pg_sys::text_to_cstring(d.cast_mut_ptr());
            let v = CStr::from_ptr(c).to_string_lossy().into_owned();
            pg_sys::pfree(c.cast());
            Some(v)
        }
    }

    /// Canonical text of the row's key `pk`: exactly what `ROW(pk1, pk2, ...)::text` prints
    /// (PostgreSQL's `record_out` quoting, with the output settings pinned where a type's text
    /// depends on them), so SQL (TRUNCATE) and the trigger build the same tombstone key.
    pub fn key_text(&self, pk: &[i16]) -> String {
        let values: Vec<(Option<pg_sys::Datum>, pg_sys::Oid)> = pk
            .iter()
            .map(|attnum| {
                let mut isnull = false;
                // SAFETY: the tuple is a valid tuple of the descriptor and `attnum` one of its
                // attributes; the datum points into the tuple, which outlives its use.
                let datum = unsafe {
                    pg_sys::heap_getattr(self.tuple, *attnum as i32, self.tupdesc, &mut isnull)
                };
                ((!isnull).then_some(datum), self.type_of(*attnum))
            })
            .collect();
        key_text_of(&values)
    }

    /// The values of columns `attnums` (a NULL reads as a zero datum; primary key columns
    /// have none). They point into the row, which outlives the trigger call.
    pub fn values(&self, attnums: &[i16]) -> Vec<pg_sys::Datum> {
        attnums
            .iter()
            .map(|attnum| {
                let mut isnull = false;
                // SAFETY: as in `key_text`.
                let d = unsafe {
                    pg_sys::heap_getattr(self.tuple, *attnum as i32, self.tupdesc, &mut isnull)
                };
                if isnull {
                    pg_sys::Datum::from(0usize)
                } else {
                    d
                }
            })
            .collect()
    }

    /// The row as the trigger's result (the executor writes it unchanged).
    pub fn datum(&self) -> pg_sys::Datum {
        pg_sys::Datum::from(self.tuple)
    }

    /// A copy of the row with bigint column `attnum` set to `value`, as the trigger's result.
    /// The row itself when the column already holds `value` (a holder writing again with its
    /// token): nothing to copy.
    pub fn with_bigint(&self, attnum: i16, value: Token) -> pg_sys::Datum {
        debug_assert_eq!(self.type_of(attnum), pg_sys::INT8OID);
        if self.bigint(attnum) == Some(value) {
            return self.datum();
        }
        let mut cols = [attnum as i32];
        let mut vals = [pg_sys::Datum::from(value)];
        let mut nulls = [false];
        // SAFETY: the tuple is a valid tuple of the descriptor; the three arrays hold exactly
        // the one (attnum, value, null) replacement announced, and the value is a by-value
        // bigint. The new tuple is palloc'd in the current memory context (the trigger's),
        // where the executor expects it.
        let tuple = unsafe {
            pg_sys::heap_modify_tuple_by_cols(
                self.tuple,
                self.tupdesc,
                1,
                cols.as_mut_ptr(),
                vals.as_mut_ptr(),
                nulls.as_mut_ptr(),
            )
        };
        pg_sys::Datum::from(tuple)
    }
}

/// `schema.table` of relation `relid`, quoted as needed (its OID if it has no name).
pub fn relation_name(relid: pg_sys::Oid) -> String {
    // SAFETY: the catalog lookups take OIDs by value and return palloc'd NUL-terminated
    // names or NULL (checked); quote_qualified_identifier returns a palloc'd string (the
    // inputs themselves when no quoting is needed), copied at once. Main thread inside a
    // transaction.
    unsafe {
        let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        let name = pg_sys::get_rel_name(relid);
        if nsp.is_null() || name.is_null() {
            return format!("oid {}", relid.to_u32());
        }
        let q = pg_sys::quote_qualified_identifier(nsp, name);
        CStr::from_ptr(q).to_string_lossy().into_owned()
    }
}

/// A trigger as plain values (copied out of a trigger descriptor).
#[derive(Clone, Debug)]
pub struct TriggerInfo {
    pub oid: u32,
    pub function: pg_sys::Oid,
    /// `tgenabled`: `O` origin, `A` always, `R` replica, `D` disabled.
    pub enabled: u8,
    /// `tgtype`: the events and timing (`TRIGGER_TYPE_*` bits).
    pub tgtype: u32,
    pub args: Vec<std::ffi::CString>,
}

impl TriggerInfo {
    /// Fires in an ordinary session (`session_replication_role` origin or local).
    pub fn fires_on_origin(&self) -> bool {
        self.enabled == b'O' || self.enabled == b'A'
    }
}

/// The trigger named `name` of a trigger descriptor, copied (only that one).
///
/// # Safety
/// `td` must be NULL or a valid trigger descriptor (a relcache entry's, or a result relation's
/// copy), alive for the call.
pub unsafe fn trigger_named_in(td: *const pg_sys::TriggerDesc, name: &CStr) -> Option<TriggerInfo> {
    // SAFETY: per the contract `td` is NULL or valid, with `numtriggers` Trigger entries whose
    // `tgname` is a NUL-terminated string; the one found is copied by `trigger_info`.
    unsafe {
        if td.is_null() || (*td).triggers.is_null() {
            return None;
        }
        let n = (*td).numtriggers.max(0) as usize;
        std::slice::from_raw_parts((*td).triggers, n)
            .iter()
            .find(|t| CStr::from_ptr(t.tgname) == name)
            .map(|t| trigger_info(t))
    }
}

/// One trigger, copied.
///
/// # Safety
/// `t` must be a valid trigger of a descriptor alive for the call.
unsafe fn trigger_info(t: &pg_sys::Trigger) -> TriggerInfo {
    // SAFETY: per the contract its name and `tgnargs` arguments are NUL-terminated strings.
    unsafe {
        TriggerInfo {
            oid: t.tgoid.to_u32(),
            function: t.tgfoid,
            enabled: t.tgenabled as u8,
            tgtype: t.tgtype as u16 as u32,
            args: if t.tgargs.is_null() {
                Vec::new()
            } else {
                (0..t.tgnargs.max(0) as usize)
                    .map(|i| CStr::from_ptr(*t.tgargs.add(i)).to_owned())
                    .collect()
            },
        }
    }
}

/// A key as `(v1,v2,...)`, each value printed by its type's output function (with pinned
/// output settings unless every type prints the same under any settings) and quoted like a
/// record field when needed; NULLs print as nothing. `values`: (datum or NULL, type).
pub fn key_text_of(values: &[(Option<pg_sys::Datum>, pg_sys::Oid)]) -> String {
    // One integer column (the usual key of a queue's table): printed at once.
    if let [(Some(d), t)] = values {
        let v = match *t {
            pg_sys::INT4OID => Some(i64::from(d.value() as i32)),
            pg_sys::INT8OID => Some(d.value() as i64),
            _ => None,
        };
        if let Some(v) = v {
            let mut out = String::with_capacity(22);
            out.push('(');
            push_decimal(&mut out, v);
            out.push(')');
            return out;
        }
    }
    if values.iter().all(|(_, t)| SETTING_FREE_TYPES.contains(t)) {
        key_text_pinned(values)
    } else {
        crate::pg::spi::with_pinned_settings(|| key_text_pinned(values))
    }
}

/// `v` in decimal ('-' before a negative value), as int8out prints it.
fn push_decimal(out: &mut String, v: i64) {
    let mut digits = [0u8; 20];
    let mut n = v.unsigned_abs();
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        out.push('-');
    }
    // SAFETY: `digits[i..]` holds only ASCII digits, which are valid UTF-8.
    out.push_str(unsafe { std::str::from_utf8_unchecked(&digits[i..]) });
}

fn key_text_pinned(values: &[(Option<pg_sys::Datum>, pg_sys::Oid)]) -> String {
    let mut out = String::with_capacity(24);
    out.push('(');
    for (i, (datum, typid)) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let Some(datum) = datum else {
            continue;
        };
        // Integers print as int2out/int4out/int8out/oidout print them (decimal, '-' for a
        // negative value, no quoting needed), without a catalog lookup and a function call.
        let int = match *typid {
            pg_sys::INT2OID => Some(i64::from(datum.value() as i16)),
            pg_sys::INT4OID => Some(i64::from(datum.value() as i32)),
            pg_sys::INT8OID => Some(datum.value() as i64),
            pg_sys::OIDOID => Some(i64::from(datum.value() as u32)),
            _ => None,
        };
        if let Some(v) = int {
            push_decimal(&mut out, v);
            continue;
        }
        // SAFETY: main thread inside a transaction. `datum` is a non-NULL value of type
        // `typid` (the callers pass each value with its own type), which is what the type's
        // output function, found by getTypeOutputInfo, expects; it returns a palloc'd
        // NUL-terminated string, copied before it is pfree'd and never used after.
        let value = unsafe {
            let mut out_fn = pg_sys::Oid::INVALID;
            let mut varlena = false;
            pg_sys::getTypeOutputInfo(*typid, &mut out_fn, &mut varlena);
            let s = pg_sys::OidOutputFunctionCall(out_fn, *datum);
            let v = CStr::from_ptr(s).to_string_lossy().into_owned();
            pg_sys::pfree(s.cast());
            v
        };
        let needs_quotes = value.is_empty()
            || value.chars().any(|c| {
                matches!(
                    c,
                    '"' | '\\' | '(' | ')' | ',' | ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'
                )
            });
        if needs_quotes {
            out.push('"');
            for c in value.chars() {
                if c == '"' || c == '\\' {
                    out.push(c);
                }
                out.push(c);
            }
            out.push('"');
        } else {
            out.push_str(&value);
        }
    }
    out.push(')');
    out
}
