//! The API under a heavy query, in-process over a large synthetic store:
//! `/healthz` and the symbolizer's writes go on while whole-host profiles
//! are computed, and big answers are bounded.

use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
    time::{Duration, Instant, SystemTime},
};

use crate::support::{
    api::{get_with, send},
    Fixture,
};
use tokio::task::JoinHandle;
use wallscope::{
    api,
    profile::model::state::State,
    profile::{
        model::{store::Store, Frame, Sample, Slice, Stack, ThreadInfo},
        report::truncate::Limits,
    },
    state::Shared,
};

const SLICES: u64 = 120;
const ROWS_PER_SLICE: usize = 2_000;
/// More than the API's stack bound, so whole-window answers are truncated.
const STACKS: usize = 30_000;
const PROCESSES: u32 = 50;
const FIRST_PID: u32 = 4_000_000;

/// A store of `SLICES` one-second slices over the last minutes, each with
/// `ROWS_PER_SLICE` samples drawn from `STACKS` distinct stacks; built once
/// for all tests, with its stacks.
fn fixture() -> &'static (Arc<Shared>, Vec<Stack>) {
    static FIXTURE: OnceLock<(Arc<Shared>, Vec<Stack>)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let common: Vec<Frame> = ["_start", "main", "run", "dispatch", "handle"]
            .map(Frame::from)
            .to_vec();
        let stacks: Vec<Stack> = (0..STACKS)
            .map(|j| {
                let mut frames = common.clone();
                frames.push(Frame::from(format!("layer{}", j % 100)));
                frames.push(Frame::from(format!("leaf_function_{j}")));
                frames.into()
            })
            .collect();
        let rss_before = api::memory::Rss::of_self().map(|r| r.anon_bytes);
        let now = SystemTime::now();
        let mut store = Store::new(Duration::from_secs(600)).with_max_bytes(usize::MAX / 2);
        for i in 0..SLICES {
            let end = now - Duration::from_secs(SLICES - i);
            store.push(slice(i, end, &stacks));
        }
        // How the estimate compares with what the allocations cost.
        let rss_after = api::memory::Rss::of_self().map(|r| r.anon_bytes);
        if let (Some(before), Some(after)) = (rss_before, rss_after) {
            let stats = store.stats();
            eprintln!(
                "store estimate {} KiB ({} slices, {} stacks); anon RSS grew {} KiB",
                stats.bytes >> 10,
                stats.slices,
                stats.stacks,
                after.saturating_sub(before) >> 10
            );
        }
        (Shared::new(store, Vec::new()), stacks)
    })
}

fn shared() -> Arc<Shared> {
    fixture().0.clone()
}

fn slice(i: u64, end: SystemTime, stacks: &[Stack]) -> Slice {
    let samples = (0..ROWS_PER_SLICE)
        .map(|k| {
            let j = (i as usize * ROWS_PER_SLICE + k) % stacks.len();
            let pid = FIRST_PID + j as u32 % PROCESSES;
            Sample {
                pid,
                tid: pid + (k % 4) as u32,
                state: State::Cpu,
                stack: stacks[j].clone(),
                ns: 1_000_000 + j as u64,
                count: 1,
            }
        })
        .collect();
    let pids = (0..PROCESSES).map(|p| FIRST_PID + p);
    Slice {
        start: end - Duration::from_secs(1),
        end,
        samples,
        wakeups: Vec::new(),
        threads: pids
            .clone()
            .flat_map(|pid| {
                (0..4).map(move |t| {
                    let name = Arc::from(format!("worker-{t}"));
                    (pid + t, ThreadInfo { pid, name })
                })
            })
            .collect(),
        thread_totals: Vec::new(),
        runq_hists: Vec::new(),
        processes: pids
            .map(|pid| (pid, Arc::from(format!("app{pid}"))))
            .collect::<HashMap<_, _>>(),
        containers: HashMap::new(),
        origins: HashMap::new(),
        kept_off: Vec::new(),
        sleeps: Vec::new(),
        stats: [0; wallscope::profile::model::state::STAT_COUNTERS],
        spans: Default::default(),
    }
}

/// GET `uri` on its own task: (status, headers, body).
fn spawn_get(router: &axum::Router, uri: &str) -> JoinHandle<(u16, axum::http::HeaderMap, String)> {
    let (router, req) = (router.clone(), get_with(uri, &[]));
    tokio::spawn(async move { send(router, req).await })
}

