//! Runqueue starvation: the process's threads runnable but waiting for a
//! CPU, and who ran meanwhile on the CPUs they waited for (the culprits
//! `/runqueue` lists), the answering daemon named as such when it is
//! among them: its own noise is then part of what the reader sees.

use serde_json::json;

use super::{pct, secs, Ctx, Finding, Kind};
use crate::profile::report::culprits;

/// Below this share of the time its threads wanted a CPU (ran or waited
/// for one), a process's runqueue waits are the normal latency of a
/// wakeup, not a finding.
const MIN_WAIT_SHARE: f64 = 0.1;
/// Culprits named.
const NAMED: usize = 5;

pub fn find(ctx: &Ctx) -> Vec<Finding> {
    let process = &ctx.seen.threads.process;
    let (waited, ran) = (process.runqueue_us, process.cpu_us);
    let share = waited as f64 / (waited + ran).max(1) as f64;
    if waited == 0 || share < MIN_WAIT_SHARE {
        return Vec::new();
    }
    let culprits = culprits::kept_off(ctx.store, ctx.window, ctx.seen.pid, None, NAMED, ctx.sight);
    let named: Vec<serde_json::Value> = culprits
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "cgroup": c.cgroup,
                "processes": c.processes,
                "pids": c.pids,
                "us": c.us,
                "share": c.share,
                "answering_daemon": c.pids.contains(&ctx.own_pid),
            })
        })
        .collect();
    let by: Vec<String> = culprits
        .iter()
        .map(|c| {
            let daemon = match (c.pids.contains(&ctx.own_pid), c.processes) {
                (false, _) => "",
                (true, 1) => " (the daemon answering)",
                (true, _) => " (the daemon answering among them)",
            };
            let many = if c.processes > 1 {
                format!(" x{}", c.processes)
            } else {
                String::new()
            };
            format!("{}{many}{daemon} {}", c.name, pct(c.share))
        })
        .collect();
    let mut headline = format!(
        "its threads waited {} for a CPU ({} of the time they wanted one)",
        secs(waited),
        pct(share)
    );
    if !by.is_empty() {
        headline.push_str(&format!("; kept off the CPU by {}", by.join(", ")));
    }
    vec![Finding::new(
        Kind::RunqueueStarvation,
        waited,
        headline,
        json!({
            "runqueue_us": waited,
            "cpu_us": ran,
            "wait_share": share,
            "culprits": named,
        }),
        ctx.link("/runqueue", "&format=text"),
    )]
}
