//! The HTTP API in-process over a synthetic store (no root, no BPF):
//! status codes, messages and formats.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::support::api::{app, call, call_on, error_of, get_with, GONE_PID};
use wallscope::{
    api,
    profile::model::{store::Store, Slice},
    state::Shared,
};

#[tokio::test]
async fn folded_serves_root_first_stacks_in_microseconds() {
    let (status, ctype, body) = call(&format!("/folded?pid={GONE_PID}")).await;
    assert_eq!(status, 200, "{body}");
    assert!(ctype.starts_with("text/plain"));
    assert_eq!(body, "app;main;heavy 6000\napp;main;light;read_[k] 1000\n");
    let (_, _, body) = call(&format!("/folded?pid={GONE_PID}&tid={}", GONE_PID + 1)).await;
    assert_eq!(body, "app;main;light;read_[k] 1000\n");
    let (_, _, body) = call("/folded").await;
    assert_eq!(body.lines().count(), 2, "no pid = whole host");
}

#[tokio::test]
async fn flamegraph_is_svg_by_default_and_folded_on_request() {
    let (status, ctype, body) = call(&format!("/flamegraph?pid={GONE_PID}&seconds=60")).await;
    assert_eq!(status, 200);
    assert_eq!(ctype, "image/svg+xml");
    assert!(
        body.contains(&format!(
            "CPU — app (pid {GONE_PID}), by process, last 60 s, total 7.0 ms"
        )),
        "{body}"
    );
    let (status, ctype, body) = call(&format!("/flamegraph?pid={GONE_PID}&format=folded")).await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/plain"));
    assert!(body.starts_with("app;main;heavy 6000"));
}

#[tokio::test]
async fn unknown_pid_is_404_and_a_known_one_with_nothing_recorded_200_with_a_note() {
    for uri in [
        "/folded?pid=4194000",
        "/flamegraph?pid=4194000",
        "/pprof?pid=4194000",
        "/threads?pid=4194000",
        "/runqueue?pid=4194000",
    ] {
        let (status, _, body) = call(uri).await;
        assert_eq!(status, 404, "{uri}");
        assert!(
            error_of(&body).contains("unknown pid 4194000"),
            "{uri}: {body}"
        );
    }
    // Our own process exists but has no samples in this store.
    let me = std::process::id();
    let note = format!("no CPU samples for pid {me} in the last 30 s");
    for uri in [format!("/folded?pid={me}"), format!("/flamegraph?pid={me}")] {
        let (status, headers, body) = crate::support::api::send(app(), get_with(&uri, &[])).await;
        assert_eq!(status, 200, "{uri}: {body}");
        let header = headers.get("x-wallscope-note").unwrap().to_str().unwrap();
        assert_eq!(header, note, "{uri}");
        if uri.starts_with("/flamegraph") {
            assert!(body.contains(&note) && body.contains("<svg"), "{body}");
        }
    }
    let (status, _, body) = call(&format!("/threads?pid={me}")).await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        report["note"]
            .as_str()
            .unwrap()
            .contains("nothing recorded"),
        "{body}"
    );
    let listed = report["threads"].as_array().unwrap();
    assert!(
        listed.iter().any(|t| t["tid"] == me),
        "our main thread: {body}"
    );
    assert!(listed.iter().all(|t| t["wall_us"] == 0), "{body}");
    let (status, headers, body) =
        crate::support::api::send(app(), get_with(&format!("/runqueue?pid={me}"), &[])).await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let note = format!("no runqueue latency or throttling recorded for pid {me} in the last 30 s");
    assert_eq!(report["note"], note.as_str(), "{body}");
    assert_eq!(headers["x-wallscope-note"], note.as_str());
    assert_eq!(
        (
            report["count"].as_u64(),
            report["throttled"]["count"].as_u64()
        ),
        (Some(0), Some(0))
    );
    // A process recorded within the retention, gone now: known too.
    let (status, _, body) = call(&format!("/folded?pid={GONE_PID}&seconds=1&kind=futex")).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(&format!("/folded?pid={GONE_PID}&tid=4194001")).await;
    assert_eq!(status, 404);
    assert!(error_of(&body).contains("tid 4194001"), "{body}");
}

