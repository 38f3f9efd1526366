//! The OpenTelemetry thread context as the BPF programs read it, without
//! the daemon: the test loads the programs, registers its C writer's TLS
//! variable in `otel_procs` as discovery will (in the executable: static
//! TLS, the thread pointer plus the offset the writer prints; in a
//! dlopen'ed library: its dtv module and offset), and checks each span's
//! exact time against the duration the writer measured itself, its
//! record, its CPU stack rows, and that time under no span goes to none.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use wallscope::{
    bpf::{self, abi::Stat, otel::OtelTls, ProbeOptions},
    collect::{Drainer, RawBatch, RecordKind},
    profile::model::{spans::SpanId, state::State},
};

use super::support::fixture::Fixture;

/// The writer's sources (with their header, `otel_record.h`).
const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/otel_capture");
/// The sampling frequency, and its period (ns).
const FREQUENCY_HZ: u64 = 1000;
const PERIOD_NS: u64 = 1_000_000_000 / FREQUENCY_HZ;

/// What the drains saw of the writer's process.
#[derive(Default)]
struct Seen {
    /// Wall time per (tid, span), all states.
    wall: HashMap<(u32, SpanId), u64>,
    /// CPU stack rows per span.
    cpu_rows: HashMap<SpanId, u64>,
    /// Records: trace id and attribute bytes.
    records: HashMap<SpanId, ([u8; 16], Vec<u8>)>,
    /// Each thread's total time (all states).
    totals: HashMap<u32, u64>,
    reads: u64,
    read_failed: u64,
}

impl Seen {
    fn add(&mut self, pid: u32, b: RawBatch) {
        for t in b.span_times.iter().filter(|t| t.pid == pid) {
            *self.wall.entry((t.tid, t.span)).or_default() += t.ns.iter().sum::<u64>();
        }
        for r in b.records.iter().filter(|r| r.pid == pid) {
            if let (Some(span), RecordKind::Time(State::Cpu)) = (r.span, r.kind) {
                *self.cpu_rows.entry(span).or_default() += r.count;
            }
        }
        for r in b.span_records.into_iter().filter(|r| r.pid == pid) {
            self.records.insert(r.span, (r.trace.0, r.attrs));
        }
        for t in b.threads.iter().filter(|t| t.pid == pid) {
            *self.totals.entry(t.tid).or_default() += t.counters.ns.iter().sum::<u64>();
        }
        self.reads += b.stats[Stat::OtelReads as usize];
        self.read_failed += b.stats[Stat::OtelReadFailed as usize];
    }
}

/// How the writer is built and run.
#[derive(Debug, Clone, Copy)]
enum Variant {
    /// Its variable in the executable: static TLS.
    Executable,
    /// In a library loader.c loads with dlopen: dynamic TLS, general
    /// dynamic (`__tls_get_addr`).
    Library,
}

fn clang(args: &[&str], out: &Path, src: &Path) {
    let built = Command::new("clang")
        .args(["-O2", "-pthread"])
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .expect("running clang");
    assert!(built.success(), "building {}", out.display());
}

/// The writer's command line, built in `dir`.
fn writer(dir: &Path, variant: Variant) -> Command {
    let src = Path::new(SOURCES).join("writer.c");
    match variant {
        Variant::Executable => {
            let exe = dir.join("writer");
            clang(&["-rdynamic"], &exe, &src);
            Command::new(exe)
        }
        Variant::Library => {
            let lib = dir.join("writer.so");
            clang(&["-fPIC", "-shared", "-DWRITER_LIBRARY"], &lib, &src);
            let loader = dir.join("loader");
            clang(&["-ldl"], &loader, &Path::new(SOURCES).join("loader.c"));
            let mut cmd = Command::new(loader);
            cmd.arg(lib);
            cmd
        }
    }
}

/// Where the writer said its variable is.
fn location(line: &str) -> OtelTls {
    let fields: Vec<&str> = line.split_whitespace().collect();
    match fields[..] {
        ["tp_offset", offset] => OtelTls::Static {
            tp_offset: offset.parse().unwrap(),
        },
        ["dtv", module, offset] => OtelTls::Dtv {
            module: module.parse().unwrap(),
            offset: offset.parse().unwrap(),
        },
        _ => panic!("writer said {line:?}"),
    }
}

#[test]
fn span_times_match_what_the_writer_measured() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    for variant in [Variant::Executable, Variant::Library] {
        check(variant);
    }
}

fn check(variant: Variant) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = writer(dir.path(), variant);
    let (probes, mut maps) =
        bpf::load(&ProbeOptions::plain(FREQUENCY_HZ)).expect("loading the programs");
    let mut otel = maps.otel_procs.take().unwrap();
    let mut drainer = Drainer::new(maps, probes.recording_since);

    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    otel.set(pid, location(&line)).unwrap();
    let lines = thread::spawn(move || out.lines().map_while(Result::ok).collect::<Vec<_>>());
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();

    let mut seen = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the writer did not finish");
        thread::sleep(Duration::from_millis(200));
        seen.add(pid, drainer.drain().unwrap());
    }
    seen.add(pid, drainer.drain().unwrap());
    otel.remove(pid);
    drop(probes);

    let logged: Vec<(SpanId, u32, u64)> = lines
        .join()
        .unwrap()
        .iter()
        .filter_map(|l| {
            let mut f = l.strip_prefix("span ")?.split(' ');
            Some((
                SpanId::parse(f.next()?)?,
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
            ))
        })
        .collect();
    assert_eq!(logged.len(), 24, "the writer's spans");
    assert!(seen.reads > 0);
    eprintln!(
        "{variant:?}: context reads {}, failed {}",
        seen.reads, seen.read_failed
    );
    let mut per_thread: HashMap<u32, u64> = HashMap::new();
    let worst = (logged.iter())
        .map(|(s, t, ns)| seen.wall.get(&(*t, *s)).copied().unwrap_or(0).abs_diff(*ns))
        .max();
    eprintln!("{variant:?}: worst span time error: {worst:?} ns");
    for (span, tid, ns) in &logged {
        let wall = seen.wall.get(&(*tid, *span)).copied().unwrap_or(0);
        let tolerance = (ns / 20).max(PERIOD_NS);
        assert!(
            wall.abs_diff(*ns) <= tolerance,
            "{variant:?}: span {} of tid {tid}: {wall} ns measured, {ns} ns logged",
            span.hex()
        );
        *per_thread.entry(*tid).or_default() += wall;
        assert!(
            seen.cpu_rows.get(span).copied().unwrap_or(0) > 0,
            "span {} has no CPU rows",
            span.hex()
        );
        let (trace, attrs) = seen.records.get(span).expect("the span's record");
        let w = span.0[0] - 0xa0;
        assert_eq!(*trace, [0x10 + w; 16]);
        let route = format!("/w{w}");
        assert_eq!(attrs[..2], [0, route.len() as u8]);
        assert_eq!(&attrs[2..], route.as_bytes());
    }
    // No span but the writer's, and the pauses between them (20 ms each,
    // under no span) are in the threads' totals only.
    let spans: std::collections::HashSet<_> = logged.iter().map(|(s, t, _)| (*t, *s)).collect();
    assert!(
        seen.wall.keys().all(|k| spans.contains(k)),
        "spans never written"
    );
    for (tid, in_spans) in per_thread {
        let total = seen.totals.get(&tid).copied().unwrap_or(0);
        assert!(
            total >= in_spans + 12 * 15_000_000,
            "tid {tid}: {total} ns in all, {in_spans} ns in spans"
        );
    }
}
