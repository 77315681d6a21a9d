//! The decisions of a watched resource's watch (`fencing_watch`), without etcd or PostgreSQL:
//! how a (re)started watch finds the hand-overs it has not applied yet, and which revision each
//! event of etcd's history makes the resource's hand-over revision. `src/lock_service/etcd/watch.rs` drives these
//! with etcd's answers; the model at the end of this file drives them with every order of lock
//! requests, releases, compactions, lost connections, server restarts and database copies up to a
//! bound, and checks that no write from a fenced-off holder is ever admitted.
//!
//! The lock is etcd's lock recipe: each contender puts a key under the lock's prefix; the holder
//! is the key with the lowest create revision; a contender is granted the lock at the later of
//! its key's create revision and the deletion of the last key ahead of it. That revision is its
//! fencing token, and the hand-over revision the watch raises the mark to.

use std::collections::BTreeMap;

/// The create revision of the lock's holder among `keys` (key -> create revision).
pub fn holder<K>(keys: &BTreeMap<K, i64>) -> Option<i64> {
    keys.values().copied().min()
}

/// The revision at which the key created at `hc`, the lock's holder at revision `r0`, was
/// granted the lock: the first revision in `[hc, r0]` at which it is the holder (it has held the
/// lock ever since). Found by bisection over reads of the lock's keys at past revisions; a
/// (re)started watch uses it instead of replaying the history through a watch, whose end etcd 3.4
/// cannot report (it answers a progress request at once, before the replayed events). Every
/// other key that ever held the lock was granted earlier, so this grant fences all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantSearch {
    lo: i64,
    hi: i64,
}

impl GrantSearch {
    pub fn new(hc: i64, r0: i64) -> Self {
        GrantSearch {
            lo: hc,
            hi: r0.max(hc),
        }
    }
    /// The next revision to read the lock's keys at, or None when the grant is found.
    pub fn next(&self) -> Option<i64> {
        (self.lo < self.hi).then(|| self.lo + (self.hi - self.lo) / 2)
    }
    /// What the read at `rev` showed: whether the key created at `hc` held the lock then.
    pub fn holder_at(&mut self, rev: i64, is_holder: bool) {
        if is_holder {
            self.hi = self.hi.min(rev);
        } else {
            self.lo = self.lo.max(rev + 1);
        }
    }
    pub fn grant(&self) -> i64 {
        self.hi
    }
}

/// The history before `compaction` is gone: the safe bound for it, given the create revision of
/// the key that held the lock at the compaction revision (if any), and the last hand-over the
/// watch applied with the create revision of the key it went to. Every token issued up to the
/// compaction revision is at most that revision, and the holder then was granted the lock no
/// later, so the compaction revision is always safe; it is exact when nobody held the lock. When
/// the holder then is the one whose grant the watch applied last, that grant is exact (so a
/// long-held lock keeps its holder's token valid across restarts and compactions); otherwise the
/// holder's grant lies somewhere between its key's creation and the compaction revision, and a
/// predecessor may have been granted after that key was created, so only the compaction revision
/// fences every predecessor (the holder itself then has to take the lock again if its grant was
/// earlier: refused, never a stale write admitted).
pub fn compacted_bound(
    holder_then: Option<i64>,
    compaction: i64,
    applied: i64,
    applied_key_create: i64,
) -> i64 {
    match holder_then {
        Some(hc) if applied > 0 && hc == applied_key_create => applied,
        _ => compaction,
    }
}

/// One event of the lock's history, applied to the watch's view of the keys. Returns the
/// hand-over revision if the event gave the lock to a new holder (the later of its key's create
/// revision and this event's revision), with the new holder's key's create revision.
pub fn apply_event<K: Ord>(
    keys: &mut BTreeMap<K, i64>,
    key: K,
    put_create_revision: Option<i64>,
    revision: i64,
) -> Option<(i64, i64)> {
    let before = holder(keys);
    match put_create_revision {
        Some(c) => {
            keys.entry(key).or_insert(c);
        }
        None => {
            keys.remove(&key);
        }
    }
    let after = holder(keys);
    match after {
        Some(hc) if after != before => Some((hc.max(revision), hc)),
        _ => None,
    }
}

#[cfg(test)]
mod model {
    //! Exhaustive exploration of the watch protocol (issue 14: "a small model of the watch /
    //! hand-over / restart protocol explored exhaustively"). Every sequence of up to `DEPTH`
    //! steps over three contenders is explored (with states already seen pruned):
    //!   request / release(or lease expiry) of the lock by each contender; etcd compaction; the
    //!   watch losing its connection; the watch (re)connecting, which derives the hand-over
    //!   revision from the keys at the current revision (`GrantSearch`, or `compacted_bound` when
    //!   the history it needs is gone) and only then admits writes; PostgreSQL restarting (shared memory lost, the state file kept, possibly
    //!   behind); the database copied to a new server (pg_upgrade, restore, promotion: the
    //!   state file lost too); the state file saved; a write by each contender with its token.
    //! Checked after every step: an admitted write's token is at least every grant the watch has
    //! seen (while connected) or could see (at its last (re)start), so a holder fenced off by a
    //! hand-over never writes again; the tokens of admitted writes never decrease; and the
    //! current holder is never refused by a synced watch (no over-fencing with history intact).
    use super::*;
    use std::collections::{HashSet, VecDeque};

