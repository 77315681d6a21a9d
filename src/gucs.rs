//! GUCs (configuration parameters) of pg_fencing.
//!
//! `pg_fencing.token` (string, user-settable): the fencing token that plain
//! `INSERT`/`UPDATE`/`DELETE`/`MERGE`/`COPY`/`TRUNCATE` on protected tables carry. It is a string
//! because GUCs hold at most 32-bit integers and tokens are 64-bit. Its check hook refuses anything
//! that is not a token at `SET` time (`22P02`, `22003`, `22023`, see `error.rs`, `parse_token`); the empty string
//! means "no token". `SET LOCAL` is the recommended form: the value then ends with the transaction,
//! so it cannot leak to the next client of a transaction-mode pooler.
//!
//! `pg_fencing.token_scope` (superuser): `transaction` (default) makes a token count only in the
//! transaction that set it (`SET LOCAL`, or `SET` inside that transaction), so a plain `SET` left
//! on a pooled server connection is never used by the next client; tokens from the connection's
//! startup packet and from `fencing_acquire` (bound to a lock this session holds) always count,
//! tokens from postgresql.conf or ALTER ROLE/DATABASE ... SET never. `session` lets a plain `SET`
//! last for the session, as any setting.

use crate::error::{make_sqlstate, parse_token, Token};
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicI64, Ordering};

static TOKEN_SETTING: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static ETCD_ENDPOINTS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static LOCK_PREFIX: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static LEASE_TTL: GucSetting<i32> = GucSetting::<i32>::new(10);
static SET_BASED_SHAPE: GucSetting<bool> = GucSetting::<bool>::new(true);
static VERIFY_MAX_LAG: GucSetting<i32> = GucSetting::<i32>::new(1000);
static WATCH_SYNC_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static PRUNE_DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static PRUNE_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(60);
static MAX_LOCKS: GucSetting<i32> = GucSetting::<i32>::new(1024);
static ETCD_CA_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static ETCD_CERT_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static ETCD_KEY_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static ETCD_SERVER_NAME: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c""));
static ETCD_USERNAME: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static ETCD_PASSWORD_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c""));

