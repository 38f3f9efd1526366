//! The live view: every thread that was off-CPU when the latest drain
//! looked, what it waits in, for how long, where, and who woke it last.
//!
//! Unlike slices, which are history, only the newest view is kept: each
//! drain replaces it. It is bounded by [`MAX_LIVE_THREADS`], the longest
//! waits first, since those are the ones a "what is stuck" question is
//! about.

use std::{
    cmp::Ordering,
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::Stack;
use crate::profile::model::state::State;

/// Threads a view keeps, longest in their state first; the others are
/// counted in [`LiveView::left_out`]. Most of a host's off-CPU threads are
/// idle pool workers: 20,000 keeps a 10,000-thread pool whole, for about
/// 2 MiB plus the view's distinct stacks (see [`super::size::live_bytes`]).
pub const MAX_LIVE_THREADS: usize = 20_000;

/// The syscall a thread blocked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syscall {
    pub nr: u32,
    /// Known for the syscalls threads commonly block in.
    pub name: Option<&'static str>,
}

/// Who woke a thread last, before its current state began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveWaker {
    Thread {
        pid: u32,
        tid: u32,
        /// When the symbolizer knew the thread (it ran in the same drain,
        /// or its JVM named it).
        name: Option<Arc<str>>,
    },
    /// A hard or soft interrupt (a timer, a device).
    Interrupt,
}

/// One thread off-CPU when the drain looked.
#[derive(Debug, Clone)]
pub struct LiveThread {
    pub pid: u32,
    pub tid: u32,
    /// Full Java thread name when known, else the kernel's.
    pub name: Arc<str>,
    /// Never [`State::Cpu`].
    pub state: State,
    /// How long it had been in `state` at [`LiveView::as_of`].
    pub in_state: Duration,
    pub syscall: Option<Syscall>,
    /// Outermost frame first, like every [`Stack`].
    pub stack: Stack,
    pub waker: Option<LiveWaker>,
}

/// The threads off-CPU at one drain, longest in their state first.
#[derive(Debug, Clone, Default)]
pub struct LiveView {
    /// When the drain looked.
    pub as_of: Option<SystemTime>,
    pub threads: Vec<LiveThread>,
    /// Names of the threads' processes, by pid.
    pub processes: HashMap<u32, Arc<str>>,
    /// Threads the drain saw that [`MAX_LIVE_THREADS`] left out.
    pub left_out: usize,
    /// The longest any of them had been in its state: every thread in its
    /// state for longer than this was kept.
    pub left_out_longest: Duration,
}

/// What [`keep_longest`] dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeftOut {
    pub count: usize,
    pub longest: Duration,
}

/// What a view is ordered by: time in state, pid, tid.
pub type OrderKey = (Duration, u32, u32);

impl LiveThread {
    /// Its place in a view.
    pub fn order_key(&self) -> OrderKey {
        (self.in_state, self.pid, self.tid)
    }
}

/// The view's order: longest in their state first, ties by pid, then tid,
/// so that the order is the same at every drain and query.
pub fn longest_first(a: OrderKey, b: OrderKey) -> Ordering {
    b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
}

/// Orders `items` by [`longest_first`] and keeps the first `max`.
pub fn keep_longest<T>(items: &mut Vec<T>, max: usize, key: impl Fn(&T) -> OrderKey) -> LeftOut {
    items.sort_by(|a, b| longest_first(key(a), key(b)));
    let count = items.len().saturating_sub(max);
    let longest = items.get(max).map_or(Duration::ZERO, |i| key(i).0);
    items.truncate(max);
    LeftOut { count, longest }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_longest_waits_in_a_stable_order() {
        let ms = Duration::from_millis;
        let mut items = vec![
            (ms(5), 2, 20),
            (ms(900), 1, 11),
            (ms(5), 1, 12),
            (ms(40), 3, 30),
            (ms(900), 1, 10),
        ];
        let left = keep_longest(&mut items, 3, |i| *i);
        assert_eq!(
            items,
            vec![(ms(900), 1, 10), (ms(900), 1, 11), (ms(40), 3, 30)]
        );
        assert_eq!(
            left,
            LeftOut {
                count: 2,
                longest: ms(5)
            }
        );
        let left = keep_longest(&mut items, 10, |i| *i);
        assert_eq!((items.len(), left), (3, LeftOut::default()));
    }
}
