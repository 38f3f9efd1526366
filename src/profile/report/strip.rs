//! The host page's state-over-time strip: per process, the window cut in
//! [`STRIP_CELLS`] equal stretches, each named by one letter for the state
//! that marks it, so a process that stalled a while ago stands out in a
//! list without a timeline per process.
//!
//! One string per process: 30 bytes, whatever the window's length.

use std::collections::HashMap;

use super::disclosure::Sight;
use crate::{
    profile::model::state::State,
    profile::model::{store::Snapshot, window::Window},
};

/// Stretches per strip.
pub const STRIP_CELLS: usize = 30;

/// A stretch with no time recorded for the process.
pub const NOTHING: char = '.';

/// The letter of each state, as `/processes` sends them in `strip`.
pub fn letter(s: State) -> char {
    match s {
        State::Cpu => 'c',
        State::Runqueue => 'r',
        State::Throttled => 't',
        State::Futex => 'f',
        State::Io => 'i',
        State::Sleep => 's',
    }
}

/// The letter of a stretch whose threads spent `ns` by state: the state
/// other than sleep that took most of it, unless sleep took 95% or more.
/// Summed over a process, idle threads' sleep would otherwise hide the one
/// thread that ran or stalled.
fn mark(ns: &[u64; State::COUNT]) -> char {
    let wall: u64 = ns.iter().sum();
    if wall == 0 {
        return NOTHING;
    }
    let sleep = ns[State::Sleep as usize];
    if sleep.saturating_mul(100) >= wall.saturating_mul(95) {
        return letter(State::Sleep);
    }
    let (state, _) = [
        State::Cpu,
        State::Runqueue,
        State::Throttled,
        State::Futex,
        State::Io,
    ]
    .iter()
    .map(|s| (*s, ns[*s as usize]))
    .fold(
        (State::Cpu, 0),
        |best, s| if s.1 > best.1 { s } else { best },
    );
    letter(state)
}

/// The strip of every process with thread time in `window`, by pid.
pub fn strips(store: &Snapshot, window: Window, sight: &Sight) -> HashMap<u32, String> {
    let length = window.length().as_nanos().max(1);
    let mut cells: HashMap<u32, [[u64; State::COUNT]; STRIP_CELLS]> = HashMap::new();
    for slice in store.within(window) {
        // A slice belongs to the stretch its end falls in, as it belongs
        // to the window its end falls in.
        let into = slice.end.duration_since(window.from).unwrap_or_default();
        let at = (into.as_nanos().saturating_sub(1) * STRIP_CELLS as u128 / length) as usize;
        let at = at.min(STRIP_CELLS - 1);
        // A reused pid's strip is its reader's process's only.
        for t in slice
            .thread_totals
            .iter()
            .filter(|t| sight.sees(t.pid, slice.start))
        {
            let cell = &mut cells
                .entry(t.pid)
                .or_insert([[0; State::COUNT]; STRIP_CELLS])[at];
            for (sum, ns) in cell.iter_mut().zip(t.counters.ns) {
                *sum += ns;
            }
        }
    }
    cells
        .into_iter()
        .map(|(pid, cells)| (pid, cells.iter().map(mark).collect()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::profile::model::{
        counters::{RawThread, ThreadCounters},
        store::Store,
        Slice,
    };

    /// A 30 s window of one process that ran, then waited on a futex for
    /// its last 10 s: the strip's last third says so.
    #[test]
    fn a_stall_shows_where_it_happened() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut store = Store::new(Duration::from_secs(600));
        for s in 0..30u64 {
            let until = end - Duration::from_secs(29 - s);
            let mut slice = Slice::empty(until - Duration::from_secs(1), until);
            let state = if s < 20 { State::Cpu } else { State::Futex };
            let mut counters = ThreadCounters::default();
            counters.ns[state as usize] = 1_000_000_000;
            slice.thread_totals = vec![RawThread {
                tid: 7,
                pid: 7,
                comm: String::new(),
                counters,
            }];
            store.push(slice);
        }
        let strips = strips(&store.snapshot(), Window::last(30, end), &Sight::all());
        assert_eq!(strips[&7], format!("{}{}", "c".repeat(20), "f".repeat(10)));
        // A window twice as long: the first half had nothing recorded.
        let strips = strips_of(&store, Window::last(60, end));
        assert_eq!(
            strips,
            format!("{}{}{}", ".".repeat(15), "c".repeat(10), "f".repeat(5))
        );
    }

    fn strips_of(store: &Store, window: Window) -> String {
        strips(&store.snapshot(), window, &Sight::all())
            .remove(&7)
            .unwrap()
    }

    fn ns(pairs: &[(State, u64)]) -> [u64; State::COUNT] {
        let mut ns = [0; State::COUNT];
        for (s, v) in pairs {
            ns[*s as usize] = *v;
        }
        ns
    }

    #[test]
    fn a_stretch_is_marked_by_what_is_not_idle() {
        assert_eq!(mark(&ns(&[])), '.');
        assert_eq!(mark(&ns(&[(State::Sleep, 100)])), 's');
        // Twenty idle threads and one that runs: the one that runs.
        assert_eq!(mark(&ns(&[(State::Sleep, 2000), (State::Cpu, 150)])), 'c');
        assert_eq!(mark(&ns(&[(State::Sleep, 2000), (State::Cpu, 50)])), 's');
        assert_eq!(
            mark(&ns(&[
                (State::Futex, 900),
                (State::Cpu, 100),
                (State::Sleep, 900)
            ])),
            'f'
        );
        assert_eq!(mark(&ns(&[(State::Runqueue, 70), (State::Cpu, 30)])), 'r');
    }
}
