//! The API's off-CPU answers in-process over a synthetic store (no root, no
//! BPF): throttled time in every view, interrupt wakers, graph titles.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::support::api::{call_on, error_of};
use wallscope::{
    api,
    profile::model::state::{Hist, State, HIST_SLOTS, INTERRUPT_TID},
    profile::model::{
        counters::{RawThread, ThreadCounters},
        HistOwner,
    },
    profile::model::{store::Store, Interrupt, Sample, Slice, Stack, ThreadInfo, Wakeup},
    state::Shared,
};

/// The process of the store: a JVM-like `java` with a throttled pool.
const PID: u32 = 4_194_300;
/// A cgroup id no cgroup2 mount will have: it stays unresolved.
const CAPPED: u64 = u64::MAX - 7;
const MS: u64 = 1_000_000;

fn stack(names: &[&str]) -> Stack {
    names.iter().map(|n| Arc::<str>::from(*n)).collect()
}

fn hist(slot: usize, n: u64, ns: u64) -> Hist {
    let mut h = Hist {
        slots: [0; HIST_SLOTS],
        ns,
    };
    h.slots[slot] = n;
    h
}

/// One slice, 1 s old: worker-1 (tid PID + 1) ran 100 ms, was throttled
/// 300 ms (200 ms of it with a stack) and futex-waited 600 ms; it was woken
/// by main, by a network softirq and by a timer interrupt. Pid 0 is the
/// idle task, named as such.
fn app() -> axum::Router {
    let worker = PID + 1;
    let sample = |state, frames: &[&str], ns| Sample {
        pid: PID,
        tid: worker,
        state,
        stack: stack(frames),
        ns,
        count: 1,
    };
    let wakeup = |pid, tid, interrupt, frames: &[&str]| Wakeup {
        pid,
        tid,
        interrupt,
        peer_pid: PID,
        peer_tid: worker,
        stack: stack(frames),
        ns: 10 * MS,
        count: 2,
    };
    let mut ns = [0; State::COUNT];
    ns[State::Cpu as usize] = 100 * MS;
    ns[State::Throttled as usize] = 300 * MS;
    ns[State::Futex as usize] = 600 * MS;
    let name = |name: &str| ThreadInfo {
        pid: PID,
        name: Arc::from(name),
    };
    let now = SystemTime::now();
    let mut store = Store::new(Duration::from_secs(600));
    store.push(Slice {
        start: now - Duration::from_secs(2),
        end: now - Duration::from_secs(1),
        samples: vec![
            sample(State::Cpu, &["run", "compute"], 100 * MS),
            sample(State::Throttled, &["run", "compute"], 200 * MS),
            sample(State::Futex, &["run", "park", "[syscall futex]"], 600 * MS),
        ],
        wakeups: vec![
            wakeup(PID, PID, None, &["main", "unpark"]),
            wakeup(
                0,
                INTERRUPT_TID,
                Some(Interrupt::Soft),
                &[
                    "handle_softirqs_[k]",
                    "net_rx_action_[k]",
                    "try_to_wake_up_[k]",
                ],
            ),
            wakeup(
                0,
                INTERRUPT_TID,
                Some(Interrupt::Hard),
                &["hrtimer_interrupt_[k]", "hrtimer_wakeup_[k]"],
            ),
        ],
        threads: HashMap::from([(PID, name("main")), (worker, name("worker-1"))]),
        thread_totals: vec![RawThread {
            tid: worker,
            pid: PID,
            comm: "worker-1".into(),
            counters: ThreadCounters {
                ns,
                switches_voluntary: 5,
                switches_involuntary: 1,
                wakeups_sent: 0,
                wakeups_received: 6,
            },
        }],
        runq_hists: vec![
            (HistOwner::Process(PID), hist(3, 4, 20_000)),
            (HistOwner::ProcessThrottled(PID), hist(15, 3, 300 * MS)),
            (HistOwner::Cgroup(CAPPED), hist(3, 4, 20_000)),
            (HistOwner::CgroupThrottled(CAPPED), hist(15, 3, 300 * MS)),
        ],
        processes: HashMap::from([(PID, Arc::from("java")), (0, Arc::from("swapper/0"))]),
        containers: HashMap::new(),
        origins: HashMap::new(),
        kept_off: Vec::new(),
        sleeps: Vec::new(),
        stats: [0; wallscope::profile::model::state::STAT_COUNTERS],
        spans: Default::default(),
    });
    api::router(Shared::new(store, Vec::new()))
}

async fn get(uri: &str) -> (u16, String, String) {
    call_on(app(), uri).await
}

async fn ok(uri: &str) -> String {
    let (status, _, body) = get(uri).await;
    assert_eq!(status, 200, "{uri}: {body}");
    body
}

async fn json(uri: &str) -> serde_json::Value {
    serde_json::from_str(&ok(uri).await).unwrap()
}

#[tokio::test]
async fn threads_report_throttled_time() {
    let v = json(&format!("/threads?pid={PID}")).await;
    let t = &v["threads"][0];
    assert_eq!(t["name"], "worker-1");
    assert_eq!(
        (t["throttled_us"].as_u64(), t["wall_us"].as_u64()),
        (Some(300_000), Some(1_000_000))
    );
    assert_eq!(v["pools"][0]["throttled_us"], 300_000);
    assert_eq!(v["process"]["throttled_us"], 300_000);
    let text = ok(&format!("/threads?pid={PID}&format=text")).await;
    assert!(text.contains("thrtl%"), "{text}");
    assert!(
        text.contains("  30.0  "),
        "30 % of wall time throttled: {text}"
    );
}

