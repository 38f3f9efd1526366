//! Per-user shares of `python_threads`: the map is one for the host, and a
//! process fills it with entries of its own choosing (a thread list can be
//! forged), so without shares one user's processes would take every entry
//! and later Python processes of every user would lose their frames. The
//! rule is [`crate::budget::shares`]'s; a process may also hold at most
//! [`PER_PROCESS`].

use crate::budget::shares::Shares;

/// Entries a user may hold however many users hold some.
pub const FLOOR: usize = 1024;
/// Entries one process may hold (the threads read per interpreter).
pub const PER_PROCESS: usize = super::MAX_THREADS;

/// Shares of a map of `capacity` entries.
pub fn shares(capacity: usize) -> Shares {
    Shares::new(capacity, FLOOR)
}

/// How many more entries a process of `uid` holding `own` may take.
pub fn room(shares: &Shares, uid: u32, own: usize) -> usize {
    PER_PROCESS.saturating_sub(own).min(shares.room(uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_takes_at_most_its_cap_within_its_users_share() {
        let mut s = shares(65_536);
        assert_eq!(room(&s, 7, 0), PER_PROCESS);
        assert_eq!(room(&s, 7, PER_PROCESS - 1), 1);
        assert_eq!(room(&s, 7, PER_PROCESS), 0);
        s.add(7, 65_536 - 10);
        assert_eq!(room(&s, 7, 0), 10);
    }
}
