//! Where a request's time went (#43), against the writers' own logs: a
//! service on the real ddtrace tracer (`tests/workloads/python/
//! spans_service.py`), the C writer in each TLS model and its Rust port
//! (`tests/workloads/rust_otel_writer/`: the variable defined with
//! `global_asm!`, local exec), each serving a lock-waiting and an
//! I/O-waiting endpoint from a pool. For each of `CHECKED` logged spans,
//! `/spans?pid=&span_id=` must give its trace id, attributes, its one
//! thread, its wall time within 5 % or one sampling period of the logged
//! duration, and a state split led by the wait with the waiting frame on
//! its stack; threads that never have a span are in no span; the
//! `span_id=`/`trace_id=` filters of `/threads` and `/folded` keep only
//! the span's thread and stacks. Needs root.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use crate::support::{
    get, parse_folded,
    rows::{json_at, within},
    settle,
    spans::{
        c_attrs, check_span, ddtrace_available, ddtrace_run, grown, rust_writer, span_counters,
        span_detail, span_tids, CWriter, Expected, LoggedSpan, SpanWriter, C_ROUTES,
    },
    Fixture, CATCH_UP,
};

/// Spans checked per writer.
const CHECKED: usize = 24;
/// How long a writer may take to log them once the daemon knows it.
const LOGGING: Duration = Duration::from_secs(30);
/// The window of the list and filter queries.
const WINDOW_S: u64 = 120;

fn is_python(frame: &str, function: &str) -> bool {
    frame.ends_with("_[py]") && frame.starts_with(&format!("{function} ("))
}

fn waits_for_lock_py(frame: &str) -> bool {
    is_python(frame, "wait_for_lock")
}

fn reads_socket_py(frame: &str) -> bool {
    is_python(frame, "read_from_socket")
}

/// A socket read is an interruptible sleep outside futex: `sleep`.
const DDTRACE_ROUTES: [Expected; 2] = [
    Expected {
        route: "/lock",
        state: "futex",
        frame: waits_for_lock_py,
    },
    Expected {
        route: "/socket",
        state: "sleep",
        frame: reads_socket_py,
    },
];

/// Waits until the daemon knows a span of `writer` (its context was
/// found and read); returns when: spans started after it were served
/// while the daemon read the context.
pub fn known_since(url: &str, writer: &SpanWriter) -> Instant {
    let known = within(CATCH_UP, || {
        let spans = writer.spans();
        let last = spans.last()?;
        span_detail(url, writer.pid, &last.span).map(|_| Instant::now())
    });
    known.unwrap_or_else(|| {
        panic!(
            "pid {}: the daemon knew none of its {} logged spans within {CATCH_UP:?}",
            writer.pid,
            writer.spans().len()
        )
    })
}

