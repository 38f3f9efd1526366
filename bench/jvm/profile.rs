//! Reading a folded CPU profile of the JVM and computing Java self time.
//! Both tools' output comes through here: `parse` reads folded rows
//! (wallscope's `/folded`, async-profiler's `collapsed` files), `java_method`
//! names a frame's Java method the same way for both (suffix stripped,
//! `pkg.Class.method`), and `Profile` holds the result: per-method self
//! weight (innermost Java frame), the rows that have no Java frame, an
//! unsymbolized frame or an unnamed Java frame, and the shares and top-N
//! the report compares.

use std::collections::BTreeMap;

/// wallscope's names for JVM code it cannot tie to a method: the template
/// interpreter and JIT code the perf map does not cover.
const WS_UNNAMED_JAVA: [&str; 2] = ["Interpreter", "[jvm code not in perf map]"];
/// async-profiler's (`ann`) suffixes of Java frames: JIT-compiled, inlined,
/// interpreted, C1-compiled.
const AP_JAVA_SUFFIXES: [&str; 4] = ["_[j]", "_[i]", "_[0]", "_[1]"];

/// Which of the two tools a profile or frame comes from.
#[derive(Clone, Copy, PartialEq)]
pub enum Tool {
    Wallscope,
    AsyncProfiler,
}

/// One tool's view of the JVM during the steady window.
#[derive(Default)]
pub struct Profile {
    /// Folded rows read.
    pub rows: usize,
    /// Weight of every row (µs for wallscope, samples for async-profiler).
    pub total: f64,
    /// Weight of the rows with a Java frame, the shares' denominator.
    pub java: f64,
    /// Self weight by method (innermost Java frame).
    pub methods: BTreeMap<String, f64>,
    /// Rows with no Java frame: (weight, row), heaviest first.
    pub no_java: Vec<(f64, String)>,
    /// Rows with an unsymbolized frame (`[unknown]`, `module+0xOFFSET`):
    /// (weight, row).
    pub unknown: Vec<(f64, String)>,
    /// Rows whose innermost Java frame has no method name: (weight, row).
    pub unnamed: Vec<(f64, String)>,
    /// Rows with a kernel frame.
    pub kernel_rows: usize,
}

/// A frame's Java method, normalized (`pkg.Class.method`), or `None` if
/// the frame is not Java code; Java code with no method name is named by
/// its frame (`Interpreter`).
fn java_method(frame: &str, tool: Tool) -> Option<String> {
    let name = match tool {
        Tool::Wallscope if WS_UNNAMED_JAVA.contains(&frame) => return Some(frame.to_string()),
        Tool::Wallscope => frame.strip_suffix("_[j]")?,
        Tool::AsyncProfiler => AP_JAVA_SUFFIXES
            .iter()
            .find_map(|s| frame.strip_suffix(s))?,
    };
    // async-profiler separates packages with '/', the JVM's perf map with
    // '.'; neither prints signatures with these options, but cut one anyway.
    let name = name.split('(').next().unwrap_or(name);
    Some(name.replace('/', "."))
}

/// Parses folded rows (`frame;...;leaf VALUE`, root first).
pub fn parse(text: &str, tool: Tool) -> Profile {
    let mut p = Profile::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some((stack, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        p.rows += 1;
        p.total += value;
        let mut frames: Vec<&str> = stack.split(';').collect();
        if tool == Tool::Wallscope {
            // The process name.
            frames.remove(0);
        }
        if frames.iter().any(|f| f.ends_with("_[k]")) {
            p.kernel_rows += 1;
        }
        if frames
            .iter()
            .any(|f| *f == "[unknown]" || f.contains("+0x"))
        {
            p.unknown.push((value, line.to_string()));
        }
        match frames.iter().rev().find_map(|f| java_method(f, tool)) {
            Some(method) => {
                p.java += value;
                if tool == Tool::Wallscope && WS_UNNAMED_JAVA.contains(&method.as_str()) {
                    p.unnamed.push((value, line.to_string()));
                }
                *p.methods.entry(method).or_default() += value;
            }
            None => p.no_java.push((value, line.to_string())),
        }
    }
    for rows in [&mut p.no_java, &mut p.unknown, &mut p.unnamed] {
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    }
    p
}

impl Profile {
    /// Self-time share (%) of `method`.
    pub fn share(&self, method: &str) -> Option<f64> {
        Some(self.methods.get(method)? / self.java * 100.0)
    }

    /// The `n` methods with the most self time, heaviest first.
    pub fn top(&self, n: usize) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = self
            .methods
            .iter()
            .map(|(m, w)| (m.clone(), w / self.java * 100.0))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    pub fn weight_pct(&self, rows: &[(f64, String)]) -> f64 {
        // `+ 0.0`: an empty sum is -0.0.
        rows.iter().map(|r| r.0).sum::<f64>() / self.total * 100.0 + 0.0
    }
}
