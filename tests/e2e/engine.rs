//! The off-CPU engine's harder distinctions (root; under CI=true these
//! fail rather than skip): waiting for the CPU quota vs for a CPU, timer
//! wakeups vs the thread a timer interrupted, and stacks sampled by length
//! vs every stack.

use std::{collections::HashMap, fs};

use crate::support::{
    cgroup::QuotaCgroup,
    kernel::accounts,
    rows::{json_at, within},
    *,
};
use serde_json::Value;

fn crunchers(url: &str, pid: u32) -> Vec<Value> {
    let (status, body) = get(&format!("{url}/threads?pid={pid}&seconds=300"));
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == "cruncher")
        .cloned()
        .collect()
}

#[test]
fn quota_throttling_is_told_apart_from_cpu_contention() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    settle(url);

    // Two busy threads, 20 % of one CPU between them.
    let group = QuotaCgroup::create("engine", 20_000);
    let before = group.throttled_us() as f64;
    let script = format!(
        "echo $$ > {} && exec {} 2 6",
        group.dir.join("cgroup.procs").display(),
        workload("starve").display()
    );
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", &script]);
    let w = Workload::spawn(cmd);
    let pid = w.pid;
    let out = w.wait();
    let kernel_throttled = group.throttled_us() as f64 - before;
    settle(url);
    let kernel = accounts(&out);
    let rows = crunchers(url, pid);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (mut throttled_sum, mut runqueue_sum, mut kernel_wait) = (0.0, 0.0, 0.0);
    for t in &rows {
        let wall = us(t, "wall_us");
        let (throttled, runqueue) = (us(t, "throttled_us") / wall, us(t, "runqueue_us") / wall);
        // The kernel's schedstat wait covers both.
        let k = &kernel[&t["tid"].as_u64().unwrap()];
        let waiting = k.runqueue_us / (k.cpu_us + k.runqueue_us);
        assert!(
            (throttled + runqueue - waiting).abs() <= 0.05,
            "runqueue + throttled {:.3} vs the kernel's wait {waiting:.3}: {t}",
            throttled + runqueue
        );
        // Each of the two threads spends about half of what cpu.stat
        // counts throttled (its per-CPU spans): on a busy host the quota
        // refills into a CPU that is taken, and that wait is the
        // runqueue's, so no fixed share holds, but the kernel's count does.
        let kernel_share = kernel_throttled / rows.len() as f64 / wall;
        assert!(
            throttled >= 0.6 * kernel_share,
            "throttled share {throttled:.2}, cpu.stat's per thread {kernel_share:.2}: {t}"
        );
        // On an idle host a refilled quota finds a CPU at once; on a busy
        // one the wait for a CPU is real: the kernel's wait beyond this
        // thread's part of the group's throttled time (cpu.stat sums the
        // per-CPU throttled spans, about one per thread here).
        let beyond_throttled =
            (k.runqueue_us - kernel_throttled / rows.len() as f64).max(0.0) / wall;
        assert!(
            runqueue <= 0.10 + beyond_throttled,
            "runqueue share {runqueue:.2}, the kernel's wait beyond throttling {beyond_throttled:.2}: {t}"
        );
        throttled_sum += us(t, "throttled_us");
        runqueue_sum += us(t, "runqueue_us");
        kernel_wait += k.runqueue_us;
    }
    // The wait for a CPU after the quota's refill counts as throttled (no
    // event marks the refill); cpu.stat leaves it out. On a busy host that
    // wait is what the kernel saw waiting beyond the throttling and the
    // daemon did not call runqueue: the allowance, nothing on an idle host.
    let contention = (kernel_wait - kernel_throttled - runqueue_sum).max(0.0);
    assert!(
        (throttled_sum - kernel_throttled).abs() <= 0.1 * kernel_throttled + contention,
        "throttled {throttled_sum:.0} us in all, cpu.stat says {kernel_throttled:.0} us \
         (waiting for a CPU beyond it: {contention:.0} us)"
    );
    drop(group);

    // Three busy threads pinned to one CPU, no quota: contention only.
    let (pid, _) = run_with_output("starve", &["3", "4", "0"]);
    for t in crunchers(url, pid) {
        let share = us(&t, "runqueue_us") / us(&t, "wall_us");
        assert!(share >= 0.6, "pinned: runqueue share {share:.2}: {t}");
        assert_eq!(us(&t, "throttled_us"), 0.0, "{t}");
    }
}

#[test]
fn a_timer_wakeup_is_not_charged_to_the_thread_it_interrupted() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    settle(url);
    let (pid, out) = run_with_output("timer_wake", &["4"]);
    let ticker: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("ticker "))
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let (rows, body) = folded_rows(&format!(
        "kind=wakeup&tid={ticker}&group=thread&seconds=300"
    ));
    // The query also has the ticker's own wakeups of others (a migration
    // thread when it pins itself): only the rows that woke it count.
    let woke_ticker = format!("[wakes ticker [tid {ticker}]]");
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|(frames, _)| frames.contains(&woke_ticker))
        .collect();
    assert!(
        !rows.is_empty(),
        "no wakers of {ticker} (pid {pid}): {body}"
    );
    assert!(
        rows.iter()
            .all(|(frames, _)| !frames.iter().any(|f| f.starts_with("hog "))),
        "the busy thread is no waker: {body}"
    );
    // Other processes' threads in a syscall are charged with the timer
    // interrupts that land in their kernel time (the known limit of
    // telling interrupts apart without the preempt count; four `yes`
    // loops writing to /dev/null on a busy host are such threads): the
    // share is of the wakeups the interrupts and the workload itself made.
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|(frames, _)| {
            frames[0] == "[irq]" || frames[0] == "[softirq]" || frames[0] == "timer_wake"
        })
        .collect();
    let by_interrupt = share_of(&rows, "[irq]") + share_of(&rows, "[softirq]");
    assert!(
        by_interrupt >= 0.9,
        "{by_interrupt:.2} woken by interrupts: {body}"
    );
}

