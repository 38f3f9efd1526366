//! The HTTP API (axum): folded stacks, flame graphs, process list, health,
//! and the web UI at `/`.

pub mod access;
pub mod error;
mod metrics;
pub mod params;
pub mod server;
pub mod token;

use std::{path::Path, sync::Arc, time::SystemTime};

use axum::{
    extract::{RawQuery, State},
    http::header,
    response::{Html, IntoResponse, Response},
    routing::get,
    Json, Router,
};
use serde_json::json;

use crate::{
    bpf::abi::{self, Stat},
    pipeline::Shared,
    profile::{
        kind::{Group, Kind},
        query::{self, Filter, Folded},
        render::{self, GraphLabels},
        runqueue::{self, OwnerError},
        threads,
    },
};
pub use access::Access;
use error::ApiError;
use params::Params;

/// Parameters of `/folded` (and, with `format`, `/flamegraph`).
const PROFILE_PARAMS: [&str; 5] = ["pid", "tid", "seconds", "kind", "group"];

/// Window used when a query gives no `seconds`.
pub const DEFAULT_SECONDS: u64 = 30;

const INDEX_HTML: &str = include_str!("../../web/index.html");

/// The API's routes over the daemon's shared state, with the default
/// access rules ([`Access::local`]: the Host check, no token).
pub fn router(shared: Arc<Shared>) -> Router {
    router_with(shared, Access::local())
}

/// The API's routes behind `access`'s Host and token checks.
pub fn router_with(shared: Arc<Shared>, access: Access) -> Router {
    routes(shared).layer(axum::middleware::from_fn_with_state(
        Arc::new(access),
        access::check,
    ))
}

fn routes(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/folded", get(folded))
        .route("/flamegraph", get(flamegraph))
        .route("/processes", get(processes))
        .route("/threads", get(threads))
        .route("/healthz", get(healthz))
        .route("/runqueue", get(runqueue))
        .route("/metrics", get(metrics))
        .with_state(shared)
}

async fn index() -> Html<&'static str> {
    Html(INDEX_HTML)
}

/// A profile query as given by `pid`, `tid` and `seconds`.
struct ProfileRequest {
    filter: Filter,
    folded: Folded,
}

fn max_seconds(shared: &Shared) -> u64 {
    shared
        .store
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .retention()
        .as_secs()
        .max(1)
}

fn seconds(p: &Params, shared: &Shared) -> Result<u64, ApiError> {
    Ok(p.int("seconds", 1, max_seconds(shared))?
        .unwrap_or(DEFAULT_SECONDS))
}

fn profile(shared: &Shared, p: &Params) -> Result<ProfileRequest, ApiError> {
    let kind = p
        .choice("kind", &Kind::NAMES)?
        .and_then(Kind::parse)
        .unwrap_or(Kind::State(abi::State::Cpu));
    let group = p
        .choice("group", &Group::NAMES)?
        .and_then(Group::parse)
        .unwrap_or(Group::Process);
    let filter = Filter {
        pid: p.id("pid")?,
        tid: p.id("tid")?,
        kind,
        group,
        seconds: seconds(p, shared)?,
    };
    let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
    let folded = query::folded(&store, &filter, SystemTime::now());
    if folded.stacks.is_empty() {
        let window = format!("in the last {} s", filter.seconds);
        let what = format!("no {} samples", filter.kind.describe());
        let retention = format!("in the last {} min", store.retention().as_secs() / 60);
        let message = match (filter.pid, filter.tid) {
            (Some(pid), _)
                if !query::pid_recorded(&store, pid)
                    && !Path::new(&format!("/proc/{pid}")).exists() =>
            {
                format!(
                    "unknown pid {pid}: no such process, and nothing recorded for it {retention}"
                )
            }
            (_, Some(tid))
                if !query::tid_recorded(&store, tid)
                    && !Path::new(&format!("/proc/{tid}")).exists() =>
            {
                format!(
                    "unknown tid {tid}: no such thread, and nothing recorded for it {retention}"
                )
            }
            (Some(pid), None) => format!("{what} for pid {pid} {window}"),
            (pid, Some(tid)) => {
                let of_pid = pid.map(|p| format!(" of pid {p}")).unwrap_or_default();
                format!("{what} for tid {tid}{of_pid} {window}")
            }
            (None, None) => format!("{what} {window}"),
        };
        return Err(ApiError::NotFound(message));
    }
    Ok(ProfileRequest { filter, folded })
}

async fn folded(
    State(shared): State<Arc<Shared>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &PROFILE_PARAMS)?;
    let req = profile(&shared, &p)?;
    Ok(folded_response(&req.folded))
}

fn folded_response(folded: &Folded) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        render::folded_text(folded),
    )
        .into_response()
}

