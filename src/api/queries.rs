//! The endpoints that walk the store: `/folded`, `/flamegraph`,
//! `/processes`, `/threads`, `/runqueue`, `/blocked`. Each parses its
//! parameters on the async worker, then reads a [`Snapshot`] of the store
//! (taken under a short lock) on a blocking thread, within the
//! [`super::limit::Queries`] bound.

use std::time::{Duration, SystemTime};

use axum::{
    extract::{RawQuery, State},
    http::{header, HeaderValue},
    response::{IntoResponse, Response},
    Extension, Json,
};

use super::{
    authority,
    error::ApiError,
    params::Params,
    recorded::{with_note, with_recorded},
    window::WINDOW_PARAMS,
    ApiState,
};
use crate::{
    bpf::abi,
    process::{cgroups, ProcessTable},
    profile::{
        blocked::{self, BlockedFilter},
        cgroup_list, culprits, gil,
        kind::{Group, Kind},
        query::{self, Filter, Folded},
        render::{self, GraphLabels},
        runqueue::{self, OwnerError},
        sleeps,
        store::{Recorded, Snapshot},
        threads,
        truncate::{Limits, Truncation},
        window::Window,
    },
    state::Shared,
};

/// Parameters of `/folded` (and, with `format`, `/flamegraph`).
pub(super) const PROFILE_PARAMS: [&str; 7] =
    ["pid", "tid", "seconds", "from", "until", "kind", "group"];

/// Response header saying what the size bounds merged away.
pub const TRUNCATED_HEADER: &str = "x-wallscope-truncated";

/// The store's slices now; the lock is held only to copy the list.
pub(super) fn snapshot(shared: &Shared) -> Snapshot {
    shared
        .store
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .snapshot()
}

/// The window `p` asks for, `seconds` bounded by the retention.
/// The window `p` asks for. "The last N seconds" end at the newest slice
/// (the last drain, at most a second ago), so that they hold N seconds of
/// records, not N less the part not drained yet.
pub(super) fn window(p: &Params, shared: &Shared) -> Result<Window, ApiError> {
    let (retention, newest) = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        (store.retention(), store.newest_end())
    };
    let now = newest.unwrap_or_else(SystemTime::now);
    super::window::window(p, retention, now).map(authority::clamp)
}

