//! Whose turn it is to be attached: attach work runs on a few threads at
//! once, and a free one goes to the user, then the target, served least
//! recently, so that slow or hostile JVMs (one user's, or many) never
//! hold up another JVM for longer than one of their time-outs.

use std::collections::HashMap;

/// Attach jobs running at once, all users together.
pub const IN_FLIGHT: usize = 4;
/// Attach jobs of one user running at once: one below [`IN_FLIGHT`], so
/// that another user's JVM always finds a free turn.
pub const IN_FLIGHT_PER_USER: usize = IN_FLIGHT - 1;

/// One target that wants a turn now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub pid: u32,
    pub uid: u32,
    /// When the target last got a turn (a sequence number; 0: never).
    pub served: u64,
}

/// Turns given so far, by user, and jobs running, by user.
#[derive(Debug, Default)]
pub struct Turns {
    next: u64,
    user_served: HashMap<u32, u64>,
    running: HashMap<u32, usize>,
}

impl Turns {
    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.running.values().sum()
    }

    /// Whether `uid` may start another job now.
    pub fn user_has_room(&self, uid: u32) -> bool {
        self.running.get(&uid).copied().unwrap_or(0) < IN_FLIGHT_PER_USER
    }

    /// The candidate to serve next, if a turn is free: of the users with
    /// room, the one served least recently, then its target served least
    /// recently (never-served targets first). Marks it served and running;
    /// returns the sequence number to store as its `served`.
    pub fn pick(&mut self, candidates: &[Candidate]) -> Option<(u32, u64)> {
        if self.running() >= IN_FLIGHT {
            return None;
        }
        let chosen = candidates
            .iter()
            .filter(|c| self.user_has_room(c.uid))
            .min_by_key(|c| {
                let user = self.user_served.get(&c.uid).copied().unwrap_or(0);
                (user, c.served, c.pid)
            })?;
        self.next += 1;
        self.user_served.insert(chosen.uid, self.next);
        *self.running.entry(chosen.uid).or_default() += 1;
        Some((chosen.pid, self.next))
    }

    /// A job of `uid` is over.
    pub fn done(&mut self, uid: u32) {
        if let Some(n) = self.running.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running.remove(&uid);
            }
        }
    }

    /// Forgets users with nothing running that no tracked target has.
    pub fn retain_users(&mut self, users: impl Fn(u32) -> bool) {
        let running = &self.running;
        self.user_served
            .retain(|uid, _| users(*uid) || running.contains_key(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(pid: u32, uid: u32, served: u64) -> Candidate {
        Candidate { pid, uid, served }
    }

    #[test]
    fn one_user_never_takes_every_turn() {
        let mut turns = Turns::default();
        let fakes: Vec<Candidate> = (1..=8).map(|pid| c(pid, 65534, 0)).collect();
        let mut taken = 0;
        while turns.pick(&fakes).is_some() {
            taken += 1;
        }
        assert_eq!(taken, IN_FLIGHT_PER_USER);
        // Another user's JVM still gets the last turn.
        assert_eq!(turns.pick(&[c(100, 0, 0)]).map(|p| p.0), Some(100));
        assert!(turns.pick(&[c(101, 1000, 0)]).is_none(), "all turns taken");
        turns.done(0);
        assert_eq!(turns.pick(&[c(101, 1000, 0)]).map(|p| p.0), Some(101));
    }

    #[test]
    fn users_then_targets_take_turns() {
        let mut turns = Turns::default();
        // User 1 was just served; user 2 goes first whatever its targets.
        let (pid, seq) = turns.pick(&[c(10, 1, 0)]).unwrap();
        assert_eq!(pid, 10);
        turns.done(1);
        let all = [c(10, 1, seq), c(11, 1, 0), c(20, 2, 5)];
        assert_eq!(turns.pick(&all).map(|p| p.0), Some(20));
        turns.done(2);
        // Then user 1's never-served target before the one just served.
        assert_eq!(turns.pick(&all).map(|p| p.0), Some(11));
    }
}
