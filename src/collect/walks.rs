//! What stack walks cost on this host: the BPF programs time every walk
//! into a per-CPU histogram (`walk_cost`, see bpf/walkcost.bpf.h); the
//! drainer reads it once a drain and keeps the counts since start, from
//! which `/healthz` and `/metrics` give walks and their p50/p99 by kind and
//! depth.

use crate::bpf::abi::{
    walk_kind, WalkCost, WALK_COST_ENTRIES, WALK_DEPTHS, WALK_KINDS, WALK_TIME_SLOTS,
};
use serde::Serialize;

/// Walk counts since start, by kind, depth bucket and time slot.
pub struct WalkCosts {
    /// The last counters read, per CPU (they wrap at 2^32).
    last: Vec<Vec<u32>>,
    total: Vec<u64>,
}

impl Default for WalkCosts {
    fn default() -> Self {
        WalkCosts {
            last: Vec::new(),
            total: vec![0; WALK_COST_ENTRIES],
        }
    }
}

/// Walks of one kind and depth since start, and their cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WalkCostRow {
    /// `user_tables`, `user_frame_pointers`, `kernel` or `blocked`.
    pub kind: &'static str,
    /// Frames found, from and to (inclusive; the last bucket is open).
    pub frames_from: u32,
    pub frames_to: u32,
    pub walks: u64,
    /// Upper bounds of the slots holding the median and the 99th
    /// percentile walk (slots are 19 % wide).
    pub p50_ns: u64,
    pub p99_ns: u64,
}

/// Name of a walk kind in `/healthz` and `/metrics`.
fn kind_name(kind: usize) -> &'static str {
    match kind {
        walk_kind::USER_TABLES => "user_tables",
        walk_kind::USER_FP => "user_frame_pointers",
        walk_kind::KERNEL => "kernel",
        _ => "blocked",
    }
}

/// Lowest walk time, in ns, that lands in `slot` (4 slots per power of two).
fn slot_floor(slot: usize) -> u64 {
    let (e, sub) = ((slot / 4) as u32, (slot % 4) as u64);
    if e < 2 {
        // Below 4 ns only the first slot of each power of two is used.
        if sub == 0 {
            1 << e
        } else {
            1 << (e + 1)
        }
    } else {
        (4 + sub) << (e - 2)
    }
}

impl WalkCosts {
    /// Adds what each CPU counted since the last read.
    pub fn add(&mut self, per_cpu: &[WalkCost]) {
        self.last
            .resize_with(per_cpu.len(), || vec![0; WALK_COST_ENTRIES]);
        for (cpu, last) in per_cpu.iter().zip(self.last.iter_mut()) {
            for ((now, was), total) in cpu.n.iter().zip(last.iter_mut()).zip(&mut self.total) {
                *total += u64::from(now.wrapping_sub(*was));
                *was = *now;
            }
        }
    }

    /// The time slots of one kind and depth bucket (laid out as in BPF).
    fn slots(&self, kind: usize, depth: usize) -> &[u64] {
        let start = (kind * WALK_DEPTHS + depth) * WALK_TIME_SLOTS;
        &self.total[start..start + WALK_TIME_SLOTS]
    }

    /// Every kind and depth that has walks, shallow first.
    pub fn rows(&self) -> Vec<WalkCostRow> {
        (0..WALK_KINDS)
            .flat_map(|kind| {
                (0..WALK_DEPTHS).filter_map(move |depth| row(kind, depth, self.slots(kind, depth)))
            })
            .collect()
    }

    /// Walks of each kind, all depths together (`frames_from` 0,
    /// `frames_to` open).
    pub fn by_kind(&self) -> Vec<WalkCostRow> {
        (0..WALK_KINDS)
            .filter_map(|kind| {
                let mut slots = [0u64; WALK_TIME_SLOTS];
                for depth in 0..WALK_DEPTHS {
                    for (s, v) in slots.iter_mut().zip(self.slots(kind, depth)) {
                        *s += v;
                    }
                }
                row(kind, WALK_DEPTHS - 1, &slots).map(|r| WalkCostRow {
                    frames_from: 0,
                    ..r
                })
            })
            .collect()
    }
}