/// `names` and the window's parameters.
pub(super) fn with_window(names: &[&'static str]) -> Vec<&'static str> {
    [names, &WINDOW_PARAMS[..]].concat()
}

/// The filter of a profile query; `group` when none is given.
pub(super) fn filter(shared: &Shared, p: &Params, group: Group) -> Result<Filter, ApiError> {
    let kind = p
        .choice("kind", &Kind::names())?
        .and_then(Kind::parse)
        .unwrap_or(Kind::State(abi::State::Cpu));
    let group = p
        .choice("group", &Group::names())?
        .and_then(Group::parse)
        .unwrap_or(group);
    Ok(Filter {
        pid: p.id("pid")?,
        tid: p.id("tid")?,
        kind,
        group,
        window: window(p, shared)?,
        others_hidden: authority::others_hidden(),
    })
}

/// A folded profile within its [`Limits`].
struct Profile {
    filter: Filter,
    folded: Folded,
    truncated: Option<Truncation>,
    /// Why it is empty, when it is.
    note: Option<String>,
    /// Seconds of the window the store has records of, and at what
    /// resolution.
    recorded: Recorded,
}

/// Folds the samples `filter` selects (on a blocking thread). Empty, with
/// a note saying why, when the process or thread is known but recorded
/// nothing in the window; 404 when it was never seen.
fn profile(shared: &Shared, filter: Filter, limits: Limits) -> Result<Profile, ApiError> {
    let store = snapshot(shared);
    // Two passes over the window (names, rows): over the process's only.
    let narrowed = filter
        .pid
        .and_then(|pid| store.narrowed(pid, filter.window));
    let (folded, truncated) =
        query::folded_within(narrowed.as_ref().unwrap_or(&store), &filter, limits);
    let note = if folded.stacks.is_empty() {
        Some(empty_note(&store, &shared.processes, &filter)?)
    } else {
        None
    };
    let recorded = store.recorded_of(filter.window, SystemTime::now(), filter.pid);
    Ok(Profile {
        filter,
        folded,
        truncated,
        note,
        recorded,
    })
}

/// The JVM report of `pid`'s newest process, if it is a JVM the agent
/// knows (never the report of an earlier process with that pid).
pub(super) fn jvm_report(shared: &Shared, pid: u32) -> Option<crate::jvm::JvmReport> {
    shared.jvms.report_of(shared.processes.newest(pid)?)
}

/// Why `pid` is unknown, if it is: no such process now, and nothing
/// recorded for it within the retention.
pub(super) fn unknown_pid(store: &Snapshot, processes: &ProcessTable, pid: u32) -> Option<String> {
    let known = query::pid_recorded(store, pid) || processes.running(pid);
    let minutes = store.retention().as_secs() / 60;
    (!known).then(|| {
        format!("unknown pid {pid}: no such process, and nothing recorded for it in the last {minutes} min")
    })
}

/// Why `filter` found nothing: `Ok(note)` when its process and thread are
/// known (alive, or recorded within the retention) but recorded nothing of
/// the kind in the window, 404 when one of them was never seen.
pub(super) fn empty_note(
    store: &Snapshot,
    processes: &ProcessTable,
    filter: &Filter,
) -> Result<String, ApiError> {
    let window = format!("in the {}", filter.window.describe());
    let what = format!("no {} samples", filter.kind.describe());
    let retention = format!("in the last {} min", store.retention().as_secs() / 60);
    if let Some(unknown) = filter
        .pid
        .and_then(|pid| unknown_pid(store, processes, pid))
    {
        return Err(ApiError::NotFound(unknown));
    }
    Ok(match (filter.pid, filter.tid) {
        (_, Some(tid)) if !query::tid_recorded(store, tid) && !processes.running(tid) => {
            return Err(ApiError::NotFound(format!(
                "unknown tid {tid}: no such thread, and nothing recorded for it {retention}"
            )));
        }
        (Some(pid), None) => format!("{what} for pid {pid} {window}"),
        (pid, Some(tid)) => {
            let of_pid = pid.map(|p| format!(" of pid {p}")).unwrap_or_default();
            format!("{what} for tid {tid}{of_pid} {window}")
        }
        (None, None) => format!("{what} {window}"),
    })
}

pub(super) async fn folded(
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &PROFILE_PARAMS)?;
    let filter = filter(&state.shared, &p, Group::Process)?;
    let shared = state.shared.clone();
    let (text, truncated, note, recorded) = state
        .queries
        .run(move || {
            let profile = profile(&shared, filter, Limits::API)?;
            let text = render::folded_text(&profile.folded);
            Ok::<_, ApiError>((text, profile.truncated, profile.note, profile.recorded))
        })
        .await??;
    let response = with_truncation(folded_response(text), truncated, Limits::API);
    Ok(with_recorded(
        with_note(response, note.as_deref()),
        &recorded,
    ))
}

fn folded_response(text: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// Marks a response whose profile lost stacks to the size bounds, e.g.
/// `x-wallscope-truncated: stacks=1234 us=5678 max_stacks=20000 max_bytes=8388608`,
/// then ` max_frames=N` for a flame graph ([`Limits::GRAPH`]), when the
/// fold's memory budget was spent, ` over_budget=N` (rows
/// merged unseen) and, when lines were cut, ` elided_lines=N`.
fn with_truncation(
    mut response: Response,
    truncated: Option<Truncation>,
    limits: Limits,
) -> Response {
    if let Some(t) = truncated {
        let mut value = format!(
            "stacks={} us={} max_stacks={} max_bytes={}",
            t.stacks,
            query::ns_to_us(t.ns),
            limits.stacks,
            limits.bytes
        );
        if limits.frames != usize::MAX {
            value.push_str(&format!(" max_frames={}", limits.frames));
        }
        if t.over_budget > 0 {
            value.push_str(&format!(" over_budget={}", t.over_budget));
        }
        if t.elided_lines > 0 {
            value.push_str(&format!(" elided_lines={}", t.elided_lines));
        }
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(TRUNCATED_HEADER, value);
        }
    }
    response
}

pub(super) async fn flamegraph(
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &[&PROFILE_PARAMS[..], &["format"]].concat())?;
    let svg = p.choice("format", &["svg", "folded"])?.unwrap_or("svg") == "svg";
    let filter = filter(&state.shared, &p, Group::Process)?;
    let shared = state.shared.clone();
    // What inferno and the SVG hold grows with the frames drawn.
    let limits = if svg { Limits::GRAPH } else { Limits::API };
    let (body, truncated) = state
        .queries
        .run(move || {
            let profile = profile(&shared, filter, limits)?;
            let note = profile.note.as_deref();
            let recorded = &profile.recorded;
            if !svg {
                let text = render::folded_text(&profile.folded);
                let response = with_recorded(with_note(folded_response(text), note), recorded);
                return Ok((response, profile.truncated));
            }
            let labels = GraphLabels {
                subject: subject(&profile),
                kind: profile.filter.kind,
                group: profile.filter.group,
                window: profile.filter.window,
            };
            let svg = match note {
                Some(note) => render::note_svg(&labels, note),
                None => render::flamegraph_svg(&profile.folded, &labels, false)
                    .map(render::still_svg)
                    .map_err(ApiError::Render)?,
            };
            let response = ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response();
            let response = with_recorded(with_note(response, note), recorded);
            Ok::<_, ApiError>((response, profile.truncated))
        })
        .await??;
    Ok(with_truncation(body, truncated, limits))
}

