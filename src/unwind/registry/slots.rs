//! Per-user shares of `unwind_procs`: the map holds one entry per
//! registered process, and one user running as many processes as it
//! holds would leave every later process of every user without tables
//! (their stacks stop at the first function without frame pointers).
//! The rule is [`crate::budget::shares`]'s: when the map is full, a new
//! process of a user within its share takes the slot of the least
//! recently active process of a user above theirs; others are refused.
//!
//! BPF also writes entries: a forked child gets a copy of its parent's.
//! A child that ends before it is registered leaves its copy behind, so
//! entries nobody owns are swept when the map refuses an entry.

use std::time::{Duration, Instant};

use aya::maps::MapError;

use super::{ProcState, Registry};
use crate::{
    bpf::abi::UnwindProc,
    budget::shares::Shares,
    untrusted::refusals::{self, Reason, What},
};

/// Sweeps at most this often: one stats every key's process.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Processes a user may keep registered however many users have some: a
/// 32nd of the map, enough for a busy service's workers.
pub(super) const FLOOR: usize = super::MAX_PROCS / 32;

/// The user whose process gives way to a new process of `uid` in a full
/// map: one above its share, if `uid` is within its own.
fn giving_way(shares: &Shares, uid: u32) -> Option<u32> {
    if shares.room(uid) == 0 {
        return None;
    }
    shares.reclaim(uid, 1).first().map(|&(victim, _)| victim)
}

/// Of `procs` (pid, user, last seen in a drain), `uid`'s least recently
/// active one: the one whose loss of tables the fewest samples notice.
fn least_active(procs: impl Iterator<Item = (u32, u32, Instant)>, uid: u32) -> Option<u32> {
    procs
        .filter(|&(_, u, _)| u == uid)
        .min_by_key(|&(pid, _, seen)| (seen, pid))
        .map(|(pid, _, _)| pid)
}

impl Registry {
    /// Keeps `pid`'s state, counted in its user's share.
    pub(super) fn keep(&mut self, pid: u32, state: ProcState) {
        self.shares.add(state.uid, 1);
        if let Some(old) = self.procs.insert(pid, state) {
            self.shares.remove(old.uid, 1);
        }
    }

    /// Takes `pid`'s state out (to be kept again, or dropped).
    pub(super) fn take(&mut self, pid: u32) -> Option<ProcState> {
        let p = self.procs.remove(&pid)?;
        self.shares.remove(p.uid, 1);
        Some(p)
    }

    /// Drops `pid`: its state, its files' use, its runtimes' state and
    /// its BPF entry.
    pub(super) fn unregister(&mut self, pid: u32) {
        self.runtimes.each(|r| r.detach(pid));
        if let Some(p) = self.take(pid) {
            self.detach(&p.mappings, p.uid);
            if p.has_entry() {
                let _ = self.maps.procs.remove(&pid);
            }
        }
    }

    /// Makes a slot for new process `pid` of `uid` in the full map, taking
    /// it from a user above its share (counted, naming the process that
    /// lost it); whether it may be registered. A refused process loses the
    /// entry BPF gave it at fork (its parent's), which would hold a slot
    /// its share has not.
    pub(super) fn make_slot(&mut self, pid: u32, uid: u32) -> bool {
        let victim = giving_way(&self.shares, uid).and_then(|user| {
            let procs = self.procs.iter().map(|(&q, p)| (q, p.uid, p.seen));
            least_active(procs, user)
        });
        let Some(victim) = victim else {
            self.stats.processes_over_limit += 1;
            let _ = self.maps.procs.remove(&pid);
            refusals::count_for(What::Elf, Reason::Budget, pid);
            return false;
        };
        // Forgotten, it is registered again when seen, once its user is
        // within its share.
        self.unregister(victim);
        self.stats.procs_taken_back += 1;
        refusals::count_for(What::Elf, Reason::Budget, victim);
        true
    }

    /// Writes `pid`'s entry; if the map is full, once more after a sweep
    /// freed some.
    pub(super) fn insert_entry(&mut self, pid: u32, entry: UnwindProc) -> Result<(), MapError> {
        match self.maps.procs.insert(pid, entry, 0) {
            Err(_) if self.sweep() => self.maps.procs.insert(pid, entry, 0),
            result => result,
        }
    }

    /// Deletes the entries no registered process owns whose process ended
    /// (at most every [`SWEEP_EVERY`]); whether it deleted any.
    fn sweep(&mut self) -> bool {
        let now = Instant::now();
        if self
            .swept
            .is_some_and(|at| now.duration_since(at) < SWEEP_EVERY)
        {
            return false;
        }
        self.swept = Some(now);
        // At most the map's capacity of keys.
        let stale: Vec<u32> = self
            .maps
            .procs
            .keys()
            .filter_map(Result::ok)
            .filter(|pid| !self.procs.contains_key(pid) && !self.changes.table().running(*pid))
            .collect();
        for pid in &stale {
            let _ = self.maps.procs.remove(pid);
        }
        self.stats.procs_stale_removed += stale.len() as u64;
        !stale.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::unwind::registry::MAX_PROCS;

    #[test]
    fn a_user_who_fills_the_map_gives_way_to_any_other() {
        let mut s = Shares::new(MAX_PROCS, FLOOR);
        s.add(65534, MAX_PROCS);
        assert_eq!(giving_way(&s, 1), Some(65534));
        assert_eq!(giving_way(&s, 0), Some(65534));
        // The hog itself takes nothing (it holds more than the map's worth).
        assert_eq!(giving_way(&s, 65534), None);
    }

    #[test]
    fn users_at_their_share_are_refused_and_keep_what_they_hold() {
        let mut s = Shares::new(MAX_PROCS, FLOOR);
        s.add(65534, MAX_PROCS / 2);
        s.add(1, MAX_PROCS / 2);
        // Both at their share: neither takes from the other.
        assert_eq!(giving_way(&s, 1), None);
        assert_eq!(giving_way(&s, 65534), None);
        // A third user's share is a third: both are above it.
        assert!(giving_way(&s, 2).is_some());
    }

    #[test]
    fn the_floor_lets_no_user_take_from_those_under_it() {
        let mut s = Shares::new(MAX_PROCS, FLOOR);
        let users = (MAX_PROCS / FLOOR) as u32;
        for uid in 0..users {
            s.add(uid, FLOOR);
        }
        // Every user holds its floor: a newcomer finds nobody above it.
        assert_eq!(giving_way(&s, 999), None);
        s.remove(0, FLOOR);
        s.add(1, FLOOR);
        assert_eq!(giving_way(&s, 999), Some(1));
    }

    #[test]
    fn the_least_recently_active_process_of_the_user_goes() {
        let t = Instant::now();
        let at = |s| t + Duration::from_secs(s);
        let procs = [
            (10, 65534, at(5)),
            (11, 65534, at(1)),
            (12, 1, at(0)),
            (13, 65534, at(9)),
        ];
        assert_eq!(least_active(procs.into_iter(), 65534), Some(11));
        assert_eq!(least_active(procs.into_iter(), 1), Some(12));
        assert_eq!(least_active(procs.into_iter(), 7), None);
        // Equally idle: the lower pid, so the choice is stable.
        let tied = [(21, 5, at(1)), (20, 5, at(1))];
        assert_eq!(least_active(tied.into_iter(), 5), Some(20));
    }
}
