//! pg_fencing's internal statements: SQL on its own tables, run through SPI as the extension's
//! owner with the latest committed snapshot, with pinned settings (search_path, output formats)
//! and a per-backend plan cache. Every caller passes fixed, schema-qualified statements (names
//! and operators qualified, so a role's own objects are never picked up) or statements built
//! from quoted identifiers.

use crate::backend_event::BackendEvent;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::CString;

/// Plans kept for the life of the backend (`SPI_keepplan`), by key: pg_fencing's fixed internal
/// statements (by their text, here) and the `fenced_*` statements (by table, operation and
/// columns, in `api/fenced.rs`). A plan dropped by `invalidate` (or when the cache is full) is
/// freed at the end of the transaction (`free_stale`), when none of them can still be running.
pub struct KeptPlans<K> {
    plans: rustc_hash::FxHashMap<K, usize>,
    stale: Vec<usize>,
    cap: usize,
    /// Bumped by `invalidate`: a plan prepared across an invalidation is used once, not kept.
    generation: u64,
}

/// Prepare `sql` with parameter `types` for keeping (`SPI_keepplan`). Call while connected to
/// SPI, and without holding a borrow of the cache the plan goes into: preparing can process
/// invalidations, whose callbacks clear the caches (`KeptPlans::invalidate`).
pub fn prepare_kept(sql: &str, types: &[pg_sys::Oid]) -> pg_sys::SPIPlanPtr {
    let plan = prepare(sql, types);
    // SAFETY: `plan` was just returned non-NULL by SPI_prepare in the current SPI connection;
    // SPI_keepplan moves it to a long-lived context, so the pointer stays valid until
    // `KeptPlans::free_stale` frees it.
    unsafe {
        pg_sys::SPI_keepplan(plan);
    }
    plan
}

impl<K: std::hash::Hash + Eq> KeptPlans<K> {
    /// An empty cache of at most `cap` plans.
    pub fn new(cap: usize) -> Self {
        KeptPlans {
            plans: Default::default(),
            stale: Vec::new(),
            cap,
            generation: 0,
        }
    }

    /// The current generation (see `keep`).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The plan kept for `key`, if any.
    pub fn get<Q: std::hash::Hash + Eq + ?Sized>(&self, key: &Q) -> Option<pg_sys::SPIPlanPtr>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.plans.get(key).map(|p| *p as pg_sys::SPIPlanPtr)
    }

    /// Keep `plan` (from `prepare_kept`, begun at `generation`) for `key`; if the cache was
    /// invalidated since, the plan may be built on stale facts: it is freed at the end of the
    /// transaction instead of kept.
    pub fn keep(
        &mut self,
        key: K,
        plan: pg_sys::SPIPlanPtr,
        generation: u64,
    ) -> pg_sys::SPIPlanPtr {
        if generation != self.generation {
            self.stale.push(plan as usize);
            return plan;
        }
        if self.plans.len() >= self.cap {
            self.invalidate();
        }
        self.plans.insert(key, plan as usize);
        plan
    }

    /// Drop every kept plan (a relcache invalidation can change what they mean); they are freed
    /// by `free_stale`.
    pub fn invalidate(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.stale.extend(self.plans.drain().map(|(_, v)| v));
    }

    /// At the end of a transaction: free the plans dropped during it.
    pub fn free_stale(&mut self) {
        for p in self.stale.drain(..) {
            // SAFETY: called from the transaction-end callback on the main thread. `p` was kept
            // with SPI_keepplan by `prepare_kept` and moved to `stale` exactly once (when it left
            // `plans`), so it is freed exactly once, and at transaction end no statement of
            // this backend can still be executing it.
            unsafe { pg_sys::SPI_freeplan(p as pg_sys::SPIPlanPtr) };
        }
    }
}

thread_local! {
    /// Plans of the fixed internal statements, by their text (see `plan_for`). A few dozen
    /// statements: never full.
    static PLANS: RefCell<KeptPlans<String>> = RefCell::new(KeptPlans::new(1000));
}

