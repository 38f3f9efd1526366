//! The HTTP API (axum): folded stacks, flame graphs, process list, thread
//! breakdowns, blocked threads, findings (`/explain`), health, and the web
//! UI at `/`.

pub mod access;
pub mod answers;
pub mod authority;
mod blocked;
pub mod client;
mod disclosed;
pub mod error;
mod explain;
pub mod headers;
mod host;
mod host_facts;
pub mod limit;
pub mod memory;
mod metrics;
pub mod params;
pub mod peer;
mod pprof;
mod processes;
mod profiles;
mod queries;
mod recorded;
mod runqueue;
pub mod select;
pub mod server;
mod span_params;
mod spans;
mod threads;
mod timeline;
mod trace;
mod ui;
mod wait_facts;
pub mod window;

use std::{
    sync::{Arc, Mutex},
    time::SystemTime,
};

use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    routing::get,
    Extension, Json, Router,
};
use serde_json::json;
use tower_http::compression::{
    predicate::{NotForContentType, Predicate, SizeAbove},
    CompressionLayer,
};

use crate::{bpf::abi::Stat, profile::model::store::Published, state::Shared};
pub use access::Access;
use authority::Authority;
use error::ApiError;
use limit::Queries;
pub use queries::TRUNCATED_HEADER;
pub use window::DEFAULT_SECONDS;

/// What the handlers share: the daemon's state and the bound on queries.
#[derive(Clone)]
struct ApiState {
    shared: Arc<Shared>,
    queries: Arc<Queries>,
    /// The store's figures, readable without its lock.
    store: Arc<Mutex<Published>>,
}

/// The API's routes over the daemon's shared state, with the default
/// access rules ([`Access::local`]: the Host check, no token).
pub fn router(shared: Arc<Shared>) -> Router {
    router_with(shared, Access::local())
}

/// The API's routes behind `access`'s Host, token and user checks, with
/// the browser security headers of [`headers`] on every answer.
pub fn router_with(shared: Arc<Shared>, access: Access) -> Router {
    routes(shared)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(access),
            access::check,
        ))
        // Outermost: refusals get the headers too.
        .layer(axum::middleware::map_response(headers::add))
}

fn routes(shared: Arc<Shared>) -> Router {
    let store = shared
        .store
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .published();
    let state = ApiState {
        shared,
        // As many running queries as the budget's `query_buffers` holds.
        queries: Arc::new(Queries::new(
            memory::query_slots(),
            limit::MAX_WAITING,
            limit::MAX_WAIT,
        )),
        store,
    };
    Router::new()
        .route("/", get(ui::host_page))
        .route("/process/{pid}", get(ui::process_page))
        .route("/ui/meta.json", get(ui::meta))
        .route("/ui/{name}", get(ui::asset))
        .route("/timeline", get(timeline::timeline))
        .route("/folded", get(profiles::folded))
        .route("/flamegraph", get(profiles::flamegraph))
        .route("/pprof", get(pprof::pprof))
        .route("/processes", get(processes::processes))
        .route("/host", get(host::host))
        .route("/threads", get(threads::threads))
        .route("/spans", get(spans::spans))
        .route("/healthz", get(healthz))
        .route("/runqueue", get(runqueue::runqueue))
        .route("/blocked", get(blocked::blocked))
        .route("/explain", get(explain::explain))
        .route("/metrics", get(metrics))
        .route("/trace", get(trace::trace))
        .with_state(state)
        // Inside the compression: it sees each answer's exact size.
        .layer(axum::middleware::from_fn(answers::charge))
        .layer(compression())
}

/// Gzip for clients that ask for it, except what is gzipped already
/// (`/pprof`'s `.pb.gz`) and answers too small to gain.
fn compression() -> CompressionLayer<impl Predicate> {
    let predicate = SizeAbove::new(1024)
        .and(NotForContentType::const_new("application/octet-stream"))
        .and(NotForContentType::IMAGES)
        .and(NotForContentType::SSE);
    CompressionLayer::new().gzip(true).compress_when(predicate)
}

/// `/metrics` reads 60 s of per-thread totals: a blocking thread, but no
/// turn from the query bound, so that scrapes go on while heavy queries run.
async fn metrics(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let queries = state.queries.stats();
    let text = tokio::task::spawn_blocking(move || {
        metrics::render(&state.shared, &queries, SystemTime::now())
    })
    .await
    .map_err(|e| ApiError::Failed(format!("metrics failed: {e}")))?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}

/// Counters only, read under short locks and never the store's: it answers
/// while queries run and while the symbolizer pushes. A user other than
/// root reads other users' processes in it only as counts ([`disclosed`]).
async fn healthz(
    State(state): State<ApiState>,
    authority: Option<Extension<Authority>>,
) -> Json<serde_json::Value> {
    let sight = authority::reader_of(authority).sight();
    let shared = &state.shared;
    let Published {
        stats: store,
        totals,
        retention,
        history,
        spans,
    } = state
        .store
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let health = shared.health().clone();
    // Outside the lock: it reads `/proc` for the processes listed.
    let health = disclosed::health(health, &sight);
    let counters = |loss: bool| -> serde_json::Map<String, serde_json::Value> {
        Stat::ALL
            .iter()
            .filter(|s| s.is_loss() == loss)
            .map(|s| (s.name().to_string(), json!(totals[*s as usize])))
            .collect()
    };
    let lost_samples = totals[Stat::CountsFull as usize];
    let push = shared.push.get().map(|p| p.report());
    let otlp = shared.otlp.get().map(|p| p.report());
    let degraded = disclosed::degraded(&sight);
    Json(json!({
        "status": if degraded.is_empty() { "ok" } else { "degraded" },
        "degraded": degraded,
        "warnings": crate::export::push::squat::warnings(),
        "uptime_s": shared.started.elapsed().as_secs(),
        "programs": shared.attached.iter().map(|(name, links)| json!({"name": name, "links": links})).collect::<Vec<_>>(),
        "samples": totals[Stat::Samples as usize],
        "samples_lost": lost_samples,
        "lost": counters(true),
        "events": counters(false),
        "refused": crate::untrusted::refusals::report(),
        "user_cpu": disclosed::user_cpu(crate::budget::cpu::report(), &sight),
        "pipeline": health,
        "retention_s": retention.as_secs(),
        "slices": store.slices,
        "stacks": store.stacks,
        "store": store,
        "history": history,
        "spans": spans,
        "memory": memory::report(&store, &spans, &state.queries.stats(), &push.iter().chain(&otlp).cloned().collect::<Vec<_>>()),
        "queries": state.queries.stats(),
        "http": server::stats::STATS.snapshot(),
        "answers": answers::BUDGET.stats(),
        "capabilities": crate::caps::report(),
        "push": push,
        "otlp": otlp,
        "trace": shared.trace.get().map(|t| t.report()),
    }))
}

/// Serves the API behind `access` until ctrl-c or SIGTERM, then returns
/// within [`server::SHUTDOWN_GRACE`] whatever the clients do (see
/// [`server`]). `on_signal` runs as the signal arrives, so that the rest of
/// the daemon stops meanwhile rather than after.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    access: Access,
    on_signal: impl FnOnce(),
) -> std::io::Result<()> {
    let shutdown = async {
        shutdown_signal().await;
        on_signal();
    };
    server::serve(listener, router_with(shared, access), shutdown).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}
