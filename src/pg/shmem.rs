//! Shared-memory arrays whose length is a server-start setting (`pg_fencing.max_locks`), which
//! pgrx's `pg_shmem_init!` (one fixed-size type per segment) cannot size. Like it, the space is
//! requested in `shmem_request_hook` (PostgreSQL 15 and later read the settings before that
//! hook runs) and attached in `shmem_startup_hook`, where the postmaster fills every element
//! with its `Default` before any child process exists; children inherit the mapping.

use pgrx::pg_sys;
use pgrx::PGRXSharedMemory;
use std::ffi::CStr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// A `[T]` in shared memory named `name`, of `len()` elements decided at server start.
pub struct ShmemArray<T: 'static> {
    name: &'static CStr,
    length: fn() -> usize,
    ptr: AtomicPtr<T>,
    len: AtomicUsize,
}

impl<T: PGRXSharedMemory + Default + Sync + 'static> ShmemArray<T> {
    /// `length` is called once, in the postmaster's `shmem_request_hook`.
    pub const fn new(name: &'static CStr, length: fn() -> usize) -> Self {
        ShmemArray {
            name,
            length,
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
        }
    }

    /// Register the array: only while preloading (`_PG_init` of `shared_preload_libraries`).
    pub fn init(&'static self) {
        if let Ok(mut areas) = AREAS.lock() {
            areas.push(self);
        }
        install_hooks();
    }

    /// The elements (empty if `init` was not called while preloading).
    pub fn get(&self) -> &'static [T] {
        let ptr = self.ptr.load(Ordering::Acquire);
        if ptr.is_null() {
            return &[];
        }
        // SAFETY: `ptr` points at `len` elements that `attach` initialised in shared memory,
        // which stays mapped at the same address for the life of every process (inherited from
        // the postmaster); `T: PGRXSharedMemory + Sync` says shared references to them may be
        // used by every process and thread at once.
        unsafe { std::slice::from_raw_parts(ptr, self.len.load(Ordering::Acquire)) }
    }

    fn bytes(&self) -> usize {
        std::mem::size_of::<T>() * self.len.load(Ordering::Acquire)
    }
}

trait Area: Sync {
    fn request(&self);
    /// # Safety
    /// In `shmem_startup_hook`, holding `AddinShmemInitLock`.
    unsafe fn attach(&self);
}

impl<T: PGRXSharedMemory + Default + Sync + 'static> Area for ShmemArray<T> {
    fn request(&self) {
        self.len.store((self.length)(), Ordering::Release);
        // SAFETY: called from shmem_request_hook, the only time RequestAddinShmemSpace is
        // allowed; it only adds to the postmaster's shared-memory size.
        unsafe { pg_sys::RequestAddinShmemSpace(self.bytes()) };
    }

    unsafe fn attach(&self) {
        let mut found = false;
        // SAFETY: ShmemInitStruct finds or allocates the named area of the size requested in
        // shmem_request_hook (raising an ERROR if it does not fit); the caller holds
        // AddinShmemInitLock, as it requires.
        let ptr = unsafe { pg_sys::ShmemInitStruct(self.name.as_ptr(), self.bytes(), &mut found) }
            .cast::<T>();
        assert!(ptr.is_aligned(), "shared memory is not aligned");
        if !found {
            for i in 0..self.len.load(Ordering::Acquire) {
                // SAFETY: `ptr` has room for `len` aligned elements (just allocated with that
                // size); each is written once, before any other process can see the area.
                unsafe { ptr.add(i).write(T::default()) };
            }
        }
        self.ptr.store(ptr, Ordering::Release);
    }
}

static AREAS: std::sync::Mutex<Vec<&'static dyn Area>> = std::sync::Mutex::new(Vec::new());
/// The hooks that were installed before ours, called first (set once, as `api/hooks.rs` does).
static PREV_REQUEST: std::sync::OnceLock<pg_sys::shmem_request_hook_type> =
    std::sync::OnceLock::new();
static PREV_STARTUP: std::sync::OnceLock<pg_sys::shmem_startup_hook_type> =
    std::sync::OnceLock::new();

fn install_hooks() {
    // SAFETY: _PG_init runs on the postmaster's only thread while it loads the preloaded
    // libraries, before either hook can run; the previous hooks are kept and called first. The
    // OnceLocks make a second call a no-op.
    unsafe {
        if PREV_REQUEST.set(pg_sys::shmem_request_hook).is_ok() {
            pg_sys::shmem_request_hook = Some(on_request);
        }
        if PREV_STARTUP.set(pg_sys::shmem_startup_hook).is_ok() {
            pg_sys::shmem_startup_hook = Some(on_startup);
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_request() {
    // SAFETY: the previous hook was installed by another library for this same moment.
    unsafe {
        if let Some(prev) = PREV_REQUEST.get().copied().flatten() {
            prev();
        }
    }
    if let Ok(areas) = AREAS.lock() {
        for a in areas.iter() {
            a.request();
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_startup() {
    // SAFETY: as in on_request. AddinShmemInitLock (MainLWLockArray[21], as pgrx's own
    // `PgAtomic` uses it) serialises the initialisation of add-in shared memory.
    unsafe {
        if let Some(prev) = PREV_STARTUP.get().copied().flatten() {
            prev();
        }
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        if let Ok(areas) = AREAS.lock() {
            for a in areas.iter() {
                a.attach();
            }
        }
        pg_sys::LWLockRelease(lock);
    }
}
