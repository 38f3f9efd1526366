//! JIT symbolization cost, issue #4: "a perf map with 50,000 entries is loaded
//! and a 10,000-stack query over it answers in under 200 ms".
//!
//! The bench plays the JVM: it maps an anonymous r-x region, writes
//! `/tmp/perf-<own pid>.map` with 50,000 JDK-17-style entries over it and
//! builds a batch of 10,000 distinct CPU stacks of its own pid (20-40 frames,
//! JIT ones plus native ones of this binary). Each round, with a fresh
//! `Symbolizer`, times (1) the first symbolize (reads the perf map and
//! `/proc/PID/maps`), (2) `Store::push` and the `/folded?pid=` fold and text,
//! (3) both, then the same for a second batch through the warm symbolizer;
//! wall and thread CPU time (their gap is waiting for a CPU on a busy host).
//! Every frame and row is checked (exit 1 if wrong); the timing verdict is
//! reported, not enforced. No eBPF, no root. Env: `WS_BENCH_ROUNDS` (default 7).

#[path = "common/mod.rs"]
mod common;

use anyhow::{ensure, Context, Result};
use std::time::{Duration, Instant, SystemTime};
use std::{fmt::Write, fs, hint::black_box, path::PathBuf, sync::Arc};
use wallscope::collect::{RawBatch, RawRecord, RecordKind};
use wallscope::perfmap::READ_STEP_BYTES;
use wallscope::profile::model::state::{State, STAT_COUNTERS};
use wallscope::profile::{
    model::{store::Store, Slice},
    report::{query, render},
};
use wallscope::symbolize::Symbolizer;

const ENTRIES: usize = 50_000;
const STACKS: usize = 10_000;
const BUDGET_MS: f64 = 200.0;
/// One sample at 99 Hz.
const SAMPLE_NS: u64 = 10_101_010;

// Words of the generated Java names.
const PKGS: &str = "com.acme org.example io.netty org.springframework java.util jdk.internal";
const SUBS: &str = "service http codec util internal cache concurrent handler json db";
const NOUNS: &str = "Order Request Buffer Channel Session Invoice Parser Executor Queue Token";
const SUFFIXES: &str = " Impl Handler Factory Manager Support";
const VERBS: &str = "get process handle encode decode apply read write lookup invoke";
const TYPES: &str = "int long boolean java.lang.String java.lang.Object byte[] java.util.List \
                     java.util.Map java.nio.ByteBuffer java.lang.Object[]";

macro_rules! native_frames {
    ($($name:ident),*) => {
        $(#[inline(never)] fn $name() -> &'static str { black_box(stringify!($name)) })*
        /// Native frames of this binary: two thread roots, two leaves.
        const NATIVE: [(fn() -> &'static str, &str); 4] = [$(($name, stringify!($name))),*];
    };
}
native_frames!(thread_start, call_helper, native_park, native_copy);

/// splitmix64: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }

    fn pick<'a>(&mut self, words: &'a str) -> &'a str {
        let words: Vec<&str> = words.split(' ').collect();
        words[self.below(words.len() as u64) as usize]
    }
}

/// One JIT method: where it is in the region, its perf map name and the
/// frame wallscope must show for it.
struct Method {
    offset: u64,
    size: u64,
    entry: String,
    frame: String,
}

fn method(rng: &mut Rng, i: usize, offset: u64) -> Method {
    let mut class = rng.pick(PKGS).to_string();
    for _ in 0..rng.below(4) {
        class = class + "." + rng.pick(SUBS);
    }
    class = class + "." + rng.pick(NOUNS) + rng.pick(NOUNS) + rng.pick(SUFFIXES);
    let (verb, noun) = (rng.pick(VERBS), rng.pick(NOUNS));
    let lambda = format!("$$Lambda${i}/0x0000000800c{i:05x}");
    let (class, name) = match rng.below(20) {
        0 => (class + &lambda, "run".to_string()),
        1..=3 => (class + "$" + noun, format!("{verb}{i}")),
        _ => (class, format!("{verb}{noun}{i}")),
    };
    let ret = [rng.pick(TYPES), "void"][(rng.below(3) == 0) as usize];
    let args: Vec<&str> = (0..rng.below(5)).map(|_| rng.pick(TYPES)).collect();
    // Code blob sizes: mostly small methods, some big ones.
    let size = match rng.below(100) {
        0..=76 => 0x40 + rng.below(0x3c0),
        77..=96 => 0x400 + rng.below(0xc00),
        _ => 0x1000 + rng.below(0x2000),
    };
    let entry = format!("{ret} {class}.{name}({})", args.join(", "));
    // Named as async-profiler does: lambdas and hidden classes without
    // their run-to-run numbers.
    let frame = format!(
        "{}_[j]",
        wallscope::perfmap::names::stable_name(&format!("{class}.{name}"))
    );
    Method {
        offset,
        size,
        entry,
        frame,
    }
}