/// `pg_fencing.tombstone_prune_database`: the database the tombstone pruner works in (empty: no
/// pruner).
pub fn tombstone_prune_database() -> String {
    PRUNE_DATABASE
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `pg_fencing.tombstone_prune_interval`: seconds between two rounds of the tombstone pruner.
pub fn tombstone_prune_interval_s() -> i32 {
    PRUNE_INTERVAL.get()
}

/// `pg_fencing.watch_sync_timeout`: how long (milliseconds) a write to a watched resource waits
/// for the watch to read etcd's state after it (re)started, before it is refused with `FT005`.
pub fn watch_sync_timeout_ms() -> i32 {
    WATCH_SYNC_TIMEOUT.get()
}

/// `pg_fencing.verify_max_lag`: how old (milliseconds) the worker's view of a watched lock may be
/// for a write to a `verify` resource to be accepted.
pub fn verify_max_lag_ms() -> i32 {
    VERIFY_MAX_LAG.get()
}
static TOKEN_SCOPE: GucSetting<TokenScope> = GucSetting::<TokenScope>::new(TokenScope::Transaction);
static LOG_REJECTIONS: GucSetting<LogRejections> =
    GucSetting::<LogRejections>::new(LogRejections::Log);

/// Values of `pg_fencing.log_rejections`: the message level of the one log line written for each
/// refused token (FT001, FT003, FT006), or `off`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PostgresGucEnum)]
pub enum LogRejections {
    #[name = c"off"]
    Off,
    #[name = c"debug1"]
    Debug1,
    #[name = c"info"]
    Info,
    #[name = c"notice"]
    Notice,
    #[name = c"warning"]
    Warning,
    #[name = c"log"]
    Log,
}

/// `pg_fencing.log_rejections` as a PostgreSQL message level (`elog.h`), `None` for `off`.
pub fn log_rejections_level() -> Option<i32> {
    let level = match LOG_REJECTIONS.get() {
        LogRejections::Off => return None,
        LogRejections::Debug1 => pg_sys::DEBUG1,
        LogRejections::Info => pg_sys::INFO,
        LogRejections::Notice => pg_sys::NOTICE,
        LogRejections::Warning => pg_sys::WARNING,
        LogRejections::Log => pg_sys::LOG,
    };
    Some(level as i32)
}

/// Values of `pg_fencing.token_scope`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PostgresGucEnum)]
pub enum TokenScope {
    #[name = c"transaction"]
    Transaction,
    #[name = c"session"]
    Session,
}

/// `pg_fencing.etcd_endpoints`: comma-separated etcd endpoints (`host:port` or URLs); empty means
/// the worker takes no locks.
pub fn etcd_endpoints() -> String {
    ETCD_ENDPOINTS
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn text_setting(s: &GucSetting<Option<CString>>) -> String {
    s.get()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The worker's TLS and authentication settings (`pg_fencing.etcd_ca_file`, `etcd_cert_file`,
/// `etcd_key_file`, `etcd_server_name`, `etcd_username`, `etcd_password_file`), as written.
pub fn etcd_security() -> [String; 6] {
    [
        text_setting(&ETCD_CA_FILE),
        text_setting(&ETCD_CERT_FILE),
        text_setting(&ETCD_KEY_FILE),
        text_setting(&ETCD_SERVER_NAME),
        text_setting(&ETCD_USERNAME),
        text_setting(&ETCD_PASSWORD_FILE),
    ]
}

/// `pg_fencing.max_locks`: lock slots of the server (read when shared memory is sized).
pub fn max_locks() -> usize {
    MAX_LOCKS.get().max(1) as usize
}

/// `pg_fencing.lock_prefix`: etcd key prefix put in front of every lock name.
pub fn lock_prefix() -> String {
    LOCK_PREFIX
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `pg_fencing.lease_ttl`: lease TTL in seconds.
pub fn lease_ttl() -> i32 {
    LEASE_TTL.get()
}

/// The parsed value of `pg_fencing.token`; 0 means "no token". Written by the assign hook only.
static CURRENT_TOKEN: AtomicI64 = AtomicI64::new(0);

/// The parsed value of `pg_fencing.token`, whether or not it counts here (0: none); see
/// `rule/session_token.rs` for which tokens count.
/// How many times `pg_fencing.token` was assigned in this backend (set, reset, restored at the
/// end of a transaction or savepoint): a `fenced_*` call tells from it whether the setting changed
/// during its statement.
pub fn token_assignments() -> u64 {
    TOKEN_ASSIGNMENTS.load(Ordering::Relaxed)
}

static TOKEN_ASSIGNMENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn token_value() -> Token {
    CURRENT_TOKEN.load(Ordering::Relaxed)
}

/// `pg_fencing.token_scope = session`?
pub fn token_scope_is_session() -> bool {
    TOKEN_SCOPE.get() == TokenScope::Session
}

/// Check hook of `pg_fencing.token`: refuses anything `parse_token` refuses.
///
/// # Safety
/// Only for guc.c to call, on the main thread, as a `GucStringCheckHook`: `newval` NULL or
/// pointing at NULL or at a NUL-terminated string.
#[pg_guard]
unsafe extern "C-unwind" fn token_check_hook(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: called by guc.c on the main thread with `newval` pointing at the candidate value
    // (a NUL-terminated, guc-malloc'd string, or NULL; both levels are NULL-checked), which we
    // only read. GUC_check_errcode and the GUC_check_err*_string variables are how a check hook
    // reports why it refused a value; the strings are pstrdup'd into the current memory context,
    // which lives until guc.c has reported them right after this hook returns.
    unsafe {
        if newval.is_null() || (*newval).is_null() {
            return true;
        }
        let text = CStr::from_ptr(*newval).to_string_lossy();
        match parse_token(&text) {
            Ok(_) => true,
            Err(e) => {
                pg_sys::GUC_check_errcode(make_sqlstate(e.sqlstate()));
                let msg = CString::new(e.to_string().replace('\0', "")).unwrap_or_default();
                pg_sys::GUC_check_errmsg_string = pg_sys::pstrdup(msg.as_ptr());
                if let Some(h) = e.hint() {
                    let hint = CString::new(h.replace('\0', "")).unwrap_or_default();
                    pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(hint.as_ptr());
                }
                false
            }
        }
    }
}

/// Assign hook of `pg_fencing.token`: keeps the parsed value in `CURRENT_TOKEN`.
///
/// # Safety
/// Only for guc.c to call, on the main thread, as a `GucStringAssignHook`: `newval` NULL or a
/// NUL-terminated string.
#[pg_guard]
unsafe extern "C-unwind" fn token_assign_hook(newval: *const c_char, _extra: *mut c_void) {
    let parsed = if newval.is_null() {
        None
    } else {
        // Already accepted by the check hook; a value that somehow fails parses as "no token",
        // which makes writes fail with FT002 rather than pass with a wrong token.
        // SAFETY: guc.c passes the value being assigned: non-NULL here (checked), NUL-terminated,
        // alive for the duration of the hook; it is copied before the hook returns.
        let text = unsafe { CStr::from_ptr(newval) }.to_string_lossy();
        parse_token(&text).ok().flatten()
    };
    CURRENT_TOKEN.store(parsed.unwrap_or(0), Ordering::Relaxed);
    TOKEN_ASSIGNMENTS.fetch_add(1, Ordering::Relaxed);
}

/// Register the GUCs. Called from `_PG_init`, with or without `shared_preload_libraries`.
pub fn init() {
    // SAFETY: called once from _PG_init on the main thread. The hooks are `#[pg_guard]`
    // `extern "C-unwind"` functions with guc.c's signatures (pgrx's requirement: a panic in them
    // becomes a PostgreSQL ERROR, never an unwind into C), and live as long as the library.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_fencing.token",
            c"Fencing token carried by plain writes to protected tables.",
            c"A positive 64-bit integer (1 .. 9223372036854775807) issued by the lock service, e.g. \
              etcd's ETCD_LOCK_REV. Empty means no token. Prefer SET LOCAL.",
            &TOKEN_SETTING,
            GucContext::Userset,
            GucFlags::from_bits_truncate(pg_sys::GUC_NOT_IN_SAMPLE as i32),
            Some(token_check_hook),
            Some(token_assign_hook),
            None,
        );
    }
    GucRegistry::define_bool_guc(
        c"pg_fencing.set_based_shape",
        c"Whether fencing_protect gives a table the set-based shape where the library is preloaded.",
        c"on (default): a plain table protected in a backend that preloaded pg_fencing gets no BEFORE INSERT row trigger, so that COPY keeps its multi-row inserts; its INSERTs and COPYs are checked once per statement by the library's hooks, and every write to it is refused (FT004) in a backend without them. off: the row-trigger shape, which needs no preloading. Read by fencing_protect only (docs/design.md, \"The set-based shape\").",
        &SET_BASED_SHAPE,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"pg_fencing.token_scope",
        c"Whether a plain SET of pg_fencing.token lasts for the transaction (default) or the session.",
        c"transaction: a token counts only in the transaction that set it, so it never reaches the next client of a transaction-mode pooler; tokens from the startup packet or fencing_acquire always count, tokens from postgresql.conf or ALTER ROLE/DATABASE SET never. session: a SET lasts for the session.",
        &TOKEN_SCOPE,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"pg_fencing.log_rejections",
        c"Message level of the log line written for each write refused for its token (FT001, FT003, FT006).",
        c"One line per refused write, with the resource or row, the token, the high-water mark, application_name, client address and backend pid. off, debug1, info, notice, warning or log (default). Superuser only, so a client cannot hide its own rejections.",
        &LOG_REJECTIONS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"pg_fencing.etcd_endpoints",
        c"Comma-separated etcd endpoints of the pg_fencing worker; empty = worker idle.",
        c"For example 127.0.0.1:2379,127.0.0.1:22379, or https://etcd1:2379. With pg_fencing.etcd_ca_file set, host:port endpoints are reached over TLS.",
        &ETCD_ENDPOINTS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_fencing.lease_ttl",
        c"TTL in seconds of the etcd lease behind each lock the worker holds.",
        c"The worker renews it every TTL/3 seconds; writes carrying a lock's token fail with FT003 once its lease was not confirmed within the TTL.",
        &LEASE_TTL,
        2,
        3600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"pg_fencing.verify_max_lag",
        c"How old the worker's view of a watched lock may be for writes to a verify resource (milliseconds).",
        c"Writes to a resource watched with verify are refused with FT006 when the worker has not confirmed etcd's state within this time.",
        &VERIFY_MAX_LAG,
        // The watch confirms its view every 200 ms; a shorter limit would refuse the holder.
        250,
        3_600_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_fencing.watch_sync_timeout",
        c"How long a write to a watched resource waits for its watch to read etcd after a (re)start (milliseconds).",
        c"After a server start, a new registration, or a database copied by pg_upgrade, pg_dump/restore, promotion or PITR, a watched resource admits no write until its watch has read the lock's state from etcd; a write waits at most this long, then fails with FT005. Default 10 s, like fencing_acquire's timeout.",
        &WATCH_SYNC_TIMEOUT,
        0,
        3_600_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    // A server-start setting can only be defined while the postmaster loads the library; a
    // session that loads it later has no pruner to configure.
    // SAFETY: a global flag the postmaster sets around loading the preloaded libraries; read on
    // the main thread from _PG_init.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        GucRegistry::define_string_guc(
            c"pg_fencing.tombstone_prune_database",
            c"Database in which the tombstone pruner worker applies fencing_tombstone_retention; empty = no pruner.",
            c"Needs shared_preload_libraries = 'pg_fencing' and the etcd worker (pg_fencing.etcd_endpoints): the pruner samples the etcd revision the worker has seen and prunes the per-row tables that have a retention, in this database only.",
            &PRUNE_DATABASE,
            GucContext::Postmaster,
            GucFlags::default(),
        );
        GucRegistry::define_int_guc(
            c"pg_fencing.max_locks",
            c"Lock slots of the pg_fencing worker: how many fencing_acquire locks the server's sessions may hold or wait for at once.",
            c"Each slot takes about 1 kB of shared memory. Beyond it fencing_acquire fails with 53400. Default 1024, at most 100000; takes effect at server start.",
            &MAX_LOCKS,
            1,
            100_000,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
    let secret = GucFlags::SUPERUSER_ONLY;
    for (name, short, long, setting) in [
        (
            c"pg_fencing.etcd_ca_file",
            c"PEM file of the CA certificates the worker trusts for etcd's server certificate; empty = no TLS.",
            c"Set, the worker speaks TLS to host:port endpoints (https:// endpoints need it). A relative path is relative to the data directory.",
            &ETCD_CA_FILE,
        ),
        (
            c"pg_fencing.etcd_cert_file",
            c"PEM file of the worker's client certificate for etcd (etcd --client-cert-auth); needs pg_fencing.etcd_key_file.",
            c"A relative path is relative to the data directory.",
            &ETCD_CERT_FILE,
        ),
        (
            c"pg_fencing.etcd_key_file",
            c"PEM file of the private key of pg_fencing.etcd_cert_file.",
            c"A relative path is relative to the data directory.",
            &ETCD_KEY_FILE,
        ),
        (
            c"pg_fencing.etcd_server_name",
            c"Name the worker checks etcd's server certificate against; empty = each endpoint's host.",
            c"For endpoints given by address whose certificate names a host.",
            &ETCD_SERVER_NAME,
        ),
        (
            c"pg_fencing.etcd_username",
            c"etcd user the worker authenticates as (etcd auth); empty = no authentication.",
            c"The password is read from pg_fencing.etcd_password_file.",
            &ETCD_USERNAME,
        ),
        (
            c"pg_fencing.etcd_password_file",
            c"File whose first line is the password of pg_fencing.etcd_username.",
            c"Must be readable by the server's operating-system user and by nobody else (mode 0600 or 0400, like .pgpass). A relative path is relative to the data directory.",
            &ETCD_PASSWORD_FILE,
        ),
    ] {
        GucRegistry::define_string_guc(name, short, long, setting, GucContext::Sighup, secret);
    }
    GucRegistry::define_int_guc(
        c"pg_fencing.tombstone_prune_interval",
        c"Seconds between two rounds of the tombstone pruner.",
        c"Each round samples the etcd revision the worker has seen and prunes the tables whose retention has passed a sample.",
        &PRUNE_INTERVAL,
        1,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_string_guc(
        c"pg_fencing.lock_prefix",
        c"etcd key prefix put in front of the lock names of fencing_acquire.",
        c"Default '' so that lock 'settlement' is the same lock as `etcdctl lock settlement`.",
        &LOCK_PREFIX,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // A misspelt setting of ours (`SET pg_fencing.tokn = ...`) is an error, not a silent
    // placeholder that a write would then run without.
    // SAFETY: called from _PG_init on the main thread, after our GUCs are defined; the name is
    // a NUL-terminated literal that PostgreSQL copies.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"pg_fencing".as_ptr()) };
}