async fn healthz(router: &axum::Router) -> serde_json::Value {
    let (status, _, body) = send(router.clone(), get_with("/healthz", &[])).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits until `/healthz` says a query runs; panics if `heavy` all end
/// first (they would have been too light to test anything).
async fn until_running(router: &axum::Router, heavy: &[JoinHandle<impl Sized>]) {
    loop {
        assert!(
            heavy.iter().any(|h| !h.is_finished()),
            "the heavy queries ended before one was seen running"
        );
        if healthz(router).await["queries"]["running"].as_u64() > Some(0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Two whole-window queries hold both async workers' worth of work: with
/// queries on the workers, `/healthz` would wait for them to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_while_heavy_queries_run() {
    let _fx = Fixture::in_process();
    let router = api::router(shared());
    let started = Instant::now();
    let heavy = [
        spawn_get(&router, "/folded?seconds=600"),
        spawn_get(&router, "/flamegraph?seconds=600&format=folded&kind=cpu"),
    ];
    until_running(&router, &heavy).await;
    let mut answered = 0;
    let mut slowest = Duration::ZERO;
    while heavy.iter().all(|h| !h.is_finished()) && answered < 20 {
        let asked = Instant::now();
        let health = healthz(&router).await;
        slowest = slowest.max(asked.elapsed());
        if heavy.iter().all(|h| !h.is_finished()) {
            // Answered while both were still computing.
            answered += 1;
            // The whole history (slices past a minute old are merged).
            assert!(
                health["store"]["history_s"].as_u64() >= Some(SLICES),
                "{health}"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut took = Vec::new();
    for h in heavy {
        let (status, headers, body) = h.await.unwrap();
        assert_eq!(status, 200, "{body:.300}");
        assert!(headers.contains_key(api::TRUNCATED_HEADER));
        took.push(started.elapsed());
    }
    eprintln!(
        "heavy queries took {took:?}; {answered} /healthz answered meanwhile, slowest {slowest:?}"
    );
    assert!(
        answered > 0,
        "no /healthz answer while the heavy queries ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_symbolizer_pushes_while_a_query_runs() {
    let _fx = Fixture::in_process();
    let shared = shared();
    let router = api::router(shared.clone());
    let heavy = [spawn_get(
        &router,
        "/folded?seconds=600&kind=cpu&group=thread",
    )];
    until_running(&router, &heavy).await;
    let pusher = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            // Stacks the store has: other tests count distinct stacks.
            let slice = slice(0, SystemTime::now(), &fixture().1);
            let started = Instant::now();
            shared.store.write().unwrap().push(slice);
            started.elapsed()
        })
    };
    while !pusher.is_finished() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        !heavy[0].is_finished(),
        "the push should have completed while the query still ran"
    );
    eprintln!("push took {:?} during the query", pusher.join().unwrap());
    let [heavy] = heavy;
    let (status, _, _) = heavy.await.unwrap();
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_window_answers_are_bounded_and_say_what_they_left_out() {
    let _fx = Fixture::in_process();
    let router = api::router(shared());
    let (status, headers, body) = send(router, get_with("/folded?seconds=600", &[])).await;
    assert_eq!(status, 200);
    let header = headers[api::TRUNCATED_HEADER].to_str().unwrap().to_string();
    let lines: Vec<&str> = body.lines().collect();
    let truncated: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains(";[truncated: "))
        .collect();
    assert!(!truncated.is_empty(), "no [truncated] frame");
    assert!(
        truncated.len() <= PROCESSES as usize,
        "one per process at most"
    );
    assert_eq!(
        lines.len(),
        Limits::API.stacks + truncated.len(),
        "{header}"
    );
    let merged: usize = truncated
        .iter()
        .map(|l| {
            let n = l.split("[truncated: ").nth(1).unwrap();
            n.split(' ').next().unwrap().parse::<usize>().unwrap()
        })
        .sum();
    assert!(header.starts_with(&format!("stacks={merged} ")), "{header}");
    assert_eq!(
        merged + Limits::API.stacks,
        STACKS,
        "every stack kept or merged"
    );
}

/// A push holds the store's write lock while it interns a slice's stacks
/// (milliseconds on a busy host): `/healthz` reads published figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_does_not_wait_for_the_store_lock() {
    let _fx = Fixture::in_process();
    let shared = crate::support::api::shared();
    let router = api::router(shared.clone());
    let (locked, is_locked) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _store = shared.store.write().unwrap();
        locked.send(()).unwrap();
        let _ = released.recv();
    });
    is_locked.recv().unwrap();
    let health = tokio::spawn(async move { healthz(&router).await });
    let answered = tokio::time::timeout(Duration::from_secs(30), health).await;
    release.send(()).unwrap();
    holder.join().unwrap();
    let health = answered
        .expect("/healthz waited for the store's write lock")
        .unwrap();
    assert_eq!(health["store"]["slices"], 1, "{health}");
}
