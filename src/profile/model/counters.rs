//! One thread's counters, and the sum of many: the one shape in which
//! time by state, context switches and wakeups are kept and added up (a
//! drain's rows, merged batches, folded pools, a process's totals).

use std::ops::AddAssign;

use crate::profile::model::state::State;

/// Time by state, context switches and wakeups of a thread, or the sum of
/// several threads'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadCounters {
    /// Nanoseconds by [`State`] (index = `State as usize`).
    pub ns: [u64; State::COUNT],
    pub switches_voluntary: u64,
    pub switches_involuntary: u64,
    pub wakeups_sent: u64,
    pub wakeups_received: u64,
}

impl ThreadCounters {
    /// Nanoseconds in `state`.
    pub fn ns_in(&self, state: State) -> u64 {
        self.ns[state as usize]
    }

    /// Wall-clock nanoseconds: the time in every state.
    pub fn wall(&self) -> u64 {
        self.ns.iter().sum()
    }

    /// Context switches of either kind.
    pub fn switches(&self) -> u64 {
        self.switches_voluntary + self.switches_involuntary
    }
}

impl AddAssign<&ThreadCounters> for ThreadCounters {
    fn add_assign(&mut self, o: &ThreadCounters) {
        for (a, b) in self.ns.iter_mut().zip(o.ns) {
            *a += b;
        }
        self.switches_voluntary += o.switches_voluntary;
        self.switches_involuntary += o.switches_involuntary;
        self.wakeups_sent += o.wakeups_sent;
        self.wakeups_received += o.wakeups_received;
    }
}

impl AddAssign for ThreadCounters {
    fn add_assign(&mut self, o: ThreadCounters) {
        *self += &o;
    }
}

/// One thread's counters for a drain interval (or a slice).
#[derive(Debug, Clone)]
pub struct RawThread {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub counters: ThreadCounters,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_field_by_field() {
        let mut sum = ThreadCounters {
            ns: std::array::from_fn(|i| i as u64 + 1),
            switches_voluntary: 1,
            switches_involuntary: 2,
            wakeups_sent: 3,
            wakeups_received: 4,
        };
        let mut more = [0; State::COUNT];
        more[State::Cpu as usize] = 10;
        sum += ThreadCounters {
            ns: more,
            switches_voluntary: 10,
            switches_involuntary: 20,
            wakeups_sent: 30,
            wakeups_received: 40,
        };
        let states = State::COUNT as u64;
        assert_eq!(sum.wall(), states * (states + 1) / 2 + 10);
        assert_eq!(sum.ns_in(State::Cpu), State::Cpu as u64 + 1 + 10);
        assert_eq!(sum.switches(), 33);
        assert_eq!((sum.wakeups_sent, sum.wakeups_received), (33, 44));
    }
}
