//! `/blocked` in-process over a synthetic store and live view (no root, no
//! BPF): the live view's threads, filters, formats and errors.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::support::api::{call_on, error_of, shared, GONE_PID};
use serde_json::{json, Value};
use wallscope::{
    api,
    profile::model::live::{LiveThread, LiveView, LiveWaker, Syscall},
    profile::model::state::State,
};

/// A process that is in the live view only (gone, and with no slice).
const ONLY_LIVE_PID: u32 = GONE_PID + 100;

fn thread(pid: u32, tid: u32, name: &str, ms: u64, state: State) -> LiveThread {
    LiveThread {
        pid,
        tid,
        name: Arc::from(name),
        state,
        in_state: Duration::from_millis(ms),
        syscall: None,
        stack: ["main", "run", "wait"]
            .map(Arc::<str>::from)
            .into_iter()
            .collect(),
        waker: None,
    }
}

/// `GONE_PID` has a thread parked for 75.5 s, one waiting for the CPU for
/// 1.2 s and one asleep for 0.6 s; `ONLY_LIVE_PID` one in I/O for 3 s.
fn view(as_of: SystemTime) -> LiveView {
    let mut parked = thread(
        GONE_PID,
        GONE_PID + 1,
        "pool-1-thread-1",
        75_500,
        State::Futex,
    );
    parked.syscall = Some(Syscall {
        nr: 202,
        name: Some("futex"),
    });
    parked.stack = ["main", "Unsafe.park", "[syscall futex]"]
        .map(Arc::<str>::from)
        .into_iter()
        .collect();
    parked.waker = Some(LiveWaker::Thread {
        pid: GONE_PID,
        tid: GONE_PID,
        name: Some(Arc::from("app")),
    });
    let mut io = thread(ONLY_LIVE_PID, ONLY_LIVE_PID, "db", 3_000, State::Io);
    io.waker = Some(LiveWaker::Interrupt);
    LiveView {
        as_of: Some(as_of),
        threads: vec![
            parked,
            io,
            thread(GONE_PID, GONE_PID + 2, "worker", 1_200, State::Runqueue),
            thread(GONE_PID, GONE_PID + 3, "timer", 600, State::Sleep),
        ],
        processes: HashMap::from([
            (GONE_PID, Arc::from("app")),
            (ONLY_LIVE_PID, Arc::from("db")),
        ]),
        left_out: 0,
        left_out_longest: Duration::ZERO,
    }
}

fn app() -> axum::Router {
    let shared = shared();
    let as_of = SystemTime::now() - Duration::from_secs(2);
    shared.store.write().unwrap().set_live(view(as_of));
    api::router(shared)
}

async fn json_of(uri: &str) -> Value {
    let (status, ctype, body) = call_on(app(), uri).await;
    assert_eq!(status, 200, "{uri}: {body}");
    assert!(ctype.starts_with("application/json"), "{uri}");
    serde_json::from_str(&body).unwrap()
}

fn tids(v: &Value) -> Vec<u64> {
    let threads = v["threads"].as_array().unwrap();
    threads.iter().map(|t| t["tid"].as_u64().unwrap()).collect()
}

#[tokio::test]
async fn blocked_threads_longest_first_with_state_stack_and_waker() {
    let v = json_of("/blocked").await;
    let g = u64::from(GONE_PID);
    assert_eq!(tids(&v), [g + 1, u64::from(ONLY_LIVE_PID), g + 2], "≥ 1 s");
    assert_eq!(
        (
            v["pid"].clone(),
            v["min_seconds"].clone(),
            v["limit"].clone()
        ),
        (Value::Null, json!(1.0), json!(100))
    );
    assert_eq!(
        (v["matched"].clone(), v["left_out"].clone()),
        (json!(3), json!(0))
    );
    assert!(v["as_of"].as_str().unwrap().ends_with('Z'), "{v}");
    let age = v["age_s"].as_f64().unwrap();
    assert!((2.0..60.0).contains(&age), "{age}");
    let parked = &v["threads"][0];
    let since = parked["since"].as_str().unwrap().to_string();
    assert_eq!(
        parked,
        &json!({
            "pid": GONE_PID,
            "process": "app",
            "tid": GONE_PID + 1,
            "name": "pool-1-thread-1",
            "state": "futex",
            "in_state_s": 75.5,
            "since": since,
            "syscall": "futex",
            "syscall_nr": 202,
            "stack": ["[syscall futex]", "Unsafe.park", "main"],
            "woken_by": {"kind": "thread", "pid": GONE_PID, "tid": GONE_PID, "name": "app"},
        })
    );
    assert_eq!(v["threads"][1]["woken_by"], json!({"kind": "interrupt"}));
    assert_eq!(v["threads"][2]["woken_by"], Value::Null);
}