/// A `text` datum (palloc'd in the current memory context) holding `s`.
pub fn text_datum(s: &str) -> pg_sys::Datum {
    // SAFETY: cstring_to_text_with_len copies exactly `s.len()` bytes from a live &str into a
    // new palloc'd text; no NUL terminator is needed. Called on a backend's main thread.
    unsafe {
        pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
            s.as_ptr().cast(),
            s.len() as i32,
        ))
    }
}

/// Settings pinned while pg_fencing runs its internal statements as the extension owner and
/// while it prints primary keys into tombstone keys:
/// * `search_path`: an ordinary role must not be able to put its own operators or functions in
///   front of `pg_catalog` and have them run with the owner's privileges;
/// * the output settings: a key's text must not depend on the session (a `timestamptz` key
///   printed in another `TimeZone` would name another tombstone).
const PINNED_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 6] = [
    (c"search_path", c"pg_catalog, pg_temp"),
    (c"TimeZone", c"UTC"),
    (c"DateStyle", c"ISO, YMD"),
    (c"IntervalStyle", c"postgres"),
    (c"extra_float_digits", c"1"),
    (c"bytea_output", c"hex"),
];

/// Run `f` with [`PINNED_SETTINGS`] in force; they are restored afterwards (and by the
/// transaction machinery if `f` raises an error).
pub fn with_pinned_settings<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: backend main thread inside a transaction. The names and values are `&'static CStr`
    // constants; set_config_option with GUC_ACTION_SAVE records the old values at the nesting
    // level just opened (elevel 0 = ERROR on a bad value, which becomes a panic through pgrx's FFI
    // guard). AtEOXact_GUC(true, level) pops exactly that level after `f`. If `f` raises instead,
    // the (sub)transaction abort unwinds the GUC nesting levels, so none is left behind.
    unsafe {
        let level = pg_sys::NewGUCNestLevel();
        for (name, value) in PINNED_SETTINGS {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        let out = f();
        pg_sys::AtEOXact_GUC(true, level);
        out
    }
}

thread_local! {
    static OWNER: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// Owner of schema `_pg_fencing` (the role that created the extension), remembered per schema OID.
fn internal_owner() -> pg_sys::Oid {
    // SAFETY: catalog access on the backend's main thread inside a transaction.
    // get_namespace_oid(missing_ok = false) raises ERROR (a panic through the FFI guard) rather
    // than returning an invalid OID. The syscache tuple is checked for NULL, read as the
    // pg_namespace row it is (heap_tuple_get_struct of a NAMESPACEOID entry), and released with
    // ReleaseSysCache before anything else can invalidate it; only the owner OID is kept.
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"_pg_fencing".as_ptr(), false);
        let (cached_nsp, cached_owner) = OWNER.with(|o| o.get());
        if cached_nsp == nsp.to_u32() && cached_owner != 0 {
            return pg_sys::Oid::from(cached_owner);
        }
        let tup = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as _,
            pg_sys::Datum::from(nsp),
        );
        if tup.is_null() {
            crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(
                "schema _pg_fencing vanished".to_string(),
            ));
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_namespace>(tup);
        let owner = (*form).nspowner;
        pg_sys::ReleaseSysCache(tup);
        OWNER.with(|o| o.set((nsp.to_u32(), owner.to_u32())));
        owner
    }
}

/// A decoder for `exec_internal` of a statement whose one column is `text` (the only kind it
/// is used with): the value, copied before SPI frees it.
pub fn text_of(d: pg_sys::Datum) -> String {
    // SAFETY: `exec_internal` passes only non-NULL values of the statement's first column, which
    // the caller's statement declares as text; String::from_datum copies it.
    unsafe { String::from_datum(d, false).unwrap_or_default() }
}

/// A decoder for `exec_internal` of a statement whose one column is `text[]`: its elements (NULL
/// elements left out), copied before SPI frees them.
pub fn text_array_of(d: pg_sys::Datum) -> Vec<String> {
    // SAFETY: `exec_internal` passes only non-NULL values of the statement's first column, which
    // the caller's statement declares as text[]; Vec::<Option<String>>::from_datum copies it.
    unsafe {
        Vec::<Option<String>>::from_datum(d, false)
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect()
    }
}

