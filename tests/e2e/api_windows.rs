//! Absolute windows (`from`/`until`) and `/pprof`, in-process over a
//! synthetic store (no root, no BPF).

use std::{
    io::Read as _,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::support::api::{call_on, error_of};
use axum::body::Body;
use flate2::read::GzDecoder;
use http_body_util::BodyExt;
use prost::Message as _;
use tower::ServiceExt;
use wallscope::{
    api,
    export::pprof::proto::Profile,
    profile::model::counters::{RawThread, ThreadCounters},
    profile::model::state::State,
    profile::model::{store::Store, Sample, Slice, ThreadInfo},
    state::Shared,
};

const PID: u32 = 4_194_301;
/// A process whose threads are all blocked on a futex.
const STUCK: u32 = 4_194_310;

/// Five one-second slices, slice `i` ending at `t0 + 10 i` s with one CPU
/// sample of `i` ms on stack `main;slice_I`. Returns the router and `t0`.
fn app() -> (axum::Router, u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let t0 = now - 60;
    let mut store = Store::new(Duration::from_secs(600));
    for i in 1..=5u64 {
        let end = UNIX_EPOCH + Duration::from_secs(t0 + 10 * i);
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        slice.samples.push(Sample {
            pid: PID,
            tid: PID,
            state: State::Cpu,
            stack: ["main".to_string(), format!("slice_{i}")]
                .iter()
                .map(|f| Arc::<str>::from(f.as_str()))
                .collect(),
            ns: i * 1_000_000,
            count: i,
        });
        let mut ns = [0; State::COUNT];
        ns[State::Cpu as usize] = i * 1_000_000;
        slice.thread_totals.push(RawThread {
            tid: PID,
            pid: PID,
            comm: "app".into(),
            counters: ThreadCounters {
                ns,
                switches_voluntary: i,
                switches_involuntary: 0,
                wakeups_sent: 0,
                wakeups_received: 0,
            },
        });
        // A process stuck on a lock: every thread on a futex, no CPU.
        let mut futex = [0; State::COUNT];
        futex[State::Futex as usize] = 1_000_000_000;
        for tid in [STUCK, STUCK + 1] {
            slice.thread_totals.push(RawThread {
                tid,
                pid: STUCK,
                comm: "stuck-db".into(),
                counters: ThreadCounters {
                    ns: futex,
                    switches_voluntary: 0,
                    switches_involuntary: 0,
                    wakeups_sent: 0,
                    wakeups_received: 0,
                },
            });
        }
        slice.processes.insert(STUCK, Arc::from("stuck-db"));
        slice.processes.insert(PID, Arc::from("app"));
        slice.threads.insert(
            PID,
            ThreadInfo {
                pid: PID,
                name: Arc::from("app"),
            },
        );
        store.push(slice);
    }
    (api::router(Shared::new(store, Vec::new())), t0)
}

fn rfc3339(unix: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix)).to_string()
}

async fn bytes(router: axum::Router, uri: &str) -> (u16, Vec<u8>) {
    let req = crate::support::api::get_with(uri, &[]);
    let res = router.oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let body: Body = res.into_body();
    (status, body.collect().await.unwrap().to_bytes().to_vec())
}