#[tokio::test]
async fn malformed_parameters_are_400_naming_the_parameter() {
    for (uri, param) in [
        ("/folded?pid=abc", "`pid`"),
        ("/folded?pid=-1", "`pid`"),
        ("/folded?pid=0", "`pid`"),
        ("/folded?tid=1.5", "`tid`"),
        ("/folded?seconds=0", "`seconds`"),
        ("/folded?seconds=601", "`seconds`"),
        ("/folded?seconds=99999999999999999999999", "`seconds`"),
        ("/flamegraph?format=png", "`format`"),
        ("/folded?format=svg", "`format`"),
        ("/folded?pdi=1", "`pdi`"),
        ("/folded?pid=1&pid=2", "`pid`"),
        ("/processes?seconds=x", "`seconds`"),
        // A sign, whitespace or nothing: only plain digits make a number.
        ("/folded?pid=+5", "`pid`"),
        ("/folded?pid=%2B5", "`pid`"),
        ("/folded?pid=5%20", "`pid`"),
        ("/folded?pid=%205", "`pid`"),
        ("/folded?pid=", "`pid`"),
        ("/threads?pid=+5", "`pid`"),
        ("/folded?seconds=+5", "`seconds`"),
    ] {
        let (status, ctype, body) = call(uri).await;
        assert_eq!(status, 400, "{uri}: {body}");
        assert!(ctype.starts_with("application/json"), "{uri}");
        assert!(error_of(&body).contains(param), "{uri}: {body}");
    }
}

#[tokio::test]
async fn processes_and_healthz_are_json() {
    let (status, _, body) = call("/processes?seconds=10").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v,
        serde_json::json!([{"pid": GONE_PID, "comm": "app", "cpu_us": 7000, "time": {
            "cpu_us": 0, "runqueue_us": 0, "throttled_us": 0, "futex_us": 0, "io_us": 0,
            "sleep_us": 0, "blocked_us": 0, "active_us": 0, "wall_us": 0
        }}]),
        "no thread totals in this store: sampled CPU only"
    );

    let (status, _, body) = call("/healthz").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["programs"][0]["links"], 2);
    assert_eq!(v["samples_lost"], 0);
}

#[tokio::test]
async fn index_page_loads_the_host_script_which_offers_every_sort_order() {
    let (status, ctype, body) = call("/").await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/html"));
    assert!(body.contains("<script src=\"/ui/host.js\">"), "{body}");
    let (status, ctype, script) = call("/ui/host.js").await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/javascript"), "{ctype}");
    assert!(script.contains("/processes?") && script.contains("/process/${p.pid}"));
    // The page offers the sort orders the daemon lists (`/ui/meta.json`,
    // tests/api_ui.rs), and keeps no list of its own.
    assert!(script.contains("WS.SORTS"), "{script}");
    assert!(!script.contains("\"blocked\""), "{script}");
}

/// Pid with runqueue histograms and thread totals in [`metrics_app`].
const BUSY_PID: u32 = 500;
/// A cgroup id no cgroup2 mount will have.
const NO_CGROUP: u64 = u64::MAX - 1;

/// A store for `/runqueue` and `/metrics`: two slices, 90 s and 1 s old.
/// Ranked by wall time in the last 60 s: pid 500 (2 threads), pid 600 (a
/// name that needs escaping), then fillers 700..=720 with decreasing time;
/// pid 800 has the most time but only in the old slice.
fn metrics_app() -> axum::Router {
    use wallscope::{
        bpf::abi::Stat,
        profile::model::state::{Hist, HIST_SLOTS},
        profile::model::{
            counters::{RawThread, ThreadCounters},
            HistOwner,
        },
    };
    let thread = |pid: u32, tid: u32, comm: &str, ns: [u64; 6]| RawThread {
        counters: ThreadCounters {
            ns,
            switches_voluntary: 3,
            switches_involuntary: 1,
            wakeups_sent: 0,
            wakeups_received: 4,
        },
        tid,
        pid,
        comm: comm.into(),
    };
    let hist = |slots: &[(usize, u64)]| {
        let mut h = Hist {
            slots: [0; HIST_SLOTS],
            ns: 0,
        };
        for &(slot, n) in slots {
            h.slots[slot] = n;
        }
        h
    };
    let now = SystemTime::now();
    let mut store = Store::new(Duration::from_secs(600));
    for age in [90, 1] {
        let ms = 1_000_000;
        let mut totals = vec![
            thread(
                BUSY_PID,
                BUSY_PID,
                "app",
                [1000 * ms, 200 * ms, 300 * ms, 0, 500 * ms, 50 * ms],
            ),
            thread(BUSY_PID, BUSY_PID + 1, "worker", [500 * ms, 0, 0, 0, 0, 0]),
            thread(600, 600, "x", [900 * ms, 0, 0, 0, 0, 0]),
        ];
        if age == 1 {
            totals.extend((0..21).map(|i| {
                thread(
                    700 + i,
                    700 + i,
                    "filler",
                    [(100 - u64::from(i)) * ms, 0, 0, 0, 0, 0],
                )
            }));
        } else {
            totals.push(thread(800, 800, "old", [10_000 * ms, 0, 0, 0, 0, 0]));
        }
        let mut runq_hists = vec![
            (
                HistOwner::Process(BUSY_PID),
                hist(&[(0, 2), (3, 5), (10, 1)]),
            ),
            (HistOwner::Cgroup(NO_CGROUP), hist(&[(5, 3)])),
            (HistOwner::Process(600), hist(&[(2, 4)])),
            (HistOwner::ProcessThrottled(600), hist(&[(12, 1)])),
        ];
        if let Some(root) = wallscope::process::cgroups::system().id_of("/") {
            runq_hists.push((HistOwner::Cgroup(root), hist(&[(1, 9)])));
        }
        let mut stats = [0; Stat::COUNT];
        stats[Stat::Samples as usize] = 7;
        store.push(Slice {
            start: now - Duration::from_secs(age + 1),
            end: now - Duration::from_secs(age),
            samples: Vec::new(),
            wakeups: Vec::new(),
            threads: HashMap::new(),
            thread_totals: totals,
            runq_hists,
            processes: HashMap::from([(BUSY_PID, Arc::from("app")), (600, Arc::from("we\"ird"))]),
            containers: HashMap::new(),
            origins: HashMap::new(),
            kept_off: Vec::new(),
            sleeps: Vec::new(),
            stats,
            spans: Default::default(),
        });
    }
    let shared = Shared::new(store, Vec::new());
    {
        let mut health = shared.health.lock().unwrap();
        health.drains = 5;
        health.last_drain_us = 1500;
    }
    api::router(shared)
}

