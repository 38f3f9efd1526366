//! The API in-process over a synthetic store, for the tests that call the
//! router directly (no root, no BPF).

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
    profile::model::state::State,
    profile::model::{store::Store, Sample, Slice, ThreadInfo},
    state::Shared,
};

/// A pid that cannot exist (above the kernel's pid_max limit).
pub const GONE_PID: u32 = 4_194_400;

pub fn app() -> axum::Router {
    api::router(shared())
}

/// The daemon state behind [`app`]: one process, `GONE_PID`, with stacks
/// `main;heavy` and `main;light;read_[k]`.
pub fn shared() -> Arc<Shared> {
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
        wakeups: Vec::new(),
        thread_totals: Vec::new(),
        runq_hists: Vec::new(),
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
        containers: HashMap::new(),
        origins: HashMap::new(),
        kept_off: Vec::new(),
        sleeps: Vec::new(),
        stats: [0; wallscope::profile::model::state::STAT_COUNTERS],
        spans: Default::default(),
    });
    Shared::new(store, vec![("on_cpu_sample".into(), 2)])
}

pub async fn call(uri: &str) -> (u16, String, String) {
    call_on(app(), uri).await
}

/// Status, content type and body of GET `uri` on `router`.
pub async fn call_on(router: axum::Router, uri: &str) -> (u16, String, String) {
    let (status, headers, body) = send(router, get_with(uri, &[])).await;
    let ctype = headers
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ctype, body)
}

pub fn error_of(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error field: {body}"))
        .to_string()
}

/// Status, headers and body of `req` on `router`.
pub async fn send(
    router: axum::Router,
    req: Request<Body>,
) -> (u16, axum::http::HeaderMap, String) {
    let res = router.oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    (status, headers, body)
}

/// GET `uri` with the given headers.
pub fn get_with(uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut req = Request::get(uri);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Body::empty()).unwrap()
}
