//! Request context (#43): processes that publish the OpenTelemetry thread
//! context and log every span they serve (the truth the daemon's `/spans`
//! is held to), and reading what the daemon says of those spans.
//!
//! Writers print `span <trace_hex32> <span_hex16> <tid> <route>
//! <duration_ns>` per finished span, `idle <tid>` per thread that never
//! has a span, and `ready <pid>`.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex, OnceLock},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{get, shared_workload, workload_variant, READY_WITHIN};

/// Where `scripts/deps.sh` installs PyPI's ddtrace 4.16.
pub const DDTRACE_DIR: &str = "/opt/wallscope-ddtrace";
/// The shared daemon's sampling frequency (`serve`'s default `--frequency`).
pub const SAMPLE_HZ: u64 = 99;
/// Lines a writer's log keeps: a churning writer prints 20,000 a second.
const KEPT_LINES: usize = 20_000;

/// One span as its writer logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedSpan {
    pub trace: String,
    pub span: String,
    pub tid: u32,
    pub route: String,
    pub duration_ns: u64,
}

impl LoggedSpan {
    /// Parses a `span ...` line; `None` for any other line.
    pub fn parse(line: &str) -> Option<LoggedSpan> {
        let mut w = line.split_whitespace();
        if w.next()? != "span" {
            return None;
        }
        let span = LoggedSpan {
            trace: w.next()?.to_string(),
            span: w.next()?.to_string(),
            tid: w.next()?.parse().ok()?,
            route: w.next()?.to_string(),
            duration_ns: w.next()?.parse().ok()?,
        };
        let hex = |s: &str, n| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        (hex(&span.trace, 32) && hex(&span.span, 16)).then_some(span)
    }
}

