//! A slice cut to the part of it a window covers: a window's edge may fall
//! inside a slice (a drain interval, or a merged 10 s or 60 s block), and
//! an answer must hold exactly the asked window. Every additive figure
//! (time, counts, histogram slots, loss counters) is scaled by the share
//! of the slice's time the window covers; names and origins are kept.
//! This assumes time spread evenly over the slice: exact for an
//! always-alive thread's wall time, an estimate for bursts (the answer
//! says which edges were cut: see `store::resolution`).

use std::time::SystemTime;

use super::{counters::ThreadCounters, Hist, Slice};

/// `num / den` of a quantity, rounded down (`den` > 0).
#[derive(Debug, Clone, Copy)]
struct Share {
    num: u128,
    den: u128,
}

impl Share {
    fn of(self, v: u64) -> u64 {
        (u128::from(v) * self.num / self.den) as u64
    }

    fn of32(self, v: u32) -> u32 {
        (u128::from(v) * self.num / self.den) as u32
    }

    fn counters(self, c: &ThreadCounters) -> ThreadCounters {
        ThreadCounters {
            ns: c.ns.map(|v| self.of(v)),
            switches_voluntary: self.of(c.switches_voluntary),
            switches_involuntary: self.of(c.switches_involuntary),
            wakeups_sent: self.of(c.wakeups_sent),
            wakeups_received: self.of(c.wakeups_received),
        }
    }

    fn hist(self, h: &Hist) -> Hist {
        let mut out = *h;
        out.slots = h.slots.map(|v| self.of(v));
        out.ns = self.of(h.ns);
        out
    }
}

fn nanos(from: SystemTime, to: SystemTime) -> u128 {
    to.duration_since(from).map_or(0, |d| d.as_nanos())
}

/// The part of `slice` within `from..until` (clipped to the slice), its
/// figures scaled by that part's share of the slice's time; rows scaled
/// to nothing are left out.
pub fn prorated(slice: &Slice, from: SystemTime, until: SystemTime) -> Slice {
    let start = from.max(slice.start);
    let end = until.min(slice.end).max(start);
    let share = Share {
        num: nanos(start, end),
        den: nanos(slice.start, slice.end).max(1),
    };
    let mut out = Slice {
        start,
        end,
        ..slice.clone()
    };
    for s in &mut out.samples {
        (s.ns, s.count) = (share.of(s.ns), share.of(s.count));
    }
    out.samples.retain(|s| s.ns > 0 || s.count > 0);
    for w in &mut out.wakeups {
        (w.ns, w.count) = (share.of(w.ns), share.of(w.count));
    }
    out.wakeups.retain(|w| w.ns > 0 || w.count > 0);
    for t in &mut out.thread_totals {
        t.counters = share.counters(&t.counters);
    }
    for (_, h) in &mut out.runq_hists {
        *h = share.hist(h);
    }
    for k in &mut out.kept_off {
        k.ns = share.of(k.ns);
    }
    out.kept_off.retain(|k| k.ns > 0);
    for s in &mut out.sleeps {
        s.slots = s.slots.map(|v| share.of32(v));
    }
    out.stats = out.stats.map(|v| share.of(v));
    out
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, UNIX_EPOCH},
    };

    use super::*;
    use crate::{
        profile::model::state::State,
        profile::model::{counters::RawThread, Sample},
    };

    fn at_ms(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn a_cut_slice_holds_its_share_of_every_figure() {
        let mut slice = Slice::empty(at_ms(10_000), at_ms(20_000));
        let mut counters = ThreadCounters::default();
        counters.ns[State::Sleep as usize] = 10_000_000_000;
        counters.wakeups_received = 10;
        slice.thread_totals.push(RawThread {
            tid: 2,
            pid: 1,
            comm: "t".into(),
            counters,
        });
        slice.samples.push(Sample {
            pid: 1,
            tid: 2,
            state: State::Sleep,
            stack: Arc::from(vec![Arc::from("f")]),
            ns: 10_000_000_000,
            count: 1,
        });
        slice.stats[0] = 100;
        // 2.5 s of the 10 s slice.
        let cut = prorated(&slice, at_ms(17_500), at_ms(30_000));
        assert_eq!((cut.start, cut.end), (at_ms(17_500), at_ms(20_000)));
        let t = &cut.thread_totals[0].counters;
        assert_eq!(t.wall(), 2_500_000_000);
        assert_eq!(t.wakeups_received, 2);
        assert_eq!(cut.samples[0].ns, 2_500_000_000);
        assert_eq!(cut.samples[0].count, 0, "rounded down, the time kept");
        assert_eq!(cut.stats[0], 25);
        // Two cuts that tile the slice add up to it (to rounding).
        let first = prorated(&slice, at_ms(0), at_ms(17_500));
        assert_eq!(
            first.thread_totals[0].counters.wall() + t.wall(),
            10_000_000_000
        );
        // Nothing of it: an empty cut, no rows.
        let none = prorated(&slice, at_ms(25_000), at_ms(30_000));
        assert!(none.samples.is_empty() && none.start == none.end);
    }
}