async fn call_metrics_app(uri: &str) -> (u16, String, String) {
    call_on(metrics_app(), uri).await
}

#[tokio::test]
async fn runqueue_reports_percentiles_as_json_and_text() {
    let (status, ctype, body) = call_metrics_app(&format!("/runqueue?pid={BUSY_PID}")).await;
    assert_eq!(status, 200, "{body}");
    assert!(ctype.starts_with("application/json"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    // The last 30 s: 8 waits, 2 under 1 us, 5 in [4, 8) us, 1 in [512, 1024) us.
    assert_eq!(v["owner"], serde_json::json!({"pid": BUSY_PID}));
    assert_eq!(
        (v["seconds"].as_u64(), v["count"].as_u64()),
        (Some(30), Some(8))
    );
    assert_eq!(v["p50_us"], 5.6, "rank 4: 2 of the 5 waits in [4, 8)");
    assert_eq!(v["p90_us"], 614.4);
    assert_eq!(v["p99_us"], 983.0);
    assert_eq!(
        v["max_bucket"],
        serde_json::json!({"from_us": 512, "to_us": 1024, "count": 1})
    );
    assert_eq!(v["buckets"].as_array().unwrap().len(), 11);
    assert_eq!(
        v["buckets"][0],
        serde_json::json!({"from_us": 0, "to_us": 1, "count": 2})
    );

    let (_, _, body) = call_metrics_app(&format!("/runqueue?pid={BUSY_PID}&seconds=120")).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["count"], 16, "both slices");

    let (status, ctype, body) =
        call_metrics_app(&format!("/runqueue?pid={BUSY_PID}&format=text")).await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/plain"));
    assert!(
        body.contains("     usecs               : count    distribution\n"),
        "{body}"
    );
    assert!(
        body.contains(
            "         4 -> 7          : 5        |****************************************|"
        ),
        "{body}"
    );
    assert!(
        body.contains("       512 -> 1023       : 1        |********"),
        "{body}"
    );
}

#[tokio::test]
async fn runqueue_takes_cgroup_ids_and_paths() {
    let (status, _, body) = call_metrics_app(&format!("/runqueue?cgroup={NO_CGROUP}")).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["owner"],
        serde_json::json!({"cgroup": NO_CGROUP}),
        "no path: unresolvable"
    );
    assert_eq!(
        v["buckets"],
        serde_json::json!([{"from_us": 16, "to_us": 32, "count": 3}])
    );
    // The root cgroup, when this host has a cgroup2 mount.
    if let Some(root) = wallscope::process::cgroups::system().id_of("/") {
        for uri in [
            "/runqueue?cgroup=/".to_string(),
            format!("/runqueue?cgroup={root}"),
        ] {
            let (status, _, body) = call_metrics_app(&uri).await;
            assert_eq!(status, 200, "{uri}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(
                v["owner"],
                serde_json::json!({"cgroup": root, "path": "/"}),
                "{uri}"
            );
            assert_eq!(v["count"], 9);
        }
    }
}

