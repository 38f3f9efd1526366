//! `/processes?format=text`: the rows as an aligned table for a terminal,
//! each with a short command line, and a last line saying how many rows
//! `limit=` cut.

use std::fmt::Write as _;

use super::{
    identity::{cut_chars, omitted_line, Shown},
    processes::ProcessSummary,
};

/// Characters of the command line a row shows.
const COMMAND_WIDTH: usize = 60;

/// Characters of the process name a row shows.
const COMM_WIDTH: usize = 16;

/// The table of `rows` (`omitted` more were cut by `limit`).
pub fn render(rows: &[ProcessSummary], omitted: usize, limit: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>8}  {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  COMMAND",
        "PID", "COMM", "CPU ms", "RUNQ ms", "FUTEX ms", "IO ms", "SLEEP ms", "WALL ms"
    );
    let ms = |us: u64| us as f64 / 1000.0;
    for r in rows {
        let _ = writeln!(
            out,
            "{:>8}  {:<16} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}  {}",
            r.pid,
            cut_chars(&r.comm, COMM_WIDTH),
            ms(r.cpu_us),
            ms(r.time.runqueue_us),
            ms(r.time.futex_us),
            ms(r.time.io_us),
            ms(r.time.sleep_us),
            ms(r.time.wall_us),
            Shown::short_command(r.identity.as_ref(), COMMAND_WIDTH),
        );
    }
    if let Some(line) = omitted_line(omitted, limit) {
        let _ = writeln!(out, "{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::report::processes::StateTimes;

    #[test]
    fn rows_show_a_short_command_and_the_cut() {
        let shown = Shown {
            cmdline: Some(format!("python3 {}", "x".repeat(200))),
            ..Shown::default()
        };
        let row = |pid, comm: &str, identity| ProcessSummary {
            pid,
            comm: comm.into(),
            cpu_us: 1500,
            time: StateTimes::default(),
            jvm: None,
            container: None,
            identity,
            kernel: false,
            strip: None,
        };
        let rows = [
            row(7, "python3", Some(shown)),
            row(8, "a-very-long-process-name", None),
        ];
        let text = render(&rows, 3, 2);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].ends_with("COMMAND"));
        assert!(lines[1].contains("python3 xxx") && lines[1].ends_with('…'));
        assert!(lines[1].contains("1.5"));
        assert!(lines[2].contains("a-very-long-pro…") && lines[2].ends_with("  -"));
        assert_eq!(lines[3], "… 3 more rows (limit=2)");
        assert!(!render(&rows, 0, 50).contains("more rows"));
    }
}
