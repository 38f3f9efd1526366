//! `/blocked`: the threads of the live view that have been off-CPU for at
//! least a given time, longest first, as JSON or as text in the manner of
//! `jstack`, with durations.

use std::{
    fmt::Write as _,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use super::{
    disclosure::Sight,
    durations,
    stuck::{Finding, PoolSummary, WaitFacts},
};
use crate::profile::model::live::{longest_first, LiveThread, LiveView, LiveWaker};

/// What `/blocked` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedFilter {
    /// One process, or the whole host.
    pub pid: Option<u32>,
    /// Shortest time in state shown.
    pub min: Duration,
    /// Most threads shown.
    pub limit: usize,
}

/// The `/blocked` answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BlockedReport {
    /// When the view was taken (RFC 3339, ms); `None` before the first
    /// drain.
    pub as_of: Option<String>,
    /// Seconds between `as_of` and the answer.
    pub age_s: Option<f64>,
    pub pid: Option<u32>,
    pub min_seconds: f64,
    pub limit: usize,
    /// Threads that matched; the first `limit` are in `threads`.
    pub matched: usize,
    /// Threads of the whole host the view left out (it keeps the longest
    /// waits); none of them waited longer than `left_out_longest_s`.
    pub left_out: usize,
    pub left_out_longest_s: f64,
    /// Pools with blocked threads, most blocked first (over every matched
    /// thread, not only the `limit` shown).
    pub pools: Vec<PoolSummary>,
    /// Deadlocks and stuck pools found among them.
    pub findings: Vec<Finding>,
    pub threads: Vec<BlockedThread>,
}

/// One blocked thread.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BlockedThread {
    pub pid: u32,
    /// Process name.
    pub process: String,
    pub tid: u32,
    /// Thread name (full Java thread name when known).
    pub name: String,
    /// `runqueue`, `throttled`, `futex`, `io` or `sleep`.
    pub state: &'static str,
    /// How long it had been in `state` at `as_of`, ms precision.
    pub in_state_s: f64,
    /// When it entered `state` (RFC 3339, ms).
    pub since: String,
    /// Name of the syscall it blocked in, when known.
    pub syscall: Option<&'static str>,
    pub syscall_nr: Option<u32>,
    /// Innermost frame first, as `jstack` prints them.
    pub stack: Vec<String>,
    /// Who woke it last before this state began; `None` if no wakeup was
    /// seen.
    pub woken_by: Option<WokenBy>,
    /// The thread holding the mutex it waits for, where read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits_for_tid: Option<u32>,
}

/// Who woke a thread last.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum WokenBy {
    Thread {
        pid: u32,
        tid: u32,
        /// When known.
        name: Option<String>,
    },
    /// A hard or soft interrupt (a timer, a device).
    Interrupt,
    /// A thread of a process the reader may not see: another user's
    /// ([`super::disclosure`]).
    #[serde(rename = "other_users")]
    OtherUsers,
}

/// The threads of `view` that `filter` selects.
pub fn matched<'a>(view: &'a LiveView, filter: &BlockedFilter) -> Vec<&'a LiveThread> {
    view.threads
        .iter()
        .filter(|t| t.in_state >= filter.min && filter.pid.is_none_or(|pid| t.pid == pid))
        .collect()
}

/// The threads of `view` that `filter` selects, longest first, with what
/// `facts` tells of them.
pub fn report(
    view: &LiveView,
    filter: &BlockedFilter,
    facts: &WaitFacts,
    now: SystemTime,
    sight: &Sight,
) -> BlockedReport {
    let mut matched = matched(view, filter);
    matched.sort_by(|a, b| longest_first(a.order_key(), b.order_key()));
    let as_of = view.as_of.unwrap_or(now);
    let all: Vec<BlockedThread> = matched
        .iter()
        .map(|t| thread(view, t, as_of, facts, sight))
        .collect();
    let (pools, findings) = super::stuck::summarize(&all, facts);
    BlockedReport {
        as_of: view.as_of.map(rfc3339),
        age_s: view
            .as_of
            .map(|t| seconds(now.duration_since(t).unwrap_or_default())),
        pid: filter.pid,
        min_seconds: seconds(filter.min),
        limit: filter.limit,
        matched: matched.len(),
        left_out: view.left_out,
        left_out_longest_s: seconds(view.left_out_longest),
        pools,
        findings,
        threads: all.into_iter().take(filter.limit).collect(),
    }
}

