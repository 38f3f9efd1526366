//! What `/blocked` concludes about its threads: per pool, how many of its
//! threads are blocked, for how long and where, and the patterns that a
//! deadlock or a starved pool leaves, each marked with how sure it is:
//!
//! - `lock_cycle` (certain): threads waiting for glibc mutexes whose owners
//!   wait, round a cycle, for each other's (owners read from the process,
//!   see [`crate::process::locks`]);
//! - `own_pool_wait` (inferred): every thread of a pool waits inside one of
//!   its own tasks for other work (a future, a join): no task queued to the
//!   pool can start, so if they wait for such tasks the pool has deadlocked
//!   on itself (whose queue a future belongs to is not visible from
//!   outside: a pool waiting on another stuck pool looks the same);
//! - `pool_blocked` (certain that they are blocked, inferred that they are
//!   stuck): every thread of a pool waits for a lock or for other work at
//!   once, for at least the report's minimum.
//!
//! Waiting for new work (a queue's `take`, a condition variable) is a pool
//! at rest and is never flagged.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::{blocked::BlockedThread, durations};
use crate::{profile::model::kind::pool_name, profile::model::state::State};

/// A pool (threads named alike in one process) with blocked threads.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PoolSummary {
    pub pid: u32,
    pub process: String,
    /// `pricing-*`.
    pub pool: String,
    /// Its threads blocked for at least the report's minimum.
    pub blocked: usize,
    /// Its live threads, blocked or not (as many as `blocked` if unknown).
    pub threads: usize,
    /// The shortest and longest time one of them has been blocked.
    pub shortest_s: f64,
    pub longest_s: f64,
    /// Where most of them wait: the innermost frame that is not wait
    /// machinery (`FutureTask.get`, `pthread_mutex_lock`)...
    pub waits_in: Option<String>,
    /// ...and its caller.
    pub inside: Option<String>,
    /// How many of them wait there.
    pub waiting_there: usize,
    /// One line: `pool pricing-* (pid 7): 2 of 2 threads blocked 45 s in
    /// FutureTask.get (inside Pricing.quote)`.
    pub summary: String,
}

/// A pattern found among the blocked threads.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Finding {
    /// `lock_cycle`, `own_pool_wait` or `pool_blocked`.
    pub kind: &'static str,
    /// `certain` (read from the kernel or the process) or `inferred` (from
    /// stacks and names).
    pub certainty: &'static str,
    pub pid: u32,
    pub pools: Vec<String>,
    pub tids: Vec<u32>,
    pub summary: String,
}

/// Frames of the wait itself, below the place a thread waits from.
const MACHINERY: [&str; 13] = [
    "Unsafe.park",
    "ForkJoinPool.unmanagedBlock",
    "LockSupport.",
    "FutureTask.awaitDone",
    "AbstractQueuedSynchronizer",
    "ConditionObject",
    "CompletableFuture.waitingGet",
    "CompletableFuture$Signaller",
    "ForkJoinPool.managedBlock",
    "Object.wait",
    "ObjectMonitor",
    "lll_lock_wait",
    "futex_",
];

/// Places where a thread waits for other work or a lock to be released.
const WAITS_ON_OTHERS: [&str; 9] = [
    "FutureTask.get",
    "CompletableFuture.get",
    "CompletableFuture.join",
    "ForkJoinTask.join",
    "ForkJoinTask.get",
    "ReentrantLock",
    "pthread_mutex_lock",
    "pthread_rwlock_",
    "pthread_join",
];

/// Places where a thread runs a task of its pool.
const RUNS_A_TASK: [&str; 3] = [
    "FutureTask.run",
    "ThreadPoolExecutor.runWorker",
    "ForkJoinTask.doExec",
];

/// A frame's name without the marks of its kind (`_[j]`, `_[k]`...).
pub(super) fn plain(frame: &str) -> &str {
    match frame.rfind("_[") {
        Some(at) if frame.ends_with(']') => &frame[..at],
        _ => frame,
    }
}

pub(super) fn is_machinery(frame: &str) -> bool {
    let f = plain(frame);
    f.starts_with('[')
        || f.starts_with("__")
        || frame.ends_with("_[k]")
        || MACHINERY.iter().any(|m| f.contains(m))
}

/// A Java frame (`_[j]` compiled, `_[i]` inlined, `_[0]` interpreted,
/// `_[1]` C1).
pub(super) fn is_java(frame: &str) -> bool {
    ["_[j]", "_[i]", "_[0]", "_[1]"]
        .iter()
        .any(|k| frame.ends_with(k))
}