/// What a graph shows, e.g. `stress (pid 42), tid 43` or `all processes`.
fn subject(profile: &Profile) -> String {
    let f = &profile.filter;
    let name_of = |pid: u32| {
        profile
            .folded
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

/// Runs `query` over a snapshot of the store within the bound.
pub(super) async fn over_snapshot<T, F>(state: &ApiState, query: F) -> Result<T, ApiError>
where
    F: FnOnce(&Snapshot) -> T + Send + 'static,
    T: Send + 'static,
{
    let shared = state.shared.clone();
    state.queries.run(move || query(&snapshot(&shared))).await
}

/// Culprits listed per thread in `/threads` (and a `[rest]`).
const THREAD_CULPRITS: usize = 3;

pub(super) async fn threads(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let p = Params::parse(q.as_deref(), &with_window(&["pid", "format"]))?;
    let pid = p
        .id("pid")?
        .ok_or_else(|| ApiError::bad("pid", "required"))?;
    let window = window(&p, &state.shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let processes = state.shared.processes.clone();
    let report = over_snapshot(&state, move |store| {
        let recorded = store.recorded_of(window, SystemTime::now(), Some(pid));
        // Four passes over the window: over the process's rows only.
        let narrowed = store.narrowed(pid, window);
        let store = narrowed.as_ref().unwrap_or(store);
        if let Some(mut report) = threads::report(store, pid, window) {
            let sight = reader.sight();
            let mut culprits = culprits::by_thread(store, window, pid, THREAD_CULPRITS, &sight);
            let mut sleeps = sleeps::by_thread(store, window, pid, &sight);
            let gil = gil::share_by_thread(store, window, pid);
            for t in &mut report.threads {
                t.kept_off_cpu_by = culprits.remove(&t.tid).unwrap_or_default();
                t.sleeps = sleeps.remove(&t.tid);
                t.gil_us = gil
                    .get(&t.tid)
                    .map(|share| (share * t.time.futex_us as f64).round() as u64);
            }
            report.recorded = recorded;
            return Ok(report);
        }
        if let Some(unknown) = unknown_pid(store, &processes, pid) {
            return Err(ApiError::NotFound(unknown));
        }
        let note = format!(
            "nothing recorded for pid {pid} in the {}: its threads neither ran, waited nor slept in it (it started later, or the daemon did)",
            window.describe()
        );
        let now = threads::LiveProcess {
            comm: processes.thread_name(pid, None).unwrap_or_default(),
            threads: processes
                .threads(pid)
                .into_iter()
                .map(|tid| (tid, processes.thread_name(pid, Some(tid)).unwrap_or_default()))
                .collect(),
        };
        let mut report = threads::empty_report(pid, now, window, note);
        report.recorded = recorded;
        Ok(report)
    })
    .await?;
    let mut report = report?;
    report.jvm = jvm_report(&state.shared, pid);
    let recorded = report.recorded.clone();
    Ok(with_recorded(
        json_or_text(text, report, threads::render_text),
        &recorded,
    ))
}

pub(super) async fn runqueue(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let p = Params::parse(
        q.as_deref(),
        &with_window(&["pid", "cgroup", "container", "format"]),
    )?;
    let window = window(&p, &state.shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let pid = p.id("pid")?;
    let cgroup = p.text("cgroup").map(str::to_string);
    let container = p.text("container").map(str::to_string);
    if container.is_some() && (pid.is_some() || cgroup.is_some()) {
        return Err(ApiError::bad(
            "container",
            "give one of `pid`, `cgroup` and `container`",
        ));
    }
    if pid.is_none() && cgroup.as_deref() == Some(cgroup_list::ALL) {
        let list = over_snapshot(&state, move |store| {
            let mut list = cgroup_list::list(store, window);
            let recorded = store.recorded(window, SystemTime::now());
            list.recorded = recorded;
            list
        })
        .await?;
        let recorded = list.recorded.clone();
        let response = json_or_text(text, list, cgroup_list::render_text);
        return Ok(with_recorded(response, &recorded));
    }
    if pid.is_none() && cgroup.is_none() && container.is_none() {
        let report = over_snapshot(&state, move |store| {
            let mut report = runqueue::host_report(store, window).ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no runqueue latency or throttling recorded on the host in the {}",
                    window.describe()
                ))
            })?;
            let recorded = store.recorded(window, SystemTime::now());
            report.recorded = recorded;
            Ok::<_, ApiError>(report)
        })
        .await??;
        let recorded = report.recorded.clone();
        let response = json_or_text(text, report, runqueue::render_text);
        return Ok(with_recorded(response, &recorded));
    }
    let processes = state.shared.processes.clone();
    // Resolving a cgroup path walks the cgroup tree: blocking work too.
    let report = over_snapshot(&state, move |store| {
        let cgroup = match container {
            Some(name) => Some(container_cgroup(store, &name)?),
            None => cgroup,
        };
        // A path only a v1 hierarchy has: its processes' histograms.
        if let Some(path) = cgroup.as_deref().filter(|c| c.starts_with('/')) {
            let pids = match cgroups::system().id_of(path) {
                Some(_) => Vec::new(),
                None => cgroups::v1_members(path),
            };
            if !pids.is_empty() {
                let owner = runqueue::Owner::CgroupV1 {
                    cgroup_v1: path.to_string(),
                    processes: pids.len(),
                };
                let who = owner.describe();
                let mut report = runqueue::processes_report(store, owner, &pids, window)
                    .ok_or_else(|| {
                        ApiError::NotFound(format!(
                            "no runqueue latency or throttling recorded for {who} in the {}",
                            window.describe()
                        ))
                    })?;
                let recorded = store.recorded(window, SystemTime::now());
                report.recorded = recorded;
                return Ok(report);
            }
        }
        let owner = runqueue::owner(pid, cgroup.as_deref()).map_err(|e| match e {
            OwnerError::Param(param, message) => ApiError::bad(param, message),
            OwnerError::NoSuchCgroup(message) => ApiError::NotFound(message),
        })?;
        let mut report = match runqueue::report(store, owner, window) {
            Some(report) => report,
            None => {
                let who = runqueue::Owner::resolve(owner);
                let nothing = format!(
                    "no runqueue latency or throttling recorded for {} in the {}",
                    who.describe(),
                    window.describe()
                );
                // A process that exists is answered (200, zeros, a note):
                // only a pid never seen is "not found".
                match pid {
                    Some(pid) => match unknown_pid(store, &processes, pid) {
                        Some(unknown) => return Err(ApiError::NotFound(unknown)),
                        None => runqueue::empty(who, window, nothing),
                    },
                    None => return Err(ApiError::NotFound(nothing)),
                }
            }
        };
        let recorded = store.recorded(window, SystemTime::now());
        report.recorded = recorded;
        if let Some(pid) = pid {
            let sight = reader.sight();
            report.kept_off_cpu_by =
                culprits::kept_off(store, window, pid, None, culprits::LISTED, &sight);
        }
        Ok::<_, ApiError>(report)
    })
    .await??;
    let recorded = report.recorded.clone();
    let note = report.note.clone();
    let response = json_or_text(text, report, runqueue::render_text);
    Ok(with_note(
        with_recorded(response, &recorded),
        note.as_deref(),
    ))
}

