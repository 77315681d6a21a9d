//! Fixed-size text fields in shared memory (lock names, etcd keys, status messages), written and
//! read by backends, the worker and the worker's etcd thread at the same time.
//!
//! Each field has a spinlock of its own: every read and write of its bytes happens under it, so
//! there is no data race, and a reader never sees half of one message and half of another. The
//! critical sections only copy at most a few hundred bytes (no allocation, no PostgreSQL call,
//! nothing that can fail), so spinning is short. A backend killed while holding one makes the
//! postmaster reinitialise shared memory, as for PostgreSQL's own spinlocks.
//!
//! A state change and its message must be seen together (a slot that turns `lost` with the
//! reason why): the writer makes the change inside [`ShmemText::set_with`], under the field's
//! lock, and a reader that has seen the new state and then reads the message waits for that
//! lock, so it gets the message written with the change (or a later one), never the old one.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Sizes of the text fields of lock and watch slots, in bytes with the terminating NUL: a lock
/// or resource name, an etcd key (prefix, name and lease id), a status message.
pub const NAME_LEN: usize = 256;
pub const KEY_LEN: usize = 320;
pub const MSG_LEN: usize = 512;

pub struct ShmemText<const N: usize> {
    busy: AtomicBool,
    bytes: UnsafeCell<[u8; N]>,
}

// SAFETY: the bytes are only touched while `busy` is held (acquire on lock, release on unlock),
// which orders every access to them between threads and processes.
unsafe impl<const N: usize> Sync for ShmemText<N> {}

impl<const N: usize> Default for ShmemText<N> {
    fn default() -> Self {
        ShmemText {
            busy: AtomicBool::new(false),
            bytes: UnsafeCell::new([0; N]),
        }
    }
}

/// Holds the field's lock; released on drop.
struct Held<'a, const N: usize>(&'a ShmemText<N>);

impl<const N: usize> Held<'_, N> {
    /// Copy `text` in (NUL-terminated, cut to N - 1 bytes at a character boundary).
    fn write(&self, text: &str) {
        // SAFETY: `self` holds the lock, so no one else reads or writes the bytes.
        let bytes = unsafe { &mut *self.0.bytes.get() };
        crate::text::copy_in(bytes, text);
    }
}

impl<const N: usize> Drop for Held<'_, N> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

impl<const N: usize> ShmemText<N> {
    fn lock(&self) -> Held<'_, N> {
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        Held(self)
    }

    /// The current text.
    pub fn get(&self) -> String {
        let copy: [u8; N] = {
            let _held = self.lock();
            // SAFETY: under the lock; a plain copy of the array.
            unsafe { *self.bytes.get() }
        };
        crate::text::read_out(&copy)
    }

    /// Whether the text is `text`, compared in place (no copy, for hot paths).
    pub fn equals(&self, text: &str) -> bool {
        if text.len() >= N {
            return false;
        }
        let _held = self.lock();
        // SAFETY: under the lock; only read.
        let bytes = unsafe { &*self.bytes.get() };
        crate::text::equals(bytes, text)
    }

    /// Replace the text.
    pub fn set(&self, text: &str) {
        self.lock().write(text);
    }

    /// Run `change` under the field's lock and, if it returns true, set the text to `text`
    /// before the lock is released: for a state change that must be seen with its message.
    /// `change` must be short and must not touch this field (it would wait for itself).
    pub fn set_with(&self, text: &str, change: impl FnOnce() -> bool) -> bool {
        let held = self.lock();
        let changed = change();
        if changed {
            held.write(text);
        }
        changed
    }
}

#[cfg(test)]
mod unit {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    #[test]
    fn text_is_cut_at_a_character_boundary() {
        let t: ShmemText<6> = ShmemText::default();
        t.set("abcdé"); // 'é' is two bytes: "abcdé" is 6 bytes, one more than fits
        assert_eq!(t.get(), "abcd");
        t.set("xy");
        assert_eq!(t.get(), "xy");
        assert!(t.equals("xy"));
        assert!(!t.equals("x") && !t.equals("xyz") && !t.equals("abcdef"));
    }

    #[test]
    fn set_with_changes_state_and_text_together() {
        let t: ShmemText<16> = ShmemText::default();
        let state = AtomicU32::new(1);
        assert!(t.set_with("lost", || state
            .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()));
        assert!(!t.set_with("again", || state
            .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()));
        assert_eq!(t.get(), "lost");
    }

    #[test]
    fn readers_never_see_a_mix_of_two_messages() {
        // Two writers alternate between two messages of the full length; readers must only
        // ever see one or the other whole.
        let t: Arc<ShmemText<64>> = Arc::new(ShmemText::default());
        let a = "a".repeat(63);
        let b = "b".repeat(63);
        t.set(&a);
        let writers: Vec<_> = [a.clone(), b.clone()]
            .into_iter()
            .map(|m| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        t.set(&m);
                    }
                })
            })
            .collect();
        for _ in 0..20_000 {
            let seen = t.get();
            assert!(seen == a || seen == b, "torn message: {seen}");
        }
        for w in writers {
            assert!(w.join().is_ok());
        }
    }
}
