//! `/explain` for a terminal: the findings, one numbered paragraph each
//! with the call that shows its evidence; host-wide, a table of the
//! processes with their top finding.

use std::fmt::Write as _;

use super::{host::HostExplanation, secs, Explanation};
use crate::profile::report::threads::recorded_note;

/// The findings of one process, most time explained first.
pub fn render(e: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pid {} ({}), {}{}: {} of thread time, {} lost waiting (not at rest)",
        e.pid,
        e.process,
        e.window,
        recorded_note(e.seconds, e.recorded.seconds),
        secs(e.wall_us),
        secs(e.waiting_us),
    );
    if let Some(note) = &e.note {
        let _ = writeln!(out, "{note}");
    }
    for f in &e.findings {
        let kind = serde_json::to_value(f.kind).unwrap_or_default();
        let _ = writeln!(
            out,
            "\n{}. [{}] {}\n   evidence: {}",
            f.rank,
            kind.as_str().unwrap_or_default(),
            f.headline,
            f.evidence
        );
    }
    out
}

/// The processes that lost the most time, with their top finding.
pub fn render_host(h: &HostExplanation) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "processes that lost the most time waiting (not at rest), {}{}: {} shown of {}",
        h.window,
        recorded_note(h.seconds, h.recorded.seconds),
        h.processes.len(),
        h.waiting_processes
    );
    for p in &h.processes {
        let _ = writeln!(
            out,
            "\npid {} ({}): {} lost waiting of {}",
            p.pid,
            p.process,
            secs(p.waiting_us),
            secs(p.wall_us)
        );
        match &p.top {
            Some(f) => {
                let _ = writeln!(out, "   {}\n   evidence: {}", f.headline, f.evidence);
                if p.findings > 1 {
                    let _ = writeln!(out, "   {} more: {}&format=text", p.findings - 1, p.details);
                }
            }
            None => {
                let _ = writeln!(out, "   no single cause found");
            }
        }
    }
    out
}