/// The fake JIT code cache: the mapping and its perf map, both removed on drop.
struct CodeCache {
    base: u64,
    len: usize,
    methods: Vec<Method>,
    map: PathBuf,
}

impl CodeCache {
    fn create(rng: &mut Rng) -> Result<CodeCache> {
        let mut methods: Vec<Method> = Vec::with_capacity(ENTRIES);
        for i in 0..ENTRIES {
            let end = methods.last().map_or(0, |m| m.offset + m.size);
            // An nmethod header before the code, code aligned to 32 bytes.
            let offset = (end + 0x40 + rng.below(0x40) + 31) & !31;
            methods.push(method(rng, i, offset));
        }
        let len = methods.last().map_or(0, |m| m.offset + m.size) as usize;
        let len = len.next_multiple_of(2 << 20);
        let prot = libc::PROT_READ | libc::PROT_EXEC;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a fresh private anonymous mapping; only its addresses are used.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        let err = std::io::Error::last_os_error();
        ensure!(base != libc::MAP_FAILED, "mmap: {err}");
        let map = PathBuf::from(format!("/tmp/perf-{}.map", std::process::id()));
        let cache = CodeCache {
            base: base as u64,
            len,
            methods,
            map,
        };
        let mut text = String::new();
        for m in &cache.methods {
            let start = cache.base + m.offset;
            writeln!(text, "{start:#018x} {:#018x} {}", m.size, m.entry)?;
        }
        fs::write(&cache.map, text).with_context(|| format!("writing {}", cache.map.display()))?;
        Ok(cache)
    }
}

impl Drop for CodeCache {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.map);
        // SAFETY: unmaps exactly the mapping made in `create`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// A frame of a generated stack: a JIT method or a native function.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Site {
    Jit(u32),
    Native(u8),
}

/// Stacks, leaf first: two native roots, JIT frames, sometimes a native
/// leaf. With 18+ random JIT frames each, they are distinct (and checked to be).
fn stacks(rng: &mut Rng) -> Vec<Vec<Site>> {
    let mut out = Vec::with_capacity(STACKS);
    while out.len() < STACKS {
        let depth = 20 + rng.below(21) as usize;
        let mut s = Vec::with_capacity(depth);
        if rng.below(100) < 15 {
            s.push(Site::Native(2 + rng.below(2) as u8));
        }
        while s.len() < depth - 2 {
            s.push(Site::Jit(rng.below(ENTRIES as u64) as u32));
        }
        s.extend([Site::Native(1), Site::Native(0)]);
        out.push(s);
    }
    out
}

/// A drained batch of `stacks`, with instruction pointers strictly inside
/// each site (a caller's ip, less one, must stay in its function).
fn batch(cache: &CodeCache, rng: &mut Rng, stacks: &[Vec<Site>]) -> RawBatch {
    let pid = std::process::id();
    let mut ip = |site: &Site| match *site {
        Site::Jit(i) => {
            let m = &cache.methods[i as usize];
            cache.base + m.offset + 1 + rng.below(m.size - 1)
        }
        Site::Native(k) => NATIVE[k as usize].0 as usize as u64 + 4,
    };
    let mut records = Vec::with_capacity(stacks.len());
    for (i, s) in stacks.iter().enumerate() {
        records.push(RawRecord {
            pid,
            tid: pid + (i % 32) as u32,
            kind: RecordKind::Time(State::Cpu),
            comm: format!("worker-{}", i % 32),
            syscall: None,
            user_stack: Some(s.iter().map(&mut ip).collect::<Arc<[u64]>>()),
            kernel_stack: None,
            ns: SAMPLE_NS * (1 + i as u64 % 3),
            count: 1 + i as u64 % 3,
            span: None,
        });
    }
    RawBatch {
        end: SystemTime::now(),
        interval: Duration::from_secs(1),
        records,
        threads: Vec::new(),
        runq_hists: Vec::new(),
        kept_off: Vec::new(),
        sleeps: Vec::new(),
        live: Vec::new(),
        span_times: Vec::new(),
        span_records: Vec::new(),
        stats: [0; STAT_COUNTERS],
        missing_stacks: 0,
        drain_time: Duration::ZERO,
    }
}

