//! How each thread of a process blocks: how many blocked intervals
//! (switch-out to the wakeup that ended it) ended in a window, their
//! median and p90, and who woke it: a timer (a thread polling with
//! `usleep` is woken by nothing else), another interrupt, or which thread
//! (of another user's process: `[other users] ×N`, see
//! [`super::disclosure`]).

use std::collections::HashMap;

use serde::Serialize;

use super::{
    disclosure::{Hidden, Sight, OTHER_USERS},
    hist::{quantile_us, Slots},
};
use crate::profile::model::{store::Snapshot, window::Window, Interrupt, Slice, Wakeup};

/// Wakers listed per thread, at most; the rest are summed into `[rest]`.
pub const WAKERS: usize = 3;

/// Kernel functions on an interrupt's stack that say a timer fired.
const TIMER_FRAMES: [&str; 5] = [
    "hrtimer_wakeup",
    "__hrtimer_run_queues",
    "process_timeout",
    "call_timer_fn",
    "run_timer_softirq",
];

/// One thread's blocked intervals in a window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SleepSummary {
    /// Blocked intervals that a wakeup ended.
    pub intervals: u64,
    /// Their median and p90, interpolated within log2 buckets (the last
    /// bucket holds everything from about 4.2 s on).
    pub median_us: f64,
    pub p90_us: f64,
    /// Whether `median_us` and `p90_us` are estimates (off by up to their
    /// bucket's width; text marks them `~`): always, the intervals being
    /// counted in buckets only.
    pub approx: bool,
    /// Who woke it, by share of the blocked time their wakeups ended
    /// (sampled as the wakeup graphs are), most first.
    pub woken_by: Vec<WokenBy>,
}

/// One waker of a thread.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WokenBy {
    /// `[timer]`, `[irq]` or `[softirq]` (another interrupt, or one whose
    /// kernel stack the per-CPU walk budget left out), a thread as
    /// `name (tid N)` or, of another process, `name (pid P, tid N)`;
    /// `[other users] ×N` for the processes the reader may not see;
    /// `[rest]` past the first [`WAKERS`].
    pub by: String,
    pub share: f64,
}

/// The blocked intervals of each thread of `pid` within `window`, by tid
/// (threads with none are absent); wakers `sight` may not see are summed
/// into one.
pub fn by_thread(
    store: &Snapshot,
    window: Window,
    pid: u32,
    sight: &Sight,
) -> HashMap<u32, SleepSummary> {
    let mut slots: HashMap<u32, Slots> = HashMap::new();
    let mut wakers: HashMap<u32, HashMap<String, u64>> = HashMap::new();
    let mut hidden: HashMap<u32, Hidden> = HashMap::new();
    for slice in store.within(window) {
        for s in slice.sleeps.iter().filter(|s| s.pid == pid) {
            let into = slots
                .entry(s.tid)
                .or_insert([0; crate::profile::model::state::HIST_SLOTS]);
            for (a, b) in into.iter_mut().zip(s.slots) {
                *a += u64::from(b);
            }
        }
        for w in slice
            .wakeups
            .iter()
            .filter(|w| w.peer_pid == pid && w.ns > 0)
        {
            let by = if w.interrupt.is_none() && !sight.sees(w.pid, slice.start) {
                hidden.entry(w.peer_tid).or_default().note(w.pid);
                OTHER_USERS.to_string()
            } else {
                waker_name(&slice, w, pid)
            };
            *wakers.entry(w.peer_tid).or_default().entry(by).or_default() += w.ns;
        }
    }
    slots
        .into_iter()
        .map(|(tid, slots)| {
            let mut woken_by = wakers.remove(&tid).map(top).unwrap_or_default();
            if let Some(hidden) = hidden.get(&tid) {
                // Named thread wakers end in `(tid N)`: none is this key.
                for w in woken_by.iter_mut().filter(|w| w.by == OTHER_USERS) {
                    w.by = hidden.label();
                }
            }
            let summary = SleepSummary {
                intervals: slots.iter().sum(),
                median_us: round(quantile_us(&slots, 0.5).unwrap_or(0.0)),
                p90_us: round(quantile_us(&slots, 0.9).unwrap_or(0.0)),
                approx: true,
                woken_by,
            };
            (tid, summary)
        })
        .collect()
}

/// What woke the thread, as [`WokenBy::by`] says.
fn waker_name(slice: &Slice, w: &Wakeup, pid: u32) -> String {
    if let Some(irq) = w.interrupt {
        let timer = w
            .stack
            .iter()
            .any(|f| TIMER_FRAMES.iter().any(|t| f.starts_with(t)));
        return match (timer, irq) {
            (true, _) => "[timer]".into(),
            (false, Interrupt::Hard | Interrupt::Soft) => irq.frame().into(),
        };
    }
    let name = slice
        .threads
        .get(&w.tid)
        .map_or_else(|| "?".to_string(), |t| t.name.to_string());
    if w.pid == pid {
        format!("{name} (tid {})", w.tid)
    } else {
        format!("{name} (pid {}, tid {})", w.pid, w.tid)
    }
}