/// Share of each leaf function (the innermost user frame) in `rows`.
fn leaf_shares(rows: &[(Vec<String>, u64)]) -> HashMap<String, f64> {
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let mut shares = HashMap::new();
    for (frames, v) in rows {
        let leaf = frames
            .iter()
            .rev()
            .find(|f| !f.starts_with('[') && !f.ends_with("_[k]"))
            .cloned()
            .unwrap_or_default();
        *shares.entry(leaf).or_insert(0.0) += *v as f64 / total.max(1) as f64;
    }
    shares
}

#[test]
fn stacks_sampled_by_length_agree_with_every_stack() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let sampled = daemon();
    // Side by side on the same run: the default sampling and none.
    let every = Daemon::start(&["--offcpu-sample-us", "0"]);
    settle(&every.url);
    settle(sampled);
    let w = Workload::start(&workload("mixed"), &["8"]);
    let pid = w.pid;
    w.wait();
    settle(sampled);
    settle(&every.url);
    let query = format!("pid={pid}&kind=offcpu&seconds=300");
    let (status, a) = get(&format!("{sampled}/folded?{query}"));
    assert_eq!(status, 200, "{a}");
    let (status, b) = get(&format!("{}/folded?{query}", every.url));
    assert_eq!(status, 200, "{b}");
    let (a, b) = (
        leaf_shares(&parse_folded(&a)),
        leaf_shares(&parse_folded(&b)),
    );
    assert!(b.len() >= 3, "leaf functions of mixed: {b:?}");
    for (leaf, share) in &b {
        let got = a.get(leaf).copied().unwrap_or(0.0);
        assert!(
            (got - share).abs() <= 0.03,
            "{leaf}: {got:.3} sampled vs {share:.3} unsampled\n{a:?}\n{b:?}"
        );
    }
}

/// The collector thread's scheduling policy and nice, as the kernel has
/// them (`/proc/PID/task/TID/stat` fields 19 and 41).
fn collector_sched(daemon_pid: u32) -> Option<(i64, u64)> {
    let tasks = fs::read_dir(format!("/proc/{daemon_pid}/task")).ok()?;
    tasks.flatten().find_map(|t| {
        let comm = fs::read_to_string(t.path().join("comm")).ok()?;
        (comm.trim() == "ws-collect").then_some(())?;
        let stat = fs::read_to_string(t.path().join("stat")).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // Fields after the name start at 3: nice is 19, policy 41.
        Some((fields[19 - 3].parse().ok()?, fields[41 - 3].parse().ok()?))
    })
}

#[test]
fn the_drain_runs_ahead_and_keeps_its_pace_on_a_busy_host() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    let port = url.rsplit(':').next().unwrap();
    let pid = *processes_running("wallscope", &format!("127.0.0.1:{port}"))
        .first()
        .expect("the daemon's pid");
    let pipeline = || json_at(url, "/healthz")["pipeline"].clone();
    let applied = pipeline()["drain_priority"]
        .as_str()
        .unwrap_or("")
        .to_string();
    // What the daemon reports is what the kernel applied to the thread.
    let (nice, policy) = collector_sched(pid).expect("the ws-collect thread");
    match applied.as_str() {
        "fifo 1" => assert_eq!(policy, libc::SCHED_FIFO as u64),
        "nice -10" => assert_eq!((nice, policy), (-10, libc::SCHED_OTHER as u64)),
        "others niced" => assert_eq!((nice, policy), (0, libc::SCHED_OTHER as u64)),
        other => panic!("drain_priority {other:?}"),
    }
    // Root, or the unit's capabilities (CAP_SYS_NICE among them).
    assert_ne!(applied, "others niced", "the daemon may raise its drain");

    // Four busy loops on top of whatever the host runs.
    let loops: Vec<Workload> = (0..4)
        .map(|_| {
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", "echo ready $$; exec yes > /dev/null"]);
            Workload::spawn(cmd)
        })
        .collect();
    let (start, drains0) = (
        std::time::Instant::now(),
        pipeline()["drains"].as_u64().unwrap(),
    );
    let seconds = 10.0;
    within(std::time::Duration::from_secs(30), || {
        (start.elapsed().as_secs_f64() >= seconds).then_some(())
    });
    let after = pipeline();
    let elapsed = start.elapsed().as_secs_f64();
    drop(loops);
    let drains = after["drains"].as_u64().unwrap() - drains0;
    // One drain a second (the default interval), with a generous margin.
    assert!(
        drains as f64 >= 0.8 * elapsed - 1.0,
        "{drains} drains in {elapsed:.1} s: {after}"
    );
    for field in [
        "drain_us_p50",
        "drain_us_p99",
        "max_drain_us",
        "max_drain_gap_us",
    ] {
        assert!(
            after[field].as_u64().is_some_and(|v| v > 0),
            "{field}: {after}"
        );
    }
    assert_eq!(after["batches_dropped"], 0, "{after}");
}
