//! `/spans` in-process over a synthetic store (no root, no BPF): the
//! spans of a process with their time by state, one span in full, and
//! the parameters' refusals.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use std::io::Read as _;

use crate::support::api::{call_on, error_of, GONE_PID};
use flate2::read::GzDecoder;
use http_body_util::BodyExt;
use prost::Message as _;
use serde_json::Value;
use tower::ServiceExt;
use wallscope::export::pprof::proto::Profile;
use wallscope::{
    api,
    profile::model::{
        spans::{SpanId, SpanRecord, SpanSample, SpanSlice, SpanTime, TraceId},
        state::State,
        store::Store,
        Sample, Slice,
    },
    state::Shared,
};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn span(n: u64) -> SpanId {
    SpanId::from_raw(n).unwrap()
}

/// Span 1 (`/cart`): 20 ms on the CPU and 80 ms on a lock, two threads;
/// span 2 (`/pay`): 50 ms reading a socket.
fn app() -> axum::Router {
    let mut store = Store::new(Duration::from_secs(600));
    let end = SystemTime::now();
    let mut slice = Slice::empty(end - Duration::from_secs(1), end);
    slice.processes.insert(GONE_PID, Arc::from("app"));
    let mut spans = SpanSlice::default();
    for (n, route) in [(1, "/cart"), (2, "/pay")] {
        spans.records.push(SpanRecord {
            pid: GONE_PID,
            span: span(n),
            trace: TraceId::parse(TRACE).unwrap(),
            flags: 1,
            attrs: vec![("http_route".into(), route.into())],
            attrs_cut: false,
        });
    }
    let rows = [
        (1, 1, State::Cpu, 20, "main;cart"),
        (1, 2, State::Futex, 80, "main;cart;pthread_mutex_lock"),
        (2, 1, State::Io, 50, "main;pay;recv"),
    ];
    for (n, tid, state, ms, stack) in rows {
        let mut ns = [0; State::COUNT];
        ns[state as usize] = ms * 1_000_000;
        let tid = GONE_PID + tid;
        spans.times.push(SpanTime {
            pid: GONE_PID,
            tid,
            span: span(n),
            ns,
            first_ns: 1,
            last_ns: 1 + ms * 1_000_000,
        });
        let stack: Arc<[Arc<str>]> = stack.split(';').map(Arc::from).collect();
        spans.samples.push(SpanSample {
            pid: GONE_PID,
            tid,
            span: span(n),
            state,
            stack: stack.clone(),
            ns: ms * 1_000_000,
            count: 1,
        });
        // The same row in the main store, as the collector puts it.
        slice.samples.push(Sample {
            pid: GONE_PID,
            tid,
            state,
            stack,
            ns: ms * 1_000_000,
            count: 1,
        });
    }
    // Time under no span.
    slice.samples.push(Sample {
        pid: GONE_PID,
        tid: GONE_PID + 1,
        state: State::Cpu,
        stack: ["main", "idle"].map(Arc::from).into(),
        ns: 30_000_000,
        count: 3,
    });
    slice.spans = spans;
    store.push(slice);
    api::router(Shared::new(store, vec![("on_cpu_sample".into(), 2)]))
}