fn row(kind: usize, depth: usize, slots: &[u64]) -> Option<WalkCostRow> {
    let walks: u64 = slots.iter().sum();
    if walks == 0 {
        return None;
    }
    let quantile = |q: f64| {
        let rank = ((walks as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (slot, n) in slots.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return slot_floor(slot + 1);
            }
        }
        slot_floor(slots.len())
    };
    Some(WalkCostRow {
        kind: kind_name(kind),
        frames_from: depth as u32 * 8,
        frames_to: if depth + 1 == WALK_DEPTHS {
            u32::MAX
        } else {
            depth as u32 * 8 + 7
        },
        walks,
        p50_ns: quantile(0.5),
        p99_ns: quantile(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slot the BPF side computes for a walk of `ns` (walkcost.bpf.h).
    fn slot_of(ns: u64) -> usize {
        let e = 63 - ns.max(1).leading_zeros();
        let sub = if e >= 2 { (ns >> (e - 2)) & 3 } else { 0 };
        ((4 * e as u64 + sub) as usize).min(WALK_TIME_SLOTS - 1)
    }

    #[test]
    fn slots_cover_the_times_they_are_given() {
        for ns in [
            1, 2, 3, 4, 5, 7, 100, 999, 1000, 1023, 1024, 30_000, 999_999,
        ] {
            let s = slot_of(ns);
            assert!(
                slot_floor(s) <= ns && ns < slot_floor(s + 1),
                "{ns} in slot {s}"
            );
        }
    }

    #[test]
    fn percentiles_come_from_the_counts_since_start_across_cpus_and_wraps() {
        let mut costs = WalkCosts::default();
        let at = |kind: usize, depth: usize, ns: u64| {
            (kind * WALK_DEPTHS + depth) * WALK_TIME_SLOTS + slot_of(ns)
        };
        let mut cpu0 = WalkCost {
            n: [0; WALK_COST_ENTRIES],
        };
        let mut cpu1 = cpu0;
        cpu0.n[at(walk_kind::USER_TABLES, 3, 800)] = u32::MAX - 10;
        costs.add(&[cpu0, cpu1]);
        // 98 fast walks and 2 slow ones since, one counter wrapping.
        cpu0.n[at(walk_kind::USER_TABLES, 3, 800)] = 87; // +98
        cpu1.n[at(walk_kind::USER_TABLES, 3, 20_000)] = 2;
        costs.add(&[cpu0, cpu1]);
        let rows = costs.rows();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(
            (r.kind, r.frames_from, r.frames_to),
            ("user_tables", 24, 31)
        );
        assert_eq!(r.walks, u64::from(u32::MAX - 10) + 100);
        assert!(r.p50_ns > 800 && r.p50_ns <= 1000, "{r:?}");
        assert!(r.p99_ns <= 1000, "{r:?}");
        assert_eq!(costs.by_kind()[0].walks, r.walks);
    }

    #[test]
    fn the_99th_percentile_is_the_slow_walk_when_two_in_a_hundred_are_slow() {
        let mut costs = WalkCosts::default();
        let mut cpu = WalkCost {
            n: [0; WALK_COST_ENTRIES],
        };
        let base = (walk_kind::KERNEL * WALK_DEPTHS + 1) * WALK_TIME_SLOTS;
        cpu.n[base + slot_of(500)] = 98;
        cpu.n[base + slot_of(20_000)] = 2;
        costs.add(&[cpu]);
        let r = &costs.rows()[0];
        assert_eq!((r.kind, r.walks), ("kernel", 100));
        assert!(r.p50_ns <= 600, "{r:?}");
        assert!(r.p99_ns > 20_000 && r.p99_ns < 24_000, "{r:?}");
    }
}
