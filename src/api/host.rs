//! `/host`: the host summary (CPUs, how busy, runqueue p99, throttled
//! cgroups, history) and the processes that waited most for a CPU with
//! who kept it from them; the UI's host page leads with it.

use std::time::SystemTime;

use axum::{
    extract::{RawQuery, State},
    http::HeaderValue,
    response::Response,
    Extension,
};

use super::{
    authority::{self, Authority},
    error::ApiError,
    host_facts::LiveHost,
    params::Params,
    queries::{answer_response, over_snapshot, window, with_window},
    ApiState,
};
use crate::profile::{
    model::{store::Snapshot, window::Window},
    report::{
        answer::Answer,
        host::{self, CpuUse},
        host_facts::HostFacts,
    },
};

/// Headers that carry the host's CPU count and utilisation in the window
/// on `/processes`, whose body is a list.
pub const CPUS_HEADER: &str = "x-wallscope-cpus";
pub const UTILIZATION_HEADER: &str = "x-wallscope-cpu-utilization";

pub(super) async fn host(
    State(state): State<ApiState>,
    authority: Option<Extension<Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let authority = authority.map_or(Authority::Open, |a| a.0);
    let p = Params::parse(q.as_deref(), &with_window(&["format"]))?;
    let window = window(&p, &state.shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let history_s = state
        .store
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .stats
        .history_s;
    let live_host = LiveHost::of(&state);
    let answer = over_snapshot(&state, move |store| {
        let sight = authority::reader(authority).sight();
        let sees = |pid| sight.sees(pid, SystemTime::now());
        let cpus = host::online_cpus();
        let mut answer = Answer::over(store, window, None, |recorded| {
            host::report(
                store,
                &live_host,
                window,
                cpus,
                recorded.seconds,
                history_s,
                &sight,
            )
        });
        let is_kernel = |pid| live_host.is_kernel_thread(pid);
        answer.body.stuck = host::stuck_now(store.live(), sees, is_kernel);
        answer
    })
    .await?;
    Ok(answer_response(text, answer, host::render_text))
}

/// The host's CPU use in `window`, for `/processes`' headers.
pub(super) fn cpu_use(store: &Snapshot, window: Window) -> CpuUse {
    host::cpu_use(store, window, host::online_cpus())
}

/// Adds [`CPUS_HEADER`] and [`UTILIZATION_HEADER`].
pub(super) fn with_cpu_use(mut response: Response, cpu: &CpuUse) -> Response {
    let headers = response.headers_mut();
    headers.insert(CPUS_HEADER, HeaderValue::from(cpu.cpus));
    if let Ok(v) = HeaderValue::from_str(&cpu.utilization.to_string()) {
        headers.insert(UTILIZATION_HEADER, v);
    }
    response
}