/// Where a thread waits (innermost non-machinery frame; in a Java thread,
/// the innermost such Java frame: the JVM's own native frames below it are
/// how it parks) and its caller.
fn place(t: &BlockedThread) -> (Option<String>, Option<String>) {
    place_in(&t.stack)
}

/// [`place`] of a stack, innermost frame first.
fn place_in(stack: &[String]) -> (Option<String>, Option<String>) {
    let java = stack.iter().any(|f| is_java(f));
    let mut frames = stack
        .iter()
        .skip_while(|f| is_machinery(f) || (java && !is_java(f)));
    let at = frames.next().map(|f| plain(f).to_string());
    let inside = frames.next().map(|f| plain(f).to_string());
    (at, inside)
}

fn waits_on_others(at: &str) -> bool {
    WAITS_ON_OTHERS.iter().any(|w| at.contains(w))
}

/// Whether a thread's stack (innermost first) waits in a lock or a join:
/// named among the wait machinery's frames (glibc's `___pthread_mutex_lock`
/// reads as machinery), or where [`place_in`] finds it waits.
fn in_lock_or_join(stack: &[String]) -> bool {
    for f in stack {
        if waits_on_others(plain(f)) {
            return true;
        }
        if !is_machinery(f) {
            break;
        }
    }
    place_in(stack).0.is_some_and(|at| waits_on_others(&at))
}

/// Whether a thread blocked in `state` with `stack` (innermost frame
/// first) is held up by another thread or a device: in I/O, or on a futex
/// in a lock or a join. A pool waiting for work, a poll or a timer is at
/// rest and is not.
pub fn held_up(state: State, stack: &[String]) -> bool {
    match state {
        State::Io => true,
        State::Futex => in_lock_or_join(stack),
        _ => false,
    }
}

/// What the host says of the blocked threads' processes, read when the
/// report is asked for.
#[derive(Debug, Clone, Default)]
pub struct WaitFacts {
    /// Live threads of each (pid, pool).
    pub pool_sizes: HashMap<(u32, String), usize>,
    /// The owner of the mutex a blocked thread waits for, by tid, where
    /// read.
    pub owners: HashMap<u32, u32>,
}

/// Summaries of the pools of two threads or more, most blocked first, and
/// the patterns found among `threads` (every thread blocked for the
/// report's minimum).
pub fn summarize(threads: &[BlockedThread], facts: &WaitFacts) -> (Vec<PoolSummary>, Vec<Finding>) {
    let (pool_sizes, owners) = (&facts.pool_sizes, &facts.owners);
    let mut pools: BTreeMap<(u32, String), Vec<&BlockedThread>> = BTreeMap::new();
    for t in threads
        .iter()
        .filter(|t| t.state != "runqueue" && t.state != "throttled")
    {
        pools
            .entry((t.pid, pool_name(&t.name)))
            .or_default()
            .push(t);
    }
    let mut summaries = Vec::new();
    let mut findings = lock_cycles(threads, owners);
    for ((pid, pool), members) in pools {
        let summary = summarize_pool(pid, &pool, &members, pool_sizes);
        findings.extend(pool_findings(&summary, &members));
        // A lone thread is no pool to summarise (its findings stay).
        if summary.threads >= 2 {
            summaries.push(summary);
        }
    }
    summaries.sort_by(|a, b| {
        b.blocked
            .cmp(&a.blocked)
            .then(b.longest_s.total_cmp(&a.longest_s))
            .then(a.pool.cmp(&b.pool))
    });
    (summaries, findings)
}

fn summarize_pool(
    pid: u32,
    pool: &str,
    members: &[&BlockedThread],
    pool_sizes: &HashMap<(u32, String), usize>,
) -> PoolSummary {
    let mut places: HashMap<(Option<String>, Option<String>), usize> = HashMap::new();
    for t in members {
        *places.entry(place(t)).or_default() += 1;
    }
    let ((waits_in, inside), waiting_there) = places
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .unwrap_or_default();
    let blocked = members.len();
    let threads = pool_sizes
        .get(&(pid, pool.to_string()))
        .copied()
        .unwrap_or(blocked)
        .max(blocked);
    let shortest_s = members
        .iter()
        .map(|t| t.in_state_s)
        .fold(f64::MAX, f64::min);
    let longest_s = members.iter().map(|t| t.in_state_s).fold(0.0, f64::max);
    let process = members[0].process.clone();
    let mut summary = format!(
        "pool {pool} (pid {pid}, {process}): {blocked} of {threads} threads blocked {}",
        durations::span(shortest_s, longest_s)
    );
    if let Some(at) = &waits_in {
        summary.push_str(&format!(" in {at}"));
        if let Some(caller) = &inside {
            summary.push_str(&format!(" (inside {caller})"));
        }
        if waiting_there < blocked {
            summary.push_str(&format!(", {waiting_there} of them"));
        }
    }
    PoolSummary {
        pid,
        process,
        pool: pool.to_string(),
        blocked,
        threads,
        shortest_s,
        longest_s,
        waits_in,
        inside,
        waiting_there,
        summary,
    }
}