/// A running writer whose output a thread collects; killed when dropped.
pub struct SpanWriter {
    child: Child,
    pub pid: u32,
    /// Each line with when it was read.
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl SpanWriter {
    /// Starts `cmd` and waits for its `ready <pid>` line; what it prints
    /// before and after is kept (the first [`KEPT_LINES`] lines).
    pub fn spawn(mut cmd: Command) -> SpanWriter {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (ready, pid) = mpsc::channel();
        let kept = lines.clone();
        // Read on to the end, so that the writer never blocks on a full
        // pipe in the middle of a span.
        thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if let Some(pid) = line
                    .strip_prefix("ready ")
                    .and_then(|p| p.parse::<u32>().ok())
                {
                    let _ = ready.send(pid);
                }
                let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                if kept.len() < KEPT_LINES {
                    kept.push((Instant::now(), line));
                }
            }
        });
        let Ok(pid) = pid.recv_timeout(READY_WITHIN) else {
            let _ = child.kill();
            let lines = lines.lock().unwrap_or_else(|e| e.into_inner());
            let printed: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
            let printed = printed.join("\n");
            panic!("{cmd:?}: no `ready <pid>` within {READY_WITHIN:?}; printed:\n{printed}");
        };
        SpanWriter { child, pid, lines }
    }

    /// The spans logged so far, in the order they finished.
    pub fn spans(&self) -> Vec<LoggedSpan> {
        self.timed_spans().into_iter().map(|(_, s)| s).collect()
    }

    /// The spans logged so far, each with when its line was read (just
    /// after the span ended).
    fn timed_spans(&self) -> Vec<(Instant, LoggedSpan)> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let spans = lines
            .iter()
            .filter_map(|(at, l)| Some((*at, LoggedSpan::parse(l)?)));
        spans.collect()
    }

    /// Thread ids of the `idle <tid>` lines: threads that never have a span.
    pub fn idle_tids(&self) -> Vec<u32> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines
            .iter()
            .filter_map(|(_, l)| l.strip_prefix("idle ")?.trim().parse().ok())
            .collect()
    }

    /// Waits until `n` spans that started after `since` were logged;
    /// returns them. Panics after `limit`.
    pub fn spans_started_after(
        &self,
        since: Instant,
        n: usize,
        limit: Duration,
    ) -> Vec<LoggedSpan> {
        let deadline = Instant::now() + limit;
        loop {
            // A span started at most its duration before its line was read.
            let started_after = |(at, s): &(Instant, LoggedSpan)| {
                at.checked_sub(Duration::from_nanos(s.duration_ns))
                    .is_some_and(|start| start > since)
            };
            let spans: Vec<LoggedSpan> = self
                .timed_spans()
                .into_iter()
                .filter(started_after)
                .map(|(_, s)| s)
                .collect();
            if spans.len() >= n {
                return spans[..n].to_vec();
            }
            assert!(
                Instant::now() < deadline,
                "pid {}: {} spans started after the daemon knew it, wanted {n} within {limit:?}",
                self.pid,
                spans.len(),
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the writer still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for SpanWriter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// True when ddtrace is installed. Without it the ddtrace tests skip,
/// except under `CI=true` (where `scripts/deps.sh` installs it).
pub fn ddtrace_available() -> bool {
    let ok = Path::new(DDTRACE_DIR).join("bin/ddtrace-run").is_file();
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but no ddtrace in {DDTRACE_DIR} (scripts/deps.sh installs it)"
        );
        eprintln!("skipping: no ddtrace in {DDTRACE_DIR}");
    }
    ok
}

/// Starts `tests/workloads/python/SCRIPT args` under Debian's python3 and
/// `ddtrace-run`, publishing the thread context, offline and quiet: no
/// agent, telemetry or remote configuration (traces it cannot send are
/// dropped, which is all the tests need).
pub fn ddtrace_run(script: &str, args: &[&str]) -> SpanWriter {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/workloads/python/{script}"));
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(Path::new(DDTRACE_DIR).join("bin/ddtrace-run"))
        .arg("/usr/bin/python3")
        .arg(script)
        .args(args)
        .env("PYTHONPATH", DDTRACE_DIR)
        .env("DD_TRACE_OTEL_CTX_ENABLED", "true")
        .env("DD_TRACE_ENABLED", "true")
        .env("DD_TRACE_AGENT_URL", "http://127.0.0.1:9")
        .env("DD_INSTRUMENTATION_TELEMETRY_ENABLED", "false")
        .env("DD_REMOTE_CONFIGURATION_ENABLED", "false")
        .env("DD_TRACE_STARTUP_LOGS", "false")
        .stderr(Stdio::null());
    SpanWriter::spawn(cmd)
}

/// Where the C writer keeps `otel_thread_ctx_v1`: the three ways a
/// process can hold a TLS variable that OTEP 4947 makes readers handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CWriter {
    /// In the executable (initial/local exec: thread pointer + offset).
    Exe,
    /// In a shared library built for TLSDESC, linked at start (static TLS).
    Linked,
    /// The same library `dlopen`ed after start (dynamic TLS, the DTV).
    Dlopened,
}

impl CWriter {
    pub const ALL: [CWriter; 3] = [CWriter::Exe, CWriter::Linked, CWriter::Dlopened];

    pub fn label(self) -> &'static str {
        match self {
            CWriter::Exe => "exe",
            CWriter::Linked => "tlsdesc-linked",
            CWriter::Dlopened => "tlsdesc-dlopen",
        }
    }

    /// The command that runs this variant with `args` (built once), from
    /// `tests/workloads/otel_writer.c`: the variable in the program, or in
    /// its TLSDESC library (`-DOTEL_PART_LIB`, gcc: clang 14 emits no
    /// TLSDESC) linked at start or `dlopen`ed with no static TLS left to
    /// it (glibc then puts its block in dynamic TLS, behind the dtv).
    pub fn command(self, args: &[&str]) -> Command {
        let mut cmd = match self {
            CWriter::Exe => Command::new(workload_variant(
                "otel_writer",
                "otel_writer_exe",
                &["-DOTEL_TLS_IN_EXE", "-rdynamic"],
            )),
            CWriter::Linked => {
                let lib = tlsdesc_library();
                let lib_s = lib.to_string_lossy();
                let rpath = format!("-Wl,-rpath,{}", lib.parent().unwrap().display());
                Command::new(workload_variant(
                    "otel_writer",
                    "otel_writer_desc",
                    &["-DOTEL_TLS_LINKED", "-Wl,--no-as-needed", &lib_s, &rpath],
                ))
            }
            CWriter::Dlopened => {
                let mut cmd = Command::new(workload_variant(
                    "otel_writer",
                    "otel_writer_dlopen",
                    &["-DOTEL_TLS_DLOPEN", "-ldl"],
                ));
                cmd.arg(tlsdesc_library())
                    .env("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=0");
                cmd
            }
        };
        cmd.args(args);
        cmd
    }
}