/// The cgroup path of the container `name` (see
/// [`crate::process::container::Container::is_named`]) among those seen
/// within the retention.
fn container_cgroup(store: &Snapshot, name: &str) -> Result<String, ApiError> {
    let mut found: Vec<String> = store
        .all()
        .flat_map(|s| {
            let named = s.containers.values().filter(|c| c.is_named(name));
            named.map(|c| c.cgroup.clone()).collect::<Vec<_>>()
        })
        .collect();
    found.sort();
    found.dedup();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] if name.len() < 12 && !name.contains('/') => Err(ApiError::bad(
            "container",
            format!("expected a container id (at least 12 hex digits) or namespace/pod/container, got `{name}`"),
        )),
        [] => Err(ApiError::NotFound(format!(
            "no container `{name}` seen in the last {} min",
            store.retention().as_secs() / 60
        ))),
        _ => Err(ApiError::bad(
            "container",
            format!("`{name}` names {} containers: give more of the id", found.len()),
        )),
    }
}

/// `min_seconds` of `/blocked` when not given: waits shorter than a second
/// are mostly the normal ebb and flow of work.
pub const DEFAULT_MIN_BLOCKED: Duration = Duration::from_secs(1);
/// Largest `min_seconds` (about 31 years: longer than any uptime).
const MAX_MIN_BLOCKED: Duration = Duration::from_secs(1_000_000_000);
/// Threads `/blocked` shows when no `limit` is given.
pub const DEFAULT_BLOCKED_LIMIT: u64 = 100;
/// Largest `limit` of `/blocked`: an answer holds at most this many
/// stacks (each ≤ 127 user and 127 kernel frames).
pub const MAX_BLOCKED_LIMIT: u64 = 2_000;