#[tokio::test]
async fn a_window_holds_the_slices_that_ended_in_it() {
    let (app, t0) = app();
    // (t0 + 10, t0 + 30]: slices 2 and 3 end inside; 1 ends on `from`.
    let (from, until) = (t0 + 10, t0 + 30);
    for window in [
        format!("from={from}&until={until}"),
        format!("from={}&until={}", rfc3339(from), rfc3339(until)),
        format!("until={until}&seconds=20"),
        format!("from={from}&seconds=20"),
    ] {
        let (status, _, body) = call_on(app.clone(), &format!("/folded?pid={PID}&{window}")).await;
        assert_eq!(status, 200, "{window}: {body}");
        assert_eq!(
            body, "app;main;slice_2 2000\napp;main;slice_3 3000\n",
            "{window}"
        );
    }
    // Fractions of a second count: slice 1 spans t0 + 9 to t0 + 10, and
    // its last millisecond holds a thousandth of its 1,000 us.
    let (_, _, body) = call_on(
        app.clone(),
        &format!("/folded?pid={PID}&from={}.999&until={}", t0 + 9, t0 + 10),
    )
    .await;
    assert_eq!(body, "app;main;slice_1 1\n");
    // Nothing ended in it: a known process, so 200, empty, with a note.
    let empty = format!("pid={PID}&from={}&until={}", t0 + 11, t0 + 19);
    let (status, _, body) = call_on(app.clone(), &format!("/folded?{empty}")).await;
    assert_eq!((status, body.as_str()), (200, ""));
    let req = crate::support::api::get_with(&format!("/pprof?{empty}"), &[]);
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let note = res.headers()["x-wallscope-note"].to_str().unwrap();
    assert!(
        note.starts_with(&format!("no CPU samples for pid {PID} in the ")),
        "{note}"
    );
    // Titles show the range.
    let (status, _, svg) = call_on(
        app.clone(),
        &format!("/flamegraph?pid={PID}&from={from}&until={until}"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        svg.contains(&format!("{} to {}", rfc3339(from), rfc3339(until))),
        "{svg}"
    );
}

#[tokio::test]
async fn every_history_endpoint_takes_a_window() {
    let (app, t0) = app();
    let window = format!("from={}&until={}", t0 + 10, t0 + 30);
    for uri in [
        format!("/threads?pid={PID}&{window}"),
        format!("/processes?{window}"),
        format!("/pprof?pid={PID}&{window}"),
        format!("/timeline?pid={PID}&{window}"),
    ] {
        let (status, _) = bytes(app.clone(), &uri).await;
        assert_eq!(status, 200, "{uri}");
    }
    let (_, _, body) = call_on(app.clone(), &format!("/threads?pid={PID}&{window}")).await;
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["process"]["cpu_us"], 5000, "{body}");
    assert_eq!(report["seconds"], 20, "{body}");
    let (status, _, body) = call_on(app.clone(), &format!("/processes?{window}")).await;
    assert_eq!(status, 200);
    let rows: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(rows[0]["cpu_us"], 5000, "{body}");
    for (query, param) in [
        (format!("from={}&until={}", t0 + 30, t0 + 10), "until"),
        ("from=2026-13-01T00:00:00Z".to_string(), "from"),
        ("until=-1".to_string(), "until"),
        (format!("from={t0}&until={}&seconds=5", t0 + 5), "seconds"),
    ] {
        for endpoint in [
            "folded",
            "pprof",
            "threads",
            "timeline",
            "runqueue",
            "processes",
        ] {
            let uri = format!("/{endpoint}?pid={PID}&{query}");
            let uri = uri.replace("/processes?pid=4194301&", "/processes?");
            let (status, _, body) = call_on(app.clone(), &uri).await;
            assert_eq!(status, 400, "{uri}: {body}");
            assert!(
                error_of(&body).contains(&format!("`{param}`")),
                "{uri}: {body}"
            );
        }
    }
}

