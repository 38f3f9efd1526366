//! Reading a folded CPU profile of the JVM and computing Java self time.
//! Both tools' output comes through here: `parse` reads folded rows
//! (wallscope's `/folded`, async-profiler's `collapsed` files), `java_frame`
//! names a frame's Java method the same way for both (kind suffix stripped,
//! `pkg.Class.method`, hidden and lambda classes normalized), and `Profile`
//! holds the result: per-method self weight (innermost Java frame), the
//! weight by the kind of that frame, the rows that have no Java frame, an
//! unsymbolized frame or an unnamed Java frame, and the shares and top-N
//! the report compares.

use std::collections::BTreeMap;

/// wallscope's names for JVM code it cannot tie to a method: the template
/// interpreter and JIT code the perf map does not cover (with perf-map
/// frames, before issue #12).
const WS_UNNAMED_JAVA: [&str; 2] = ["Interpreter", "[jvm code not in perf map]"];
/// Suffixes of Java frames, async-profiler's (`ann`) and wallscope's alike:
/// JIT-compiled (C2), C1-compiled, inlined into a compiled frame,
/// interpreted.
pub const JAVA_SUFFIXES: [&str; 4] = ["_[j]", "_[1]", "_[i]", "_[0]"];
/// The kind of an innermost Java frame without a method name.
pub const UNNAMED: &str = "unnamed";

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
    /// Self weight by the innermost Java frame's kind: one of
    /// [`JAVA_SUFFIXES`] or [`UNNAMED`].
    pub kinds: BTreeMap<&'static str, f64>,
    /// Rows with no Java frame: (weight, row), heaviest first.
    pub no_java: Vec<(f64, String)>,
    /// Rows with an unsymbolized frame (`[unknown]`, `module+0xOFFSET`):
    /// (weight, row).
    pub unknown: Vec<(f64, String)>,
    /// Rows whose innermost Java frame has no method name: (weight, row).
    pub unnamed: Vec<(f64, String)>,
    /// Rows with a kernel frame.
    pub kernel_rows: usize,
    /// Weight of the rows with a Java frame that reach the thread's entry
    /// (`java.lang.Thread.run`): complete stacks.
    pub entry: f64,
}

/// The entry frame of every Java thread the workload starts.
pub const ENTRY_METHOD: &str = "java.lang.Thread.run";

/// A frame's Java method, normalized (`pkg.Class.method`), and its kind
/// (a [`JAVA_SUFFIXES`] entry), or `None` if the frame is not Java code;
/// Java code with no method name is named by its frame (`Interpreter`), of
/// kind [`UNNAMED`].
fn java_frame(frame: &str, tool: Tool) -> Option<(String, &'static str)> {
    if tool == Tool::Wallscope && WS_UNNAMED_JAVA.contains(&frame) {
        return Some((frame.to_string(), UNNAMED));
    }
    let (name, kind) = JAVA_SUFFIXES
        .iter()
        .find_map(|s| Some((frame.strip_suffix(s)?, *s)))?;
    Some((normalize(name), kind))
}

/// `pkg.Class.method` for both tools' spelling of a method: signature cut
/// (neither prints one with these options, but cut one anyway), `/` (
/// async-profiler's package separator) to `.`, and hidden classes named
/// without their address and lambda counter (`Pools$$Lambda$14/0x0000000800c03000`,
/// `Pools$$Lambda/0x…` and `Pools$$Lambda` all become `Pools$$Lambda`):
/// the counter and address differ from run to run and between the JVM's
/// perf map (`/0x…`) and JVMTI (`.0x…`), not between methods.
pub fn normalize(name: &str) -> String {
    let name = name.split('(').next().unwrap_or(name).replace('/', ".");
    let Some((class, method)) = name.rsplit_once('.') else {
        return name;
    };
    let mut class = class.to_string();
    // A hidden class's address: the last part of its name, a number.
    if let Some((outer, last)) = class.rsplit_once(['.', '+']) {
        if last.starts_with(|c: char| c.is_ascii_digit()) {
            class.truncate(outer.len());
        }
    }
    if let Some(at) = class.find("$$Lambda$") {
        let tail = &class[at + "$$Lambda$".len()..];
        if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit()) {
            class.truncate(at + "$$Lambda".len());
        }
    }
    format!("{class}.{method}")
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
        match frames.iter().rev().find_map(|f| java_frame(f, tool)) {
            Some((method, kind)) => {
                p.java += value;
                if frames
                    .iter()
                    .any(|f| java_frame(f, tool).is_some_and(|(m, _)| m == ENTRY_METHOD))
                {
                    p.entry += value;
                }
                if kind == UNNAMED {
                    p.unnamed.push((value, line.to_string()));
                }
                *p.kinds.entry(kind).or_default() += value;
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

    /// Share (%) of the Java samples whose stack reaches the entry frame.
    pub fn entry_pct(&self) -> f64 {
        self.entry / self.java * 100.0 + 0.0
    }

    pub fn weight_pct(&self, rows: &[(f64, String)]) -> f64 {
        // `+ 0.0`: an empty sum is -0.0.
        rows.iter().map(|r| r.0).sum::<f64>() / self.total * 100.0 + 0.0
    }
}