/// Run a statement as the extension owner, with the latest committed snapshot, and decode the
/// first column of the first row (if any, and not NULL) with `decode`. `cached`: keep the plan
/// for the life of the backend (only for the fixed statements above).
///
/// Each `args[i]` must be a valid datum of type `types[i]` (a by-reference one, such as
/// `text_datum`'s, alive until the call returns): the statement reads them as such. The number
/// of arguments is checked against the plan; their types cannot be, so this rests on the
/// callers passing fixed statements with matching arguments.
pub fn exec_internal<T>(
    sql: &str,
    cached: bool,
    types: &[pg_sys::Oid],
    args: &mut [pg_sys::Datum],
    read_only: bool,
    decode: impl FnOnce(pg_sys::Datum) -> T,
) -> Option<T> {
    // The cached statements qualify every name, operators included (see above), and return
    // bigints, so neither search_path nor output settings matter to them once prepared. A plan
    // not yet prepared, and one-off statements (which print keys), run with pinned settings.
    exec_internal_row(sql, cached, types, args, read_only, |row| {
        row.first().copied().flatten().map(decode)
    })
    .flatten()
}

/// As [`exec_internal`], but `decode` gets every column of the first row (`None` for a NULL);
/// `None` if the statement returned no row. By-reference values must be copied by `decode`.
pub fn exec_internal_row<T>(
    sql: &str,
    cached: bool,
    types: &[pg_sys::Oid],
    args: &mut [pg_sys::Datum],
    read_only: bool,
    decode: impl FnOnce(&[Option<pg_sys::Datum>]) -> T,
) -> Option<T> {
    let prepared = cached && PLANS.with(|p| p.borrow().get(sql).is_some());
    if prepared {
        exec_internal_pinned(sql, cached, types, args, read_only, decode)
    } else {
        with_pinned_settings(|| exec_internal_pinned(sql, cached, types, args, read_only, decode))
    }
}

