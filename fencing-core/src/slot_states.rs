//! The states of the lock service's shared-memory slots, and every transition between them.
//!
//! A slot's state lives in an `AtomicU32` in shared memory, written by backends, the worker's
//! main thread and its etcd thread at the same time; every change is a compare-and-swap from
//! one of these states to another (`transition` in `src/lock_service/etcd_locks.rs` and
//! `src/lock_service/watch.rs`), and only the pairs `may_become` allows are made: anything else
//! is a bug, refused (debug builds panic). The tables below are the protocol; the tests check
//! that no state is a dead end.

/// An etcd lock slot (`fencing_acquire`, `fencing_release`).
///
/// | from | to | who, when |
/// |---|---|---|
/// | Free | Reserved | a backend takes the slot for a request |
/// | Reserved | Requested | it has filled the request in and publishes it |
/// | Reserved, Requested, Acquiring | Cancelled | the backend gives up (cancel, timeout, abort) |
/// | Requested | Acquiring | the worker hands the request to the etcd thread |
/// | Requested | Free | the backend, when no worker runs to take it |
/// | Requested, Acquiring | Failed | etcd unreachable, the wait timed out, the lease was lost |
/// | Acquiring | Held | the etcd thread was granted the lock |
/// | Held | Lost | its key or lease is gone, or etcd's revisions went backwards |
/// | Held, Lost | ReleaseRequested | the backend releases it (`fencing_release`, session end, abort) |
/// | ReleaseRequested | Releasing | the worker hands the release to the etcd thread |
/// | ReleaseRequested, Releasing, Cancelled | Free | the etcd thread (or a worker that stops) cleaned up |
/// | Failed | Free | the backend has read the failure |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum LockSlotState {
    Free = 0,
    Reserved = 1,
    Requested = 2,
    Acquiring = 3,
    Held = 4,
    Failed = 5,
    Cancelled = 6,
    ReleaseRequested = 7,
    Releasing = 8,
    Lost = 9,
}

impl LockSlotState {
    pub const ALL: [LockSlotState; 10] = [
        Self::Free,
        Self::Reserved,
        Self::Requested,
        Self::Acquiring,
        Self::Held,
        Self::Failed,
        Self::Cancelled,
        Self::ReleaseRequested,
        Self::Releasing,
        Self::Lost,
    ];

    /// The state stored as `v`. Only `as u32` of a state is ever stored, so any other value
    /// means the shared memory is corrupt.
    pub fn from_u32(v: u32) -> LockSlotState {
        Self::ALL
            .get(v as usize)
            .copied()
            .unwrap_or_else(|| panic!("lock slot state {v} is none of LockSlotState"))
    }

    /// Is `self` to `to` a transition of the protocol (the table above)?
    pub const fn may_become(self, to: LockSlotState) -> bool {
        use LockSlotState::*;
        matches!(
            (self, to),
            (Free, Reserved)
                | (Reserved, Requested)
                | (Reserved | Requested | Acquiring, Cancelled)
                | (Requested, Acquiring)
                | (Requested, Free)
                | (Requested | Acquiring, Failed)
                | (Acquiring, Held)
                | (Held, Lost)
                | (Held | Lost, ReleaseRequested)
                | (ReleaseRequested, Releasing)
                | (ReleaseRequested | Releasing | Cancelled, Free)
                | (Failed, Free)
        )
    }
}

/// Why an acquisition failed (a `Failed` slot's error code, read by the requesting backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum AcquireFailure {
    /// etcd could not be reached (FT005).
    Unreachable = 1,
    /// The caller's timeout ran out (55P03).
    Timeout = 2,
    /// The session's lease ended while the request queued (FT003, "not granted").
    Lease = 3,
    /// Anything else, said in the slot's message (FT005).
    Other = 4,
}

impl AcquireFailure {
    /// The failure stored as `v` (0, or a value never stored, reads as `Other`: the message says why).
    pub fn from_u32(v: u32) -> AcquireFailure {
        match v {
            1 => Self::Unreachable,
            2 => Self::Timeout,
            3 => Self::Lease,
            _ => Self::Other,
        }
    }
}

