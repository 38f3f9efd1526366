//! Complete Java stacks on JVMs started without any flag (issue #27): the
//! BPF walk steps through compiled frames by their code blob's frame size
//! (`bpf/java.bpf.h`), so stacks reach the thread's entry on JDK 17 and
//! HotSpot 21 and 25 without `-XX:+PreserveFramePointer`, on CPU and off
//! CPU. Needs root (eBPF) and the JDKs (`scripts/deps.sh` installs them).
//!
//! Shares of the pool threads' samples, never absolute CPU: a busy host
//! runs the pools less, not differently.

use std::{collections::BTreeMap, thread, time::Duration};

use serde_json::Value;

use crate::support::{
    daemon,
    java::{JavaRun, Jdk, Jvm},
    java_frames::{is_java, java_method},
    rows::{folded_at, json_at, show, within, Rows},
    settle, Fixture, CATCH_UP,
};

/// The thread's entry frame every complete Java stack runs through.
const ENTRY: &str = "java.lang.Thread.run_[0]";
/// Pools' pools (`group=pool`).
const POOLS: [&str; 2] = ["MutationStage-*", "Native-Transport-Requests-*"];
/// Parked's threads.
const PARKERS: [&str; 1] = ["parker-*"];
/// Seconds of profile the checks read, all of it after the warm-up.
const WINDOW: u64 = 10;
/// How long the two JVMs may take to show the same methods at work.
const SETTLE_SHARES: Duration = Duration::from_secs(90);

crate::on_jdks!(pool_stacks_reach_the_thread_entry_without_flags:
    jdk17 Default, jdk21 V21, jdk25 V25);

/// The rows of `pid`'s `pools` over the last [`WINDOW`].
fn rows_of(url: &str, pid: u32, kind: &str, pools: &[&str]) -> Rows {
    folded_at(
        url,
        &format!("pid={pid}&kind={kind}&group=pool&seconds={WINDOW}"),
    )
    .into_iter()
    .filter(|(stack, _)| stack.get(1).is_some_and(|p| pools.contains(&p.as_str())))
    .collect()
}

/// The rows of Pools' pools.
fn pool_rows(url: &str, pid: u32, kind: &str) -> Rows {
    rows_of(url, pid, kind, &POOLS)
}

/// Share of `rows`' weight whose stack holds `frame`.
fn share_through(rows: &Rows, frame: &str) -> f64 {
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let through: u64 = rows
        .iter()
        .filter(|(stack, _)| stack.iter().any(|f| f == frame))
        .map(|r| r.1)
        .sum();
    through as f64 / total.max(1) as f64
}

/// In each pool, each innermost application method's share of the pool's
/// samples (`Pools.*`, marks left out). Application methods, not the JDK
/// ones under them: which JDK methods C2 inlines or replaces with
/// intrinsics differs from one JVM run to the next, and so do the pools'
/// shares of a busy host's CPU; neither is the walk's doing.
fn leaf_shares(rows: &Rows) -> BTreeMap<(String, String), f64> {
    let mut weights: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, value) in rows {
        let pool = stack.get(1).cloned().unwrap_or_default();
        *totals.entry(pool.clone()).or_default() += value;
        let leaf = stack
            .iter()
            .rev()
            .filter_map(|f| java_method(f))
            .map(|(method, _)| method)
            .find(|m| m.starts_with("Pools."));
        if let Some(method) = leaf {
            *weights.entry((pool, method.to_string())).or_default() += value;
        }
    }
    weights
        .into_iter()
        .map(|((pool, method), w)| {
            let share = w as f64 / totals.get(&pool).copied().unwrap_or(1).max(1) as f64;
            ((pool, method), share)
        })
        .collect()
}

/// A method holding a tenth of its pool's samples in `one` and less than
/// a hundredth in `other`, if any.
fn methods_at_work<'a>(
    one: &'a BTreeMap<(String, String), f64>,
    other: &BTreeMap<(String, String), f64>,
) -> Option<&'a (String, String)> {
    one.iter()
        .find(|(method, share)| **share >= 0.1 && other.get(*method).copied().unwrap_or(0.0) < 0.01)
        .map(|(method, _)| method)
}

/// Waits until `jvm`'s pools have compiled frames on CPU, then a whole
/// window more.
fn warm_up(url: &str, jvm: &Jvm) {
    let compiled = |rows: &Rows| {
        rows.iter()
            .any(|(stack, _)| stack.iter().any(|f| f.ends_with("_[j]")))
    };
    within(CATCH_UP, || {
        compiled(&pool_rows(url, jvm.pid, "cpu")).then_some(())
    })
    .unwrap_or_else(|| panic!("no compiled frames in the pools of {}", jvm.pid));
}

