//! Pool saturation: the threads of one pool (named alike) mostly in one
//! wait that is not rest (a socket read, a lock) at one application
//! frame, with the pool's throughput and capacity by Little's law.
//!
//! A task ends each such wait, so the pool's tasks are the wakeups its
//! threads received, in the proportion of their waits that were the
//! dominant one (the waits drawn with a stack, counted). A task's time is
//! the pool's busy time (wall time less time at rest) per task, and the
//! pool's capacity is its threads over that time: what it completes per
//! second when no thread is free.

use std::collections::{HashMap, HashSet};

use serde_json::json;

use super::{
    pct, strongest,
    waits::{self, WaitClass},
    Ctx, Finding, Kind, Place,
};
use crate::profile::model::state::State;

/// The share of a pool's wall time its dominant wait must take: "mostly".
const MIN_WAIT_SHARE: f64 = 0.5;

/// Sums of a pool's waits of one place.
#[derive(Default)]
struct Sum {
    ns: u64,
    count: u64,
    by_tid: HashMap<u32, u64>,
}

pub fn find(ctx: &Ctx) -> Vec<Finding> {
    let seen = ctx.seen;
    let mut pools: HashMap<&str, Vec<u32>> = HashMap::new();
    for t in &seen.threads.threads {
        pools.entry(t.pool.as_str()).or_default().push(t.tid);
    }
    let found = pools
        .into_iter()
        .filter(|(_, tids)| tids.len() >= 2)
        .filter_map(|(pool, tids)| saturated(ctx, pool, &tids))
        .collect();
    strongest(found, usize::MAX)
}

fn saturated(ctx: &Ctx, pool: &str, tids: &[u32]) -> Option<Finding> {
    let seen = ctx.seen;
    let members: HashSet<u32> = tids.iter().copied().collect();
    let (mut wall_us, mut wakeups) = (0u64, 0u64);
    let mut wall_of: HashMap<u32, u64> = HashMap::new();
    for t in seen
        .threads
        .threads
        .iter()
        .filter(|t| members.contains(&t.tid))
    {
        wall_us += t.time.wall_us;
        wakeups += t.time.wakeups_received;
        wall_of.insert(t.tid, t.time.wall_us);
    }
    let mut places: HashMap<Place, Sum> = HashMap::new();
    let (mut rest_ns, mut blocked_count) = (0u64, 0u64);
    for r in seen.rows.iter().filter(|r| members.contains(&r.tid)) {
        if !matches!(r.state, State::Futex | State::Io | State::Sleep) {
            continue;
        }
        blocked_count += r.count;
        let class = waits::classify(r.state, &r.stack);
        match class {
            WaitClass::Rest => rest_ns += r.ns,
            // The GIL's own finding tells of these.
            WaitClass::Gil => {}
            _ => {
                let sum = places.entry(Place::of(class, &r.stack)).or_default();
                sum.ns += r.ns;
                sum.count += r.count;
                *sum.by_tid.entry(r.tid).or_default() += r.ns;
            }
        }
    }
    let (place, top) = places
        .into_iter()
        .max_by(|a, b| a.1.ns.cmp(&b.1.ns).then_with(|| b.0.cmp(&a.0)))?;
    let wait_share = top.ns as f64 / (wall_us.max(1) * 1000) as f64;
    if wait_share < MIN_WAIT_SHARE || blocked_count == 0 {
        return None;
    }
    // Threads that spent most of their own time there.
    let in_wait = top
        .by_tid
        .iter()
        .filter(|(tid, ns)| **ns * 2 > wall_of.get(tid).copied().unwrap_or(0) * 1000)
        .count();
    let tasks = wakeups as f64 * top.count as f64 / blocked_count as f64;
    let threads = tids.len();
    let busy_us = wall_us.saturating_sub(rest_ns / 1000);
    let thread_s = wall_us as f64 / 1e6 / threads as f64;
    let (tasks_per_s, task_ms, capacity) = if tasks >= 1.0 && thread_s > 0.0 {
        let task_s = busy_us as f64 / 1e6 / tasks;
        (
            Some(tasks / thread_s),
            Some(task_s * 1000.0),
            Some(threads as f64 / task_s),
        )
    } else {
        (None, None, None)
    };
    let mut headline = format!(
        "pool {pool} is saturated: {in_wait} of its {threads} threads spend most of their time waiting ({} of the pool's time) in {}",
        pct(wait_share),
        place.describe()
    );
    if let (Some(rate), Some(ms), Some(cap)) = (tasks_per_s, task_ms, capacity) {
        headline.push_str(&format!(
            "; {rate:.1} tasks/s at {ms:.1} ms per task: capacity {cap:.1} tasks/s ({threads} threads / {ms:.1} ms)"
        ));
    }
    let numbers = json!({
        "pool": pool,
        "threads": threads,
        "threads_in_wait": in_wait,
        "tids": tids,
        "wait": place.to_json(),
        "wait_us": top.ns / 1000,
        "wait_share": wait_share,
        "busy_us": busy_us,
        "tasks": tasks.round(),
        "tasks_per_s": tasks_per_s,
        "time_per_task_ms": task_ms,
        "capacity_per_s": capacity,
    });
    Some(Finding::new(
        Kind::PoolSaturation,
        busy_us,
        headline,
        numbers,
        ctx.link("/threads", "&format=text"),
    ))
}