#[tokio::test]
async fn blocked_filters_by_pid_min_seconds_and_limit() {
    let g = u64::from(GONE_PID);
    let v = json_of(&format!("/blocked?pid={GONE_PID}&min_seconds=0.5")).await;
    assert_eq!(tids(&v), [g + 1, g + 2, g + 3]);
    assert_eq!(v["min_seconds"], 0.5);
    let v = json_of(&format!("/blocked?pid={GONE_PID}&min_seconds=0&limit=1")).await;
    assert_eq!((tids(&v), v["matched"].clone()), (vec![g + 1], json!(3)));
    let v = json_of(&format!("/blocked?pid={ONLY_LIVE_PID}")).await;
    assert_eq!(
        tids(&v),
        [u64::from(ONLY_LIVE_PID)],
        "known from the view alone"
    );
    // A known process with nothing blocked that long: an empty list.
    let v = json_of(&format!("/blocked?pid={GONE_PID}&min_seconds=100")).await;
    assert_eq!(
        (v["threads"].clone(), v["matched"].clone()),
        (json!([]), json!(0))
    );
}

#[tokio::test]
async fn blocked_text_is_jstack_with_durations() {
    let (status, ctype, body) =
        call_on(app(), &format!("/blocked?pid={GONE_PID}&format=text")).await;
    assert_eq!(status, 200, "{body}");
    assert!(ctype.starts_with("text/plain"));
    let head = body.lines().next().unwrap();
    assert!(
        head.starts_with(&format!(
            "Threads of pid {GONE_PID} off-CPU for at least 1 s, as of "
        )) && head.ends_with("s ago): 2 shown of 2"),
        "{body}"
    );
    let parked = format!(
        "\"pool-1-thread-1\" tid={} pid={GONE_PID} (app): futex for 75.5 s since ",
        GONE_PID + 1
    );
    let frames = format!(
        ", in futex()\n    at [syscall futex]\n    at Unsafe.park\n    at main\n    \
         woken last by \"app\" tid={GONE_PID} pid={GONE_PID}\n\n"
    );
    let at = body.find(&parked).unwrap_or_else(|| panic!("{body}"));
    assert!(body[at..].contains(&frames), "{body}");
    assert!(
        body.ends_with("    at wait\n    at run\n    at main\n    woken last by: no wakeup seen\n"),
        "{body}"
    );
}

#[tokio::test]
async fn blocked_before_the_first_drain_has_no_view() {
    let (status, _, body) = call_on(api::router(shared()), "/blocked").await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["as_of"].clone(), v["threads"].clone()),
        (Value::Null, json!([]))
    );
    let (_, _, body) = call_on(api::router(shared()), "/blocked?format=text").await;
    assert!(body.contains("first drain"), "{body}");
}

#[tokio::test]
async fn blocked_rejects_bad_input_and_unknown_pids() {
    for (uri, param) in [
        ("/blocked?min_seconds=-1", "`min_seconds`"),
        ("/blocked?min_seconds=-0.5", "`min_seconds`"),
        ("/blocked?min_seconds=NaN", "`min_seconds`"),
        ("/blocked?min_seconds=inf", "`min_seconds`"),
        ("/blocked?min_seconds=1e3", "`min_seconds`"),
        ("/blocked?min_seconds=abc", "`min_seconds`"),
        ("/blocked?min_seconds=", "`min_seconds`"),
        ("/blocked?min_seconds=%2B1", "`min_seconds`"),
        ("/blocked?min_seconds=1&min_seconds=2", "`min_seconds`"),
        ("/blocked?limit=0", "`limit`"),
        ("/blocked?limit=2001", "`limit`"),
        ("/blocked?limit=ten", "`limit`"),
        ("/blocked?pid=abc", "`pid`"),
        ("/blocked?pid=0", "`pid`"),
        ("/blocked?format=svg", "`format`"),
        ("/blocked?seconds=5", "`seconds`"),
    ] {
        let (status, ctype, body) = call_on(app(), uri).await;
        assert_eq!(status, 400, "{uri}: {body}");
        assert!(ctype.starts_with("application/json"), "{uri}");
        assert!(error_of(&body).contains(param), "{uri}: {body}");
    }
    let unknown = GONE_PID + 5;
    let (status, ctype, body) = call_on(app(), &format!("/blocked?pid={unknown}")).await;
    assert_eq!(status, 404, "{body}");
    assert!(ctype.starts_with("application/json"));
    assert!(
        error_of(&body).contains(&format!("unknown pid {unknown}")),
        "{body}"
    );
}
