//! CPU quota throttling: the process's threads runnable but held back
//! because its cgroup spent its CPU quota, named by the cgroup's path in
//! the `cpu` controller's own hierarchy (v1 or v2) with the quota read
//! from the cgroup ([`crate::profile::report::throttling`]).

use super::{Ctx, Finding, Kind};
use crate::profile::report::throttling;

/// Below this share of its wall time throttled, a quota is not a cause.
const MIN_THROTTLED_SHARE: f64 = 0.05;

pub fn find(ctx: &Ctx) -> Vec<Finding> {
    let process = &ctx.seen.threads.process;
    let throttled = process.throttled_us;
    let share = throttled as f64 / process.wall_us.max(1) as f64;
    if throttled == 0 || share < MIN_THROTTLED_SHARE {
        return Vec::new();
    }
    let Some(t) = throttling::of_pid(ctx.store, ctx.host, ctx.window, ctx.seen.pid, ctx.sight)
    else {
        return Vec::new();
    };
    let headline = throttling::describe(&t, &ctx.window.describe());
    let numbers = match serde_json::to_value(&t) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.insert("process_throttled_us".into(), throttled.into());
            serde_json::Value::Object(map)
        }
        other => other.unwrap_or_default(),
    };
    vec![Finding::new(
        Kind::CpuQuota,
        throttled,
        headline,
        numbers,
        ctx.link("/runqueue", "&format=text"),
    )]
}