/// A watched resource's slot (`fencing_watch`, `fencing_unwatch`).
///
/// | from | to | who, when |
/// |---|---|---|
/// | Free | Busy | a backend (or the state file's reader) takes the slot for a registration |
/// | Busy | Active | it has filled the slot in; the etcd thread starts the watch |
/// | Active | Stopping | a committing transaction unwatched it: still enforced, no longer raised |
/// | Stopping | Active | that commit failed (`undo_applied`) |
/// | Stopping, Active | Draining | the commit is done, or the registration is gone |
/// | Draining | Free | the etcd thread has stopped the slot's watch task |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WatchSlotState {
    Free = 0,
    Active = 1,
    Busy = 2,
    Draining = 3,
    Stopping = 4,
}

impl WatchSlotState {
    pub const ALL: [WatchSlotState; 5] = [
        Self::Free,
        Self::Active,
        Self::Busy,
        Self::Draining,
        Self::Stopping,
    ];

    /// The state stored as `v` (see `LockSlotState::from_u32`).
    pub fn from_u32(v: u32) -> WatchSlotState {
        Self::ALL
            .get(v as usize)
            .copied()
            .unwrap_or_else(|| panic!("watch slot state {v} is none of WatchSlotState"))
    }

    /// Is `self` to `to` a transition of the protocol (the table above)?
    pub const fn may_become(self, to: WatchSlotState) -> bool {
        use WatchSlotState::*;
        matches!(
            (self, to),
            (Free, Busy)
                | (Busy, Active)
                | (Active, Stopping)
                | (Stopping, Active)
                | (Stopping | Active, Draining)
                | (Draining, Free)
        )
    }

    /// Is a slot in this state enforced by the fencing check (and listed, and saved)?
    pub const fn enforced(self) -> bool {
        matches!(self, Self::Active | Self::Stopping)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn reachable<S: Copy + Eq + std::hash::Hash>(
        from: S,
        all: &[S],
        edge: impl Fn(S, S) -> bool,
    ) -> HashSet<S> {
        let mut seen = HashSet::from([from]);
        let mut todo = vec![from];
        while let Some(s) = todo.pop() {
            for &t in all {
                if edge(s, t) && seen.insert(t) {
                    todo.push(t);
                }
            }
        }
        seen
    }

    #[test]
    fn every_lock_slot_state_is_reached_from_free_and_leads_back_to_it() {
        let all = LockSlotState::ALL;
        let from_free = reachable(LockSlotState::Free, &all, |a, b| a.may_become(b));
        assert_eq!(
            from_free.len(),
            all.len(),
            "unreachable: {:?}",
            all.iter()
                .filter(|s| !from_free.contains(s))
                .collect::<Vec<_>>()
        );
        for s in all {
            assert!(
                reachable(s, &all, |a, b| a.may_become(b)).contains(&LockSlotState::Free),
                "{s:?} never becomes Free again"
            );
        }
    }

    #[test]
    fn every_watch_slot_state_is_reached_from_free_and_leads_back_to_it() {
        let all = WatchSlotState::ALL;
        let from_free = reachable(WatchSlotState::Free, &all, |a, b| a.may_become(b));
        assert_eq!(from_free.len(), all.len());
        for s in all {
            assert!(
                reachable(s, &all, |a, b| a.may_become(b)).contains(&WatchSlotState::Free),
                "{s:?}"
            );
        }
    }

    #[test]
    fn states_round_trip_through_their_stored_value() {
        for s in LockSlotState::ALL {
            assert_eq!(LockSlotState::from_u32(s as u32), s);
            assert!(!s.may_become(s), "{s:?} to itself is no transition");
        }
        for s in WatchSlotState::ALL {
            assert_eq!(WatchSlotState::from_u32(s as u32), s);
        }
        for f in [
            AcquireFailure::Unreachable,
            AcquireFailure::Timeout,
            AcquireFailure::Lease,
            AcquireFailure::Other,
        ] {
            assert_eq!(AcquireFailure::from_u32(f as u32), f);
        }
    }

    #[test]
    fn a_held_lock_is_given_up_only_through_a_release_or_its_loss() {
        use LockSlotState::*;
        for to in LockSlotState::ALL {
            assert_eq!(
                Held.may_become(to),
                matches!(to, Lost | ReleaseRequested),
                "Held -> {to:?}"
            );
        }
        // Only the etcd thread's grant makes a lock held.
        for from in LockSlotState::ALL {
            assert_eq!(from.may_become(Held), from == Acquiring, "{from:?} -> Held");
        }
    }
}