fn thread(
    view: &LiveView,
    t: &LiveThread,
    as_of: SystemTime,
    facts: &WaitFacts,
    sight: &Sight,
) -> BlockedThread {
    let process = view.processes.get(&t.pid).map(|n| n.to_string());
    let since = as_of.checked_sub(t.in_state).unwrap_or(as_of);
    BlockedThread {
        pid: t.pid,
        process: process.unwrap_or_default(),
        tid: t.tid,
        name: t.name.to_string(),
        state: t.state.name(),
        in_state_s: seconds(t.in_state),
        since: rfc3339(since),
        syscall: t.syscall.and_then(|s| s.name),
        syscall_nr: t.syscall.map(|s| s.nr),
        stack: t.stack.iter().rev().map(|f| f.to_string()).collect(),
        woken_by: t.waker.as_ref().map(|w| match w {
            LiveWaker::Thread { pid, .. } if !sight.sees(*pid, since) => WokenBy::OtherUsers,
            LiveWaker::Thread { pid, tid, name } => WokenBy::Thread {
                pid: *pid,
                tid: *tid,
                name: name.as_ref().map(|n| n.to_string()),
            },
            LiveWaker::Interrupt => WokenBy::Interrupt,
        }),
        waits_for_tid: facts.owners.get(&t.tid).copied(),
    }
}