#[tokio::test]
async fn runqueue_without_pid_or_cgroup_is_the_whole_host() {
    for uri in ["/runqueue", "/runqueue?seconds=10"] {
        let (status, _, body) = call_metrics_app(uri).await;
        assert_eq!(status, 200, "{uri}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["owner"], serde_json::json!({"host": true}), "{uri}");
        // Pids 500 (8 waits) and 600 (4) in the newest slice; cgroups'
        // histograms hold the same waits again and are not added.
        assert_eq!(v["count"], 12, "{uri}: {body}");
        assert_eq!(v["throttled"]["count"], 1, "{uri}: {body}");
    }
    let (_, _, text) = call_metrics_app("/runqueue?format=text").await;
    assert!(text.starts_with("runqueue latency of the host"), "{text}");
    let (_, _, body) = call_metrics_app("/runqueue?seconds=120").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["count"], 24, "both slices: {body}");
}

#[tokio::test]
async fn runqueue_errors_name_the_parameter() {
    for (uri, param) in [
        ("/runqueue?pid=500&cgroup=1", "`cgroup`"),
        ("/runqueue?cgroup=system.slice", "`cgroup`"),
        ("/runqueue?cgroup=-3", "`cgroup`"),
        ("/runqueue?cgroup=%2B5", "`cgroup`"),
        ("/runqueue?cgroup=5%20", "`cgroup`"),
        ("/runqueue?pid=500&format=svg", "`format`"),
        ("/runqueue?pid=500&tid=1", "`tid`"),
    ] {
        let (status, ctype, body) = call_metrics_app(uri).await;
        assert_eq!(status, 400, "{uri}: {body}");
        assert!(ctype.starts_with("application/json"), "{uri}");
        assert!(error_of(&body).contains(param), "{uri}: {body}");
    }
    for (uri, message) in [
        (
            format!("/runqueue?pid={GONE_PID}"),
            format!("unknown pid {GONE_PID}"),
        ),
        ("/runqueue?cgroup=12345".into(), "for cgroup 12345".into()),
        (
            "/runqueue?cgroup=/no/such.slice".into(),
            "no cgroup at /no/such.slice".into(),
        ),
    ] {
        let (status, ctype, body) = call_metrics_app(&uri).await;
        assert_eq!(status, 404, "{uri}: {body}");
        assert!(ctype.starts_with("application/json"), "{uri}");
        assert!(error_of(&body).contains(&message), "{uri}: {body}");
    }
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text() {
    use prometheus_parse::{Scrape, Value};
    let (status, ctype, body) = call_metrics_app("/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(ctype, "text/plain; version=0.0.4");
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    let find = |metric: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no {metric} {labels:?} in\n{body}"))
    };
    let value = |metric: &str, labels: &[(&str, &str)]| match find(metric, labels).value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
        ref other => panic!("{metric}: {other:?}"),
    };
    let pid = BUSY_PID.to_string();
    let busy = [("pid", pid.as_str()), ("comm", "app")];
    let state = |s| [busy[0], busy[1], ("state", s)];

    // Counters over both slices, the one outside the 60 s ranking window too.
    let states = "wallscope_process_state_seconds_total";
    assert!(matches!(
        find(states, &state("cpu")).value,
        Value::Counter(_)
    ));
    assert_eq!(value(states, &state("cpu")), 3.0);
    assert_eq!(value(states, &state("runqueue")), 0.4);
    assert_eq!(value(states, &state("futex")), 0.6);
    assert_eq!(value(states, &state("io")), 0.0);
    assert_eq!(value(states, &state("sleep")), 1.0);
    assert_eq!(value(states, &state("throttled")), 0.1);
    let wakeups = "wallscope_process_wakeups_total";
    assert_eq!(value(wakeups, &busy), 16.0);
    let switches = "wallscope_process_switches_total";
    assert_eq!(value(switches, &[busy[0], ("kind", "voluntary")]), 12.0);
    assert_eq!(value(switches, &[busy[0], ("kind", "involuntary")]), 4.0);

    // Top 20 by wall time in the last 60 s; pid 800 was busy before that.
    let mut pids: Vec<u32> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == states && s.labels.get("state") == Some("cpu"))
        .map(|s| s.labels.get("pid").unwrap().parse().unwrap())
        .collect();
    pids.sort();
    let expected: Vec<u32> = [BUSY_PID, 600].into_iter().chain(700..=717).collect();
    assert_eq!(pids, expected);
    assert_eq!(
        scrape.samples.iter().filter(|s| s.metric == states).count(),
        120
    );
    assert!(
        body.contains(r#"{pid="600",comm="we\"ird",state="cpu"} 1.8"#),
        "{body}"
    );
    assert_eq!(
        find(states, &[("pid", "700")]).labels.get("comm"),
        Some("filler")
    );

    // Histogram: cumulative buckets in seconds; 2 waits under 1 us, 10 in
    // [4, 8) us, 2 in [512, 1024) us.
    let latency = "wallscope_process_runqueue_latency_seconds";
    let Value::Histogram(buckets) = &find(latency, &busy).value else {
        panic!("{latency} is no histogram");
    };
    let le = |bound: f64| {
        buckets
            .iter()
            .find(|b| b.less_than == bound)
            .map(|b| b.count)
    };
    assert_eq!(buckets.len(), 33);
    assert_eq!(le(0.000001), Some(4.0));
    assert_eq!(le(0.000004), Some(4.0));
    assert_eq!(le(0.000008), Some(14.0));
    assert_eq!(le(0.000512), Some(14.0));
    assert_eq!(le(0.001024), Some(16.0));
    assert_eq!(le(f64::INFINITY), Some(16.0));
    assert_eq!(value(&format!("{latency}_count"), &busy), 16.0);
    let sum = value(&format!("{latency}_sum"), &busy);
    assert!(
        (sum - 0.001598).abs() < 1e-9,
        "midpoints 0.5, 6 and 768 us: {sum}"
    );

    // Daemon health.
    let events = "wallscope_bpf_events_total";
    for stat in wallscope::bpf::abi::Stat::ALL {
        let expected = if stat.name() == "samples" { 14.0 } else { 0.0 };
        assert_eq!(
            value(events, &[("counter", stat.name())]),
            expected,
            "{}",
            stat.name()
        );
    }
    assert_eq!(value("wallscope_drains_total", &[]), 5.0);
    assert_eq!(value("wallscope_drain_errors_total", &[]), 0.0);
    assert_eq!(value("wallscope_last_drain_seconds", &[]), 0.0015);
    assert_eq!(value("wallscope_last_symbolize_seconds", &[]), 0.0);
    assert_eq!(value("wallscope_stacks", &[]), 0.0);
    assert!(value("wallscope_daemon_cpu_seconds_total", &[]) >= 0.0);
    assert!(value("wallscope_daemon_resident_memory_bytes", &[]) > 0.0);

    // Every family has one HELP and one TYPE, before its samples.
    let mut typed = Vec::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.push(rest.split(' ').next().unwrap().to_string());
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = typed.last().expect("a sample before any TYPE");
            let base = name.strip_suffix("_bucket").or(name.strip_suffix("_sum"));
            let base = base.or(name.strip_suffix("_count")).filter(|b| b == family);
            assert_eq!(base.unwrap_or(name), family, "{line}");
        }
    }
    let helped = body.lines().filter(|l| l.starts_with("# HELP ")).count();
    assert_eq!(helped, typed.len());
    let mut unique = typed.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), typed.len(), "no family twice");
    assert!(scrape.docs.contains_key(states) && scrape.docs.contains_key(latency));
}