#[tokio::test]
async fn pprof_is_the_folded_profile_of_the_same_window() {
    let (app, t0) = app();
    let window = format!("from={}&until={}", t0, t0 + 40);
    let (status, gz) = bytes(app.clone(), &format!("/pprof?pid={PID}&{window}")).await;
    assert_eq!(status, 200);
    let mut raw = Vec::new();
    GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
    let p = Profile::decode(&raw[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    let total: i64 = p.sample.iter().map(|x| x.value[1]).sum();
    let count: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    assert_eq!((count, total), (10, 10_000_000), "slices 1 to 4");
    assert_eq!(p.period, 1_000_000, "one sample is 1 ms here");
    assert_eq!(p.time_nanos, t0 as i64 * 1_000_000_000);
    assert_eq!(p.duration_nanos, 40_000_000_000);
    let labels: Vec<String> = p.sample[0]
        .label
        .iter()
        .map(|l| {
            format!(
                "{}={}",
                s(l.key),
                if l.str != 0 {
                    s(l.str).to_string()
                } else {
                    l.num.to_string()
                }
            )
        })
        .collect();
    assert!(labels.contains(&format!("pid={PID}")), "{labels:?}");
    assert!(
        labels.contains(&"thread_name=app".to_string()),
        "{labels:?}"
    );
    let (_, _, folded) = call_on(app.clone(), &format!("/folded?pid={PID}&{window}")).await;
    let folded_us: i64 = folded
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(folded_us * 1000, total);
    // Unknown pid: 404 as for /folded.
    let (status, _, body) = call_on(app, "/pprof?pid=4194302").await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test]
async fn processes_sort_by_state_and_filter_by_name() {
    let (app, _) = app();
    let pids = |body: &str| -> Vec<u64> {
        let rows: serde_json::Value = serde_json::from_str(body).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| r["pid"].as_u64().unwrap())
            .collect()
    };
    let (_, _, body) = call_on(app.clone(), "/processes?seconds=600").await;
    assert_eq!(
        pids(&body),
        [u64::from(PID), u64::from(STUCK)],
        "by CPU: {body}"
    );
    for sort in ["futex", "blocked", "wall"] {
        let (status, _, body) =
            call_on(app.clone(), &format!("/processes?seconds=600&sort={sort}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(pids(&body)[0], u64::from(STUCK), "sort={sort}: {body}");
    }
    let (_, _, body) = call_on(app.clone(), "/processes?seconds=600&sort=futex").await;
    let rows: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        rows[0]["time"]["futex_us"], 10_000_000,
        "5 slices x 2 threads x 1 s"
    );
    assert_eq!(rows[0]["cpu_us"], 0);
    let (_, _, body) = call_on(app.clone(), "/processes?seconds=600&comm=stuck").await;
    assert_eq!(pids(&body), [u64::from(STUCK)], "{body}");
    let (_, _, body) = call_on(app.clone(), "/processes?comm=nothing-like-it").await;
    assert_eq!(body, "[]");
    let (status, _, body) = call_on(app, "/processes?sort=park").await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("`sort`"), "{body}");
}

#[tokio::test]
async fn windows_reaching_before_the_records_say_how_much_was_recorded() {
    let (app, _) = app();
    // The oldest slice began 51 s ago (t0 + 9, t0 = now - 60).
    let recorded = |headers: &axum::http::HeaderMap| -> u64 {
        headers["x-wallscope-recorded-seconds"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    for uri in [
        format!("/folded?pid={PID}&seconds=600"),
        format!("/flamegraph?pid={PID}&seconds=600"),
        format!("/threads?pid={PID}&seconds=600"),
        "/processes?seconds=600".to_string(),
    ] {
        let (status, headers, _) =
            crate::support::api::send(app.clone(), crate::support::api::get_with(&uri, &[])).await;
        assert_eq!(status, 200, "{uri}");
        // From the oldest slice's start (t0 + 9) to the newest's end
        // (t0 + 50), where "the last 600 s" end.
        let r = recorded(&headers);
        assert!((40..=42).contains(&r), "{uri}: {r}");
        // All of it per second (slices of 1 s, ending 10 to 50 s ago).
        let resolution = headers["x-wallscope-resolution"].to_str().unwrap();
        assert!(
            resolution.starts_with("1s:") && resolution.ends_with("s ago"),
            "{uri}: {resolution}"
        );
        assert!(!resolution.contains(',') && !resolution.contains("pools"));
    }
    let uri = format!("/timeline?pid={STUCK}&seconds=600");
    let (status, headers, body) =
        crate::support::api::send(app.clone(), crate::support::api::get_with(&uri, &[])).await;
    assert_eq!(status, 200, "{body}");
    let resolution = headers["x-wallscope-resolution"].to_str().unwrap();
    assert!(resolution.starts_with("1s:"), "{resolution}");
    let timeline: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(timeline["resolution"][0]["step_s"], 1, "{body:.500}");
    let (_, _, body) = call_on(app.clone(), &format!("/threads?pid={PID}&seconds=600")).await;
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["seconds"], 600);
    let r = report["recorded_seconds"].as_u64().unwrap();
    assert!((40..=42).contains(&r), "{body}");
    let parts = report["resolution"].as_array().expect("a resolution list");
    assert_eq!(parts.len(), 1, "{body}");
    assert_eq!(
        (&parts[0]["step_s"], &parts[0]["rows"]),
        (&1.into(), &"thread".into())
    );
    let (from, to) = (&parts[0]["from_s_ago"], &parts[0]["to_s_ago"]);
    assert!((50..=52).contains(&from.as_u64().unwrap()), "{body}");
    assert!((9..=11).contains(&to.as_u64().unwrap()), "{body}");
    let (_, _, text) = call_on(
        app.clone(),
        &format!("/threads?pid={PID}&seconds=600&format=text"),
    )
    .await;
    assert!(
        text.contains(&format!("last 600 s (only {r} s recorded)")),
        "{text}"
    );
    // A window inside the records: all of it.
    let (_, headers, _) = crate::support::api::send(
        app,
        crate::support::api::get_with(&format!("/folded?pid={PID}&seconds=30"), &[]),
    )
    .await;
    assert_eq!(recorded(&headers), 30);
}

#[tokio::test]
async fn the_timeline_has_a_column_per_slice_and_a_row_per_thread() {
    let (app, t0) = app();
    let window = format!("from={}&until={}", t0 + 10, t0 + 30);
    let (status, _, body) = call_on(app.clone(), &format!("/timeline?pid={STUCK}&{window}")).await;
    assert_eq!(status, 200, "{body}");
    let t: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(t["comm"], "stuck-db");
    assert_eq!(t["columns"].as_array().unwrap().len(), 2, "{body}");
    let rows = t["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{body}");
    let futex = t["states"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s == "futex")
        .unwrap();
    for row in rows {
        for cell in row["cells"].as_array().unwrap() {
            assert_eq!(cell[futex], 1000, "{body}");
        }
    }
    // Pools, and the row limit with what it left out.
    let (_, _, body) = call_on(
        app.clone(),
        &format!("/timeline?pid={STUCK}&group=pool&{window}"),
    )
    .await;
    let t: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(t["rows"][0]["threads"], 2, "{body}");
    let (_, _, body) = call_on(
        app.clone(),
        &format!("/timeline?pid={STUCK}&limit=1&{window}"),
    )
    .await;
    let t: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            t["rows"].as_array().unwrap().len(),
            t["rows_left_out"].as_u64()
        ),
        (1, Some(1))
    );
    // Bad input names its parameter; an unknown pid is 404.
    for (uri, param) in [
        ("/timeline".to_string(), "pid"),
        (format!("/timeline?pid={STUCK}&group=cgroup"), "group"),
        (format!("/timeline?pid={STUCK}&limit=0"), "limit"),
        (format!("/timeline?pid={STUCK}&limit=2001"), "limit"),
        (format!("/timeline?pid={STUCK}&tid=1"), "tid"),
    ] {
        let (status, _, body) = call_on(app.clone(), &uri).await;
        assert_eq!(status, 400, "{uri}: {body}");
        assert!(
            error_of(&body).contains(&format!("`{param}`")),
            "{uri}: {body}"
        );
    }
    let (status, _, body) = call_on(app.clone(), "/timeline?pid=4194399").await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test]
async fn titles_of_an_absolute_range_show_the_range() {
    let (app, t0) = app();
    let range = format!("pid={PID}&from={}&until={}&format=text", t0 + 5, t0 + 35);
    for path in ["/threads", "/runqueue"] {
        let (status, _, body) = call_on(app.clone(), &format!("{path}?{range}")).await;
        assert_eq!(status, 200, "{path}: {body}");
        let title = body.lines().next().unwrap_or_default();
        assert!(!title.contains("last "), "{path}: {title}");
        assert!(title.contains(" to "), "{path}: {title}");
    }
}
