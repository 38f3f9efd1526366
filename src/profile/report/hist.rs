//! The BPF log2 histograms (runqueue latency, throttled intervals): merging
//! them over a window, their buckets and quantiles, and runqlat-style bars.
//!
//! Slot 0 counts intervals under 1 us, slot i > 0 intervals in
//! [2^(i-1), 2^i) us.

use crate::profile::model::{store::Snapshot, window::Window, HistOwner};
use std::fmt::Write as _;

use serde::Serialize;

use crate::profile::model::state::{Hist, HIST_SLOTS};

/// Counts by slot, summed over slices.
pub type Slots = [u64; HIST_SLOTS];

/// One owner's histograms summed over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Merged {
    pub slots: Slots,
    /// Total time of the intervals counted.
    pub ns: u64,
}

impl Default for Merged {
    fn default() -> Self {
        Merged {
            slots: [0; HIST_SLOTS],
            ns: 0,
        }
    }
}

impl Merged {
    /// Adds another owner's merged histograms.
    pub fn absorb(&mut self, other: &Merged) {
        self.ns += other.ns;
        for (a, b) in self.slots.iter_mut().zip(other.slots) {
            *a += b;
        }
    }

    /// Adds one drained histogram.
    pub fn add(&mut self, hist: &Hist) {
        add(&mut self.slots, hist);
        self.ns += hist.ns;
    }

    /// Number of intervals counted.
    pub fn count(&self) -> u64 {
        self.slots.iter().sum()
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// From the lowest to the highest non-empty bucket, empty ones between
    /// included; none when nothing was counted.
    pub fn buckets(&self) -> Vec<Bucket> {
        let first = self.slots.iter().position(|&n| n > 0);
        let last = self.slots.iter().rposition(|&n| n > 0);
        match (first, last) {
            (Some(first), Some(last)) => (first..=last).map(|s| self.bucket(s)).collect(),
            _ => Vec::new(),
        }
    }

    /// The highest non-empty bucket: the longest interval lies in it.
    pub fn max_bucket(&self) -> Option<Bucket> {
        Some(self.bucket(self.slots.iter().rposition(|&n| n > 0)?))
    }

    fn bucket(&self, slot: usize) -> Bucket {
        let (from_us, to_us) = slot_bounds_us(slot);
        Bucket {
            from_us,
            to_us,
            count: self.slots[slot],
        }
    }
}

/// One histogram bucket, intervals in [`from_us`, `to_us`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Bucket {
    pub from_us: u64,
    pub to_us: u64,
    pub count: u64,
}

/// Bounds of `slot` in microseconds, `[from, to)`.
pub fn slot_bounds_us(slot: usize) -> (u64, u64) {
    match slot {
        0 => (0, 1),
        i => (1 << (i - 1), 1 << i),
    }
}

/// Adds `hist`'s counts into `into`.
pub fn add(into: &mut Slots, hist: &Hist) {
    for (a, b) in into.iter_mut().zip(hist.slots) {
        *a += b;
    }
}

/// The `q` quantile (0..=1) in microseconds. The bucket holding the rank
/// `q * count` is found, and intervals are taken as spread evenly within
/// it: the estimate interpolates linearly between its bounds (as
/// Prometheus' `histogram_quantile` does). Error is at most the bucket
/// width.
pub fn quantile_us(slots: &Slots, q: f64) -> Option<f64> {
    let rank = q.clamp(0.0, 1.0) * slots.iter().sum::<u64>() as f64;
    let mut below = 0u64;
    for (slot, &n) in slots.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let (from, to) = slot_bounds_us(slot);
            let within = ((rank - below as f64) / n as f64).max(0.0);
            return Some(from as f64 + (to - from) as f64 * within);
        }
        below += n;
    }
    None
}

/// The `q` quantile to 0.1 us (finer than any bucket is wide), 0 when
/// nothing was counted.
pub fn quantile_rounded(slots: &Slots, q: f64) -> f64 {
    quantile_us(slots, q).map_or(0.0, |v| (v * 10.0).round() / 10.0)
}

/// The histograms of `owner` within `window`, merged.
pub fn merged(store: &Snapshot, owner: HistOwner, window: Window) -> Merged {
    merged_where(store, window, |o| *o == owner)
}

/// The histograms of the owners `pick` takes within `window`, merged.
pub fn merged_where(store: &Snapshot, window: Window, pick: impl Fn(&HistOwner) -> bool) -> Merged {
    let mut merged = Merged::default();
    for slice in store.within(window) {
        for (_, hist) in slice.runq_hists.iter().filter(|(o, _)| pick(o)) {
            merged.add(hist);
        }
    }
    merged
}

/// Width of the `*` bars, as in runqlat.
const BAR_WIDTH: usize = 40;

/// The buckets as BCC's runqlat prints them (bounds as inclusive whole
/// microseconds), under a header.
pub fn render_bars(out: &mut String, buckets: &[Bucket]) {
    let _ = writeln!(out, "{:5}{:<19} : count    distribution", "", "usecs");
    let max = buckets.iter().map(|b| b.count).max().unwrap_or(0).max(1);
    for b in buckets {
        let stars = (u128::from(b.count) * BAR_WIDTH as u128 / u128::from(max)) as usize;
        let _ = writeln!(
            out,
            "{:>10} -> {:<10} : {:<8} |{:<width$}|",
            b.from_us,
            b.to_us - 1,
            b.count,
            "*".repeat(stars),
            width = BAR_WIDTH
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 intervals: 10 under 1 us, 40 in [4, 8), 40 in [8, 16), 10 in
    /// [64, 128).
    fn slots() -> Slots {
        let mut s = [0; HIST_SLOTS];
        (s[0], s[3], s[4], s[7]) = (10, 40, 40, 10);
        s
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let s = slots();
        // Rank 50: 10 + 40 waits end at 8 us exactly; rank 90 at 16 us.
        assert_eq!(quantile_us(&s, 0.5), Some(8.0));
        assert_eq!(quantile_us(&s, 0.9), Some(16.0));
        // Rank 99: 9 of the 10 waits in [64, 128); rank 30: half of [4, 8).
        assert_eq!(quantile_us(&s, 0.99), Some(64.0 + 64.0 * 0.9));
        assert_eq!(quantile_us(&s, 0.3), Some(6.0));
        assert_eq!(quantile_us(&s, 0.05), Some(0.5));
        assert_eq!(quantile_us(&[0; HIST_SLOTS], 0.5), None);
        assert_eq!(quantile_rounded(&[0; HIST_SLOTS], 0.5), 0.0);
    }

    #[test]
    fn buckets_span_the_non_empty_slots() {
        let mut m = Merged::default();
        assert!(m.is_empty() && m.buckets().is_empty() && m.max_bucket().is_none());
        m.add(&Hist {
            slots: slots(),
            ns: 7_000,
        });
        m.add(&Hist {
            slots: slots(),
            ns: 1_000,
        });
        assert_eq!((m.count(), m.ns), (200, 8_000));
        let buckets = m.buckets();
        assert_eq!(buckets.len(), 8, "slots 0..=7");
        let b = |from_us, to_us, count| Bucket {
            from_us,
            to_us,
            count,
        };
        assert_eq!(buckets[1], b(1, 2, 0));
        assert_eq!(m.max_bucket(), Some(b(64, 128, 20)));
    }
}
