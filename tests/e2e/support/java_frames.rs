//! Reading Java frames in folded rows, named as async-profiler names them:
//! `pkg.Class.method_[j]` compiled by C2, `_[1]` by C1, `_[i]` inlined
//! into the compiled frame above it, `_[0]` interpreted. Code the JVM's
//! perf map names only as a whole (`Interpreter`) or lacks counts as Java
//! code too: a profile that shows it lost a Java method's name.

use std::collections::{BTreeMap, BTreeSet};

use super::rows::Rows;

/// Marks that end a named Java frame.
pub const JAVA_MARKS: [&str; 4] = ["_[j]", "_[1]", "_[i]", "_[0]"];

/// Java code without a method name: the perf map's one entry for the
/// whole template interpreter, and JIT code the perf map does not have.
const UNNAMED_JAVA: [&str; 2] = ["Interpreter", "[jvm code not in perf map]"];

/// The method of a named Java frame (`Inline.mix` for `Inline.mix_[i]`)
/// and its mark, or `None` for any other frame.
pub fn java_method(frame: &str) -> Option<(&str, &str)> {
    JAVA_MARKS
        .iter()
        .find_map(|mark| Some((frame.strip_suffix(mark)?, *mark)))
}

/// True for a frame that runs Java code, named or not.
pub fn is_java(frame: &str) -> bool {
    java_method(frame).is_some() || UNNAMED_JAVA.contains(&frame)
}

/// The leaf-most Java frame of a stack (root first): the method running,
/// or the one that called the JVM or kernel code below it.
pub fn innermost_java(stack: &[String]) -> Option<&str> {
    stack.iter().rev().map(String::as_str).find(|f| is_java(f))
}

/// The rows' weight by their innermost Java frame, marks kept; rows
/// without one are left out.
pub fn by_innermost_java(rows: &Rows) -> BTreeMap<&str, u64> {
    let mut weights = BTreeMap::new();
    for (stack, value) in rows {
        if let Some(frame) = innermost_java(stack) {
            *weights.entry(frame).or_default() += value;
        }
    }
    weights
}

/// The rows whose frame under the process is `root` (a thread or pool
/// with `group=thread` or `group=pool`).
pub fn under(rows: &Rows, root: &str) -> Rows {
    rows.iter()
        .filter(|(stack, _)| stack.get(1).map(String::as_str) == Some(root))
        .cloned()
        .collect()
}

/// True when a row holds a frame for which `pick` is true.
pub fn has_frame(rows: &Rows, pick: impl Fn(&str) -> bool) -> bool {
    rows.iter().any(|(stack, _)| stack.iter().any(|f| pick(f)))
}

/// Frames whose names change from one run to the next: a hidden class's
/// address (`Pools$$Lambda$2/0x00007f005c000c30.run`, or any address in
/// a Java frame) or a lambda class's number (`$$Lambda$2`).
pub fn unstable_names(rows: &Rows) -> BTreeSet<String> {
    let numbered_lambda = |f: &str| {
        f.match_indices("$$Lambda$")
            .any(|(at, m)| f[at + m.len()..].starts_with(|c: char| c.is_ascii_digit()))
    };
    rows.iter()
        .flat_map(|(stack, _)| stack)
        .filter(|f| {
            f.contains("/0x")
                || numbered_lambda(f)
                || (java_method(f).is_some() && f.contains("0x"))
        })
        .cloned()
        .collect()
}