    const CLIENTS: usize = 3;
    const DEPTH: usize = 9;

    /// Which restart strategy the watch uses (the model also shows that the one before issue
    /// 14 had the gap).
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Strategy {
        Replay,
        /// Before issue 14: start at the current revision, keep the applied revision as it is.
        FromNow,
    }

    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct State {
        rev: i64,
        /// Contender -> create revision of its key.
        keys: BTreeMap<usize, i64>,
        /// (revision, contender, Some(create revision) for a put, None for a delete).
        history: Vec<(i64, usize, Option<i64>)>,
        compacted: i64,
        /// Each contender's token (grant revision) if it was ever granted the lock.
        token: [Option<i64>; CLIENTS],
        /// The watch: hand-over revision in shared memory, in the state file; connected and
        /// replayed (`synced`), and the watch's view of the keys while connected.
        handover: i64,
        /// The create revision of the key whose grant `handover` is (0: not a known grant).
        handover_key: i64,
        file: (i64, i64),
        synced: bool,
        view: BTreeMap<usize, i64>,
        /// Stored mark (highest admitted token).
        mark: i64,
        /// The highest grant the watch must fence from: seen while connected, or granted before
        /// its last (re)start.
        must: i64,
        steps: usize,
    }

    fn grant_on_change(s: &mut State, revision: i64, before: Option<i64>) {
        let after = holder(&s.keys);
        if after != before {
            if let Some(hc) = after {
                let c = *s.keys.iter().find(|(_, v)| **v == hc).unwrap().0;
                let g = hc.max(revision);
                s.token[c] = Some(g);
                if s.synced {
                    // Delivered at once to a connected watch.
                    s.must = s.must.max(g);
                }
            }
        }
    }

    fn deliver(s: &mut State, c: usize, put: Option<i64>, revision: i64) {
        if s.synced {
            if let Some((r, k)) = apply_event(&mut s.view, c, put, revision) {
                raise_to(s, r, k);
            }
        }
    }

    /// As `WatchSlot::raise_handover`: the hand-over revision only goes up; it remembers whose
    /// grant it is (0 for a bound that is no known grant).
    fn raise_to(s: &mut State, r: i64, key: i64) {
        if r > s.handover {
            s.handover = r;
            s.handover_key = key;
        }
    }

    /// The watch (re)connects, as `src/lock_service/etcd/watch.rs` does: from the keys at the current revision
    /// alone (free: the current revision; held: the holder's grant, by `GrantSearch` over reads
    /// at past revisions, or `compacted_bound` where those are compacted); then it follows live
    /// events.
    fn reconnect(s: &mut State, strategy: Strategy) {
        let r0 = s.rev;
        let applied = s.handover;
        let applied_key = s.handover_key;
        let at = |s: &State, r: i64| -> BTreeMap<usize, i64> {
            let mut k = BTreeMap::new();
            for (rv, c, put) in &s.history {
                if *rv <= r {
                    apply_event(&mut k, *c, *put, *rv);
                }
            }
            k
        };
        match (strategy, holder(&s.keys)) {
            (Strategy::FromNow, Some(hc)) => raise_to(s, hc, 0),
            (Strategy::FromNow, None) => {}
            (Strategy::Replay, None) => raise_to(s, r0, 0),
            (Strategy::Replay, Some(hc)) => {
                let mut search = GrantSearch::new(hc, r0);
                let mut bound = None;
                while let Some(mid) = search.next() {
                    if mid < s.compacted {
                        // The read fails; etcd says where its history starts.
                        let cr = s.compacted;
                        if holder(&at(s, cr)) == Some(hc) {
                            bound = Some(compacted_bound(Some(hc), cr, applied, applied_key));
                            break;
                        }
                        search.holder_at(cr, false);
                        continue;
                    }
                    search.holder_at(mid, holder(&at(s, mid)) == Some(hc));
                }
                match bound {
                    Some(b) => raise_to(s, b, if b == applied { applied_key } else { 0 }),
                    None => raise_to(s, search.grant(), hc),
                }
            }
        }
        s.view = s.keys.clone();
        s.synced = true;
        // Everything granted so far is visible to the watch now.
        let latest = s.token.iter().flatten().copied().max().unwrap_or(0);
        s.must = s.must.max(latest);
    }