async fn flamegraph(
    State(shared): State<Arc<Shared>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &[&PROFILE_PARAMS[..], &["format"]].concat())?;
    let format = p.choice("format", &["svg", "folded"])?.unwrap_or("svg");
    let req = profile(&shared, &p)?;
    if format == "folded" {
        return Ok(folded_response(&req.folded));
    }
    let labels = GraphLabels {
        subject: subject(&req),
        what: "CPU".into(),
        seconds: req.filter.seconds,
    };
    let svg =
        tokio::task::spawn_blocking(move || render::flamegraph_svg(&req.folded, &labels, false))
            .await
            .map_err(|e| ApiError::Render(std::io::Error::other(e)))?
            .map_err(ApiError::Render)?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}

/// What a graph shows, e.g. `stress (pid 42), tid 43` or `all processes`.
fn subject(req: &ProfileRequest) -> String {
    let f = &req.filter;
    let name_of = |pid: u32| {
        req.folded
            .processes
            .get(&pid)
            .map(|n| n.to_string())
            .unwrap_or_default()
    };
    let mut s = match f.pid {
        Some(pid) => format!("{} (pid {pid})", name_of(pid)),
        None => "all processes".to_string(),
    };
    if let Some(tid) = f.tid {
        s.push_str(&format!(", tid {tid}"));
    }
    s
}

async fn processes(
    State(shared): State<Arc<Shared>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &["seconds"])?;
    let seconds = seconds(&p, &shared)?;
    let mut rows = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        query::processes(&store, seconds, SystemTime::now())
    };
    for row in &mut rows {
        row.jvm = shared.jvms.report(row.pid);
    }
    Ok(Json(rows).into_response())
}

async fn threads(
    State(shared): State<Arc<Shared>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &["pid", "seconds", "format"])?;
    let pid = p
        .id("pid")?
        .ok_or_else(|| ApiError::bad("pid", "required"))?;
    let seconds = seconds(&p, &shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let report = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        threads::report(&store, pid, seconds, SystemTime::now())
    };
    let Some(mut report) = report else {
        return Err(ApiError::NotFound(
            if Path::new(&format!("/proc/{pid}")).exists() {
                format!("no thread activity for pid {pid} in the last {seconds} s")
            } else {
                format!("unknown pid {pid}: no such process, and nothing recorded for it in the last {seconds} s")
            },
        ));
    };
    report.jvm = shared.jvms.report(pid);
    Ok(json_or_text(text, report, threads::render_text))
}

async fn runqueue(
    State(shared): State<Arc<Shared>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &["pid", "cgroup", "seconds", "format"])?;
    let seconds = seconds(&p, &shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let cgroup = p.text("cgroup");
    let owner = runqueue::owner(p.id("pid")?, cgroup).map_err(|e| match e {
        OwnerError::Param(param, message) => ApiError::bad(param, message),
        OwnerError::NoSuchCgroup(message) => ApiError::NotFound(message),
    })?;
    let slots = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        runqueue::merged(&store, owner, seconds, SystemTime::now())
    };
    let who = runqueue::Owner::resolve(owner);
    let report = runqueue::from_slots(&slots, who.clone(), seconds).ok_or_else(|| {
        let who = who.describe();
        ApiError::NotFound(format!(
            "no runqueue latency recorded for {who} in the last {seconds} s"
        ))
    })?;
    Ok(json_or_text(text, report, runqueue::render_text))
}

/// A report as JSON, or as text for a terminal when `text`.
fn json_or_text<T: serde::Serialize>(text: bool, report: T, render: fn(&T) -> String) -> Response {
    if text {
        (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            render(&report),
        )
            .into_response()
    } else {
        Json(report).into_response()
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::render(&shared, SystemTime::now()),
    )
        .into_response()
}

async fn healthz(State(shared): State<Arc<Shared>>) -> Json<serde_json::Value> {
    let (totals, retention, stacks, slices) = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        (
            *store.totals(),
            store.retention(),
            store.stack_count(),
            store.all().count(),
        )
    };
    let health = shared.health().clone();
    let counters = |loss: bool| -> serde_json::Map<String, serde_json::Value> {
        Stat::ALL
            .iter()
            .filter(|s| s.is_loss() == loss)
            .map(|s| (s.name().to_string(), json!(totals[*s as usize])))
            .collect()
    };
    let lost_samples = totals[Stat::CountsFull as usize];
    Json(json!({
        "status": "ok",
        "uptime_s": shared.started.elapsed().as_secs(),
        "programs": shared.attached.iter().map(|(name, links)| json!({"name": name, "links": links})).collect::<Vec<_>>(),
        "samples": totals[Stat::Samples as usize],
        "samples_lost": lost_samples,
        "lost": counters(true),
        "events": counters(false),
        "refused": crate::untrusted::refusals::report(),
        "pipeline": health,
        "retention_s": retention.as_secs(),
        "slices": slices,
        "stacks": stacks,
        "http": server::STATS.snapshot(),
    }))
}

/// Serves the API behind `access` until ctrl-c or SIGTERM, then returns
/// within about a second whatever the clients do (see [`server`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    access: Access,
) -> std::io::Result<()> {
    server::serve(listener, router_with(shared, access), shutdown_signal()).await
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
