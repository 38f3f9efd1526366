//! Reading the daemon's answers: folded rows, JSON, waiting for a condition.

use std::{
    thread,
    time::{Duration, Instant},
};

use super::{get, parse_folded};

/// Folded rows: frames root first, and the value.
pub type Rows = Vec<(Vec<String>, u64)>;

/// `/folded?QUERY` of the daemon at `url`; no rows when nothing was
/// recorded yet (404).
pub fn folded_at(url: &str, query: &str) -> Rows {
    let (status, body) = get(&format!("{url}/folded?{query}"));
    match status {
        200 => parse_folded(&body),
        404 => Vec::new(),
        _ => panic!("{query}: {status} {body}"),
    }
}

/// `PATH` of the daemon at `url` as JSON (must answer 200).
pub fn json_at(url: &str, path: &str) -> serde_json::Value {
    let (status, body) = get(&format!("{url}{path}"));
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls `check` every second until it returns `Some`, for at most `limit`.
pub fn within<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_secs(1));
    }
}

/// Share of the rows' weight whose stack holds `chain` in this order
/// (other frames may sit between).
pub fn share_with_chain(rows: &Rows, chain: &[&str]) -> f64 {
    let holds = |stack: &[String]| {
        let mut at = 0;
        chain
            .iter()
            .all(|want| match stack[at..].iter().position(|f| f == want) {
                Some(i) => {
                    at += i + 1;
                    true
                }
                None => false,
            })
    };
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let with: u64 = rows.iter().filter(|r| holds(&r.0)).map(|r| r.1).sum();
    with as f64 / total.max(1) as f64
}

/// The heaviest rows, for failure messages.
pub fn show(rows: &Rows) -> String {
    let mut rows = rows.clone();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    rows.iter()
        .take(8)
        .map(|(s, v)| format!("{} {v}", s.join(";")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A CPU stack from a pool's worker loop down to a workload method, all
/// of it named: the worker loop, then only Java frames or JVM stubs, ending
/// in a `Pools.` method. Java frames of any kind are marked `_[j]` here.
pub fn named_pool_stack(rows: &Rows) -> Option<Vec<String>> {
    jit_marks(rows.clone())
        .iter()
        .map(|r| &r.0)
        .find_map(|stack| {
            let user: Vec<&String> = stack.iter().take_while(|f| !f.ends_with("_[k]")).collect();
            let start = user
                .iter()
                .position(|f| *f == "java.util.concurrent.ThreadPoolExecutor.runWorker_[j]")?;
            let below = &user[start + 1..];
            let leaf = below.last()?;
            let all_named = below
                .iter()
                .all(|f| f.ends_with("_[j]") || f.starts_with("[jvm stub]"));
            (all_named && leaf.starts_with("Pools.") && leaf.ends_with("_[j]"))
                .then(|| stack.clone())
        })
}

/// Whether `frame` is a named Java frame of any kind: compiled (`_[j]`,
/// C1 `_[1]`), inlined (`_[i]`) or interpreted (`_[0]`).
pub fn is_java_frame(frame: &str) -> bool {
    ["_[j]", "_[i]", "_[0]", "_[1]"]
        .iter()
        .any(|m| frame.ends_with(m))
}

/// `rows` with every Java frame marked `_[j]`, for checks about which
/// methods a stack holds, not how each ran (whether a method was inlined
/// or still interpreted depends on the JIT's timing).
pub fn jit_marks(rows: Rows) -> Rows {
    rows.into_iter()
        .map(|(stack, n)| {
            let stack = stack
                .into_iter()
                .map(|f| match f.len().checked_sub(4) {
                    Some(cut) if is_java_frame(&f) => format!("{}_[j]", &f[..cut]),
                    _ => f,
                })
                .collect();
            (stack, n)
        })
        .collect()
}