/// `/blocked`: the threads off-CPU at the last drain for at least
/// `min_seconds`, longest first.
pub(super) async fn blocked(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let p = Params::parse(q.as_deref(), &["pid", "min_seconds", "limit", "format"])?;
    let filter = BlockedFilter {
        pid: p.id("pid")?,
        min: p
            .seconds("min_seconds", MAX_MIN_BLOCKED)?
            .unwrap_or(DEFAULT_MIN_BLOCKED),
        limit: p
            .int("limit", 1, MAX_BLOCKED_LIMIT)?
            .unwrap_or(DEFAULT_BLOCKED_LIMIT) as usize,
    };
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let processes = state.shared.processes.clone();
    let report = over_snapshot(&state, move |store| {
        let live = store.live();
        if let Some(pid) = filter.pid {
            let blocked_now = live.threads.iter().any(|t| t.pid == pid);
            if let Some(unknown) = unknown_pid(store, &processes, pid).filter(|_| !blocked_now) {
                return Err(ApiError::NotFound(unknown));
            }
        }
        let facts = super::wait_facts::read(store, &processes, &blocked::matched(live, &filter));
        let sight = reader.sight();
        Ok(blocked::report(
            live,
            &filter,
            &facts,
            SystemTime::now(),
            &sight,
        ))
    })
    .await??;
    Ok(json_or_text(text, report, blocked::render_text))
}

/// A report as JSON, or as text for a terminal when `text`.
pub(super) fn json_or_text<T: serde::Serialize>(
    text: bool,
    report: T,
    render: fn(&T) -> String,
) -> Response {
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