fn pool_stacks_reach_the_thread_entry_without_flags(jdk: Jdk) {
    let Some(_fx) = Fixture::ebpf_serial().filter(|_| jdk.available()) else {
        return;
    };
    let url = daemon();
    let plain = JavaRun {
        jdk,
        no_frame_pointer: true,
        ..JavaRun::default()
    }
    .start("Pools", &["3600", "2"]);
    let with_fp = JavaRun {
        jdk,
        ..JavaRun::default()
    }
    .start("Pools", &["3600", "2"]);
    warm_up(url, &plain);
    warm_up(url, &with_fp);
    thread::sleep(Duration::from_secs(WINDOW + 2));
    settle(url);

    // On CPU: from the thread's entry down to the method running.
    let cpu = pool_rows(url, plain.pid, "cpu");
    let reached = share_through(&cpu, ENTRY);
    eprintln!("{jdk:?}: {reached:.3} of the pools' CPU samples reach {ENTRY}");
    assert!(
        reached >= 0.98,
        "{reached:.3} of the pools' CPU samples reach {ENTRY}:\n{}",
        show(&cpu)
    );
    // The same application methods at work as with frame pointers, once
    // both JVMs' JITs have settled. Not the same shares: which callee C2
    // inlines into its caller differs from one JVM run to the next and
    // for good (a CI run saw encodeFrame hold 0.98 of a pool here and
    // 0.86 beside frame pointers, the rest in its caller), and a frame
    // pointer walk from a frameless stub skips the stub's caller. A walk
    // that misnamed or lost frames would leave a method doing a tenth of
    // a pool's work in one JVM and none in the other.
    let mut last = String::new();
    let settled = within(SETTLE_SHARES, || {
        let (ours, theirs) = (
            leaf_shares(&pool_rows(url, plain.pid, "cpu")),
            leaf_shares(&pool_rows(url, with_fp.pid, "cpu")),
        );
        let missing = methods_at_work(&ours, &theirs).or(methods_at_work(&theirs, &ours));
        last = format!("{missing:?} at work in one JVM only\nwithout: {ours:?}\nwith: {theirs:?}");
        missing.is_none().then_some(())
    });
    assert!(settled.is_some(), "{last}");

    drop(with_fp);
    drop(plain);

    // Off CPU: threads parked from compiled code, on a futex.
    let parked = JavaRun {
        jdk,
        no_frame_pointer: true,
        ..JavaRun::default()
    }
    .start("Parked", &["3600", "2"]);
    let compiled_parks = |rows: &Rows| {
        rows.iter().any(|(stack, _)| {
            stack
                .iter()
                .any(|f| f.starts_with("Parked.round_[") && !f.ends_with("_[0]"))
        })
    };
    within(CATCH_UP, || {
        compiled_parks(&rows_of(url, parked.pid, "futex", &PARKERS)).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "Parked.round never compiled in the parkers' futex stacks:\n{}",
            show(&rows_of(url, parked.pid, "futex", &PARKERS))
        )
    });
    thread::sleep(Duration::from_secs(WINDOW + 2));
    settle(url);
    let futex = rows_of(url, parked.pid, "futex", &PARKERS);
    let complete = share_through(&futex, ENTRY);
    eprintln!("{jdk:?}: {complete:.3} of the parkers' futex time reaches {ENTRY}");
    assert!(
        complete >= 0.9,
        "{complete:.3} of the parkers' futex time reaches {ENTRY}:\n{}",
        show(&futex)
    );
    blocked_stacks_are_complete(url, parked.pid);
}

/// `/blocked` lists a parker of `pid` parked with the whole path: the
/// entry and compiled Java frames down to the futex wait.
fn blocked_stacks_are_complete(url: &str, pid: u32) {
    let complete = |t: &Value| {
        let frames: Vec<String> = t["stack"]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter_map(|f| f.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        frames.iter().any(|f| f == ENTRY)
            && frames
                .iter()
                .any(|f| is_java(f) && (f.ends_with("_[j]") || f.ends_with("_[1]")))
    };
    let found = within(CATCH_UP, || {
        let view = json_at(url, &format!("/blocked?pid={pid}&min_seconds=0"));
        view["threads"]
            .as_array()?
            .iter()
            .find(|t| {
                t["state"] == "futex"
                    && t["name"].as_str().is_some_and(|n| n.starts_with("parker-"))
                    && complete(t)
            })
            .cloned()
    });
    assert!(
        found.is_some(),
        "no parked thread with a complete stack in {}",
        json_at(url, &format!("/blocked?pid={pid}&min_seconds=0"))
    );
}