    fn steps(s: &State, strategy: Strategy) -> Vec<(String, State)> {
        let mut out = Vec::new();
        for c in 0..CLIENTS {
            if !s.keys.contains_key(&c) && s.token[c].is_none() {
                let mut n = s.clone();
                n.rev += 1;
                let before = holder(&n.keys);
                n.keys.insert(c, n.rev);
                n.history.push((n.rev, c, Some(n.rev)));
                let rv = n.rev;
                deliver(&mut n, c, Some(rv), rv);
                grant_on_change(&mut n, rv, before);
                out.push((format!("request {c}"), n));
            }
            if s.keys.contains_key(&c) {
                let mut n = s.clone();
                n.rev += 1;
                let before = holder(&n.keys);
                n.keys.remove(&c);
                n.history.push((n.rev, c, None));
                let rv = n.rev;
                deliver(&mut n, c, None, rv);
                grant_on_change(&mut n, rv, before);
                out.push((format!("release {c}"), n));
            }
            if let Some(t) = s.token[c] {
                let mut n = s.clone();
                // The write check: the watch must have read etcd since it (re)started
                // (`wait_until_synced`), then the effective mark is max(stored mark, hand-over).
                if n.synced && t >= n.mark.max(n.handover) {
                    assert!(
                        t >= n.must,
                        "contender {c} wrote with token {t}, below grant {} the watch should fence from: {n:?}",
                        n.must
                    );
                    n.mark = t;
                    out.push((format!("write {c} ({t}) admitted"), n));
                } else if n.synced
                    && n.keys.contains_key(&c)
                    && n.keys.get(&c).copied() == holder(&n.keys)
                    && n.compacted == 0
                {
                    panic!(
                        "the current holder {c} (token {t}) was refused by a synced watch: {n:?}"
                    );
                }
            }
        }
        if s.compacted < s.rev {
            let mut n = s.clone();
            n.compacted = n.rev;
            out.push(("compact".into(), n));
        }
        if s.synced {
            let mut n = s.clone();
            n.synced = false;
            out.push(("connection lost".into(), n));
        } else {
            let mut n = s.clone();
            reconnect(&mut n, strategy);
            out.push(("watch (re)starts".into(), n));
        }
        if s.file != (s.handover, s.handover_key) {
            let mut n = s.clone();
            n.file = (n.handover, n.handover_key);
            out.push(("state file saved".into(), n));
        }
        let mut n = s.clone();
        (n.handover, n.handover_key) = n.file;
        n.synced = false;
        out.push(("PostgreSQL restarts".into(), n));
        let mut n = s.clone();
        n.handover = 0;
        n.handover_key = 0;
        n.file = (0, 0);
        n.synced = false;
        out.push(("database copied to a new server".into(), n));
        out
    }

    /// Breadth-first over all step sequences up to DEPTH; a failed check panics with the state.
    /// Returns the number of distinct states seen.
    fn explore(strategy: Strategy) -> Result<usize, String> {
        let init = State {
            rev: 1,
            keys: BTreeMap::new(),
            history: Vec::new(),
            compacted: 0,
            token: [None; CLIENTS],
            handover: 0,
            handover_key: 0,
            file: (0, 0),
            synced: false,
            view: BTreeMap::new(),
            mark: 0,
            must: 0,
            steps: 0,
        };
        let mut seen = HashSet::new();
        let mut queue = VecDeque::from([(init, Vec::<String>::new())]);
        while let Some((s, trace)) = queue.pop_front() {
            if s.steps >= DEPTH {
                continue;
            }
            let next = std::panic::catch_unwind(|| steps(&s, strategy)).map_err(|e| {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                format!("after {trace:?}: {why}")
            })?;
            for (what, mut n) in next {
                n.steps = s.steps + 1;
                let mut key = n.clone();
                key.steps = 0;
                if seen.insert(key) {
                    let mut t = trace.clone();
                    t.push(what);
                    queue.push_back((n, t));
                }
            }
        }
        Ok(seen.len())
    }

    #[test]
    fn every_order_of_events_up_to_the_bound_fences_every_former_holder() {
        let n = explore(Strategy::Replay).unwrap_or_else(|e| panic!("{e}"));
        assert!(n > 10_000, "the model explored only {n} states");
        eprintln!(
            "watch model: {n} distinct states, every order of up to {DEPTH} steps, no violation"
        );
    }

    #[test]
    fn the_restart_strategy_before_issue_14_is_caught() {
        // Negative control: a watch that restarts at the current revision misses a hand-over
        // that happened while it was not running (issue 14, path 3), and the model says so.
        let e = explore(Strategy::FromNow).expect_err("the old strategy must be caught");
        assert!(e.contains("below grant"), "{e}");
        eprintln!("old strategy caught: {e}");
    }

    #[test]
    fn bounds() {
        let mut g = GrantSearch::new(4, 10);
        // Held from revision 7 on.
        while let Some(mid) = g.next() {
            g.holder_at(mid, mid >= 7);
        }
        assert_eq!(g.grant(), 7);
        assert_eq!(GrantSearch::new(5, 5).next(), None);
        assert_eq!(compacted_bound(None, 6, 0, 0), 6);
        assert_eq!(compacted_bound(Some(4), 6, 0, 0), 6);
        assert_eq!(compacted_bound(Some(4), 6, 5, 4), 5);
        assert_eq!(compacted_bound(Some(4), 6, 5, 3), 6);
    }
}
