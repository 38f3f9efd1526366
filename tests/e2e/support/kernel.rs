//! The kernel's own account of a workload's threads, printed by the
//! workloads (`tests/workloads/account.h`): what the daemon reports is
//! compared with it, so that a test holds however much CPU the workload
//! got on a busy host.

use std::collections::HashMap;

/// One thread's schedstat and context switch counts, as the kernel kept them.
#[derive(Debug, Clone, Copy)]
pub struct Account {
    /// Time on a CPU, microseconds.
    pub cpu_us: f64,
    /// Time runnable but waiting on a runqueue, microseconds.
    pub runqueue_us: f64,
    /// Times put on a CPU: each ends a wait on a runqueue.
    pub runs: u64,
    /// Voluntary context switches: each is a block that a wakeup ended.
    pub voluntary: u64,
}

/// The `account <tid> <cpu_ns> <runqueue_ns> <runs> <voluntary>` lines of a
/// workload's output, by thread id.
pub fn accounts(output: &str) -> HashMap<u64, Account> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("account "))
        .map(|l| {
            let f: Vec<u64> = l
                .split(' ')
                .map(|v| v.parse().unwrap_or_else(|_| panic!("bad account {l:?}")))
                .collect();
            assert_eq!(f.len(), 5, "bad account {l:?}");
            let account = Account {
                cpu_us: f[1] as f64 / 1e3,
                runqueue_us: f[2] as f64 / 1e3,
                runs: f[3],
                voluntary: f[4],
            };
            (f[0], account)
        })
        .collect()
}

/// Panics unless the daemon's `daemon_us` is the kernel's `kernel_us` within
/// `share` of the thread's `wall_us` (sampling and drain boundaries differ
/// a little, not in proportion to the load).
pub fn assert_agrees(what: &str, daemon_us: f64, kernel_us: f64, wall_us: f64, share: f64) {
    assert!(
        (daemon_us - kernel_us).abs() <= share * wall_us + 20_000.0,
        "{what}: daemon {daemon_us:.0} us, kernel {kernel_us:.0} us (thread wall {wall_us:.0} us)"
    );
}

/// The kernel's account, read now from `/proc`, of each live thread of
/// `pid` whose name (at most 15 bytes) starts with `prefix`.
pub fn threads_now(pid: u32, prefix: &str) -> HashMap<u64, Account> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let read = |file| std::fs::read_to_string(task.path().join(file)).ok();
            read("comm")?.starts_with(prefix).then_some(())?;
            let schedstat: Vec<u64> = read("schedstat")?
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            let voluntary = read("status")?
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
                .trim()
                .parse()
                .ok()?;
            let account = Account {
                cpu_us: *schedstat.first()? as f64 / 1e3,
                runqueue_us: *schedstat.get(1)? as f64 / 1e3,
                runs: *schedstat.get(2)?,
                voluntary,
            };
            Some((tid, account))
        })
        .collect()
}

/// How much the accounts of the threads in both `before` and `after`
/// grew, summed; and how many threads that is.
pub fn growth(before: &HashMap<u64, Account>, after: &HashMap<u64, Account>) -> (Account, usize) {
    let mut sum = Account {
        cpu_us: 0.0,
        runqueue_us: 0.0,
        runs: 0,
        voluntary: 0,
    };
    let mut threads = 0;
    for (tid, a) in after {
        if let Some(b) = before.get(tid) {
            sum.cpu_us += a.cpu_us - b.cpu_us;
            sum.runqueue_us += a.runqueue_us - b.runqueue_us;
            sum.runs += a.runs - b.runs;
            sum.voluntary += a.voluntary - b.voluntary;
            threads += 1;
        }
    }
    (sum, threads)
}
