//! Selecting and grouping samples: the answers the API gives.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::SystemTime,
};

use serde::Serialize;

use super::{store::Store, Sample};
use crate::bpf::abi::State;

/// Which samples a query wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub state: State,
    /// The last `seconds` before the query.
    pub seconds: u64,
}

impl Filter {
    fn matches(&self, s: &Sample) -> bool {
        s.state == self.state
            && self.pid.is_none_or(|p| p == s.pid)
            && self.tid.is_none_or(|t| t == s.tid)
    }
}

/// Stacks folded root-first, with nanoseconds per stack.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    /// `process;frame;...;leaf` -> nanoseconds.
    pub stacks: BTreeMap<String, u64>,
    pub total_ns: u64,
    /// Names of the processes that contributed, by pid.
    pub processes: BTreeMap<u32, Arc<str>>,
}

/// Folds the samples that match `filter`; the root frame is the process name.
pub fn folded(store: &Store, filter: &Filter, now: SystemTime) -> Folded {
    let mut out = Folded::default();
    let mut by_stack: HashMap<(Arc<str>, &super::Stack), u64> = HashMap::new();
    for slice in store.window(filter.seconds, now) {
        for s in slice.samples.iter().filter(|s| filter.matches(s)) {
            let name = slice
                .processes
                .get(&s.pid)
                .cloned()
                .unwrap_or_else(|| Arc::from("[unknown]"));
            out.processes.entry(s.pid).or_insert_with(|| name.clone());
            *by_stack.entry((name, &s.stack)).or_default() += s.ns;
            out.total_ns += s.ns;
        }
    }
    for ((root, stack), ns) in by_stack {
        let mut line = String::with_capacity(16 * (stack.len() + 1));
        line.push_str(&root);
        for frame in stack.iter() {
            line.push(';');
            line.push_str(frame);
        }
        *out.stacks.entry(line).or_default() += ns;
    }
    out
}

/// One row of `/processes`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessSummary {
    pub pid: u32,
    pub comm: String,
    pub cpu_us: u64,
}

/// Processes by CPU time in the last `seconds`, busiest first.
pub fn processes(store: &Store, seconds: u64, now: SystemTime) -> Vec<ProcessSummary> {
    let mut cpu: HashMap<u32, (Arc<str>, u64)> = HashMap::new();
    for slice in store.window(seconds, now) {
        for s in slice.samples.iter().filter(|s| s.state == State::Cpu) {
            let entry = cpu.entry(s.pid).or_insert_with(|| {
                (
                    slice
                        .processes
                        .get(&s.pid)
                        .cloned()
                        .unwrap_or_else(|| Arc::from("[unknown]")),
                    0,
                )
            });
            entry.1 += s.ns;
        }
    }
    let mut rows: Vec<ProcessSummary> = cpu
        .into_iter()
        .map(|(pid, (comm, ns))| ProcessSummary {
            pid,
            comm: comm.to_string(),
            cpu_us: ns_to_us(ns),
        })
        .collect();
    rows.sort_by(|a, b| b.cpu_us.cmp(&a.cpu_us).then(a.pid.cmp(&b.pid)));
    rows
}

/// Whether anything was recorded for `pid` during the whole retention.
pub fn pid_recorded(store: &Store, pid: u32) -> bool {
    store.all().any(|s| s.processes.contains_key(&pid))
}

/// Whether anything was recorded for thread `tid` during the whole retention.
pub fn tid_recorded(store: &Store, tid: u32) -> bool {
    store.all().any(|s| s.threads.contains_key(&tid))
}

/// Nanoseconds to microseconds, rounded to nearest; a non-zero time never
/// rounds down to zero, so no recorded stack disappears from the output.
pub fn ns_to_us(ns: u64) -> u64 {
    if ns == 0 {
        0
    } else {
        ((ns + 500) / 1000).max(1)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::profile::{Slice, Stack};

    fn sample(pid: u32, tid: u32, frames: &[&str], ns: u64) -> Sample {
        let stack: Stack = frames.iter().map(|f| Arc::<str>::from(*f)).collect();
        Sample {
            pid,
            tid,
            state: State::Cpu,
            stack,
            ns,
            count: 1,
        }
    }

    fn store() -> (Store, SystemTime) {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        store.push(Slice {
            start: end - Duration::from_secs(1),
            end,
            samples: vec![
                sample(10, 10, &["main", "a"], 3_000),
                sample(10, 11, &["main", "a"], 1_000),
                sample(10, 11, &["main", "b"], 2_000),
                sample(20, 20, &["main"], 9_000),
            ],
            threads: [10, 11, 20]
                .map(|tid| {
                    (
                        tid,
                        crate::profile::ThreadInfo {
                            pid: tid / 10 * 10,
                            name: Arc::from("t"),
                        },
                    )
                })
                .into(),
            processes: [(10, Arc::from("ten")), (20, Arc::from("twenty"))].into(),
            stats: Default::default(),
        });
        (store, end)
    }

    #[test]
    fn folds_by_process_and_filters_by_pid_and_tid() {
        let (store, now) = store();
        let all = Filter {
            pid: None,
            tid: None,
            state: State::Cpu,
            seconds: 30,
        };
        let f = folded(&store, &all, now);
        assert_eq!(f.total_ns, 15_000);
        assert_eq!(
            f.stacks["ten;main;a"], 4_000,
            "threads merge under the process"
        );
        assert_eq!(f.stacks["twenty;main"], 9_000);

        let f = folded(
            &store,
            &Filter {
                pid: Some(10),
                tid: Some(11),
                ..all.clone()
            },
            now,
        );
        assert_eq!(f.total_ns, 3_000);
        assert_eq!(f.stacks.len(), 2);

        let later = now + Duration::from_secs(60);
        assert!(
            folded(&store, &all, later).stacks.is_empty(),
            "outside the window"
        );
    }

    #[test]
    fn processes_sorted_by_cpu() {
        let (store, now) = store();
        let rows = processes(&store, 30, now);
        assert_eq!(
            rows[0],
            ProcessSummary {
                pid: 20,
                comm: "twenty".into(),
                cpu_us: 9
            }
        );
        assert_eq!(rows[1].pid, 10);
        assert!(pid_recorded(&store, 10) && !pid_recorded(&store, 11));
        assert!(tid_recorded(&store, 11) && !tid_recorded(&store, 99));
    }

    #[test]
    fn rounding_never_loses_a_stack() {
        assert_eq!(ns_to_us(0), 0);
        assert_eq!(ns_to_us(1), 1);
        assert_eq!(ns_to_us(1_499), 1);
        assert_eq!(ns_to_us(1_500), 2);
    }
}