async fn json(uri: &str) -> Value {
    let (status, _, body) = call_on(app(), uri).await;
    assert_eq!(status, 200, "{uri}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn spans_list_their_wall_time_by_state_sorted_and_filtered() {
    let r = json(&format!("/spans?pid={GONE_PID}&seconds=60")).await;
    let spans = r["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 2, "{r}");
    let first = &spans[0];
    assert_eq!(first["span_id"], span(1).hex());
    assert_eq!(first["trace_id"], TRACE);
    assert_eq!(first["attrs"]["http_route"], "/cart");
    let states: u64 = (first["states_us"].as_object().unwrap().values())
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(first["wall_us"].as_u64(), Some(states));
    assert_eq!(first["states_us"]["futex"].as_u64(), Some(80_000));
    assert_eq!(first["threads"].as_array().unwrap().len(), 2);
    assert_eq!(
        first["top_stacks"][0]["stack"],
        "main;cart;pthread_mutex_lock"
    );
    let by_io = json(&format!("/spans?pid={GONE_PID}&sort=io")).await;
    assert_eq!(by_io["spans"][0]["span_id"], span(2).hex());
    let pay = json(&format!("/spans?pid={GONE_PID}&attr.http_route=%2Fpay")).await;
    assert_eq!(pay["spans_total"], 1);
    let one = json(&format!("/spans?pid={GONE_PID}&limit=1")).await;
    assert_eq!(
        (one["spans_total"].as_u64(), one["rows_omitted"].as_u64()),
        (Some(2), Some(1))
    );
    let (status, ctype, text) = call_on(app(), &format!("/spans?pid={GONE_PID}&format=text")).await;
    assert_eq!(status, 200);
    assert!(
        ctype.starts_with("text/plain") && text.contains("/cart"),
        "{text}"
    );
}

#[tokio::test]
async fn one_span_in_full_and_unseen_spans_are_not_found() {
    let d = json(&format!("/spans?pid={GONE_PID}&span_id={}", span(1).hex())).await;
    assert_eq!(d["by_thread"].as_array().unwrap().len(), 2, "{d}");
    assert!(d["timeline"]
        .as_str()
        .unwrap()
        .starts_with("/timeline?pid="));
    let (status, _, body) = call_on(
        app(),
        &format!("/spans?pid={GONE_PID}&span_id=00000000000000ff"),
    )
    .await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test]
async fn bad_parameters_are_refused_naming_them() {
    for (q, param) in [
        ("span_id=XYZ", "span_id"),
        ("span_id=00F067AA0BA902B7", "span_id"),
        ("trace_id=123", "trace_id"),
        ("sort=gpu", "sort"),
        ("limit=0", "limit"),
        ("attr.=x", "attr."),
        ("attr.a=1&attr.a=2", "attr.a"),
        ("seconds=abc", "seconds"),
    ] {
        let uri = format!("/spans?pid={GONE_PID}&{q}");
        let (status, _, body) = call_on(app(), &uri).await;
        assert_eq!(status, 400, "{uri}: {body}");
        assert!(error_of(&body).contains(param), "{uri}: {body}");
    }
    let (status, _, body) = call_on(app(), "/spans").await;
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("pid"), "{body}");
}

#[tokio::test]
async fn profiles_keep_only_the_time_under_the_spans_asked_for() {
    let folded = |q: String| async move {
        let (status, _, body) =
            call_on(app(), &format!("/folded?pid={GONE_PID}&kind=wall&{q}")).await;
        assert_eq!(status, 200, "{q}: {body}");
        body
    };
    let all = folded(String::new()).await;
    assert!(
        all.contains("main;idle") && all.contains("main;pay;recv"),
        "{all}"
    );
    let cart = folded("attr.http_route=%2Fcart".into()).await;
    assert!(
        cart.contains("main;cart;pthread_mutex_lock 80000"),
        "{cart}"
    );
    assert!(!cart.contains("idle") && !cart.contains("pay"), "{cart}");
    let pay = folded(format!("span_id={}", span(2).hex())).await;
    assert!(
        pay.contains("main;pay;recv") && !pay.contains("cart"),
        "{pay}"
    );
    let (status, _, body) = call_on(app(), &format!("/folded?pid={GONE_PID}&trace_id=XYZ")).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("trace_id"), "{body}");
    let (status, _, body) =
        call_on(app(), &format!("/flamegraph?pid={GONE_PID}&span_id=bad")).await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test]