/// Fails unless every frame of every sample is the one expected.
fn check_slice(cache: &CodeCache, slice: &Slice, stacks: &[Vec<Site>]) -> Result<()> {
    ensure!(slice.samples.len() == stacks.len(), "wrong sample count");
    for (sample, sites) in slice.samples.iter().zip(stacks) {
        let frames = sample.stack.iter().zip(sites.iter().rev());
        let ok = sample.stack.len() == sites.len()
            && frames.into_iter().all(|(frame, site)| match *site {
                Site::Jit(i) => **frame == *cache.methods[i as usize].frame,
                Site::Native(k) => frame.contains(NATIVE[k as usize].1),
            });
        let wrong =
            sample
                .stack
                .iter()
                .zip(sites.iter().rev())
                .find(|(frame, site)| match **site {
                    Site::Jit(i) => ***frame != *cache.methods[i as usize].frame,
                    Site::Native(k) => !frame.contains(NATIVE[k as usize].1),
                });
        let want = wrong.map(|(_, site)| match *site {
            Site::Jit(i) => cache.methods[i as usize].frame.clone(),
            Site::Native(k) => NATIVE[k as usize].1.to_string(),
        });
        ensure!(
            ok,
            "stack {:?} is not {sites:?}: {:?} where {want:?} was expected",
            sample.stack,
            wrong.map(|(frame, _)| frame)
        );
    }
    Ok(())
}

/// Store push and what `/folded?pid=` computes; returns the text.
fn query(slice: Slice) -> String {
    let mut store = Store::new(Duration::from_secs(600));
    store.push(slice);
    let window = wallscope::profile::model::window::Window::last(60, SystemTime::now());
    let filter = query::Filter::cpu(Some(std::process::id()), None, window);
    render::folded_text(&query::folded(&store.snapshot(), &filter))
}

/// Fails unless there is one row per stack, each `process;thread_start;...`.
fn check_folded(text: &str, process: &str) -> Result<()> {
    let rows = text.lines().count();
    ensure!(rows == STACKS, "{rows} folded rows, want {STACKS}");
    let ok = |l: &str| {
        let mut frames = l.split(';');
        frames.next() == Some(process) && frames.next().is_some_and(|f| f.contains(NATIVE[0].1))
    };
    let bad = text.lines().find(|l| !ok(l));
    ensure!(bad.is_none(), "bad folded row {bad:?}");
    Ok(())
}

/// Wall and thread CPU milliseconds.
type Time = [f64; 2];

fn thread_cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Time) {
    let (wall, cpu) = (Instant::now(), thread_cpu_ms());
    let out = f();
    let ms = [wall.elapsed().as_secs_f64() * 1e3, thread_cpu_ms() - cpu];
    (out, ms)
}

/// One round: cold symbolize, cold query, warm symbolize, warm query, and
/// the perf map read in steps by a fresh symbolizer (one-stack batches).
fn round(cache: &CodeCache, batches: &[(RawBatch, Vec<Vec<Site>>); 2]) -> Result<[Time; 5]> {
    let records = batches[0].0.records[..1].to_vec();
    let one = RawBatch {
        records,
        ..batches[0].0.clone()
    };
    let mut times = [[0.0; 2]; 5];
    // A perf map is read in steps of at most READ_STEP_BYTES a batch (a
    // map another user writes may not hold up a drain): one-stack batches
    // until all of it is read, so that every frame of the big batch can
    // be named.
    let steps = fs::metadata(&cache.map)?.len() / READ_STEP_BYTES + 1;
    let mut symbolizer = Symbolizer::new();
    times[4] = timed(|| {
        for _ in 0..steps {
            let one = RawBatch {
                end: SystemTime::now(),
                ..one.clone()
            };
            symbolizer.symbolize(one);
        }
    })
    .1;
    for (i, (batch, stacks)) in batches.iter().enumerate() {
        let batch = RawBatch {
            end: SystemTime::now(),
            ..batch.clone()
        };
        let (slice, t) = timed(|| symbolizer.symbolize(batch).slice);
        check_slice(cache, &slice, stacks)?;
        let process = slice.processes[&std::process::id()].to_string();
        let (text, q) = timed(|| query(slice));
        check_folded(&text, &process)?;
        (times[2 * i], times[2 * i + 1]) = (t, q);
    }
    Ok(times)
}

/// The memory budget the bench runs with (`--memory-mb`).
const BENCH_BUDGET_MB: u64 = 2048;

fn main() {
    common::main("jvm_symbols", run);
}