/// Seconds with millisecond precision (rounded to nearest).
fn seconds(d: Duration) -> f64 {
    ((d.as_nanos() + 500_000) / 1_000_000) as f64 / 1000.0
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// One block per thread, as `jstack` prints them: a header line with the
/// state and how long it has lasted, the frames innermost first, and who
/// woke the thread last.
pub fn render_text(r: &BlockedReport) -> String {
    let mut out = String::new();
    let (Some(as_of), Some(age)) = (&r.as_of, r.age_s) else {
        out.push_str("No live view yet: the first drain has not happened.\n");
        return out;
    };
    let whose = r.pid.map(|p| format!(" of pid {p}")).unwrap_or_default();
    let _ = writeln!(
        out,
        "Threads{whose} off-CPU for at least {}, as of {as_of} ({} ago): {} shown of {}",
        durations::seconds(r.min_seconds),
        durations::seconds(age),
        r.threads.len(),
        r.matched
    );
    if r.matched > r.threads.len() {
        let more = r.matched - r.threads.len();
        let _ = writeln!(out, "({more} more not shown: limit={})", r.limit);
    }
    if r.left_out > 0 && r.min_seconds <= r.left_out_longest_s {
        let _ = writeln!(
            out,
            "(the view left out {} shorter waits host-wide, none over {})",
            r.left_out,
            durations::seconds(r.left_out_longest_s)
        );
    }
    if !r.findings.is_empty() {
        out.push_str("\nFound:\n");
        for f in &r.findings {
            let _ = writeln!(out, "  [{} {}] {}", f.kind, f.certainty, f.summary);
        }
    }
    if !r.pools.is_empty() {
        out.push_str("\nPools:\n");
        for p in &r.pools {
            let _ = writeln!(out, "  {}", p.summary);
        }
    }
    for t in &r.threads {
        out.push('\n');
        thread_block(&mut out, t);
    }
    out
}

fn thread_block(out: &mut String, t: &BlockedThread) {
    let _ = write!(out, "\"{}\" tid={} pid={}", t.name, t.tid, t.pid);
    if !t.process.is_empty() {
        let _ = write!(out, " ({})", t.process);
    }
    let _ = write!(
        out,
        ": {} for {} since {}",
        t.state,
        durations::seconds(t.in_state_s),
        t.since
    );
    match (t.syscall, t.syscall_nr) {
        (Some(name), _) => {
            let _ = write!(out, ", in {name}()");
        }
        (None, Some(nr)) => {
            let _ = write!(out, ", in syscall {nr}");
        }
        (None, None) => {}
    }
    out.push('\n');
    for frame in &t.stack {
        let _ = writeln!(out, "    at {frame}");
    }
    let _ = match &t.woken_by {
        Some(WokenBy::Thread { pid, tid, name }) => {
            let name = name
                .as_deref()
                .map(|n| format!("\"{n}\" "))
                .unwrap_or_default();
            writeln!(out, "    woken last by {name}tid={tid} pid={pid}")
        }
        Some(WokenBy::Interrupt) => writeln!(out, "    woken last by an interrupt"),
        Some(WokenBy::OtherUsers) => writeln!(out, "    woken last by another user's process"),
        None => writeln!(out, "    woken last by: no wakeup seen"),
    };
    if let Some(owner) = t.waits_for_tid {
        let _ = writeln!(out, "    waits for a mutex held by tid={owner}");
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use super::*;
    use crate::{
        profile::model::live::{Syscall, MAX_LIVE_THREADS},
        profile::model::state::State,
        profile::report::disclosure::Reader,
    };

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    fn thread(pid: u32, tid: u32, ms: u64, state: State) -> LiveThread {
        LiveThread {
            pid,
            tid,
            name: Arc::from(format!("t{tid}")),
            state,
            in_state: Duration::from_millis(ms),
            syscall: None,
            stack: ["main", "wait"].map(Arc::<str>::from).into_iter().collect(),
            waker: None,
        }
    }

    /// Deliberately out of order: the report sorts.
    fn view() -> LiveView {
        let mut parked = thread(1, 11, 12_345, State::Futex);
        parked.name = Arc::from("ForkJoinPool-1-worker-3");
        parked.syscall = Some(Syscall {
            nr: 202,
            name: Some("futex"),
        });
        parked.waker = Some(LiveWaker::Thread {
            pid: 1,
            tid: 10,
            name: Some(Arc::from("main")),
        });
        let mut io = thread(2, 20, 2_000, State::Io);
        io.waker = Some(LiveWaker::Interrupt);
        io.syscall = Some(Syscall {
            nr: 999,
            name: None,
        });
        LiveView {
            as_of: Some(at(1000)),
            threads: vec![
                thread(1, 12, 400, State::Sleep),
                io,
                parked,
                thread(1, 13, 2_000, State::Runqueue),
            ],
            processes: HashMap::from([(1, Arc::from("java")), (2, Arc::from("db"))]),
            left_out: 7,
            left_out_longest: Duration::from_millis(300),
        }
    }

    fn filter(pid: Option<u32>, min_ms: u64, limit: usize) -> BlockedFilter {
        BlockedFilter {
            pid,
            min: Duration::from_millis(min_ms),
            limit,
        }
    }

    fn tids(r: &BlockedReport) -> Vec<u32> {
        r.threads.iter().map(|t| t.tid).collect()
    }

    #[test]
    fn filters_by_pid_and_time_longest_first() {
        let now = at(1001) + Duration::from_millis(250);
        let r = report(
            &view(),
            &filter(None, 1000, 100),
            &WaitFacts::default(),
            now,
            &Sight::all(),
        );
        assert_eq!(tids(&r), [11, 13, 20], "ties by pid, then tid");
        assert_eq!((r.matched, r.age_s), (3, Some(1.25)));
        let r = report(
            &view(),
            &filter(Some(1), 0, 100),
            &WaitFacts::default(),
            now,
            &Sight::all(),
        );
        assert_eq!(tids(&r), [11, 13, 12]);
        let r = report(
            &view(),
            &filter(Some(1), 500, 1),
            &WaitFacts::default(),
            now,
            &Sight::all(),
        );
        assert_eq!((tids(&r), r.matched), (vec![11], 2), "limit");
        let r = report(
            &view(),
            &filter(Some(3), 0, 100),
            &WaitFacts::default(),
            now,
            &Sight::all(),
        );
        assert!(r.threads.is_empty() && r.matched == 0);
        let r = report(
            &view(),
            &filter(None, 12_346, 100),
            &WaitFacts::default(),
            now,
            &Sight::all(),
        );
        assert!(r.threads.is_empty(), "12.345 s < 12.346 s");
    }

    #[test]
    fn a_thread_carries_its_names_times_stack_and_waker() {
        let r = report(
            &view(),
            &filter(Some(1), 10_000, 100),
            &WaitFacts::default(),
            at(1001),
            &Sight::all(),
        );
        let t = &r.threads[0];
        assert_eq!(r.as_of.as_deref(), Some("1970-01-01T00:16:40.000Z"));
        assert_eq!(
            (t.process.as_str(), t.name.as_str()),
            ("java", "ForkJoinPool-1-worker-3")
        );
        assert_eq!((t.state, t.in_state_s), ("futex", 12.345));
        assert_eq!(t.since, "1970-01-01T00:16:27.655Z");
        assert_eq!((t.syscall, t.syscall_nr), (Some("futex"), Some(202)));
        assert_eq!(t.stack, ["wait", "main"], "innermost first");
        let json = serde_json::to_value(&r.threads[0]).unwrap();
        assert_eq!(
            json["woken_by"],
            serde_json::json!({"kind": "thread", "pid": 1, "tid": 10, "name": "main"})
        );
        let r = report(
            &view(),
            &filter(Some(2), 0, 100),
            &WaitFacts::default(),
            at(1001),
            &Sight::all(),
        );
        let json = serde_json::to_value(&r.threads[0]).unwrap();
        assert_eq!(json["woken_by"], serde_json::json!({"kind": "interrupt"}));
        assert_eq!(
            (json["syscall"].clone(), json["syscall_nr"].clone()),
            (serde_json::Value::Null, 999.into())
        );
    }

    #[test]
    fn text_is_one_jstack_like_block_per_thread() {
        let r = report(
            &view(),
            &filter(None, 1000, 2),
            &WaitFacts::default(),
            at(1001),
            &Sight::all(),
        );
        let text = render_text(&r);
        let expected = "\
Threads off-CPU for at least 1 s, as of 1970-01-01T00:16:40.000Z (1 s ago): 2 shown of 3
(1 more not shown: limit=2)

\"ForkJoinPool-1-worker-3\" tid=11 pid=1 (java): futex for 12.345 s since 1970-01-01T00:16:27.655Z, in futex()
    at wait
    at main
    woken last by \"main\" tid=10 pid=1

\"t13\" tid=13 pid=1 (java): runqueue for 2 s since 1970-01-01T00:16:38.000Z
    at wait
    at main
    woken last by: no wakeup seen
";
        assert_eq!(text, expected);
        let r = report(
            &view(),
            &filter(Some(2), 100, 5),
            &WaitFacts::default(),
            at(1001),
            &Sight::all(),
        );
        let text = render_text(&r);
        assert!(
            text.starts_with("Threads of pid 2 off-CPU for at least 100 ms"),
            "{text}"
        );
        assert!(
            text.contains("(the view left out 7 shorter waits host-wide, none over 300 ms)"),
            "{text}"
        );
        assert!(
            text.contains("): io for 2 s since") && text.contains(", in syscall 999\n"),
            "{text}"
        );
        assert!(text.ends_with("    woken last by an interrupt\n"), "{text}");
    }

    #[test]
    fn before_the_first_drain_there_is_no_view() {
        let r = report(
            &LiveView::default(),
            &filter(None, 0, MAX_LIVE_THREADS),
            &WaitFacts::default(),
            at(5),
            &Sight::all(),
        );
        assert_eq!((r.as_of.as_deref(), r.age_s, r.matched), (None, None, 0));
        assert_eq!(
            render_text(&r),
            "No live view yet: the first drain has not happened.\n"
        );
    }

    #[test]
    fn a_waker_the_reader_may_not_see_is_another_users() {
        // Pid 1 is the reader's, but only since 1000 s: the wakeup of
        // 987.655 s came from an earlier process with that pid.
        let reader = |since: u64| Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(move |pid| (pid == 1).then_some((1000, at(since)))),
        };
        let woken_by = |since| {
            let facts = WaitFacts::default();
            let r = report(
                &view(),
                &filter(Some(1), 10_000, 100),
                &facts,
                at(1001),
                &reader(since).sight(),
            );
            serde_json::to_value(&r.threads[0]).unwrap()["woken_by"].clone()
        };
        assert_eq!(woken_by(1000), serde_json::json!({"kind": "other_users"}));
        assert_eq!(woken_by(0)["kind"], "thread");
    }
}
