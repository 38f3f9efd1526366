//! Lock contention and self-deadlock: the process's threads waiting for
//! a lock or a join, by the frame they wait from, over the window; and
//! the deadlocks and stuck pools `/blocked` finds among its threads
//! blocked now ([`crate::profile::report::stuck`]).

use std::collections::{BTreeSet, HashMap};

use serde_json::json;

use super::{
    pct, secs, share_of_threads, strongest, threads,
    waits::{self, WaitClass},
    Ctx, Finding, Kind,
};
use crate::profile::{
    model::state::State,
    report::blocked::{self, BlockedFilter},
};

/// Below this share of the waiting threads' wall time, lock waits are
/// not a finding.
const MIN_WAIT_SHARE: f64 = 0.1;
/// Places of contention listed.
const LISTED: usize = 3;
/// How long a thread must have been blocked to count as stuck (as
/// `/blocked`'s default).
const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

pub fn find(ctx: &Ctx) -> Vec<Finding> {
    let mut found = stuck(ctx);
    found.extend(contention(ctx));
    found
}

/// Lock waits over the window, by the frame they wait from.
fn contention(ctx: &Ctx) -> Vec<Finding> {
    let seen = ctx.seen;
    let mut places: HashMap<Option<String>, (u64, BTreeSet<u32>)> = HashMap::new();
    for r in seen.rows.iter().filter(|r| r.state == State::Futex) {
        if waits::classify(r.state, &r.stack) == WaitClass::Lock {
            let place = places.entry(waits::app_frame(&r.stack)).or_default();
            place.0 += r.ns;
            place.1.insert(r.tid);
        }
    }
    let found: Vec<Finding> = places
        .into_iter()
        .filter_map(|(frame, (ns, tids))| {
            let share = share_of_threads(seen, &tids, ns);
            (share >= MIN_WAIT_SHARE).then(|| {
                let at = frame
                    .as_deref()
                    .map(|f| format!(" in {f}"))
                    .unwrap_or_default();
                Finding::new(
                    Kind::LockContention,
                    ns / 1000,
                    format!(
                        "{} waited {} for a lock or another thread's result{at} ({} of their wall time)",
                        threads(tids.len()),
                        secs(ns / 1000),
                        pct(share)
                    ),
                    json!({
                        "frame": frame,
                        "threads": tids.len(),
                        "tids": tids,
                        "wait_us": ns / 1000,
                        "wait_share": share,
                    }),
                    ctx.link("/folded", "&kind=futex"),
                )
            })
        })
        .collect();
    strongest(found, LISTED)
}

/// What `/blocked` concludes of the process's threads blocked now.
fn stuck(ctx: &Ctx) -> Vec<Finding> {
    let filter = BlockedFilter {
        pid: Some(ctx.seen.pid),
        min: STUCK_AFTER,
        limit: 1,
    };
    let report = blocked::report(ctx.live, &filter, ctx.facts, ctx.now, ctx.sight);
    let window_us = ctx.window.length().as_micros() as u64;
    report
        .findings
        .into_iter()
        .map(|f| {
            // Threads that can never go on: all of the window lost, which
            // ranks them first.
            let score = window_us.saturating_mul(f.tids.len() as u64);
            Finding::new(
                Kind::Deadlock,
                score,
                f.summary.clone(),
                json!({
                    "pattern": f.kind,
                    "certainty": f.certainty,
                    "pools": f.pools,
                    "tids": f.tids,
                }),
                format!("/blocked?pid={}&format=text", ctx.seen.pid),
            )
        })
        .collect()
}