/// The writer's TLSDESC library.
fn tlsdesc_library() -> PathBuf {
    shared_workload(
        "otel_writer",
        "libotel_writer_desc.so",
        &["-DOTEL_PART_LIB", "-mtls-dialect=gnu2"],
    )
}

/// The command that runs the Rust writer with `args`:
/// `tests/workloads/rust_otel_writer/`, the C writer's default mode in
/// Rust (the variable defined in `.tbss` with `global_asm!`, local exec,
/// exported by its build script), so [`C_ROUTES`] and [`c_attrs`] hold
/// for it. Built once per test run, offline (it has no dependencies), by
/// the cargo running the tests into a target directory of its own: the
/// main one is locked by that cargo.
pub fn rust_writer(args: &[&str]) -> Command {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let bin = BUILT.get_or_init(|| {
        let package =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/rust_otel_writer");
        // CARGO_TARGET_TMPDIR is `<target dir>/tmp`.
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target directory")
            .join("workloads/rust_otel_writer");
        let status = Command::new(env!("CARGO"))
            .args(["build", "--release", "--offline", "--quiet"])
            .arg("--manifest-path")
            .arg(package.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .status()
            .expect("running cargo");
        assert!(status.success(), "building {}", package.display());
        target.join("release/rust_otel_writer")
    });
    let mut cmd = Command::new(bin);
    cmd.args(args);
    cmd
}

/// The daemon's answer for one span (`/spans?pid=&span_id=`): `None` while
/// it does not know the span (404).
pub fn span_detail(url: &str, pid: u32, span: &str) -> Option<Value> {
    let (status, body) = get(&format!("{url}/spans?pid={pid}&span_id={span}"));
    match status {
        200 => {
            let v: Value = serde_json::from_str(&body).unwrap();
            // The span itself, or wrapped as `span` or a one-row `spans`.
            Some(match (&v["span"], &v["spans"]) {
                (Value::Object(_), _) => v["span"].clone(),
                (_, Value::Array(rows)) if rows.len() == 1 => rows[0].clone(),
                _ => v,
            })
        }
        404 => None,
        _ => panic!("/spans?pid={pid}&span_id={span}: {status} {body}"),
    }
}

/// The thread ids of a span's `threads` (plain ids or `{tid, ...}` rows).
pub fn span_tids(span: &Value) -> Vec<u32> {
    let rows = span["threads"].as_array().cloned().unwrap_or_default();
    rows.iter()
        .filter_map(|t| t.as_u64().or_else(|| t["tid"].as_u64()))
        .map(|t| t as u32)
        .collect()
}

/// A span's stacks: `(state, frames root first, us)`, from `top_stacks`
/// (or the detail's `stacks`).
pub fn span_stacks(span: &Value) -> Vec<(String, Vec<String>, u64)> {
    let rows = span["top_stacks"]
        .as_array()
        .or_else(|| span["stacks"].as_array())
        .cloned()
        .unwrap_or_default();
    rows.iter()
        .map(|s| {
            let state = s["state"].as_str().unwrap_or("").to_string();
            let frames = s["stack"].as_str().unwrap_or("");
            let frames = frames.split(';').map(str::to_string).collect();
            (state, frames, s["us"].as_u64().unwrap_or(0))
        })
        .collect()
}

/// What a route's spans must show: the state their time is mostly in and
/// a frame of the wait that explains it.
pub struct Expected {
    pub route: &'static str,
    pub state: &'static str,
    pub frame: fn(&str) -> bool,
}

/// A blocked `pthread_mutex_lock`: libc's lock wait or the kernel's futex.
fn waits_for_lock_c(frame: &str) -> bool {
    frame.contains("futex") || frame.contains("lll_lock_wait") || frame.contains("mutex_lock")
}

/// A blocked read of a pipe or socket, in libc or the kernel.
fn reads_c(frame: &str) -> bool {
    frame.contains("read") || frame.contains("recv")
}

/// The C writer's routes: a mutex another thread holds, a slow read.
pub const C_ROUTES: [Expected; 2] = [
    Expected {
        route: "/lock",
        state: "futex",
        frame: waits_for_lock_c,
    },
    Expected {
        route: "/io",
        state: "sleep",
        frame: reads_c,
    },
];

/// The C writer's attributes: its route and method.
pub fn c_attrs(logged: &LoggedSpan) -> Vec<(&'static str, String)> {
    vec![
        ("http_route", logged.route.clone()),
        ("http_method", "GET".to_string()),
    ]
}

/// Checks the daemon's `span` against the writer's `logged` one: the trace
/// id, `attrs` (name, value), its one thread, its wall time (within 5 % or
/// one sampling period), every nanosecond once across states, the
/// dominant state and the waiting frame. The first mismatch, if any.
pub fn check_span(
    span: &Value,
    logged: &LoggedSpan,
    attrs: &[(&str, String)],
    expected: &Expected,
) -> Result<(), String> {
    let id = &logged.span;
    if span["trace_id"] != logged.trace.as_str() {
        return Err(format!(
            "{id}: trace_id {} != {}",
            span["trace_id"], logged.trace
        ));
    }
    for (name, value) in attrs {
        if span["attrs"][name] != value.as_str() {
            return Err(format!(
                "{id}: attrs.{name} {} != {value}",
                span["attrs"][name]
            ));
        }
    }
    if span_tids(span) != [logged.tid] {
        return Err(format!(
            "{id}: threads {:?} != [{}]",
            span_tids(span),
            logged.tid
        ));
    }
    let wall_ns = span["wall_us"].as_u64().unwrap_or(0) * 1000;
    let period_ns = 1_000_000_000 / SAMPLE_HZ;
    let tolerance = (logged.duration_ns / 20).max(period_ns);
    if wall_ns.abs_diff(logged.duration_ns) > tolerance {
        return Err(format!(
            "{id}: wall {wall_ns} ns, logged {} ns (tolerance {tolerance} ns)",
            logged.duration_ns
        ));
    }
    let states = span["states_us"].as_object().cloned().unwrap_or_default();
    let sum: u64 = states.values().filter_map(Value::as_u64).sum();
    // Each state is rounded to a microsecond on its own.
    if sum.abs_diff(wall_ns / 1000) > states.len() as u64 {
        return Err(format!(
            "{id}: states sum to {sum} us, wall {} us",
            wall_ns / 1000
        ));
    }
    let dominant = states.iter().max_by_key(|(_, us)| us.as_u64().unwrap_or(0));
    if dominant.map(|(s, _)| s.as_str()) != Some(expected.state) {
        return Err(format!(
            "{id} ({}): states {states:?}, wanted mostly {}",
            logged.route, expected.state
        ));
    }
    let explained = span_stacks(span).iter().any(|(state, frames, _)| {
        state == expected.state && frames.iter().any(|f| (expected.frame)(f))
    });
    if !explained {
        return Err(format!(
            "{id} ({}): no {} stack with the expected frame: {}",
            logged.route, expected.state, span["top_stacks"]
        ));
    }
    Ok(())
}

/// Every counter of `/healthz` whose path names the thread context or
/// spans (`lost.otel_context_read_failed`, `refused.otel_ctx.size`, ...),
/// by path.
pub fn span_counters(health: &Value) -> Vec<(String, u64)> {
    fn walk(v: &Value, path: String, out: &mut Vec<(String, u64)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    walk(
                        v,
                        if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        },
                        out,
                    );
                }
            }
            Value::Number(n) => {
                let p = path.to_ascii_lowercase();
                if p.contains("otel") || p.contains("span") {
                    out.extend(n.as_u64().map(|n| (path, n)));
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(health, String::new(), &mut out);
    out
}

/// The counters of [`span_counters`] that grew from `before` to `after`.
pub fn grown(before: &[(String, u64)], after: &[(String, u64)]) -> Vec<String> {
    after
        .iter()
        .filter(|(path, n)| *n > before.iter().find(|(p, _)| p == path).map_or(0, |b| b.1))
        .map(|(path, _)| path.clone())
        .collect()
}
