//! Output formats: folded text (FlameGraph/inferno) and SVG flame graphs.

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
    /// What the widths measure, e.g. `CPU`.
    pub what: String,
    pub seconds: u64,
}

/// Renders an interactive SVG. `deterministic` fixes colours and ids for
/// golden tests.
pub fn flamegraph_svg(
    folded: &Folded,
    labels: &GraphLabels,
    deterministic: bool,
) -> Result<Vec<u8>, std::io::Error> {
    let mut opts = Options::default();
    opts.title = format!(
        "{} — {}, last {} s, total {:.1} ms",
        labels.subject,
        labels.what,
        labels.seconds,
        folded.total_ns as f64 / 1e6
    );
    opts.count_name = "us".to_string();
    opts.deterministic = deterministic;
    opts.hash = true;
    let text = folded_text(folded);
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut opts, text.lines(), &mut svg)?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, path::Path};

    use super::*;

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
            what: "CPU".into(),
            seconds: 30,
        };
        let svg = String::from_utf8(flamegraph_svg(&sample(), &labels, true).unwrap()).unwrap();
        assert!(svg.contains("app (pid 7) — CPU, last 30 s, total 9.0 ms"));
        golden("simple.svg", &svg);
    }
}