#[tokio::test]
async fn processes_strip_marks_each_thirtieth_of_the_window() {
    let (status, _, body) = call_metrics_app("/processes?seconds=30&strip=1&sort=active").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = v.as_array().unwrap();
    let busy = rows.iter().find(|r| r["pid"] == BUSY_PID).unwrap();
    // Its one slice in the window ended a second ago: one stretch near the
    // end, CPU before the rest.
    let strip = busy["strip"].as_str().unwrap();
    assert_eq!(strip.len(), 30, "{strip}");
    assert_eq!(strip.replace('.', ""), "c", "{strip}");
    assert!(strip.rfind('c') >= Some(27), "{strip}");
    // Active: cpu + runqueue + throttled + io.
    let t = &busy["time"];
    let active = ["cpu_us", "runqueue_us", "throttled_us", "io_us"]
        .iter()
        .map(|k| t[k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(t["active_us"].as_u64(), Some(active), "{t}");
    let (status, _, body) = call_metrics_app("/processes?seconds=30").await;
    assert_eq!(status, 200);
    assert!(!body.contains("\"strip\""), "{body}");
    let (status, _, body) = call_metrics_app("/processes?strip=yes").await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("strip"), "{body}");

    // `/host` says how many threads are held up now: none without a drain.
    let (status, _, body) = call_metrics_app("/host?seconds=30").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["stuck"],
        serde_json::json!({"min_s": 10, "threads": 0, "processes": []})
    );
}
