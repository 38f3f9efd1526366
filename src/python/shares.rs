//! Per-user shares of `python_threads`: the map is one for the host, and a
//! process fills it with entries of its own choosing (a thread list can be
//! forged), so without shares one user's processes would take every entry
//! and later Python processes of every user would lose their frames.
//!
//! A user may hold at most an even share of the map among the users that
//! hold entries (itself counted), never less than [`FLOOR`]; a process at
//! most [`PER_PROCESS`]. When the map is full, a user within its share
//! takes entries back from the users above theirs (the most above first),
//! so a process of a user new to the map always finds room.

use std::collections::HashMap;

/// Entries a user may hold however many users hold some.
pub const FLOOR: usize = 1024;
/// Entries one process may hold (the threads read per interpreter).
pub const PER_PROCESS: usize = super::MAX_THREADS;

/// Entries held, by user (euid), against a capacity.
#[derive(Debug, Clone)]
pub struct Shares {
    capacity: usize,
    held: HashMap<u32, usize>,
}

impl Shares {
    pub fn new(capacity: usize) -> Shares {
        Shares {
            capacity,
            held: HashMap::new(),
        }
    }

    /// Entries `uid` holds.
    pub fn held(&self, uid: u32) -> usize {
        self.held.get(&uid).copied().unwrap_or(0)
    }

    fn total(&self) -> usize {
        self.held.values().sum()
    }

    /// What `uid` may hold now: an even share among the users holding
    /// entries and `uid`, at least [`FLOOR`] (but never the whole map's
    /// worth more than it has).
    pub fn share(&self, uid: u32) -> usize {
        self.share_asked_by(uid)
    }

    /// A user's share while `asking` is counted among the users holding
    /// entries (it may hold none yet).
    fn share_asked_by(&self, asking: u32) -> usize {
        let users = self.held.len() + usize::from(!self.held.contains_key(&asking));
        (self.capacity / users.max(1)).max(FLOOR).min(self.capacity)
    }

    /// How many more entries a process of `uid` holding `own` may take.
    pub fn room(&self, uid: u32, own: usize) -> usize {
        PER_PROCESS
            .saturating_sub(own)
            .min(self.share(uid).saturating_sub(self.held(uid)))
    }

    /// Entries to take back from other users, most above their share
    /// first, so that `want` more of `uid`'s fit the map: `(user, n)`.
    /// Only entries above a user's share are taken; `want` should be
    /// within [`Shares::room`].
    pub fn reclaim(&self, uid: u32, want: usize) -> Vec<(u32, usize)> {
        let free = self.capacity.saturating_sub(self.total());
        let mut need = want.saturating_sub(free);
        let mut over: Vec<(usize, u32)> = self
            .held
            .iter()
            .filter(|(&u, _)| u != uid)
            .map(|(&u, &n)| (n.saturating_sub(self.share_asked_by(uid)), u))
            .filter(|&(excess, _)| excess > 0)
            .collect();
        over.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        for (excess, u) in over {
            if need == 0 {
                break;
            }
            let n = excess.min(need);
            need -= n;
            out.push((u, n));
        }
        out
    }

    pub fn add(&mut self, uid: u32, n: usize) {
        if n > 0 {
            *self.held.entry(uid).or_insert(0) += n;
        }
    }

    pub fn remove(&mut self, uid: u32, n: usize) {
        if let Some(h) = self.held.get_mut(&uid) {
            *h = h.saturating_sub(n);
            if *h == 0 {
                self.held.remove(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = 65_536;

    #[test]
    fn a_user_alone_may_fill_its_processes_but_each_only_to_the_process_cap() {
        let s = Shares::new(CAP);
        assert_eq!(s.share(7), CAP);
        assert_eq!(s.room(7, 0), PER_PROCESS);
        assert_eq!(s.room(7, PER_PROCESS - 1), 1);
        assert_eq!(s.room(7, PER_PROCESS), 0);
    }

    #[test]
    fn a_user_who_filled_the_map_gives_way_to_a_newcomer() {
        let mut s = Shares::new(CAP);
        s.add(65534, CAP);
        // The newcomer's share is half; the hog is over its share by half.
        assert_eq!(s.share(1), CAP / 2);
        assert_eq!(s.room(1, 0), PER_PROCESS);
        assert_eq!(s.reclaim(1, 5), [(65534, 5)]);
        s.remove(65534, 5);
        s.add(1, 5);
        // Now both hold entries: the hog may take none back.
        assert_eq!(s.room(65534, 0), 0);
        assert_eq!(s.share(65534), CAP / 2);
        // A third user takes from the one most over its share.
        assert_eq!(s.share(2), CAP / 3);
        assert_eq!(s.reclaim(2, 100), [(65534, 100)]);
    }

    #[test]
    fn with_room_nothing_is_taken_and_users_within_their_share_keep_theirs() {
        let mut s = Shares::new(CAP);
        s.add(5, 1000);
        assert!(s.reclaim(6, 4096).is_empty());
        s.add(6, CAP - 1000);
        // 5 holds less than its share: nothing of it is taken.
        assert_eq!(s.reclaim(7, 10), [(6, 10)]);
        assert!(s.reclaim(6, 10).is_empty());
    }

    #[test]
    fn the_floor_holds_among_many_users_and_removal_forgets_a_user() {
        let mut s = Shares::new(8192);
        for uid in 0..100 {
            s.add(uid, 10);
        }
        assert_eq!(s.share(500), FLOOR);
        for uid in 0..100 {
            s.remove(uid, 10);
        }
        assert_eq!(s.held(3), 0);
        assert_eq!(s.share(3), 8192);
        // A small map: a share is never more than the map.
        assert_eq!(Shares::new(100).share(1), 100);
    }
}