async fn pprof_labels_the_time_under_spans_and_counts_it_once() {
    let profile = |q: String| async move {
        let req =
            crate::support::api::get_with(&format!("/pprof?pid={GONE_PID}&kind=wall{q}"), &[]);
        let res = app().oneshot(req).await.unwrap();
        assert_eq!(res.status().as_u16(), 200, "{q}");
        let gz = res.into_body().collect().await.unwrap().to_bytes().to_vec();
        let mut raw = Vec::new();
        GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        Profile::decode(&raw[..]).unwrap()
    };
    let wall = |p: &Profile| p.sample.iter().map(|s| s.value[1]).sum::<i64>();
    let span_of = |p: &Profile, s: &wallscope::export::pprof::proto::Sample| {
        (s.label.iter())
            .find(|l| p.string_table[l.key as usize] == "span_id")
            .map(|l| p.string_table[l.str as usize].clone())
    };
    let all = profile(String::new()).await;
    assert_eq!(wall(&all), 180_000_000, "every row once");
    let under: i64 = (all.sample.iter())
        .filter(|s| span_of(&all, s).is_some())
        .map(|s| s.value[1])
        .sum();
    assert_eq!(under, 150_000_000);
    let cart = profile("&attr.http_route=%2Fcart".into()).await;
    assert_eq!(wall(&cart), 100_000_000);
    assert!(cart
        .sample
        .iter()
        .all(|s| span_of(&cart, s) == Some(span(1).hex())));
    assert!(cart.string_table.iter().any(|s| s == "attr.http_route"));
    assert!(cart.string_table.iter().any(|s| s == TRACE));
}

#[tokio::test]
async fn group_by_an_attribute_roots_each_value_and_none() {
    let uri = format!("/folded?pid={GONE_PID}&kind=wall&group=attr.http_route");
    let (status, _, body) = call_on(app(), &uri).await;
    assert_eq!(status, 200, "{body}");
    let us = |root: &str| -> u64 {
        (body.lines())
            .filter(|l| l.split(';').any(|f| f == root))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(us("http_route=/cart"), 100_000, "{body}");
    assert_eq!(us("http_route=/pay"), 50_000, "{body}");
    assert_eq!(us("http_route=(none)"), 30_000, "{body}");
    let (status, _, body) = call_on(app(), "/folded?group=attr.http_route").await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("pid"), "{body}");
    let (status, _, body) = call_on(app(), &format!("/folded?pid={GONE_PID}&group=attr.")).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("group"), "{body}");
    let svg = format!("/flamegraph?pid={GONE_PID}&kind=wall&group=attr.http_route");
    let (status, _, body) = call_on(app(), &svg).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("http_route=/cart"),
        "the graph names the value"
    );
}

/// The process page's "slowest spans" panel asks `/spans` sorted by wall
/// time or by any state the UI's meta lists, and each is an answer.
#[tokio::test]
async fn the_spans_panel_asks_spans_sorted_as_the_api_takes() {
    let (_, _, page) = call_on(app(), "/process/1234").await;
    assert!(
        page.contains(r#"id="spans-table""#),
        "the panel is on the page"
    );
    let (_, _, script) = call_on(app(), "/ui/process.js").await;
    assert!(
        script.contains("/spans?") && script.contains("highlight"),
        "{script}"
    );
    let (_, _, meta) = call_on(app(), "/ui/meta.json").await;
    let meta: Value = serde_json::from_str(&meta).unwrap();
    let states = meta["states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap());
    for sort in std::iter::once("wall").chain(states) {
        let r = json(&format!("/spans?pid={GONE_PID}&sort={sort}&limit=50")).await;
        assert_eq!(r["sort"], sort);
        let keys: Vec<u64> = (r["spans"].as_array().unwrap().iter())
            .map(|s| match sort {
                "wall" => s["wall_us"].as_u64().unwrap(),
                state => s["states_us"][state].as_u64().unwrap(),
            })
            .collect();
        assert!(keys.windows(2).all(|w| w[0] >= w[1]), "{sort}: {keys:?}");
    }
}

#[tokio::test]
async fn threads_under_spans_show_their_exact_time_under_them() {
    let r = json(&format!(
        "/threads?pid={GONE_PID}&fold=off&attr.http_route=%2Fcart"
    ))
    .await;
    let mut rows: Vec<(u64, u64, u64)> = (r["threads"].as_array().unwrap().iter())
        .map(|t| {
            (
                t["tid"].as_u64().unwrap(),
                t["cpu_us"].as_u64().unwrap(),
                t["futex_us"].as_u64().unwrap(),
            )
        })
        .collect();
    rows.sort();
    let (one, two) = (u64::from(GONE_PID) + 1, u64::from(GONE_PID) + 2);
    assert_eq!(rows, [(one, 20_000, 0), (two, 0, 80_000)], "{r}");
    let (status, _, body) = call_on(app(), &format!("/threads?pid={GONE_PID}&span_id=zz")).await;
    assert_eq!(status, 400, "{body}");
}
