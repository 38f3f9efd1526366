//! GIL contention, naming the holder: the Python threads that waited for
//! the GIL, the share of their wall time they spent so, and the thread of
//! the process that held the GIL the most (its share of the GIL-held
//! time and the Python function it ran).
//!
//! Only the thread holding the GIL runs Python, so a thread's GIL-held
//! time is its CPU time in Python frames (its on-CPU samples with one);
//! a process whose samples show no Python frame has its threads' CPU
//! time stand for it.

use std::collections::HashMap;

use serde_json::json;

use super::{pct, secs, threads, Ctx, Finding, Kind};
use crate::profile::model::{state::State, GIL_FRAME};

/// Below this share of the waiting threads' wall time, GIL waits are the
/// normal hand-over of a busy interpreter, not a finding.
const MIN_WAIT_SHARE: f64 = 0.05;

fn is_python(frame: &str) -> bool {
    frame.ends_with("_[py]") && frame != GIL_FRAME
}

pub fn find(ctx: &Ctx) -> Vec<Finding> {
    let seen = ctx.seen;
    let waiting: Vec<(u32, u64, u64)> = seen
        .threads
        .threads
        .iter()
        .filter_map(|t| Some((t.tid, t.gil_us.filter(|&us| us > 0)?, t.time.wall_us)))
        .collect();
    let gil_us: u64 = waiting.iter().map(|w| w.1).sum();
    let wall_us: u64 = waiting.iter().map(|w| w.2).sum();
    let share = gil_us as f64 / wall_us.max(1) as f64;
    if waiting.is_empty() || share < MIN_WAIT_SHARE {
        return Vec::new();
    }
    // GIL-held time by thread, and by (thread, innermost Python frame).
    let mut held: HashMap<u32, u64> = HashMap::new();
    let mut frames: HashMap<(u32, String), u64> = HashMap::new();
    for r in seen.rows.iter().filter(|r| r.state == State::Cpu) {
        let Some(frame) = r.stack.iter().rev().find(|f| is_python(f)) else {
            continue;
        };
        *held.entry(r.tid).or_default() += r.ns;
        let name = frame.strip_suffix("_[py]").unwrap_or(frame);
        *frames.entry((r.tid, name.to_string())).or_default() += r.ns;
    }
    if held.is_empty() {
        held = seen
            .threads
            .threads
            .iter()
            .map(|t| (t.tid, t.time.cpu_us * 1000))
            .collect();
    }
    let held_ns: u64 = held.values().sum();
    let holder = held
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(&tid, &ns)| (tid, ns));
    let mut numbers = json!({
        "waiting_threads": waiting.len(),
        "waiting_tids": waiting.iter().map(|w| w.0).collect::<Vec<_>>(),
        "gil_wait_us": gil_us,
        "waiting_wall_us": wall_us,
        "wait_share": share,
    });
    let mut headline = format!(
        "{} waited {} for the GIL ({} of their wall time)",
        threads(waiting.len()),
        secs(gil_us),
        pct(share)
    );
    if let Some((tid, ns)) = holder.filter(|_| held_ns > 0) {
        let name = seen.thread_name(tid);
        let held_share = ns as f64 / held_ns as f64;
        let frame = frames
            .iter()
            .filter(|((t, _), _)| *t == tid)
            .max_by(|a, b| a.1.cmp(b.1).then(b.0 .1.cmp(&a.0 .1)))
            .map(|((_, f), _)| f.clone());
        let cpu_us = seen.thread(tid).map_or(0, |t| t.time.cpu_us);
        headline.push_str(&format!(
            "; the GIL is held by \"{name}\" (tid {tid}) {} of the GIL-held time",
            pct(held_share)
        ));
        if let Some(f) = &frame {
            headline.push_str(&format!(", running {f}"));
        }
        numbers["holder"] = json!({
            "tid": tid,
            "name": name,
            "held_share": held_share,
            "cpu_us": cpu_us,
            "frame": frame,
        });
    }
    vec![Finding::new(
        Kind::Gil,
        gil_us,
        headline,
        numbers,
        ctx.link("/threads", ""),
    )]
}