/// Checks `spans` of `writer` until they all agree (the daemon may still
/// be symbolizing the last drain); panics with the mismatches after
/// [`CATCH_UP`].
pub fn check_all(
    url: &str,
    writer: &SpanWriter,
    spans: &[LoggedSpan],
    routes: &[Expected],
    attrs: fn(&LoggedSpan) -> Vec<(&'static str, String)>,
) {
    for route in routes {
        assert!(
            spans.iter().any(|s| s.route == route.route),
            "no {} span among {spans:?}",
            route.route
        );
    }
    let mut failures = Vec::new();
    // What the first look found: later ones may only say that the spans
    // have aged out of the window.
    let mut first: Option<Vec<String>> = None;
    // The largest |wall - logged| of the last look, for the test's log.
    let mut worst = (0, 0, "");
    let agreed = within(CATCH_UP, || {
        worst = (0, 0, "");
        failures = spans
            .iter()
            .filter_map(|logged| {
                let expected = routes.iter().find(|r| r.route == logged.route)?;
                let Some(span) = span_detail(url, writer.pid, &logged.span) else {
                    return Some(format!("{}: not known", logged.span));
                };
                let wall_ns = span["wall_us"].as_u64().unwrap_or(0) * 1000;
                let error = wall_ns.abs_diff(logged.duration_ns);
                worst = worst.max((error, logged.duration_ns, &logged.span));
                check_span(&span, logged, &attrs(logged), expected).err()
            })
            .collect();
        first.get_or_insert_with(|| failures.clone());
        failures.is_empty().then_some(())
    });
    if agreed.is_some() {
        eprintln!(
            "pid {}: all {} spans agree; the worst wall time is {} us off the logged {} us ({})",
            writer.pid,
            spans.len(),
            worst.0 / 1000,
            worst.1 / 1000,
            worst.2
        );
    }
    if agreed.is_none() {
        let list = json_at(
            url,
            &format!("/spans?pid={}&seconds={WINDOW_S}&limit=3", writer.pid),
        );
        let held = json_at(url, "/healthz")["spans"].clone();
        panic!(
            "pid {}: {} of {} spans disagree with the log:\n{}\nat first:\n{}\nthe daemon's newest spans: {list}\nits spans' store: {held}",
            writer.pid,
            failures.len(),
            spans.len(),
            failures.join("\n"),
            first.unwrap_or_default().join("\n")
        );
    }
}

/// Threads that never have a span are in no span of the list.
fn idle_threads_in_no_span(url: &str, writer: &SpanWriter) {
    let idle = writer.idle_tids();
    let list = json_at(
        url,
        &format!("/spans?pid={}&seconds={WINDOW_S}&limit=100000", writer.pid),
    );
    let spans = list["spans"].as_array().expect("spans");
    assert!(!spans.is_empty(), "{list}");
    for span in spans {
        let tids = span_tids(span);
        assert!(
            tids.iter().all(|t| !idle.contains(t)),
            "an idle thread ({idle:?}) in span {span}"
        );
    }
}

/// `/threads` and `/folded` filtered by `span_id=` (and `trace_id=`) keep
/// only the span's thread and its waiting stack.
fn filters_keep_the_span(url: &str, pid: u32, logged: &LoggedSpan, expected: &Expected) {
    let window = format!("pid={pid}&seconds={WINDOW_S}");
    for filter in [
        format!("span_id={}", logged.span),
        format!("trace_id={}", logged.trace),
    ] {
        let threads = json_at(url, &format!("/threads?{window}&{filter}"));
        let tids: Vec<u64> = threads["threads"]
            .as_array()
            .expect("threads")
            .iter()
            .filter_map(|t| t["tid"].as_u64())
            .collect();
        assert_eq!(tids, [logged.tid as u64], "/threads?{filter}: {threads}");
    }
    // Wall time: the span's waits as well as its CPU.
    let (status, body) = get(&format!(
        "{url}/folded?{window}&kind=wall&span_id={}",
        logged.span
    ));
    assert_eq!(status, 200, "{body}");
    let rows = parse_folded(&body);
    assert!(
        rows.iter()
            .any(|(stack, _)| stack.iter().any(|f| (expected.frame)(f))),
        "/folded?span_id={} has no {} frame:\n{body}",
        logged.span,
        expected.route
    );
}

/// One writer's spans against its log, its idle threads and the filters.
fn check_writer(
    url: &str,
    writer: &SpanWriter,
    routes: &[Expected],
    attrs: fn(&LoggedSpan) -> Vec<(&'static str, String)>,
) {
    let started = Instant::now();
    let since = known_since(url, writer);
    let spans = writer.spans_started_after(since, CHECKED, LOGGING);
    settle(url);
    eprintln!(
        "pid {}: known after {:?}, {CHECKED} spans logged and the daemon settled after {:?}",
        writer.pid,
        since - started,
        started.elapsed()
    );
    check_all(url, writer, &spans, routes, attrs);
    idle_threads_in_no_span(url, writer);
    let first = &spans[0];
    let expected = routes.iter().find(|r| r.route == first.route).unwrap();
    filters_keep_the_span(url, writer.pid, first, expected);
}

/// ddtrace publishes one attribute, the local root span's id in hex: each
/// request's span is its trace's root, so its own id.
fn ddtrace_attrs(logged: &LoggedSpan) -> Vec<(&'static str, String)> {
    vec![("datadog.local_root_span_id", logged.span.clone())]
}

#[test]
fn ddtrace_spans_match_the_service_log() {
    let Some(fx) = Fixture::ebpf() else { return };
    if !ddtrace_available() {
        return;
    }
    let url = fx.daemon();
    let service = ddtrace_run("spans_service.py", &["--max-seconds", "300"]);
    assert_eq!(service.idle_tids().len(), 2, "the service's idle threads");
    check_writer(url, &service, &DDTRACE_ROUTES, ddtrace_attrs);
}

/// A writer of the C writer's protocol (routes, attributes), started by
/// `command` once the fixture is had, against its log.
fn writer_spans_match_its_log(name: &str, command: impl FnOnce() -> Command) {
    let Some(fx) = Fixture::ebpf() else { return };
    let url = fx.daemon();
    let writer = SpanWriter::spawn(command());
    eprintln!("{name}: pid {}", writer.pid);
    check_writer(url, &writer, &C_ROUTES, c_attrs);
}

fn c_writer_spans_match_its_log(variant: CWriter) {
    let name = format!("C writer {}", variant.label());
    writer_spans_match_its_log(&name, || variant.command(&[]));
}

#[test]
fn c_writer_in_the_executable_spans_match_its_log() {
    c_writer_spans_match_its_log(CWriter::Exe);
}

#[test]
fn c_writer_tlsdesc_linked_spans_match_its_log() {
    c_writer_spans_match_its_log(CWriter::Linked);
}

#[test]
fn c_writer_tlsdesc_dlopened_spans_match_its_log() {
    c_writer_spans_match_its_log(CWriter::Dlopened);
}

#[test]
fn rust_writer_spans_match_its_log() {
    writer_spans_match_its_log("Rust writer", || rust_writer(&[]));
}

/// The checks themselves, on answers built by hand (no root, no daemon):
/// they accept a span that agrees with its log and name each way one can
/// disagree.
#[test]
fn span_checks_accept_agreement_and_name_each_mismatch() {
    let line = format!(
        "span {} {} 4242 /lock 100000000",
        "ab".repeat(16),
        "cd".repeat(8)
    );
    let logged = LoggedSpan::parse(&line).unwrap();
    assert_eq!(LoggedSpan::parse("span zz 1 2 /lock 3"), None);
    let answer = |wall_us: u64, futex_us: u64, tid: u32, frame: &str| {
        serde_json::json!({
            "span_id": logged.span, "trace_id": logged.trace,
            "attrs": {"http_route": "/lock", "http_method": "GET"},
            "wall_us": wall_us,
            "states_us": {"cpu": wall_us - futex_us, "runqueue": 0, "throttled": 0,
                          "futex": futex_us, "io": 0, "sleep": 0},
            "threads": [tid],
            "top_stacks": [{"state": "futex", "stack": format!("main;{frame}"), "us": futex_us}],
        })
    };
    let lock = &C_ROUTES[0];
    let check = |span: &serde_json::Value| check_span(span, &logged, &c_attrs(&logged), lock);
    assert_eq!(
        check(&answer(104_000, 90_000, 4242, "futex_wait_[k]")),
        Ok(())
    );
    // One sampling period (10.1 ms) is the tolerance for a 100 ms span.
    assert_eq!(
        check(&answer(110_000, 90_000, 4242, "futex_wait_[k]")),
        Ok(())
    );
    let wrong = [
        (answer(111_000, 90_000, 4242, "futex_wait_[k]"), "wall"),
        (
            answer(100_000, 40_000, 4242, "futex_wait_[k]"),
            "wanted mostly futex",
        ),
        (answer(100_000, 90_000, 4243, "futex_wait_[k]"), "threads"),
        (answer(100_000, 90_000, 4242, "compute"), "expected frame"),
    ];
    for (span, says) in wrong {
        let err = check(&span).unwrap_err();
        assert!(err.contains(says), "{err} (wanted {says:?})");
    }
    let mut other_route = answer(100_000, 90_000, 4242, "futex_wait_[k]");
    other_route["attrs"]["http_route"] = "/io".into();
    assert!(check(&other_route)
        .unwrap_err()
        .contains("attrs.http_route"));
}

#[test]
fn counters_that_grew_are_found_by_path() {
    let before = serde_json::json!({"lost": {"otel_context_read_failed": 1, "counts_full": 5},
                                    "refused": {"otel_ctx": {"size": 0}}});
    let after = serde_json::json!({"lost": {"otel_context_read_failed": 1, "counts_full": 9},
                                   "refused": {"otel_ctx": {"size": 2}},
                                   "events": {"span_records_new": 3}});
    let grown = grown(&span_counters(&before), &span_counters(&after));
    assert_eq!(grown, ["events.span_records_new", "refused.otel_ctx.size"]);
}