/// The wakers most first, at most [`WAKERS`] and a `[rest]`.
fn top(by: HashMap<String, u64>) -> Vec<WokenBy> {
    let total: u64 = by.values().sum();
    let mut all: Vec<(String, u64)> = by.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let rest: u64 = all.iter().skip(WAKERS).map(|w| w.1).sum();
    all.truncate(WAKERS);
    if rest > 0 {
        all.push(("[rest]".into(), rest));
    }
    all.into_iter()
        .map(|(by, ns)| WokenBy {
            by,
            share: (ns as f64 / total as f64 * 1000.0).round() / 1000.0,
        })
        .collect()
}

fn round(us: f64) -> f64 {
    (us * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, SystemTime},
    };

    use super::*;
    use crate::profile::model::{store::Store, Sleeps, ThreadInfo};

    fn wakeup(
        tid: u32,
        peer_tid: u32,
        interrupt: Option<Interrupt>,
        stack: &[&str],
        ns: u64,
    ) -> Wakeup {
        Wakeup {
            pid: if interrupt.is_some() { 0 } else { 7 },
            tid,
            interrupt,
            peer_pid: 7,
            peer_tid,
            stack: stack.iter().map(|f| Arc::from(*f)).collect(),
            ns,
            count: 1,
        }
    }

    #[test]
    fn a_poller_is_woken_by_a_timer_and_a_consumer_by_its_producer() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        let mut poller = [0; crate::profile::model::state::SLEEP_SLOTS];
        // 1,000 sleeps of 1-2 ms (slot 11: [1024, 2048) us).
        poller[11] = 1000;
        let mut consumer = [0; crate::profile::model::state::SLEEP_SLOTS];
        consumer[5] = 10; // [16, 32) us
        consumer[8] = 30; // [128, 256) us
        slice.sleeps = vec![
            Sleeps {
                pid: 7,
                tid: 8,
                slots: poller,
            },
            Sleeps {
                pid: 7,
                tid: 9,
                slots: consumer,
            },
        ];
        let timer = [
            "asm_sysvec_apic_timer_interrupt",
            "hrtimer_interrupt",
            "__hrtimer_run_queues",
            "hrtimer_wakeup",
        ];
        slice.wakeups = vec![
            wakeup(0, 8, Some(Interrupt::Hard), &timer, 990),
            wakeup(0, 8, Some(Interrupt::Soft), &["net_rx_action"], 10),
            wakeup(10, 9, None, &["producer", "push"], 700),
            wakeup(0, 9, Some(Interrupt::Hard), &timer, 300),
        ];
        slice.threads.insert(
            10,
            ThreadInfo {
                pid: 7,
                name: Arc::from("producer"),
            },
        );
        store.push(slice);
        let s = by_thread(&store.snapshot(), Window::last(30, end), 7, &Sight::all());
        let poll = &s[&8];
        assert_eq!(poll.intervals, 1000);
        assert!((1024.0..2048.0).contains(&poll.median_us), "{poll:?}");
        assert_eq!(
            poll.woken_by[0],
            WokenBy {
                by: "[timer]".into(),
                share: 0.99
            }
        );
        assert_eq!(poll.woken_by[1].by, "[softirq]");
        let cons = &s[&9];
        assert_eq!(cons.intervals, 40);
        assert!((128.0..256.0).contains(&cons.median_us), "{cons:?}");
        assert_eq!(
            cons.woken_by[0],
            WokenBy {
                by: "producer (tid 10)".into(),
                share: 0.7
            }
        );
        assert!(!s.contains_key(&10));
    }

    #[test]
    fn a_user_reads_other_users_wakers_as_a_count() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        let mut slots = [0; crate::profile::model::state::SLEEP_SLOTS];
        slots[5] = 10;
        slice.sleeps = vec![Sleeps {
            pid: 7,
            tid: 9,
            slots,
        }];
        // Thread 9 of pid 7 woken by its own thread 8, and by threads of
        // pids 20 and 30 (another user's), one of them twice.
        let from = |pid, tid, ns| Wakeup {
            pid,
            ..wakeup(tid, 9, None, &["write"], ns)
        };
        slice.wakeups = vec![
            from(7, 8, 100),
            from(20, 21, 300),
            from(30, 31, 500),
            from(20, 22, 100),
        ];
        for (tid, pid, name) in [(8, 7, "own"), (21, 20, "victim"), (31, 30, "victim")] {
            let name = Arc::from(name);
            slice.threads.insert(tid, ThreadInfo { pid, name });
        }
        store.push(slice);
        let reader = crate::profile::report::disclosure::Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(|pid| (pid == 7).then_some((1000, SystemTime::UNIX_EPOCH))),
        };
        let s = by_thread(&store.snapshot(), Window::last(30, end), 7, &reader.sight());
        let by: Vec<&str> = s[&9].woken_by.iter().map(|w| w.by.as_str()).collect();
        assert_eq!(by, ["[other users] ×2", "own (tid 8)"]);
        assert_eq!(s[&9].woken_by[0].share, 0.9);
    }
}