/// The patterns of one pool whose every thread is blocked at one place.
fn pool_findings(p: &PoolSummary, members: &[&BlockedThread]) -> Vec<Finding> {
    let all_there = p.blocked == p.threads && p.waiting_there == p.blocked;
    let Some(at) = p
        .waits_in
        .as_deref()
        .filter(|at| all_there && waits_on_others(at))
    else {
        return Vec::new();
    };
    let tids: Vec<u32> = members.iter().map(|t| t.tid).collect();
    let in_own_task = members.iter().all(|t| {
        t.stack
            .iter()
            .any(|f| RUNS_A_TASK.iter().any(|r| plain(f).contains(r)))
    });
    let finding = |kind, certainty, summary| Finding {
        kind,
        certainty,
        pid: p.pid,
        pools: vec![p.pool.clone()],
        tids: tids.clone(),
        summary,
    };
    if in_own_task && !at.contains("Lock") && !at.contains("mutex") {
        return vec![finding(
            "own_pool_wait",
            "inferred",
            format!(
                "every thread of pool {} waits in {at} inside one of the pool's own tasks: no thread of it is free, so no task queued to it can start; if they wait for such tasks the pool has deadlocked on itself, else it is held up by what they wait for (certain: all {} threads blocked for at least {}; inferred: what they wait for)",
                p.pool, p.threads, durations::at_least(p.shortest_s)
            ),
        )];
    }
    vec![finding(
        "pool_blocked",
        "inferred",
        format!(
            "every thread of pool {} ({}) is blocked in {at} for at least {}: nothing in that pool can make progress until what it waits for is released (certain: they are blocked; inferred: stuck)",
            p.pool, p.threads, durations::at_least(p.shortest_s)
        ),
    )]
}

/// Cycles of mutex owners: A waits for a mutex B holds, B for one A holds.
fn lock_cycles(threads: &[BlockedThread], owners: &HashMap<u32, u32>) -> Vec<Finding> {
    let by_tid: HashMap<u32, &BlockedThread> = threads.iter().map(|t| (t.tid, t)).collect();
    let mut seen: HashSet<u32> = HashSet::new();
    let mut findings = Vec::new();
    let mut starts: Vec<u32> = owners.keys().copied().collect();
    starts.sort_unstable();
    for start in starts {
        if seen.contains(&start) {
            continue;
        }
        // Follow owners from `start`: the walk either leaves the blocked
        // threads or comes back to a thread it passed.
        let mut path = vec![start];
        let mut at = start;
        let cycle = loop {
            let Some(&next) = owners.get(&at) else {
                break None;
            };
            if let Some(i) = path.iter().position(|&t| t == next) {
                break Some(path[i..].to_vec());
            }
            // A walk before this one went on from there: its cycle, if
            // any, is found already.
            if seen.contains(&next) {
                break None;
            }
            if path.len() > threads.len() {
                break None;
            }
            path.push(next);
            at = next;
        };
        seen.extend(&path);
        let Some(cycle) = cycle else { continue };
        let Some(members) = cycle
            .iter()
            .map(|tid| by_tid.get(tid).copied())
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        let describe = |t: &BlockedThread| {
            let (at, inside) = place(t);
            let inside = inside.map(|c| format!(" in {c}")).unwrap_or_default();
            format!(
                "\"{}\" (tid {}) waits{}{inside} for a mutex held by tid {}",
                t.name,
                t.tid,
                at.map(|a| format!(" in {a}")).unwrap_or_default(),
                owners[&t.tid]
            )
        };
        let mut pools: Vec<String> = members.iter().map(|t| pool_name(&t.name)).collect();
        pools.sort();
        pools.dedup();
        findings.push(Finding {
            kind: "lock_cycle",
            certainty: "certain",
            pid: members[0].pid,
            pools,
            tids: cycle.clone(),
            summary: format!(
                "deadlock: {}; none can go on (mutex owners read from the process: certain)",
                members
                    .iter()
                    .map(|t| describe(t))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        });
    }
    findings
}

#[cfg(test)]
#[path = "stuck_tests.rs"]
mod tests;
