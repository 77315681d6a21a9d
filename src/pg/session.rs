//! Who the current session is, for the rejection log line and the views' last rejection.

use crate::backend_event::BackendEvent;
use pgrx::pg_sys;

/// Where a refused write came from: the session's `application_name`, its client address
/// (`host:port`, `[local]` for a Unix socket, empty for a background process) and backend pid.
pub struct Origin {
    pub application_name: String,
    pub client: String,
    pub pid: i32,
}

thread_local! {
    /// The client address never changes during a backend's life; computed on first need.
    static CLIENT: std::cell::OnceCell<String> = const { std::cell::OnceCell::new() };
}

/// The origin of the current session (see `Origin`). Must run inside a pgrx guard: it calls
/// PostgreSQL's `inet_client_addr()`/`inet_client_port()` the first time.
pub fn origin() -> Origin {
    let client = CLIENT.with(|c| c.get_or_init(client_address).clone());
    // SAFETY: main thread. `application_name` is the GUC's `char *`: NULL or a NUL-terminated
    // string owned by guc.c that only a GUC assignment replaces, and none can happen while it is
    // copied into a Rust String here.
    let application_name = unsafe {
        let p = pg_sys::application_name;
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Origin {
        application_name,
        client,
        // SAFETY: MyProcPid is set at process start and only read afterwards.
        pid: unsafe { pg_sys::MyProcPid },
    }
}

fn client_address() -> String {
    // SAFETY: main thread, inside a pgrx guard (see `origin`). MyProcPort is NULL or the
    // backend's connection, set at startup and alive for the whole session. inet_client_addr and
    // inet_client_port take no arguments and return NULL (None) for a Unix socket; inet_out gets
    // the inet datum inet_client_addr just returned and returns a palloc'd NUL-terminated
    // cstring (non-NULL, as a strict output function), copied into a Rust String at once.
    unsafe {
        if pg_sys::MyProcPort.is_null() {
            return String::new();
        }
        // Both are NULL for a Unix-socket connection.
        let Some(addr) = pgrx::direct_function_call_as_datum(pg_sys::inet_client_addr, &[]) else {
            return "[local]".into();
        };
        let text = pgrx::direct_function_call_as_datum(pg_sys::inet_out, &[Some(addr)])
            .map(|d| {
                std::ffi::CStr::from_ptr(d.cast_mut_ptr::<std::ffi::c_char>())
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        let port = pgrx::direct_function_call::<i32>(pg_sys::inet_client_port, &[]);
        let host = if text.contains(':') {
            format!("[{text}]")
        } else {
            text
        };
        match port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }
}

/// Per-backend state's life (`backend.rs`): the client's origin is read once and holds for the
/// backend's life; no event clears it.
pub fn on_event(_ev: BackendEvent) {}
