//! `/metrics` per-process slots taken fairly: 21 idle processes of 300
//! threads each, run by `nobody`, do not take all 20 slots from a busy
//! process of another user. Needs root and eBPF.

use std::path::PathBuf;

use crate::support::{
    get, rows::within, settle, users, workload, Daemon, Fixture, Workload, CATCH_UP,
};

/// `workload(name)` copied where `nobody` can run it.
fn for_nobody(name: &str) -> PathBuf {
    users::runnable_copy(name, &users::shared_dir("slots", 0o755))
}

/// Pids with series in `/metrics`.
fn pids_with_series(url: &str) -> Vec<u32> {
    let (_, body) = get(&format!("{url}/metrics"));
    let mut pids: Vec<u32> = body
        .lines()
        .filter(|l| l.starts_with("wallscope_process_wakeups_total{"))
        .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

#[test]
fn idle_crowd_of_one_user_leaves_a_busy_process_its_metrics_slot() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let ws = Daemon::start(&[]);
    settle(&ws.url);
    let bin = for_nobody("many_threads");
    let crowd: Vec<Workload> = (0..21)
        .map(|_| {
            let mut cmd = users::as_nobody(&bin);
            cmd.args(["300", "120"]);
            Workload::spawn(cmd)
        })
        .collect();
    let busy = Workload::start(&workload("cpu_shares"), &["120", "4"]);
    let crowd_pids: Vec<u32> = crowd.iter().map(|w| w.pid).collect();
    let mut last = Vec::new();
    let seen = within(CATCH_UP, || {
        last = pids_with_series(&ws.url);
        let crowd_in = last.iter().filter(|p| crowd_pids.contains(p)).count();
        // Once the crowd shows up at all, so that it did compete.
        (crowd_in > 0 && last.contains(&busy.pid)).then_some(crowd_in)
    });
    let crowd_in = seen.unwrap_or_else(|| {
        panic!(
            "busy pid {} not in /metrics beside the crowd {crowd_pids:?}: {last:?}",
            busy.pid
        )
    });
    assert!(crowd_in < 20, "the crowd took {crowd_in} slots");
    eprintln!("crowd has {crowd_in} of {} slots", last.len());
    drop(crowd);
}
