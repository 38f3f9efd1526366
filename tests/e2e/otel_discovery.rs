//! Discovery of OpenTelemetry thread contexts (`wallscope::otelctx`) on
//! real writers: the C writer of `tests/workloads/otel_writer.c` with its
//! variable in the program (local exec), in a TLSDESC library linked at
//! start, and in the same library `dlopen`ed; and ddtrace's native module
//! (`DD_TRACE_OTEL_CTX_ENABLED=true`). For each, the address discovery
//! computes from a thread's thread pointer (which the writer prints) must
//! be the variable the writer prints, and the record it points to must be
//! one of the requests the writer logs. Forged contexts and records cost
//! bounded work and are counted. No daemon, no eBPF: root reads the
//! writers' memory (a shared turn: the writers are light, but must not
//! run beside a test that runs alone).

use std::{
    collections::HashMap,
    io::BufRead,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use wallscope::{
    bpf::otel::OtelTls,
    collect::spans::SpanKeyNames,
    otelctx::{OtelContexts, OtelProcsSink},
    process::{live, remote::Remote},
    runtime::Runtime,
};

use crate::support::{shared_workload, workload_variant, Fixture, Workload};

/// Longest a writer may take to show what is checked.
const WITHIN: Duration = Duration::from_secs(30);

/// What discovery wrote for BPF.
#[derive(Default)]
struct Sink(Mutex<HashMap<u32, OtelTls>>);
impl OtelProcsSink for Sink {
    fn set(&self, pid: u32, access: OtelTls) {
        self.0.lock().unwrap().insert(pid, access);
    }
    fn remove(&self, pid: u32) {
        self.0.lock().unwrap().remove(&pid);
    }
}

/// The library variant of the writer, with the access model `model`
/// (gcc flags), as `libotel_writer_NAME.so`.
fn library(name: &str, model: &str) -> PathBuf {
    let out = format!("libotel_writer_{name}.so");
    shared_workload("otel_writer", &out, &["-DOTEL_PART_LIB", model])
}

/// The writer linked at start with `lib`, as `out`.
fn linked(out: &str, lib: &Path) -> PathBuf {
    let lib_s = lib.to_string_lossy();
    let rpath = format!("-Wl,-rpath,{}", lib.parent().unwrap().display());
    let flags = ["-DOTEL_TLS_LINKED", "-Wl,--no-as-needed", &lib_s, &rpath];
    workload_variant("otel_writer", out, &flags)
}

/// The C writers: (label, program, arguments before the options, whether
/// glibc must leave no static TLS to `dlopen`: the library's block is then
/// dynamic, reached through the thread's dtv).
fn writers() -> Vec<(&'static str, PathBuf, Vec<String>, bool)> {
    let desc = library("desc", "-mtls-dialect=gnu2");
    let gd = library("gd", "-mtls-dialect=gnu");
    let ie = library("ie", "-ftls-model=initial-exec");
    let path = |p: &Path| vec![p.to_string_lossy().into_owned()];
    let dlopener = workload_variant(
        "otel_writer",
        "otel_writer_dlopen",
        &["-DOTEL_TLS_DLOPEN", "-ldl"],
    );
    let exe = workload_variant(
        "otel_writer",
        "otel_writer_exe",
        &["-DOTEL_TLS_IN_EXE", "-rdynamic"],
    );
    vec![
        ("in the program", exe, vec![], false),
        (
            "TLSDESC library linked",
            linked("otel_writer_desc", &desc),
            vec![],
            false,
        ),
        (
            "initial-exec library linked",
            linked("otel_writer_ie", &ie),
            vec![],
            false,
        ),
        (
            "TLSDESC library dlopen'ed, static TLS",
            dlopener.clone(),
            path(&desc),
            false,
        ),
        (
            "TLSDESC library dlopen'ed, dynamic TLS",
            dlopener.clone(),
            path(&desc),
            true,
        ),
        (
            "general-dynamic library dlopen'ed",
            dlopener,
            path(&gd),
            true,
        ),
    ]
}

/// The address of the variable of the thread whose pointer is `tp`.
fn variable_at(remote: &Remote, access: OtelTls, tp: u64) -> u64 {
    match access {
        OtelTls::Static { tp_offset } => tp.wrapping_add_signed(tp_offset),
        OtelTls::Dtv { module, offset } => {
            let dtv = remote.u64(tp + 8).expect("reading the dtv pointer");
            let block = remote.u64(dtv + 16 * module).expect("reading dtv entry");
            block + offset
        }
    }
}

/// Discovers `pid` until an access is found (a dlopen'ed library may come
/// a moment after start).
fn discover(ctx: &OtelContexts, pid: u32, program: &Path) -> OtelTls {
    let deadline = Instant::now() + WITHIN;
    loop {
        let mappings = live::exec_mappings(pid).expect("reading the writer's maps");
        ctx.discover(pid, &mappings, program.to_str(), Instant::now());
        if let Some(a) = ctx.found(pid).and_then(|f| f.access) {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "no access found: {:?}",
            ctx.found(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Reads the record the variable at `at` points to until it is set:
/// (trace hex, span hex).
fn current_record(remote: &Remote, at: u64) -> (String, String) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let ptr = remote.u64(at).expect("reading the variable");
        if ptr != 0 {
            if let Ok(rec) = remote.bytes(ptr, 28) {
                if rec[24] == 1 {
                    return (hex(&rec[..16]), hex(&rec[16..24]));
                }
            }
        }
        assert!(Instant::now() < deadline, "the variable stayed empty");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn each_c_writer_variant_is_found_and_its_records_read() {
    if !nix_root() {
        return;
    }
    let _turn = Fixture::in_process();
    for (label, bin, pre, dynamic) in writers() {
        let mut cmd = Command::new(&bin);
        cmd.args(&pre).args(["--threads", "2", "--ms", "10"]);
        if dynamic {
            cmd.env("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=0");
        }
        let mut w = Workload::spawn(cmd);
        let mut tls = HashMap::new();
        let mut lines = Vec::new();
        while tls.len() < 2 {
            let mut line = String::new();
            assert!(
                w.stdout().read_line(&mut line).unwrap() > 0,
                "{label}: ended"
            );
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.first() == Some(&"tls") {
                let n = |s: &str| u64::from_str_radix(s, 16).unwrap();
                tls.insert(f[1].to_string(), (n(f[2]), n(f[3])));
            }
            lines.push(line);
        }
        let sink = Arc::new(Sink::default());
        let ctx = OtelContexts::new(sink.clone());
        let access = discover(&ctx, w.pid, &bin);
        assert_eq!(
            matches!(access, OtelTls::Dtv { .. }),
            dynamic,
            "{label}: {access:?}"
        );
        assert_eq!(sink.0.lock().unwrap().get(&w.pid), Some(&access), "{label}");
        let names = ctx.names(w.pid).expect("the key map");
        let names: Vec<&str> = names.iter().map(|n| &**n).collect();
        assert_eq!(names, ["http_route", "http_method"], "{label}");
        let found = ctx.found(w.pid).unwrap();
        let schema = found.context.as_ref().and_then(|c| c.schema.clone());
        assert_eq!(schema.as_deref(), Some("tlsdesc_v1_dev"), "{label}");
        let remote = Remote::new(w.pid);
        for (tid, (tp, slot)) in &tls {
            let at = variable_at(&remote, access, *tp);
            assert_eq!(at, *slot, "{label}: thread {tid} with {access:?}");
            // Its record is a request the writer logs.
            let (trace, span) = current_record(&remote, at);
            let deadline = Instant::now() + WITHIN;
            let want = format!("span {trace} {span} {tid} ");
            while !lines.iter().any(|l| l.starts_with(&want)) {
                assert!(Instant::now() < deadline, "{label}: {want} never logged");
                let mut line = String::new();
                assert!(
                    w.stdout().read_line(&mut line).unwrap() > 0,
                    "{label}: ended"
                );
                lines.push(line);
            }
        }
        eprintln!("{label}: {access:?}, {:?}", ctx.stats());
        Runtime::detach(&*ctx, w.pid);
        assert!(
            sink.0.lock().unwrap().is_empty(),
            "{label}: removed at detach"
        );
    }
}

fn nix_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// ddtrace's native module: its variable is found, its key map read, and
/// the record a thread's variable points to is a span the service logs.
#[test]
fn ddtrace_is_found_and_its_records_read() {
    let ddtrace = Path::new("/opt/wallscope-ddtrace");
    if !nix_root() || !ddtrace.join("bin/ddtrace-run").exists() {
        return;
    }
    let _turn = Fixture::in_process();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/python/otel_ddtrace.py");
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(ddtrace.join("bin/ddtrace-run"))
        .arg("/usr/bin/python3")
        .arg(&script)
        .env("PYTHONPATH", ddtrace)
        .env("DD_TRACE_OTEL_CTX_ENABLED", "true")
        .env("DD_TRACE_ENABLED", "true")
        .env("DD_TRACE_AGENT_URL", "http://127.0.0.1:9")
        .env("DD_INSTRUMENTATION_TELEMETRY_ENABLED", "false")
        .env("DD_REMOTE_CONFIGURATION_ENABLED", "false")
        .env("DD_SERVICE", "otel-discovery");
    let mut w = Workload::spawn(cmd);
    let mut lines = Vec::new();
    let (tid, tp) = loop {
        let mut line = String::new();
        assert!(
            w.stdout().read_line(&mut line).unwrap() > 0,
            "ddtrace ended"
        );
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() == Some(&"tls") {
            break (f[1].to_string(), u64::from_str_radix(f[2], 16).unwrap());
        }
    };
    let sink = Arc::new(Sink::default());
    let ctx = OtelContexts::new(sink.clone());
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let access = discover(&ctx, w.pid, &python);
    let found = ctx.found(w.pid).unwrap();
    let context = found.context.expect("ddtrace's process context");
    assert!(context.schema.is_some(), "{context:?}");
    assert!(!context.key_names.is_empty(), "{context:?}");
    let service = context
        .resource
        .iter()
        .find(|(k, _)| &**k == "service.name");
    assert_eq!(service.map(|(_, v)| &**v), Some("otel-discovery"));
    let remote = Remote::new(w.pid);
    let at = variable_at(&remote, access, tp);
    let (trace, span) = current_record(&remote, at);
    let want = format!("span {trace} {span} {tid}");
    let deadline = Instant::now() + WITHIN;
    while !lines.iter().any(|l: &String| l.trim() == want) {
        assert!(Instant::now() < deadline, "{want} never logged: {lines:?}");
        let mut line = String::new();
        assert!(
            w.stdout().read_line(&mut line).unwrap() > 0,
            "ddtrace ended"
        );
        lines.push(line);
    }
    eprintln!("ddtrace: {access:?}, {context:?}");
}

/// A forged process context (a huge payload size, a payload pointer into
/// nowhere, `published_at_ns` changing all the time) costs bounded work,
/// backs its polls off and is counted; a writer beside it is read as
/// usual.
#[test]
fn a_forged_context_is_refused_counted_and_polled_less_and_less() {
    if !nix_root() {
        return;
    }
    let _turn = Fixture::in_process();
    let bin = workload_variant(
        "otel_writer",
        "otel_writer_exe",
        &["-DOTEL_TLS_IN_EXE", "-rdynamic"],
    );
    let forger = Workload::start(&bin, &["--threads", "1", "--forge-ctx", "--tls-unmapped"]);
    let honest = Workload::start(&bin, &["--threads", "1"]);
    let sink = Arc::new(Sink::default());
    let ctx = OtelContexts::new(sink.clone());
    discover(&ctx, forger.pid, &bin);
    discover(&ctx, honest.pid, &bin);
    let pids = [forger.pid, honest.pid].into_iter().collect();
    let polls = 300;
    let mut now = Instant::now();
    for _ in 0..polls {
        now += Duration::from_secs(1);
        ctx.synchronize(&pids, now, Instant::now() + Duration::from_secs(1));
    }
    let stats = ctx.stats();
    let refused = stats.ctx_refused + stats.ctx_too_big + stats.ctx_unstable;
    assert!(refused > 0, "{stats:?}");
    // Polled each second at first, then less and less while refused: far
    // fewer reads than polls (a valid moment resets the pace).
    assert!(stats.ctx_rereads < polls / 4, "{stats:?}");
    let names = ctx.names(honest.pid).expect("the honest writer's key map");
    assert_eq!(names.len(), 2);
    assert_eq!(
        sink.0.lock().unwrap().len(),
        2,
        "both variables found: {stats:?}"
    );
    eprintln!("forged: {stats:?}");
}
