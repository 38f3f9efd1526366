//! `/spans` as text for a terminal: one line per span, its top stack
//! under it.

use std::fmt::Write;

use super::{SpanDetail, SpanRow, SpansReport, StatesUs};

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

fn states(s: &StatesUs) -> String {
    format!(
        "{:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        ms(s.cpu),
        ms(s.runqueue),
        ms(s.throttled),
        ms(s.futex),
        ms(s.io),
        ms(s.sleep)
    )
}

const HEADER: &str =
    "span_id          wall_ms       cpu  runqueue throttled     futex        io     sleep threads attrs";

fn attrs(row: &SpanRow) -> String {
    let pairs: Vec<String> = (row.attrs.iter())
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    pairs.join(" ")
}

fn span_line(out: &mut String, row: &SpanRow) {
    let _ = writeln!(
        out,
        "{} {:>9} {} {:>7} {}",
        row.span_id,
        ms(row.wall_us),
        states(&row.states_us),
        row.threads.len(),
        attrs(row)
    );
}

pub fn render_text(r: &SpansReport) -> String {
    let mut out = String::new();
    let name = r.process.as_deref().unwrap_or("?");
    let _ = writeln!(
        out,
        "pid {} ({name}): {} spans in the last {:.0} s, by {} (ms)",
        r.pid, r.spans_total, r.seconds, r.sort
    );
    let _ = writeln!(out, "{HEADER}");
    for row in &r.spans {
        span_line(&mut out, row);
        if let Some(top) = row.top_stacks.first() {
            let _ = writeln!(out, "    {} {} ms: {}", top.state, ms(top.us), top.stack);
        }
    }
    if r.rows_omitted > 0 {
        let _ = writeln!(out, "... {} more spans (limit=)", r.rows_omitted);
    }
    if !r.aggregated.is_empty() {
        let _ = writeln!(out, "older spans, by attributes (ids dropped):");
        for a in &r.aggregated {
            let pairs: Vec<String> = (a.attrs.iter()).map(|(n, v)| format!("{n}={v}")).collect();
            let _ = writeln!(
                out,
                "{:>7} spans {:>9} {} {}",
                a.spans,
                ms(a.wall_us),
                states(&a.states_us),
                pairs.join(" ")
            );
        }
    }
    out
}

pub fn render_detail_text(d: &SpanDetail) -> String {
    let mut out = String::new();
    let row = &d.span;
    let _ = writeln!(
        out,
        "span {} of trace {} in pid {}: {} ms wall, {}",
        row.span_id,
        row.trace_id,
        d.pid,
        ms(row.wall_us),
        attrs(row)
    );
    let _ = writeln!(out, "{HEADER}");
    span_line(&mut out, row);
    let _ = writeln!(out, "threads:");
    for t in &d.by_thread {
        let _ = writeln!(
            out,
            "{:>16} {:>9} {}",
            t.tid,
            ms(t.wall_us),
            states(&t.states_us)
        );
    }
    let _ = writeln!(out, "stacks:");
    for s in &d.stacks {
        let _ = writeln!(out, "  {} {} ms: {}", s.state, ms(s.us), s.stack);
    }
    let _ = writeln!(out, "timeline: {}", d.timeline);
    out
}
