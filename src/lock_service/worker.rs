//! The background worker's main thread (PostgreSQL's `autoprewarm.c` discipline): the only thread
//! of the worker that calls PostgreSQL. It waits on its latch (1 s at most), handles SIGHUP
//! (re-reads the settings and passes them on), SIGTERM and postmaster death, loads the state
//! files at start, saves the etcd state file when it stops, and forwards the backends' requests from the lock
//! slots to the etcd thread over a channel. The etcd thread (`etcd/`) is spawned with every
//! signal blocked, so PostgreSQL's handlers only ever run here.
//!
//! On SIGTERM or postmaster death every held lock is marked lost first (writes with its token
//! fail at once, FT003), then the etcd thread gets a short chance to revoke the leases.

use super::etcd::client::{Config, Security};
use super::etcd::mutex::Cmd;
use super::etcd_locks::*;
use super::{etcd, watch};
use crate::gucs;
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn read_config(dir: &str) -> Config {
    Config {
        endpoints: gucs::etcd_endpoints()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        ttl: gucs::lease_ttl() as i64,
        state_dir: dir.to_string(),
        security: read_security(dir),
    }
}

/// The TLS and authentication settings, with their files read (paths relative to the data
/// directory `dir`). What cannot be used is kept as the reason every connection fails with.
fn read_security(dir: &str) -> Security {
    let [ca, cert, key, server_name, user, password_file] = gucs::etcd_security();
    let read = |setting: &str, path: &str| -> Result<Option<Vec<u8>>, String> {
        if path.is_empty() {
            return Ok(None);
        }
        let full = std::path::Path::new(dir).join(path);
        std::fs::read(&full)
            .map(Some)
            .map_err(|e| format!("cannot read {setting} \"{}\": {e}", full.display()))
    };
    let mut sec = Security {
        server_name: (!server_name.is_empty()).then_some(server_name),
        ..Security::default()
    };
    let files = (|| -> Result<(), String> {
        sec.ca_pem = read("pg_fencing.etcd_ca_file", &ca)?;
        match (
            read("pg_fencing.etcd_cert_file", &cert)?,
            read("pg_fencing.etcd_key_file", &key)?,
        ) {
            (Some(c), Some(k)) => sec.client_pem = Some((c, k)),
            (None, None) => {}
            _ => {
                return Err(
                    "pg_fencing.etcd_cert_file and pg_fencing.etcd_key_file must be set together"
                        .into(),
                )
            }
        }
        if sec.client_pem.is_some() && sec.ca_pem.is_none() {
            return Err("pg_fencing.etcd_cert_file needs pg_fencing.etcd_ca_file (the client certificate is only sent over TLS)".into());
        }
        match (user.is_empty(), password_file.is_empty()) {
            (true, true) => {}
            (false, false) => {
                let full = std::path::Path::new(dir).join(&password_file);
                check_private(&full)?;
                let text =
                    read("pg_fencing.etcd_password_file", &password_file)?.unwrap_or_default();
                let password = String::from_utf8_lossy(&text)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                sec.user = Some((user.clone(), password));
            }
            _ => return Err(
                "pg_fencing.etcd_username and pg_fencing.etcd_password_file must be set together"
                    .into(),
            ),
        }
        Ok(())
    })();
    if let Err(why) = files {
        sec.problem = Some(why);
    }
    sec
}

/// A password file must be readable by the server's user alone (like libpq's `.pgpass`): one
/// that group or others may read is refused, with why.
fn check_private(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| {
        format!(
            "cannot read pg_fencing.etcd_password_file \"{}\": {e}",
            path.display()
        )
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "pg_fencing.etcd_password_file \"{}\" has mode {mode:04o}: it must not be accessible to group or others (chmod 0600)",
            path.display()
        ));
    }
    Ok(())
}

