//! Runqueue waits summed since start by the waiting thread's cgroup and
//! the cgroup of what ran on the CPU meanwhile: the counters behind
//! `/metrics`' `wallscope_cgroup_kept_off_cpu_seconds_total`.
//!
//! Prometheus counters must only grow, so pairs are never dropped; their
//! number is bounded instead ([`MAX_PAIRS`]), and what comes after lands
//! in one [`OVERFLOW`] pair, so the sum over all pairs stays exact.

use std::{collections::HashMap, sync::Arc};

use crate::profile::model::{KeptOff, Slice};

/// Pairs (victim cgroup, culprit cgroup) kept, at most; one more holds
/// the time of those that did not fit.
pub const MAX_PAIRS: usize = 256;
/// Both halves of the pair that holds what did not fit.
pub const OVERFLOW: &str = "[other]";
/// A process whose cgroup the daemon could not read.
const UNKNOWN: &str = "[unknown]";

/// Nanoseconds of runqueue wait by (victim cgroup, culprit cgroup).
#[derive(Debug, Default)]
pub struct CgroupKeptOff {
    pairs: HashMap<(Arc<str>, Arc<str>), u64>,
}

impl CgroupKeptOff {
    /// Adds the waits of `slice`.
    pub fn add(&mut self, slice: &Slice) {
        let cgroup_of = |pid: u32| -> Arc<str> {
            slice
                .origins
                .get(&pid)
                .and_then(|o| o.cgroup.clone())
                .unwrap_or_else(|| Arc::from(UNKNOWN))
        };
        for k in &slice.kept_off {
            let by: Arc<str> = match k.by {
                0 => Arc::from("[idle]"),
                KeptOff::UNSEEN => Arc::from("[other CPU]"),
                KeptOff::OTHERS => Arc::from("[others]"),
                pid => cgroup_of(pid),
            };
            let mut key = (cgroup_of(k.pid), by);
            if self.pairs.len() >= MAX_PAIRS && !self.pairs.contains_key(&key) {
                key = (Arc::from(OVERFLOW), Arc::from(OVERFLOW));
            }
            *self.pairs.entry(key).or_default() += k.ns;
        }
    }

    /// Every pair with its nanoseconds, in no order.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.pairs.iter().map(|((v, b), ns)| (&**v, &**b, *ns))
    }

    /// Bytes held: the keys' strings and the table's entries.
    pub fn bytes(&self) -> usize {
        let entry = std::mem::size_of::<((Arc<str>, Arc<str>), u64)>() + 8;
        self.pairs
            .keys()
            .map(|(v, b)| entry + v.len() + b.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::profile::model::Origin;

    fn slice(kept: &[(u32, u32, u64)], cgroups: &[(u32, &str)]) -> Slice {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        let mut s = Slice::empty(t - Duration::from_secs(1), t);
        s.kept_off = kept
            .iter()
            .map(|&(pid, by, ns)| KeptOff {
                pid,
                tid: pid,
                by,
                ns,
            })
            .collect();
        for &(pid, cg) in cgroups {
            s.origins.insert(
                pid,
                Origin {
                    parent: 1,
                    cgroup: Some(Arc::from(cg)),
                    ..Origin::default()
                },
            );
        }
        s
    }

    fn get(t: &CgroupKeptOff, victim: &str, by: &str) -> u64 {
        t.pairs()
            .find(|p| (p.0, p.1) == (victim, by))
            .map_or(0, |p| p.2)
    }

    #[test]
    fn waits_are_summed_by_both_cgroups_and_overflow_keeps_the_sum() {
        let mut t = CgroupKeptOff::default();
        t.add(&slice(
            &[(7, 20, 5), (7, 21, 6), (7, 0, 1), (8, KeptOff::UNSEEN, 2)],
            &[(7, "/api"), (20, "/batch"), (21, "/batch")],
        ));
        t.add(&slice(&[(7, 20, 10)], &[(7, "/api"), (20, "/batch")]));
        assert_eq!(get(&t, "/api", "/batch"), 21);
        assert_eq!(get(&t, "/api", "[idle]"), 1);
        assert_eq!(get(&t, "[unknown]", "[other CPU]"), 2);

        let many: Vec<(u32, u32, u64)> = (0..MAX_PAIRS as u32 + 10)
            .map(|i| (1000 + i, 0, 1))
            .collect();
        let groups: Vec<(u32, String)> = many.iter().map(|k| (k.0, format!("/g{}", k.0))).collect();
        let groups: Vec<(u32, &str)> = groups.iter().map(|(p, g)| (*p, g.as_str())).collect();
        t.add(&slice(&many, &groups));
        assert_eq!(t.pairs().count(), MAX_PAIRS + 1);
        let sum: u64 = t.pairs().map(|p| p.2).sum();
        assert_eq!(sum, 24 + MAX_PAIRS as u64 + 10);
        assert!(get(&t, OVERFLOW, OVERFLOW) > 0);
        assert!(t.bytes() > 0);
    }
}
