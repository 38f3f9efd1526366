//! Per-user shares of one bounded table the host's processes fill (a BPF
//! map such as `python_threads` or `unwind_procs`): without shares, one
//! user's processes could take every entry and leave none for the later
//! processes of every other user.
//!
//! A user may hold at most an even share of the table among the users
//! that hold entries (itself counted), never less than a floor. When the
//! table is full, a user within its share takes entries back from the
//! users above theirs (the most above first), so a process of a user new
//! to the table always finds room.

use std::collections::HashMap;

/// Entries held, by user (euid), against a capacity.
#[derive(Debug, Clone)]
pub struct Shares {
    capacity: usize,
    /// Entries a user may hold however many users hold some.
    floor: usize,
    held: HashMap<u32, usize>,
}

impl Shares {
    pub fn new(capacity: usize, floor: usize) -> Shares {
        Shares {
            capacity,
            floor,
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
    /// entries and `uid`, at least the floor (never more than the table).
    pub fn share(&self, uid: u32) -> usize {
        let users = self.held.len() + usize::from(!self.held.contains_key(&uid));
        (self.capacity / users.max(1))
            .max(self.floor)
            .min(self.capacity)
    }

    /// How many more entries `uid` may take.
    pub fn room(&self, uid: u32) -> usize {
        self.share(uid).saturating_sub(self.held(uid))
    }

    /// Entries to take back from other users, most above their share
    /// first, so that `want` more of `uid`'s fit the table: `(user, n)`.
    /// Only entries above a user's share (as `uid` counts among the users)
    /// are taken; `want` should be within [`Shares::room`].
    pub fn reclaim(&self, uid: u32, want: usize) -> Vec<(u32, usize)> {
        let free = self.capacity.saturating_sub(self.total());
        let mut need = want.saturating_sub(free);
        let share = self.share(uid);
        let mut over: Vec<(usize, u32)> = self
            .held
            .iter()
            .filter(|(&u, _)| u != uid)
            .map(|(&u, &n)| (n.saturating_sub(share), u))
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
    const FLOOR: usize = 1024;

    #[test]
    fn a_user_alone_may_fill_the_table() {
        let mut s = Shares::new(CAP, FLOOR);
        assert_eq!(s.share(7), CAP);
        assert_eq!(s.room(7), CAP);
        s.add(7, CAP - 1);
        assert_eq!(s.room(7), 1);
        s.add(7, 1);
        assert_eq!(s.room(7), 0);
    }

    #[test]
    fn a_user_who_filled_the_table_gives_way_to_a_newcomer() {
        let mut s = Shares::new(CAP, FLOOR);
        s.add(65534, CAP);
        // The newcomer's share is half; the hog is over its share by half.
        assert_eq!(s.share(1), CAP / 2);
        assert_eq!(s.room(1), CAP / 2);
        assert_eq!(s.reclaim(1, 5), [(65534, 5)]);
        s.remove(65534, 5);
        s.add(1, 5);
        // Now both hold entries: the hog may take none back.
        assert_eq!(s.room(65534), 0);
        assert!(s.reclaim(65534, 1).is_empty());
        assert_eq!(s.share(65534), CAP / 2);
        // A third user takes from the one most over its share.
        assert_eq!(s.share(2), CAP / 3);
        assert_eq!(s.reclaim(2, 100), [(65534, 100)]);
    }

    #[test]
    fn with_room_nothing_is_taken_and_users_within_their_share_keep_theirs() {
        let mut s = Shares::new(CAP, FLOOR);
        s.add(5, 1000);
        assert!(s.reclaim(6, 4096).is_empty());
        s.add(6, CAP - 1000);
        // 5 holds less than its share: nothing of it is taken.
        assert_eq!(s.reclaim(7, 10), [(6, 10)]);
        assert!(s.reclaim(6, 10).is_empty());
    }

    #[test]
    fn a_take_back_spans_users_most_above_first_and_only_their_excess() {
        let mut s = Shares::new(90, 1);
        s.add(1, 50);
        s.add(2, 40);
        // The newcomer's share is 30: 1 is 20 above, 2 is 10 above.
        assert_eq!(s.reclaim(3, 25), [(1, 20), (2, 5)]);
        assert_eq!(s.reclaim(3, 100), [(1, 20), (2, 10)]);
    }

    #[test]
    fn the_floor_holds_among_many_users_and_removal_forgets_a_user() {
        let mut s = Shares::new(8192, FLOOR);
        for uid in 0..100 {
            s.add(uid, 10);
        }
        assert_eq!(s.share(500), FLOOR);
        for uid in 0..100 {
            s.remove(uid, 10);
        }
        assert_eq!(s.held(3), 0);
        assert_eq!(s.share(3), 8192);
        // A small table: a share is never more than the table.
        assert_eq!(Shares::new(100, FLOOR).share(1), 100);
    }
}
