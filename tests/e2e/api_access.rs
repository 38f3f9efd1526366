//! The API's access rules in-process (no root, no BPF): the Host check,
//! the bearer token, the HTTP counters, and the server's connection rules.

use std::{sync::Arc, time::Duration};

use crate::support::api::{app, call, error_of, get_with, send, shared, GONE_PID};
use wallscope::{api, token};

#[tokio::test]
async fn other_hosts_are_421_and_local_ones_are_served() {
    let before = api::server::stats::STATS.snapshot().rejected_host;
    let app = || {
        api::router_with(
            shared(),
            // In-process requests come through no socket: no client uid
            // to check (api_headers and security_auth do).
            api::Access::new(vec!["prof.example".into()], None).with_local_auth(false),
        )
    };
    let folded = format!("/folded?pid={GONE_PID}");
    for host in [
        "attacker.example",
        "attacker.example:7070",
        "localhost.attacker.example",
        "127.0.0.1.nip.io:7070",
    ] {
        for uri in [folded.as_str(), "/healthz", "/"] {
            let (status, _, body) = send(app(), get_with(uri, &[("host", host)])).await;
            assert_eq!(status, 421, "{host} {uri}: {body}");
            let error = error_of(&body);
            assert!(
                error.contains(&format!("`{host}`")) && error.contains("--allow-host"),
                "{host}: {error}"
            );
            assert!(!body.contains("heavy"), "{body}");
        }
    }
    for host in [
        "127.0.0.1:7070",
        "127.0.0.1",
        "localhost:7070",
        "localhost",
        "[::1]:7070",
        "[::1]",
        "10.0.0.7:80",
        "prof.example",
        "PROF.example:7070",
    ] {
        let (status, _, body) = send(app(), get_with(&folded, &[("host", host)])).await;
        assert_eq!(status, 200, "{host}: {body}");
        assert!(body.contains("app;main;heavy 6000"), "{host}: {body}");
    }
    // No Host at all (HTTP/1.0): nothing to rebind.
    let (status, _, _) = send(app(), get_with(&folded, &[])).await;
    assert_eq!(status, 200);
    // The default router has the same check, without the extra name.
    let (status, _, _) = send(
        api::router(shared()),
        get_with(&folded, &[("host", "prof.example")]),
    )
    .await;
    assert_eq!(status, 421);
    let (status, _, _) = send(
        api::router(shared()),
        get_with(&folded, &[("host", "localhost:1")]),
    )
    .await;
    assert_eq!(status, 200);
    // Counted: 4 hosts x 3 paths + the default router's refusal.
    let after = api::server::stats::STATS.snapshot().rejected_host;
    assert!(after >= before + 13, "{before} -> {after}");
}

#[tokio::test]
async fn a_token_guards_every_endpoint_but_healthz() {
    let before = api::server::stats::STATS.snapshot().rejected_token;
    let token = token::Token::new("s3cret-t0ken").unwrap();
    let app = || api::router_with(shared(), api::Access::new(Vec::new(), Some(token.clone())));
    let folded = format!("/folded?pid={GONE_PID}");
    let uris = [
        folded.clone(),
        format!("/flamegraph?pid={GONE_PID}"),
        format!("/threads?pid={GONE_PID}"),
        format!("/blocked?pid={GONE_PID}"),
        "/processes".into(),
        "/metrics".into(),
        "/runqueue?pid=1".into(),
        "/".into(),
        "/no-such-page".into(),
    ];
    let refused = [
        vec![],
        vec![("authorization", "Bearer wrong")],
        vec![("authorization", "Bearer s3cret-t0ke")],
        vec![("authorization", "Bearer s3cret-t0ken2")],
        vec![("authorization", "Basic s3cret-t0ken")],
        vec![("authorization", "s3cret-t0ken")],
    ];
    for uri in &uris {
        for headers in &refused {
            let (status, h, body) = send(app(), get_with(uri, headers)).await;
            assert_eq!(status, 401, "{uri} {headers:?}: {body}");
            assert_eq!(h.get("www-authenticate").unwrap(), "Bearer", "{uri}");
            let error = error_of(&body);
            assert!(error.contains("token"), "{uri}: {error}");
            assert!(
                !body.contains("heavy") && !body.contains("main") && !body.contains("app"),
                "no data in a refusal: {body}"
            );
        }
    }
    let bearer = [("authorization", "Bearer s3cret-t0ken")];
    let (status, _, body) = send(app(), get_with(&folded, &bearer)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "app;main;heavy 6000\napp;main;light;read_[k] 1000\n");
    let (status, _, _) = send(app(), get_with("/metrics", &bearer)).await;
    assert_eq!(status, 200);
    // The scheme is case-insensitive (RFC 7235).
    let (status, _, _) = send(
        app(),
        get_with(&folded, &[("authorization", "bearer s3cret-t0ken")]),
    )
    .await;
    assert_eq!(status, 200);
    // Liveness probes need no secret; a foreign Host is still refused.
    let (status, _, body) = send(app(), get_with("/healthz", &[])).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["http"]["rejected_token"].as_u64().unwrap() >= before + 48,
        "{body}"
    );
    let (status, _, _) = send(app(), get_with("/healthz", &[("host", "attacker.example")])).await;
    assert_eq!(status, 421);
}