fn run() -> Result<()> {
    // The bench binary (with its debug info) is larger than the default
    // budget's per-process share of mapped ELF files: a larger budget, so
    // that its native frames are named as before that bound.
    let split = wallscope::budget::Split::new(BENCH_BUDGET_MB, &wallscope::budget::bases(), &[])
        .map_err(|e| anyhow::anyhow!("budget: {e}"))?;
    wallscope::budget::install(split);
    // The bench measures the symbolizer's cost, not the per-user CPU
    // budget's refusals: the bench's user may use a whole CPU.
    wallscope::budget::cpu::install(1000);
    let rounds = common::env_u64("WS_BENCH_ROUNDS", 7)? as usize;
    let load_before = fs::read_to_string("/proc/loadavg")?;
    let mut rng = Rng(0x5eed);
    let cache = CodeCache::create(&mut rng)?;
    let batches = [0, 1].map(|_| {
        let s = stacks(&mut rng);
        (batch(&cache, &mut rng, &s), s)
    });
    let runs = (0..rounds)
        .map(|_| round(&cache, &batches))
        .collect::<Result<Vec<_>>>()?;

    // Median wall, max wall and median CPU ms of the sum of `steps`.
    let stat = |steps: &[usize]| {
        let sum = |r: &[Time; 5], k: usize| steps.iter().map(|&s| r[s][k]).sum::<f64>();
        let wall: Vec<f64> = runs.iter().map(|r| sum(r, 0)).collect();
        let max = wall.iter().copied().fold(0.0, f64::max);
        let cpu = common::median(runs.iter().map(|r| sum(r, 1))).unwrap_or(0.0);
        [common::median(wall).unwrap_or(0.0), max, cpu]
    };
    let steps: [(&str, &[usize]); 7] = [
        (
            "(1) first symbolize: /proc/PID/maps, ELF, the map's frames",
            &[0],
        ),
        (
            "(1a) before it, loading: the perf map read in 2 MiB steps (one-stack batches)",
            &[4],
        ),
        ("(2) store push + `/folded?pid=` fold and text", &[1]),
        ("(3) total (1a) + (1) + (2)", &[4, 0, 1]),
        ("warm: symbolize a second batch", &[2]),
        ("warm: store push + fold and text", &[3]),
        ("warm: total", &[2, 3]),
    ];
    let row = |(name, s): &(&str, &[usize])| {
        let cells = stat(s).map(|v| format!("{v:.1}"));
        [name.to_string()].into_iter().chain(cells).collect()
    };
    let rows: Vec<Vec<String>> = steps.iter().map(row).collect();
    let [med, max, cpu] = stat(&[4, 0, 1]);
    let verdict = if max < BUDGET_MS {
        format!("PASS: total < {BUDGET_MS:.0} ms")
    } else {
        format!("FAIL: total >= {BUDGET_MS:.0} ms")
    };

    let sites = batches[0].1.iter().flatten();
    let frames = sites.clone().count();
    let native = sites.filter(|s| matches!(s, Site::Native(_))).count();
    let lens = || cache.methods.iter().map(|m| m.entry.len());
    let lmed = common::median(lens().map(|l| l as f64)).unwrap_or(0.0);
    let cpuinfo = fs::read_to_string("/proc/cpuinfo")?;
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name\t: "));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let (date, kernel, load) = common::system()?;
    let header = ["step", "median ms", "max ms", "median CPU ms"];
    let report = format!(
        "# JIT symbolization cost (issue #4)\n\n- date: {date}\n- kernel: {kernel}\n\
         - CPU: {model} ({cpus} CPUs)\n- load average before / after: {before} / {load}\n\
         - perf map: {ENTRIES} JDK-17-style entries (`0x... 0x... RET pkg.Cls.method(ARGS)`), \
         {kib} KiB, names {lmin}-{lmax} chars (median {lmed}), over a {mib} MiB anonymous \
         r-x mapping\n- batch: {STACKS} distinct CPU stacks of the bench process, 20-40 frames \
         ({frames} frames: {jit} JIT, {native} native from the bench binary), no kernel stacks\n\
         - {rounds} rounds, each with a fresh `Symbolizer` (files in the page cache); warm = a \
         second batch of {STACKS} new stacks through the same symbolizer; CPU = the thread's \
         CPU time\n\n{table}\nVerdict (worst round of (3), wall): {verdict} (median {med:.1} ms, \
         max {max:.1} ms, median CPU {cpu:.1} ms)\n",
        before = load_before.trim(),
        model = model.unwrap_or("unknown"),
        kib = fs::metadata(&cache.map)?.len() >> 10,
        lmin = lens().min().unwrap_or(0),
        lmax = lens().max().unwrap_or(0),
        mib = cache.len >> 20,
        jit = frames - native,
        table = common::table(&header, &rows),
    );
    drop(cache);
    common::write_report("jvm_symbols", &report)?;
    println!("{verdict}");
    Ok(())
}
