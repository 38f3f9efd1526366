//! What resolution each part of a window has, for answers to say
//! (`x-wallscope-resolution` and a JSON `resolution` field): compaction
//! (see [`super::compact`]) merges old slices in time and folds their rows
//! into pools.

use std::time::SystemTime;

use serde::Serialize;

use super::{
    super::window::{rfc3339_nanos, unix_nanos, Overlap},
    Snapshot, Window,
};

/// Seconds of a window the store holds, and at what resolution.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Recorded {
    /// Whole seconds of the window within what the store holds (see
    /// [`Snapshot::recorded_seconds`]).
    #[serde(rename = "recorded_seconds")]
    pub seconds: u64,
    /// Runs of equal resolution, oldest first.
    pub resolution: Vec<Part>,
    /// Exactly what the answer holds, `None` when nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub covered: Option<Covered>,
}

/// The exact span an answer holds, and the slices its edges cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Covered {
    /// RFC 3339 to the nanosecond.
    pub from: String,
    pub until: String,
    pub from_unix_ns: u64,
    pub until_unix_ns: u64,
    /// Slices (drain intervals or merged blocks) an edge of the window
    /// falls inside: their figures count pro rata.
    pub prorated: Vec<Cut>,
}

/// A slice cut by an edge of the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cut {
    /// `start` or `end` of the window (`both` when it holds the window).
    pub edge: &'static str,
    /// Milliseconds the slice spans, and of them within the window.
    pub slice_ms: u64,
    pub kept_ms: u64,
}

impl Covered {
    /// The `x-wallscope-covered` line: `FROM/UNTIL` (RFC 3339, ns).
    pub fn line(&self) -> String {
        format!("{}/{}", self.from, self.until)
    }

    /// The `x-wallscope-prorated` line, `None` when no slice was cut:
    /// `start 2.500 s of a 10.000 s slice, end 0.300 s of a 1.002 s slice`.
    pub fn prorated_line(&self) -> Option<String> {
        let cuts: Vec<String> = self
            .prorated
            .iter()
            .map(|c| {
                format!(
                    "{} {:.3} s of a {:.3} s slice",
                    c.edge,
                    c.kept_ms as f64 / 1e3,
                    c.slice_ms as f64 / 1e3
                )
            })
            .collect();
        (!cuts.is_empty()).then(|| cuts.join(", "))
    }
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
        self.resolution_of(window, now, None)
    }

    /// [`Self::resolution`] of what concerns process `pid` (its rows are
    /// pools only where it was folded), or of the whole host.
    fn resolution_of(&self, window: Window, now: SystemTime, pid: Option<u32>) -> Vec<Part> {
        let within = self
            .layout(window, pid)
            .into_iter()
            .map(|(start, end, step, folded, _)| {
                let start = start.max(window.from);
                (start, end.min(window.until).max(start), step, folded)
            });
        parts(within, now)
    }

    /// Seconds of `window` held, their resolution and exact span.
    pub fn recorded(&self, window: Window, now: SystemTime) -> Recorded {
        self.recorded_of(window, now, None)
    }

    /// [`Self::recorded`] for an answer about process `pid` (or the host):
    /// its resolution says pools only where that process was folded.
    pub fn recorded_of(&self, window: Window, now: SystemTime, pid: Option<u32>) -> Recorded {
        Recorded {
            seconds: self.recorded_seconds(window),
            resolution: self.resolution_of(window, now, pid),
            covered: self.covered_exactly(window),
        }
    }

    /// [`Snapshot::covered`] with the slices the window's edges cut.
    fn covered_exactly(&self, window: Window) -> Option<Covered> {
        let (from, until) = self.covered(window)?;
        let ms =
            |a: SystemTime, b: SystemTime| b.duration_since(a).map_or(0, |d| d.as_millis() as u64);
        let prorated = self
            .layout(window, None)
            .into_iter()
            .filter(|l| l.4 == Overlap::Part)
            .map(|(start, end, ..)| {
                let edge = match (start < window.from, end > window.until) {
                    (true, true) => "both",
                    (true, false) => "start",
                    _ => "end",
                };
                let kept = (start.max(window.from), end.min(window.until));
                Cut {
                    edge,
                    slice_ms: ms(start, end),
                    kept_ms: ms(kept.0, kept.1.max(kept.0)),
                }
            })
            .collect();
        Some(Covered {
            from: rfc3339_nanos(from),
            until: rfc3339_nanos(until),
            from_unix_ns: unix_nanos(from),
            until_unix_ns: unix_nanos(until),
            prorated,
        })
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

/// Runs of equal resolution over `(start, end, step, folded)` oldest
/// first, relative to `now`.
pub fn parts(
    slices: impl Iterator<Item = (SystemTime, SystemTime, u32, bool)>,
    now: SystemTime,
) -> Vec<Part> {
    let ago = |t: SystemTime| {
        now.duration_since(t)
            .map_or(0, |d| d.as_secs_f64().round() as u64)
    };
    let mut out: Vec<Part> = Vec::new();
    for (start, end, step, folded) in slices {
        let rows = if folded { "pool" } else { "thread" };
        match out.last_mut() {
            Some(p) if p.step_s == step && p.rows == rows => p.to_s_ago = ago(end),
            _ => out.push(Part {
                from_s_ago: ago(start),
                to_s_ago: ago(end),
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