#[tokio::test]
async fn throttled_is_a_kind_and_a_wall_state() {
    let body = ok(&format!("/folded?pid={PID}&kind=throttled")).await;
    assert_eq!(body, "java;run;compute 200000\n");
    let body = ok(&format!("/folded?pid={PID}&kind=offcpu")).await;
    assert!(body.contains("java;run;compute 200000\n"), "{body}");
    let body = ok(&format!("/folded?pid={PID}&kind=wall&group=thread")).await;
    for line in [
        "java;worker-1 [tid 4194301];[throttled];run;compute 200000",
        "java;worker-1 [tid 4194301];[throttled];[unattributed] 100000",
        "java;worker-1 [tid 4194301];[cpu];run;compute 100000",
    ] {
        assert!(body.lines().any(|l| l == line), "no {line} in\n{body}");
    }
    let (status, _, body) = get("/folded?kind=quota").await;
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("throttled"), "{body}");
}

#[tokio::test]
async fn interrupt_wakers_show_as_irq_and_softirq() {
    let body = ok(&format!("/folded?pid={PID}&kind=wakeup&group=thread")).await;
    let wakee = "[wakes worker-1 [tid 4194301]]";
    for line in [
        format!("[softirq];handle_softirqs_[k];net_rx_action_[k];try_to_wake_up_[k];{wakee} 10000"),
        format!("[irq];hrtimer_interrupt_[k];hrtimer_wakeup_[k];{wakee} 10000"),
        format!("java;main [tid {PID}];main;unpark;{wakee} 10000"),
    ] {
        assert!(body.lines().any(|l| l == line), "no {line} in\n{body}");
    }
    assert!(!body.contains("swapper"), "{body}");
    let svg = ok(&format!("/flamegraph?pid={PID}&kind=wakeup")).await;
    assert!(
        svg.contains("[softirq]") && svg.contains("java (pid 4194300)"),
        "{svg}"
    );
}

#[tokio::test]
async fn flame_graph_titles_name_kind_and_grouping() {
    for (query, title) in [
        (
            "kind=futex&group=thread",
            "Futex wait — java (pid 4194300), by thread, last 30 s, total 600.0 ms",
        ),
        (
            "kind=throttled&group=pool",
            "Throttled (CPU quota spent) — java (pid 4194300), by pool, last 30 s, total 200.0 ms",
        ),
        (
            "kind=offcpu",
            "Off-CPU — java (pid 4194300), by process, last 30 s",
        ),
    ] {
        let svg = ok(&format!("/flamegraph?pid={PID}&{query}")).await;
        assert!(svg.contains(title), "{query}: no {title}");
    }
    let svg = ok("/flamegraph?kind=offcpu&group=pool").await;
    assert!(svg.contains("Off-CPU — all processes, by pool, last 30 s"));
}

#[tokio::test]
async fn runqueue_shows_throttled_time_apart() {
    let v = json(&format!("/runqueue?pid={PID}")).await;
    assert_eq!(
        (v["count"].as_u64(), v["total_us"].as_u64()),
        (Some(4), Some(20))
    );
    assert_eq!(
        v["throttled"],
        serde_json::json!({
            "count": 3,
            "total_us": 300_000,
            "max_bucket": {"from_us": 16384, "to_us": 32768, "count": 3},
            "buckets": [{"from_us": 16384, "to_us": 32768, "count": 3}],
        })
    );
    let v = json(&format!("/runqueue?cgroup={CAPPED}")).await;
    assert_eq!(v["throttled"]["total_us"], 300_000);
    let text = ok(&format!("/runqueue?pid={PID}&format=text")).await;
    assert!(
        text.contains(
            "throttled (CPU quota spent) of pid 4194300, last 30 s: 3 intervals, 300.0 ms in all"
        ),
        "{text}"
    );
    assert!(
        text.contains("     16384 -> 32767      : 3        |"),
        "{text}"
    );
}

#[tokio::test]
async fn runqueue_lists_cgroups_throttled_first() {
    let v = json("/runqueue?cgroup=all").await;
    assert_eq!(v["seconds"], 30);
    let rows = v["cgroups"].as_array().unwrap();
    let throttled = &rows[0];
    assert_eq!(throttled["cgroup"], CAPPED, "{v}");
    assert_eq!(
        (
            &throttled["throttled_intervals"],
            &throttled["throttled_us"]
        ),
        (&serde_json::json!(3), &serde_json::json!(300_000)),
        "{v}"
    );
    // The waits BPF filed under the unified id: the same row where the
    // `cpu` controller is unified, a `v2` row of their own where it has a
    // v1 hierarchy (ids of two hierarchies name different directories).
    let waits = rows
        .iter()
        .find(|r| r["cgroup"] == CAPPED && r["hierarchy"] == "v2")
        .unwrap_or_else(|| panic!("no v2 row of {CAPPED}: {v}"));
    assert_eq!(
        (
            &waits["runqueue_waits"],
            &waits["runqueue_total_us"],
            &waits["runqueue_p99_us"]
        ),
        (
            &serde_json::json!(4),
            &serde_json::json!(20),
            &serde_json::json!(8.0)
        ),
        "{v}"
    );
    let text = ok("/runqueue?cgroup=all&format=text").await;
    assert!(text.contains("1 throttled (CPU quota spent)"), "{text}");
    assert!(text.contains(&format!("cgroup {CAPPED}")), "{text}");
    let (status, _, body) = get(&format!("/runqueue?cgroup=all&pid={PID}")).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("`cgroup`"), "{body}");
    let (status, _, body) = get("/runqueue?cgroup=everything").await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("`all`"), "{body}");
}
