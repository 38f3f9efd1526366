//! What resolution each part of a window has, for answers to say
//! (`x-wallscope-resolution` and a JSON `resolution` field): compaction
//! (see [`super::compact`]) merges old slices in time and folds their rows
//! into pools.

use std::time::SystemTime;

use super::{Slice, Snapshot, Window};

/// Seconds of a window the store holds, and at what resolution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Whole seconds of the window within what the store holds (see
    /// [`Snapshot::recorded_seconds`]).
    pub seconds: u64,
    /// Runs of equal resolution, oldest first.
    pub resolution: Vec<Part>,
}

impl Recorded {
    /// The `x-wallscope-resolution` line (see [`describe`]).
    pub fn describe(&self) -> String {
        describe(&self.resolution)
    }
}

impl Snapshot {
    /// The resolution of each part of `window` the store holds, oldest
    /// first, in seconds before `now`.
    pub fn resolution(&self, window: Window, now: SystemTime) -> Vec<Part> {
        let held = self.slices.iter().zip(&self.steps);
        let within = held.filter(|(s, _)| window.holds(s));
        parts(within.map(|(s, (step, f))| (&**s, *step, *f)), now)
    }

    /// Seconds of `window` held and their resolution.
    pub fn recorded(&self, window: Window, now: SystemTime) -> Recorded {
        Recorded {
            seconds: self.recorded_seconds(window, now),
            resolution: self.resolution(window, now),
        }
    }
}

/// The resolution of one run of consecutive slices of a window.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Part {
    /// Seconds before the answer's time the run starts (older end).
    pub from_s_ago: u64,
    /// Seconds before the answer's time it ends.
    pub to_s_ago: u64,
    /// Seconds each slice of the run spans at most.
    pub step_s: u32,
    /// `thread` (stack rows per thread) or `pool` (folded into pools).
    pub rows: &'static str,
}

/// Runs of equal resolution over `(slice, step, folded)` oldest first,
/// relative to `now`.
pub fn parts<'a>(
    slices: impl Iterator<Item = (&'a Slice, u32, bool)>,
    now: SystemTime,
) -> Vec<Part> {
    let ago = |t: SystemTime| {
        now.duration_since(t)
            .map_or(0, |d| d.as_secs_f64().round() as u64)
    };
    let mut out: Vec<Part> = Vec::new();
    for (s, step, folded) in slices {
        let rows = if folded { "pool" } else { "thread" };
        match out.last_mut() {
            Some(p) if p.step_s == step && p.rows == rows => p.to_s_ago = ago(s.end),
            _ => out.push(Part {
                from_s_ago: ago(s.start),
                to_s_ago: ago(s.end),
                step_s: step,
                rows,
            }),
        }
    }
    out
}

/// One line for the `x-wallscope-resolution` header, newest first:
/// `1s:0-60s ago, 10s:60-300s ago, 60s:300-600s ago (pools)`, where
/// `(pools)` marks parts whose stack rows were folded into per-pool rows;
/// `none` when the window holds nothing.
pub fn describe(parts: &[Part]) -> String {
    if parts.is_empty() {
        return "none".into();
    }
    let mut s: Vec<String> = parts
        .iter()
        .rev()
        .map(|p| {
            let pools = if p.rows == "pool" { " (pools)" } else { "" };
            format!("{}s:{}-{}s ago{pools}", p.step_s, p.to_s_ago, p.from_s_ago)
        })
        .collect();
    s.dedup();
    s.join(", ")
}
