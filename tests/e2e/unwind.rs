//! Stacks through code without frame pointers (issue 5): the same workload
//! watched at once by a daemon walking with unwind tables (the default) and
//! one walking frame pointers only (`--unwind fp`). Needs root (eBPF).

use std::{path::Path, time::Duration};

use crate::support::{
    daemon, get,
    rows::{folded_at as folded, json_at, share_with_chain, show, within, Rows},
    rust_workload, settle, workload_without_frame_pointers, Daemon, Fixture, Workload,
};

/// Waits until the daemon at `url` has caught up and built the tables of
/// the binaries running on the host (a few per drain, within a budget): a
/// workload started after them gets its own at once instead of sharing the
/// builds with that backlog. On a host where new binaries keep starting
/// the backlog may never empty: then 60 s are enough.
fn wait_warm(url: &str) {
    settle(url);
    within(Duration::from_secs(60), || {
        let health = json_at(url, "/healthz");
        (health["pipeline"]["unwind"]["tables_pending"].as_u64()? == 0).then_some(())
    });
}

/// Runs `bin 8` under both daemons; returns (tables, fp) rows for `kind`s.
fn watch(bin: &Path, kinds: &[&str]) -> Vec<(Rows, Rows)> {
    let tables = daemon();
    let fp = Daemon::start(&["--unwind", "fp"]);
    wait_warm(tables);
    wait_warm(&fp.url);
    let w = Workload::start(bin, &["8"]);
    let pid = w.pid;
    w.wait();
    settle(tables);
    settle(&fp.url);
    kinds
        .iter()
        .map(|kind| {
            let q = format!("pid={pid}&kind={kind}&seconds=300");
            (folded(tables, &q), folded(&fp.url, &q))
        })
        .collect()
}

/// The first second of a process runs before its tables are registered
/// (they are set up at the first drain that sees it): most, not all.
const COMPLETE: f64 = 0.7;

#[test]
fn c_without_frame_pointers_has_complete_stacks_with_tables_only() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let bin = workload_without_frame_pointers("nofp");
    let views = watch(&bin, &["cpu", "sleep"]);
    let (cpu, cpu_fp) = &views[0];
    let (sleep, sleep_fp) = &views[1];
    let cpu_chain = ["main", "run", "stage_one", "stage_two", "burn"];
    let sleep_chain = ["start_thread", "sleeper", "nap_outer", "nap_inner"];

    for (kind, (tables, fp), chain) in [
        ("cpu", (cpu, cpu_fp), &cpu_chain[..]),
        ("sleep", (sleep, sleep_fp), &sleep_chain[..]),
    ] {
        let (with, without) = (share_with_chain(tables, chain), share_with_chain(fp, chain));
        eprintln!("{kind}: complete {with:.2} with tables, {without:.2} with frame pointers");
        assert!(with >= COMPLETE, "tables, {kind}:\n{}", show(tables));
        assert!(without < 0.2, "frame pointers alone, {kind}:\n{}", show(fp));
    }
    // Frame pointers alone: one or two frames above the syscall.
    let user_frames = |s: &Vec<String>| s.iter().skip(1).filter(|f| !f.starts_with('[')).count();
    let short: u64 = sleep_fp
        .iter()
        .filter(|r| user_frames(&r.0) <= 2)
        .map(|r| r.1)
        .sum();
    let total: u64 = sleep_fp.iter().map(|r| r.1).sum();
    assert!(short as f64 > 0.8 * total as f64, "{}", show(sleep_fp));
}

#[test]
fn rust_release_build_without_frame_pointers_has_complete_stacks() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let bin = rust_workload("nofp_rust");
    let views = watch(&bin, &["cpu", "sleep"]);
    let (cpu, cpu_fp) = &views[0];
    let (sleep, sleep_fp) = &views[1];
    let cpu_chain = [
        "main",
        "nofp_rust::main",
        "nofp_rust::outer",
        "nofp_rust::middle",
        "nofp_rust::spin",
    ];
    let sleep_chain = [
        "start_thread",
        "nofp_rust::doze_outer",
        "nofp_rust::doze_inner",
        "std::thread::functions::sleep",
    ];
    let cpu_share = share_with_chain(cpu, &cpu_chain);
    let sleep_share = share_with_chain(sleep, &sleep_chain);
    eprintln!(
        "rust: complete cpu {cpu_share:.2} (fp {:.2}), sleep {sleep_share:.2} (fp {:.2})",
        share_with_chain(cpu_fp, &cpu_chain),
        share_with_chain(sleep_fp, &sleep_chain)
    );
    assert!(cpu_share >= COMPLETE, "cpu:\n{}", show(cpu));
    assert!(sleep_share >= COMPLETE, "sleep:\n{}", show(sleep));
    assert!(
        share_with_chain(cpu_fp, &cpu_chain) < 0.2,
        "{}",
        show(cpu_fp)
    );
}

#[test]
fn tables_that_do_not_fit_are_counted_not_fatal() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    // 2 MiB hold about 175k rows and no table may take over a quarter:
    // glibc's table (29k rows) fits, the daemon's own binary's (over 100k
    // rows) does not.
    let small = Daemon::start(&["--unwind-table-mb", "2"]);
    wait_warm(&small.url);
    let bin = workload_without_frame_pointers("nofp");
    let w = Workload::start(&bin, &["8"]);
    let pid = w.pid;
    w.wait();
    settle(&small.url);
    let (status, body) = get(&format!("{}/healthz", small.url));
    assert_eq!(status, 200);
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    let unwind = &health["pipeline"]["unwind"];
    let n = |k: &str| unwind[k].as_u64().unwrap_or(0);
    assert!(n("tables_too_big") + n("tables_evicted") >= 1, "{unwind}");
    assert!(n("tables_loaded") >= 1, "{unwind}");
    assert!(n("rows_in_use") <= n("rows_capacity"), "{unwind}");
    let rows = folded(&small.url, &format!("pid={pid}&kind=cpu&seconds=300"));
    let chain = ["main", "run", "stage_one", "stage_two", "burn"];
    assert!(
        share_with_chain(&rows, &chain) >= COMPLETE,
        "{}",
        show(&rows)
    );
    // Every way a walk can end early has its counter.
    let (_, metrics) = get(&format!("{}/metrics", small.url));
    for reason in [
        "unwind_no_info",
        "unwind_unsupported_rule",
        "unwind_read_failed",
        "unwind_truncated",
    ] {
        assert!(
            metrics.contains(&format!(
                "wallscope_bpf_events_total{{counter=\"{reason}\"}}"
            )),
            "{reason} missing from /metrics"
        );
    }
}

#[test]
fn a_forked_child_walks_with_its_parents_tables_at_once() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    wait_warm(url);
    // User space registers the child at the first drain that sees it, up
    // to a second or two into its two-second life; until then its tables
    // come from the parent, copied at fork.
    let w = Workload::start(&workload_without_frame_pointers("forker"), &[]);
    let out = w.wait();
    let child: u32 = out
        .trim()
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no child pid in {out:?}"));
    settle(url);
    let rows = folded(url, &format!("pid={child}&kind=sleep&seconds=300"));
    let complete = share_with_chain(
        &rows,
        &[
            "main",
            "child_loop",
            "child_nap",
            "[syscall clock_nanosleep]",
        ],
    );
    assert!(complete > 0.95, "child:\n{}", show(&rows));
}
