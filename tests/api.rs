//! The HTTP API in-process over a synthetic store (no root, no BPF):
//! status codes, messages and formats.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum::{body::Body, http::Request};
use http_body_util::BodyExt;
use tower::ServiceExt;
use wallscope::{
    api,
    bpf::abi::State,
    pipeline::Shared,
    profile::{store::Store, Sample, Slice, ThreadInfo},
};

/// A pid that cannot exist (above the kernel's pid_max limit).
const GONE_PID: u32 = 4_194_400;

fn app() -> axum::Router {
    let mut store = Store::new(Duration::from_secs(600));
    let end = SystemTime::now();
    let frames = |names: &[&str]| {
        names
            .iter()
            .map(|n| Arc::<str>::from(*n))
            .collect::<Arc<[_]>>()
    };
    let sample = |tid, stack: &[&str], ns| Sample {
        pid: GONE_PID,
        tid,
        state: State::Cpu,
        stack: frames(stack),
        ns,
        count: 1,
    };
    store.push(Slice {
        start: end - Duration::from_secs(1),
        end,
        samples: vec![
            sample(GONE_PID, &["main", "heavy"], 6_000_000),
            sample(GONE_PID + 1, &["main", "light", "read_[k]"], 1_000_000),
        ],
        threads: HashMap::from([
            (
                GONE_PID,
                ThreadInfo {
                    pid: GONE_PID,
                    name: Arc::from("app"),
                },
            ),
            (
                GONE_PID + 1,
                ThreadInfo {
                    pid: GONE_PID,
                    name: Arc::from("worker"),
                },
            ),
        ]),
        processes: HashMap::from([(GONE_PID, Arc::from("app"))]),
        stats: Default::default(),
    });
    api::router(Shared::new(store, vec![("on_cpu_sample".into(), 2)]))
}

async fn call(uri: &str) -> (u16, String, String) {
    let res = app()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let ctype = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    (status, ctype, body)
}

fn error_of(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error field: {body}"))
        .to_string()
}

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
            "app (pid {GONE_PID}) — CPU, last 60 s, total 7.0 ms"
        )),
        "{body}"
    );
    let (status, ctype, body) = call(&format!("/flamegraph?pid={GONE_PID}&format=folded")).await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/plain"));
    assert!(body.starts_with("app;main;heavy 6000"));
}

#[tokio::test]
async fn unknown_pid_and_empty_window_are_404() {
    let (status, _, body) = call("/folded?pid=4194000").await;
    assert_eq!(status, 404);
    assert!(error_of(&body).contains("unknown pid 4194000"), "{body}");
    // Our own process exists but has no samples in this store.
    let me = std::process::id();
    let (status, _, body) = call(&format!("/flamegraph?pid={me}")).await;
    assert_eq!(status, 404);
    assert!(
        error_of(&body).contains(&format!("no CPU samples for pid {me} in the last 30 s")),
        "{body}"
    );
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
        serde_json::json!([{"pid": GONE_PID, "comm": "app", "cpu_us": 7000}])
    );

    let (status, _, body) = call("/healthz").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["programs"][0]["links"], 2);
    assert_eq!(v["samples_lost"], 0);
}

#[tokio::test]
async fn index_page_links_to_flame_graphs() {
    let (status, ctype, body) = call("/").await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/html"));
    assert!(body.contains("/processes?seconds=") && body.contains("/flamegraph?pid="));
}