thread_local! {
    /// Depth of pg_fencing's own internal statements now running (see `internal_write`).
    static INTERNAL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Is one of pg_fencing's own internal statements running? The REPLICA triggers on its tables
/// (`_pg_fencing.on_replicated_change`) let these through: in a replica-mode session (logical
/// replication's apply worker) they are the subscriber's own bookkeeping, not replicated rows.
pub fn internal_write() -> bool {
    INTERNAL.with(|d| d.get() > 0)
}

/// Transaction end: no internal statement is running any more (also after an error in one).
fn forget_internal_write() {
    INTERNAL.with(|d| d.set(0));
}

struct InternalWrite;
impl InternalWrite {
    fn begin() -> Self {
        INTERNAL.with(|d| d.set(d.get() + 1));
        InternalWrite
    }
}
impl Drop for InternalWrite {
    fn drop(&mut self) {
        INTERNAL.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

fn exec_internal_pinned<T>(
    sql: &str,
    cached: bool,
    types: &[pg_sys::Oid],
    args: &mut [pg_sys::Datum],
    read_only: bool,
    decode: impl FnOnce(&[Option<pg_sys::Datum>]) -> T,
) -> Option<T> {
    // SAFETY: backend main thread inside a transaction (every caller: a trigger, a SQL function
    // or the pre-commit callback). The user id is switched with SECURITY_LOCAL_USERID_CHANGE |
    // SECURITY_RESTRICTED_OPERATION and restored after SPI_finish; if an ERROR escapes in
    // between, transaction/subtransaction abort restores the saved user and security context and
    // AtEOXact_SPI/AtEOSubXact_SPI close the SPI connection. `plan` is valid in this SPI
    // connection (kept, or prepared in it). `args` holds as many datums as the plan has parameters
    // (checked below), each of its parameter's type (the caller's duty, see `exec_internal`);
    // `nulls` has `args.len()` entries (' ' = not null); both outlive the call. SPI_tuptable is read only when SPI_processed > 0, so `vals[0]` exists and matches
    // `tupdesc` (its `natts` columns are read); the datums `decode` gets live in SPI memory, so `decode` must copy it out (every
    // caller returns a by-value integer/bool or an owned String) before SPI_finish frees it.
    unsafe {
        let mut save_user = pg_sys::Oid::INVALID;
        let mut save_sec: std::ffi::c_int = 0;
        pg_sys::GetUserIdAndSecContext(&mut save_user, &mut save_sec);
        let owner = internal_owner();
        pg_sys::SetUserIdAndSecContext(
            owner,
            save_sec
                | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
        );
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(
                "SPI_connect failed".to_string(),
            ));
        }
        let plan = if cached {
            plan_for(sql, types)
        } else {
            prepare(sql, types)
        };
        // SPI reads as many values as the plan has parameters: never more than `args` holds.
        if pg_sys::SPI_getargcount(plan) != args.len() as std::ffi::c_int {
            crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(format!(
                "internal statement given {} arguments: {sql}",
                args.len()
            )));
        }
        let nulls = vec![b' ' as std::ffi::c_char; args.len()];
        let _internal = InternalWrite::begin();
        let rc = pg_sys::SPI_execute_snapshot(
            plan,
            args.as_mut_ptr(),
            nulls.as_ptr(),
            crate::pg::process::latest_snapshot(),
            std::ptr::null_mut(),
            read_only,
            false,
            if read_only { 1 } else { 0 },
        );
        if rc < 0 {
            crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(format!(
                "internal statement failed: SPI code {rc}"
            )));
        }
        let mut out = None;
        if pg_sys::SPI_processed > 0 && !pg_sys::SPI_tuptable.is_null() {
            let tt = &*pg_sys::SPI_tuptable;
            let natts = (*tt.tupdesc).natts.max(0);
            let row: Vec<Option<pg_sys::Datum>> = (1..=natts)
                .map(|i| {
                    let mut isnull = false;
                    let d = pg_sys::SPI_getbinval(*tt.vals, tt.tupdesc, i, &mut isnull);
                    (!isnull).then_some(d)
                })
                .collect();
            out = Some(decode(&row));
        }
        pg_sys::SPI_finish();
        pg_sys::SetUserIdAndSecContext(save_user, save_sec);
        out
    }
}

/// Prepared plans, kept for the life of the backend (the plan cache re-plans them if the
/// extension's tables are dropped and re-created).
fn plan_for(sql: &str, types: &[pg_sys::Oid]) -> pg_sys::SPIPlanPtr {
    if let Some(plan) = PLANS.with(|p| p.borrow().get(sql)) {
        return plan;
    }
    let generation = PLANS.with(|p| p.borrow().generation());
    let plan = prepare_kept(sql, types);
    PLANS.with(|p| p.borrow_mut().keep(sql.to_string(), plan, generation))
}

/// A plan in the current SPI procedure's memory (freed by SPI_finish).
pub fn prepare(sql: &str, types: &[pg_sys::Oid]) -> pg_sys::SPIPlanPtr {
    // Our statements contain no NUL (identifiers cannot); strip one rather than panic.
    let csql = CString::new(sql.replace('\0', "")).unwrap_or_default();
    let mut types = types.to_vec();
    // SAFETY: called while connected to SPI (from exec_internal_pinned). `csql` is a
    // NUL-terminated C string and `types` holds `types.len()` OIDs; both outlive the call, and
    // SPI_prepare copies what it keeps. A NULL result is turned into an ERROR here.
    unsafe {
        let plan = pg_sys::SPI_prepare(csql.as_ptr(), types.len() as i32, types.as_mut_ptr());
        if plan.is_null() {
            crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(format!(
                "could not prepare internal statement: {sql}"
            )));
        }
        plan
    }
}

/// Per-backend state's life (`backend.rs`): the depth of internal statements ends with any
/// transaction.
pub fn on_event(ev: BackendEvent) {
    if ev.ends_any_transaction() {
        forget_internal_write();
    }
}
