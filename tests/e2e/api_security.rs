//! In-process: the browser security headers on every answer, the flame
//! graph SVG served without script, and what a client's local user may
//! read (the uid as the accept loop would have found it), including
//! nothing of an earlier process with the same pid.

use std::{
    process::Command,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::support::api::{error_of, get_with, send, shared, GONE_PID};
use axum::http::HeaderMap;
use wallscope::{
    api::{self, headers, peer::Client, Access},
    profile::model::state::State,
    profile::model::{store::Store, Sample, Slice},
    state::Shared,
};

async fn headers_of(uri: &str) -> (u16, HeaderMap, String) {
    send(api::router(shared()), get_with(uri, &[])).await
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_else(|| panic!("no {name} header"))
}

#[tokio::test]
async fn every_answer_says_nosniff_and_no_framing() {
    let svg = format!("/flamegraph?pid={GONE_PID}&seconds=60");
    let threads = format!("/threads?pid={GONE_PID}");
    for uri in [
        "/",
        "/process/1",
        "/ui/common.js",
        "/healthz",
        "/metrics",
        svg.as_str(),
        threads.as_str(),
        "/threads",       // 400
        "/ui/missing.js", // 404
        "/nothing-here",  // 404 from the router
    ] {
        let (_, h, _) = headers_of(uri).await;
        assert_eq!(header(&h, "x-content-type-options"), "nosniff", "{uri}");
        assert_eq!(header(&h, "x-frame-options"), "DENY", "{uri}");
        let csp = header(&h, "content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{uri}: {csp}");
        assert!(!csp.contains("unsafe-eval"), "{uri}: {csp}");
        assert!(!csp.contains("script-src"), "{uri}: {csp}");
    }
    // Pages load their own scripts and nothing else; data runs nothing.
    let (_, h, _) = headers_of("/").await;
    assert_eq!(header(&h, "content-security-policy"), headers::PAGE_POLICY);
    assert!(headers::PAGE_POLICY.starts_with("default-src 'self';"));
    let (_, h, _) = headers_of(&threads).await;
    assert_eq!(header(&h, "content-security-policy"), headers::DATA_POLICY);
    assert!(headers::DATA_POLICY.starts_with("default-src 'none';"));
}

#[tokio::test]
async fn the_served_flame_graph_is_a_still_svg_under_a_no_script_policy() {
    let (status, h, body) = headers_of(&format!("/flamegraph?pid={GONE_PID}&seconds=60")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&h, "content-type"), "image/svg+xml");
    assert_eq!(header(&h, "content-security-policy"), headers::DATA_POLICY);
    for gone in ["<script", "onload=", "onclick="] {
        assert!(!body.contains(gone), "{gone} in {body}");
    }
    assert!(body.contains("<title>heavy ("), "{body}");
    assert!(body.trim_end().ends_with("</svg>"));
}

/// GET `uri` as a client the accept loop found to be `uid` (`None`:
/// unknown) over loopback, on a router with the default access rules.
async fn as_user(uid: Option<u32>, uri: &str) -> (u16, String) {
    as_user_on(shared(), uid, uri).await
}

async fn as_user_on(shared: Arc<Shared>, uid: Option<u32>, uri: &str) -> (u16, String) {
    let router = api::router_with(shared, Access::new(Vec::new(), None));
    let mut req = get_with(uri, &[]);
    req.extensions_mut().insert(Client {
        addr: "127.0.0.1:40000".parse().unwrap(),
        uid,
    });
    let (status, _, body) = send(router, req).await;
    (status, body)
}

#[tokio::test]
async fn root_reads_all_other_users_their_own_unknown_clients_nothing() {
    let me = std::process::id();
    // SAFETY: getuid cannot fail.
    let my_uid = unsafe { libc::getuid() };
    let other = if my_uid == 0 { 65534 } else { 0 };
    let gone = format!("/threads?pid={GONE_PID}");
    let mine = format!("/threads?pid={me}");
    // Root (or the daemon's own user when it is root) reads everything.
    if my_uid == 0 {
        for uri in [gone.as_str(), "/metrics", "/folded", "/processes"] {
            assert_eq!(as_user(Some(0), uri).await.0, 200, "{uri}");
        }
    }
    // A user reads their own process, not another's nor the host's.
    assert_eq!(as_user(Some(my_uid), &mine).await.0, 200);
    let (status, body) = as_user(Some(other), &mine).await;
    assert_eq!(status, 403, "{body}");
    assert!(error_of(&body).contains(&format!("pid {me}")), "{body}");
    for uri in [gone.as_str(), "/metrics", "/folded", "/runqueue?cgroup=all"] {
        let (status, body) = as_user(Some(other), uri).await;
        assert_eq!(status, 403, "{uri}: {body}");
        assert!(error_of(&body).starts_with("forbidden"), "{body}");
    }
    // Their process list is filtered: the synthetic store's process is
    // gone, so no user but root is shown it.
    let (status, body) = as_user(Some(other), "/processes").await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(&GONE_PID.to_string()), "{body}");
    // A client whose uid is unknown gets the pages and health only.
    for uri in ["/", "/healthz", "/ui/app.css"] {
        assert_eq!(as_user(None, uri).await.0, 200, "{uri}");
    }
    for uri in [mine.as_str(), "/processes", "/metrics"] {
        assert_eq!(as_user(None, uri).await.0, 403, "{uri}");
    }
}

/// A store where `pid` was process `earlier` (stack `main;old`) before it
/// started, and is `sleep` (stack `main;fresh`) since.
fn reused(pid: u32, started: SystemTime) -> Arc<Shared> {
    let mut store = Store::new(Duration::from_secs(600));
    for (name, frame, start) in [
        ("earlier", "old", started - Duration::from_secs(20)),
        ("sleep", "fresh", started + Duration::from_millis(1100)),
    ] {
        let end = start + Duration::from_millis(500);
        store.push(Slice {
            samples: vec![Sample {
                pid,
                tid: pid,
                state: State::Cpu,
                stack: [Arc::<str>::from("main"), Arc::from(frame)].into(),
                ns: 1_000_000,
                count: 1,
            }],
            processes: [(pid, Arc::from(name))].into(),
            ..Slice::empty(start, end)
        });
    }
    Shared::new(store, Vec::new())
}

#[tokio::test]
async fn a_user_sees_nothing_of_an_earlier_process_with_their_pid() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        return; // needs a process of another user
    }
    let mut child = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    let pid = child.id();
    let owned = || api::authority::process_uid(pid) == Some(65534);
    let deadline = SystemTime::now() + Duration::from_secs(10);
    while !owned() && SystemTime::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(owned(), "setpriv did not become nobody");
    let started = wallscope::process::live::start_time(pid).unwrap();
    // The second slice must have ended before the query.
    while SystemTime::now() < started + Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let shared = reused(pid, started);
    let uri = format!("/folded?pid={pid}&seconds=60");
    let (status, root) = as_user_on(shared.clone(), Some(0), &uri).await;
    assert_eq!(status, 200, "{root}");
    assert!(root.contains("earlier;main;old 1000"), "{root}");
    assert!(root.contains("sleep;main;fresh 1000"), "{root}");
    let (status, own) = as_user_on(shared, Some(65534), &uri).await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(own.trim(), "sleep;main;fresh 1000", "{own}");
    let _ = child.kill();
    let _ = child.wait();
}
