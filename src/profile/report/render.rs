//! Output formats: folded text (FlameGraph/inferno) and SVG flame graphs.

use crate::profile::model::{
    kind::{Group, Kind},
    window::Window,
};
use std::fmt::Write as _;

use inferno::flamegraph::{self, Options};

use super::query::{ns_to_us, Folded};

/// Folded stacks, one `root;...;leaf VALUE` line per stack, VALUE in
/// microseconds, lines sorted for stable output.
pub fn folded_text(folded: &Folded) -> String {
    let mut out = String::new();
    for (stack, &ns) in &folded.stacks {
        let _ = writeln!(out, "{stack} {}", ns_to_us(ns));
    }
    out
}

/// What a flame graph is titled with.
#[derive(Debug, Clone)]
pub struct GraphLabels {
    /// What was profiled, e.g. `nginx (pid 42)` or `all processes`.
    pub subject: String,
    /// What the widths measure.
    pub kind: Kind,
    /// What sits under the root frames.
    pub group: Group,
    /// The window the graph covers.
    pub window: Window,
}

/// The title: what the widths measure, then what was profiled, how it is
/// grouped, the window and the total, e.g. `Futex wait — java (pid 1234),
/// by thread, last 30 s, total 812.4 ms`.
pub fn title(labels: &GraphLabels, total_ns: u64) -> String {
    let by = match labels.group {
        Group::Process => "by process",
        Group::Thread => "by thread",
        Group::Pool => "by pool",
    };
    format!(
        "{} — {}, {by}, {}, total {:.1} ms",
        capitalized(labels.kind.describe()),
        labels.subject,
        labels.window.describe(),
        total_ns as f64 / 1e6
    )
}

fn capitalized(words: &str) -> String {
    let mut chars = words.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// An SVG with the graph's title and `note` (why there is no graph), for
/// a window in which a known process recorded nothing.
pub fn note_svg(labels: &GraphLabels, note: &str) -> Vec<u8> {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" height=\"80\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text><text x=\"600\" y=\"56\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"13\">{}</text></svg>\n",
        escape(&title(labels, 0)),
        escape(note)
    )
    .into_bytes()
}

/// Renders an interactive SVG. `deterministic` fixes colours and ids for
/// golden tests.
pub fn flamegraph_svg(
    folded: &Folded,
    labels: &GraphLabels,
    deterministic: bool,
) -> Result<Vec<u8>, std::io::Error> {
    let mut opts = Options::default();
    opts.title = title(labels, folded.total_ns);
    opts.count_name = "us".to_string();
    opts.deterministic = deterministic;
    opts.hash = true;
    let text = folded_text(folded);
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut opts, text.lines(), &mut svg)?;
    Ok(svg)
}

/// `svg` (from [`flamegraph_svg`]) as a still picture: without its script,
/// the `onload` that calls it, and the `Search` button only the script
/// served. The API serves flame graphs under a Content-Security-Policy
/// that runs no script (frame names come from the profiled processes); a
/// frame's name and time still show on hover, from its `<title>`, and the
/// web UI's own flame graph zooms and searches.
pub fn still_svg(svg: Vec<u8>) -> Vec<u8> {
    let Ok(mut text) = String::from_utf8(svg) else {
        return Vec::new();
    };
    let mut cut = |open: &str, close: &str| {
        if let Some(start) = text.find(open) {
            if let Some(len) = text[start..].find(close) {
                text.replace_range(start..start + len + close.len(), "");
            }
        }
    };
    cut("<script", "</script>");
    cut("<text id=\"search\"", "</text>");
    text.replace(" onload=\"init(evt)\"", "").into_bytes()
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, path::Path};

    use super::*;
    use crate::profile::model::state::State;

    fn sample() -> Folded {
        Folded {
            stacks: BTreeMap::from([
                ("app;main;compute".to_string(), 6_000_000),
                ("app;main;io;read_[k]".to_string(), 3_000_400),
                ("app;main".to_string(), 999),
            ]),
            total_ns: 9_001_399,
            processes: BTreeMap::new(),
        }
    }

    /// Compares with a file in tests/golden; `BLESS=1` rewrites it.
    fn golden(name: &str, actual: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        if std::env::var_os("BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, actual).unwrap();
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with BLESS=1 to create it)", path.display()));
        assert_eq!(actual, expected, "output differs from {}", path.display());
    }

    #[test]
    fn folded_matches_golden() {
        golden("simple.folded", &folded_text(&sample()));
    }

    #[test]
    fn svg_matches_golden() {
        let labels = GraphLabels {
            subject: "app (pid 7)".into(),
            kind: Kind::State(State::Cpu),
            group: Group::Process,
            window: Window::last(30, std::time::UNIX_EPOCH),
        };
        let svg = String::from_utf8(flamegraph_svg(&sample(), &labels, true).unwrap()).unwrap();
        assert!(svg.contains("CPU — app (pid 7), by process, last 30 s, total 9.0 ms"));
        golden("simple.svg", &svg);
    }

    #[test]
    fn still_svg_has_no_script_and_keeps_the_frames() {
        let labels = GraphLabels {
            subject: "app (pid 7)".into(),
            kind: Kind::State(State::Cpu),
            group: Group::Process,
            window: Window::last(30, std::time::UNIX_EPOCH),
        };
        let svg = flamegraph_svg(&sample(), &labels, true).unwrap();
        assert!(String::from_utf8_lossy(&svg).contains("<script"));
        let still = String::from_utf8(still_svg(svg)).unwrap();
        for gone in ["<script", "onload", "init(", ">Search<"] {
            assert!(!still.contains(gone), "{gone}");
        }
        assert!(still.contains("<title>compute (6,000 us, 66.66%)</title>"));
        assert!(still.contains("CPU — app (pid 7)"));
        assert!(still.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn titles_name_the_kind_and_the_grouping() {
        let labels = |kind: &str, group| GraphLabels {
            subject: "java (pid 1234)".into(),
            kind: Kind::parse(kind).unwrap(),
            group,
            window: Window::last(30, std::time::UNIX_EPOCH),
        };
        let cases = [
            (
                "futex",
                Group::Thread,
                "Futex wait — java (pid 1234), by thread, last 30 s, total 1.5 ms",
            ),
            (
                "throttled",
                Group::Pool,
                "Throttled (CPU quota spent) — java (pid 1234), by pool, last 30 s, total 1.5 ms",
            ),
            (
                "offcpu",
                Group::Process,
                "Off-CPU — java (pid 1234), by process, last 30 s, total 1.5 ms",
            ),
            (
                "wall",
                Group::Thread,
                "Wall clock — java (pid 1234), by thread, last 30 s, total 1.5 ms",
            ),
        ];
        for (kind, group, expected) in cases {
            assert_eq!(title(&labels(kind, group), 1_500_000), expected);
        }
        let svg = flamegraph_svg(&sample(), &labels("throttled", Group::Thread), true).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(
            svg.contains("Throttled (CPU quota spent) — java (pid 1234), by thread"),
            "{svg}"
        );
    }
}