#[tokio::test]
async fn healthz_and_metrics_report_http_counters() {
    const EVENTS: [&str; 6] = [
        "connections_accepted",
        "closed_idle_timeout",
        "closed_evicted",
        "refused_full",
        "rejected_host",
        "rejected_token",
    ];
    let (_, _, body) = call("/healthz").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    for field in ["connections_open", "connection_limit"]
        .iter()
        .chain(&EVENTS)
    {
        assert!(v["http"][field].is_u64(), "{field}: {body}");
    }
    let (status, _, body) = call("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(
            "# TYPE wallscope_http_connections_open gauge\nwallscope_http_connections_open "
        ),
        "{body}"
    );
    assert!(
        body.contains("# TYPE wallscope_http_events_total counter\n"),
        "{body}"
    );
    for event in EVENTS {
        assert!(
            body.contains(&format!(
                "wallscope_http_events_total{{event=\"{event}\"}} "
            )),
            "{event}: {body}"
        );
    }
}

/// The server's connection rules in-process, on the API router plus slow
/// routes: eviction at the cap, refusal when every connection is busy, and
/// a shutdown that neither cuts a short request nor waits for a stuck one
/// or for idle clients.
#[test]
fn server_evicts_refuses_and_stops_promptly() {
    use std::{
        io::{ErrorKind, Read, Write},
        net::TcpStream,
        sync::atomic::{AtomicUsize, Ordering},
        time::Instant,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Handlers count their start, so the test knows a request is being
    // served (not just sent); `/busy` then waits for `release`.
    let started = Arc::new(AtomicUsize::new(0));
    let (release, released) = tokio::sync::watch::channel(false);
    let sleeper = |ms: u64| {
        let started = started.clone();
        axum::routing::get(move || async move {
            started.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            "done"
        })
    };
    let busy_route = {
        let started = started.clone();
        axum::routing::get(move || async move {
            started.fetch_add(1, Ordering::SeqCst);
            let _ = released.clone().wait_for(|r| *r).await;
            "done"
        })
    };
    let router = app()
        .route("/slow", sleeper(300))
        .route("/stuck", sleeper(60_000))
        .route("/busy", busy_route);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(api::server::serve(listener, router, async {
        let _ = stopped.await;
    }));
    let connect = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let send = |path: &str| {
        let mut s = connect();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        s
    };
    let answer = |mut s: TcpStream| {
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text
    };
    // Whether the server closed `s` (within a second) without answering.
    let closed = |mut s: &TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        }
    };
    let wait_until = |what: &str, ready: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready() {
            assert!(Instant::now() < deadline, "waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let stats = || api::server::stats::STATS.snapshot();
    wait_until("the server", &|| stats().connection_limit > 0);
    let cap = stats().connection_limit as usize;
    let before = stats();

    // At the cap, a new client still gets an answer: the connection that
    // waited longest makes room.
    let idle: Vec<TcpStream> = (0..cap).map(|_| connect()).collect();
    wait_until("idle connections", &|| {
        stats().connections_open as usize >= cap
    });
    let reply = answer(send("/healthz"));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(closed(&idle[0]), "the longest-waiting connection is closed");
    assert!(!closed(&idle[cap - 1]), "the newest idle one is not");
    assert!(stats().closed_evicted > before.closed_evicted);

    // Every connection busy serving: a new one is closed at once.
    let busy: Vec<TcpStream> = (0..cap).map(|_| send("/busy")).collect();
    wait_until("busy requests", &|| started.load(Ordering::SeqCst) >= cap);
    assert!(closed(&connect()), "refused when every connection is busy");
    assert!(stats().refused_full > before.refused_full);
    release.send(true).unwrap();
    for s in busy {
        let reply = answer(s);
        assert!(
            reply.starts_with("HTTP/1.1 200") && reply.ends_with("done"),
            "busy requests are not cut: {reply}"
        );
    }
    drop(idle);

    // Shutdown: a short request in progress completes; a stuck one, idle
    // and slowloris clients do not hold the server.
    let idle: Vec<TcpStream> = (0..50).map(|_| connect()).collect();
    let mut slowloris = connect();
    slowloris.write_all(b"GET / HTTP/1.1\r\nHost: 12").unwrap();
    let serving = started.load(Ordering::SeqCst);
    let short = send("/slow");
    let stuck = send("/stuck");
    wait_until("short and stuck requests", &|| {
        started.load(Ordering::SeqCst) >= serving + 2
    });
    let stopping = Instant::now();
    stop.send(()).unwrap();
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(2), server).await })
        .expect("serve returned")
        .unwrap()
        .unwrap();
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "serve took {took:?} to return"
    );
    let reply = answer(short);
    assert!(
        reply.starts_with("HTTP/1.1 200") && reply.ends_with("done"),
        "{reply}"
    );
    assert!(!answer(stuck).contains("done"));
    assert!(idle.iter().all(closed) && closed(&slowloris));
}