/// Entry point of the background worker.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_fencing_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let sh = SHARED.get();
    // A previous incarnation of the worker died: its leases are no longer kept alive.
    for s in sh.slots().iter() {
        let why = "the pg_fencing worker restarted";
        let _ = s.transition_saying(S::Held, S::Lost, why);
        let _ = s.fail_from(
            &[S::Acquiring, S::Requested],
            AcquireFailure::Unreachable,
            why,
        );
        let _ = s.transition(S::ReleaseRequested, S::Free);
        let _ = s.transition(S::Releasing, S::Free);
        let _ = s.transition(S::Cancelled, S::Free);
    }
    let dir = data_dir();
    if let Ok(text) = std::fs::read_to_string(std::path::Path::new(&dir).join(STATE_FILE)) {
        sh.load_state_text(&text);
    }
    if let Some(wsh) = watch::shared() {
        match watch::StateLock::take_interruptible(&dir) {
            Ok(_lock) => {
                for line in watch::load_state(wsh, &dir) {
                    pgrx::warning!("pg_fencing: ignored a line of pg_fencing_watches.state it cannot read: {line:?}");
                }
            }
            Err(e) => pgrx::warning!("pg_fencing: could not lock pg_fencing_watches.state: {e}"),
        }
    }
    let mut logged_regression = false;
    let mut last_problem = String::new();
    sh.worker_pid
        .store(crate::pg::process::my_pid(), Ordering::Relaxed);
    sh.worker_latch
        .store(crate::pg::process::my_latch(), Ordering::Release);
    log!(
        "pg_fencing worker started (etcd endpoints: \"{}\")",
        gucs::etcd_endpoints()
    );

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Cmd>();
    let cfg = read_config(&dir);
    // The etcd thread must never run PostgreSQL's signal handlers: they belong to this thread. A
    // thread starts with its creator's signal mask, so block everything here before spawning
    // (blocking inside the new thread would leave a window) and restore this thread's mask
    // afterwards; tokio's threads inherit the blocked mask in turn.
    let blocked = AllSignalsBlocked::new();
    let thread = std::thread::Builder::new()
        .name("pg_fencing etcd".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match rt {
                Ok(rt) => rt.block_on(etcd::mutex::run(rx, cfg, sh)),
                Err(e) => eprintln!("pg_fencing: could not start the etcd runtime: {e}"),
            }
        });
    drop(blocked);
    if let Err(e) = thread {
        crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(format!(
            "could not start the etcd thread: {e}"
        )));
    }

    let mut dispatched: Vec<u64> = vec![0; sh.slot_count()];
    let mut acquiring: Vec<u64> = vec![u64::MAX; sh.slot_count()];
    while BackgroundWorker::wait_latch(Some(Duration::from_millis(1000))) {
        if BackgroundWorker::sighup_received() {
            crate::pg::process::reload_config();
            let _ = tx.send(Cmd::Config(Box::new(read_config(&dir))));
        }
        // Problems of the connection to etcd, logged once per change (the etcd thread cannot
        // log: it never calls PostgreSQL).
        let problem = sh.etcd_problem.get();
        if problem != last_problem {
            if problem.is_empty() {
                log!("pg_fencing: the worker reaches etcd again");
            } else {
                pgrx::warning!("pg_fencing: worker: {problem}");
            }
            last_problem = problem;
        }
        match sh.regression() {
            Some(why) if !logged_regression => {
                pgrx::warning!("pg_fencing: the worker stopped handing out tokens: {why}. Check etcd, then run fencing_reset (see docs/operations.md, \"Recovery after an etcd restore\").");
                logged_regression = true;
            }
            None => logged_regression = false,
            _ => {}
        }
        // The state file is saved by the etcd thread, off this loop: a save is two fsyncs, and
        // this loop forwards the requests (see "Revision regression" in etcd_locks.rs).
        for (i, s) in sh.slots().iter().enumerate() {
            // The generation is read after the state, never before: a slot freed and taken
            // again between the two reads would otherwise be sent to the etcd thread with its
            // previous request's generation, and that request's clean-up would never come (the
            // etcd thread's tasks act only on their own generation). A backend writes the
            // generation before it publishes Requested (release), and it cannot change while
            // the slot is not Free; only this thread sends requests, so a generation newer than
            // the state that was read has never been sent.
            match s.state() {
                S::Requested if s.transition(S::Requested, S::Acquiring) => {
                    let generation = s.generation.load(Ordering::Acquire);
                    acquiring[i] = generation;
                    let _ = tx.send(Cmd::Acquire(i, generation));
                }
                S::ReleaseRequested if s.transition(S::ReleaseRequested, S::Releasing) => {
                    let generation = s.generation.load(Ordering::Acquire);
                    let _ = tx.send(Cmd::Release(i, generation));
                }
                S::Cancelled => {
                    let generation = s.generation.load(Ordering::Acquire);
                    if acquiring[i] != generation {
                        // Cancelled before the request reached the etcd thread: nothing to
                        // clean up.
                        let _ = s.transition(S::Cancelled, S::Free);
                    } else if dispatched[i] != generation {
                        dispatched[i] = generation;
                        let _ = tx.send(Cmd::Cancel(i, generation));
                    }
                }
                _ => {}
            }
        }
    }
    // SIGTERM or postmaster death. First make every held lock lost, so that writes with their
    // tokens fail at once (FT003): nobody keeps their leases alive from now on. Then revoke the
    // leases if etcd answers quickly, never waiting long.
    sh.worker_latch.store(0, Ordering::Release);
    for s in sh.slots().iter() {
        let why = "the pg_fencing worker stopped";
        let _ = s.transition_saying(S::Held, S::Lost, why);
        let _ = s.fail_from(
            &[S::Acquiring, S::Requested],
            AcquireFailure::Unreachable,
            why,
        );
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    if tx.send(Cmd::Shutdown(done_tx)).is_ok() {
        let _ = done_rx.recv_timeout(Duration::from_millis(700));
    }
    // What the etcd thread had not saved yet (a higher revision waits up to STATE_SAVE_INTERVAL).
    if let Err(e) = save_state(sh, &dir, "worker") {
        pgrx::warning!("pg_fencing: could not save {STATE_FILE}: {e}");
    }
    log!("pg_fencing worker stopped");
    // Exit code 1: if only the worker was stopped (not the server), the postmaster restarts it.
    crate::pg::process::exit(1);
}

/// Every signal blocked on the calling thread while this value lives; the thread's previous mask
/// comes back when it is dropped. Signals that arrive meanwhile stay pending and are delivered
/// then.
struct AllSignalsBlocked(libc::sigset_t);

impl AllSignalsBlocked {
    fn new() -> Self {
        // SAFETY: sigfillset initialises `all`; pthread_sigmask changes only the calling thread's
        // mask and writes the previous one into `old`, which it fully initialises.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            AllSignalsBlocked(old)
        }
    }
}

impl Drop for AllSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: pthread_sigmask with a mask that `new` filled in; the value is made and
        // dropped within one function on the worker's main thread, so the mask returns to the
        // thread it came from.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}
