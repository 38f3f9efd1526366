//! On-CPU sampling overhead: throughput of a CPU-bound workload with nothing
//! attached, with wallscope sampling, and with `perf record -a -g`, measured
//! round-robin in one run. Prints a table and writes `bench/results/oncpu.md`.
//!
//! Needs root. Env: `WS_BENCH_ROUNDS` (default 5), `WS_BENCH_SECONDS` (default 5).

use anyhow::{bail, ensure, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};
use std::{fmt, fs};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Time a profiler gets to attach before the workload starts.
const SETTLE: Duration = Duration::from_secs(1);
/// A bit more than the daemon's 1 s drain interval, so `/healthz` has
/// counted the workload's last samples.
const DRAIN_WAIT: Duration = Duration::from_millis(1200);

/// What is attached during a run; the number is the sampling frequency in Hz.
#[derive(Clone, Copy, PartialEq)]
enum Profiler {
    Baseline,
    Wallscope(u64),
    Perf(u64),
}

/// The configurations, in the order they run each round.
const CONFIGS: [Profiler; 5] = [
    Profiler::Baseline,
    Profiler::Wallscope(99),
    Profiler::Wallscope(999),
    Profiler::Perf(99),
    Profiler::Perf(999),
];

impl fmt::Display for Profiler {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Profiler::Baseline => write!(f, "baseline"),
            Profiler::Wallscope(hz) => write!(f, "wallscope {hz} Hz"),
            Profiler::Perf(hz) => write!(f, "perf -a -g {hz} Hz"),
        }
    }
}

/// Fixed inputs shared by every run.
struct Setup {
    workload: PathBuf,
    daemon: PathBuf,
    tmp: tempfile::TempDir,
    seconds: u64,
    cpus: usize,
}

/// What one run measured: workload iterations/s, samples the profiler took
/// and the CPU seconds the profiler process used.
struct Run {
    throughput: f64,
    samples: Option<u64>,
    tool_cpu_s: Option<f64>,
}

impl Run {
    fn new(throughput: f64, samples: Option<u64>, tool_cpu_s: Option<f64>) -> Self {
        Run {
            throughput,
            samples,
            tool_cpu_s,
        }
    }
}

/// A child process, killed if dropped while still running.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Guard {
    /// Sends `sig` and waits up to 30 s for the process to exit.
    fn stop(&mut self, sig: libc::c_int) -> Result<()> {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.0.id() as libc::pid_t, sig) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.0.try_wait()?.is_none() {
            ensure!(Instant::now() < deadline, "signal {sig} ignored");
            sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// User + system CPU seconds the process has used so far.
    fn cpu_seconds(&self) -> Result<f64> {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.0.id()))?;
        let after_comm = stat.rsplit_once(')').context("bad /proc/PID/stat")?.1;
        let f: Vec<&str> = after_comm.split_whitespace().collect();
        let ticks = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
        // SAFETY: sysconf has no preconditions.
        Ok(ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("oncpu bench: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("must run as root: wallscope loads eBPF programs and perf samples every CPU");
    }
    let rounds = env_u64("WS_BENCH_ROUNDS", 5)? as usize;
    let tmp = tempfile::tempdir()?;
    let setup = Setup {
        workload: build_workload(tmp.path())?,
        daemon: daemon_binary()?,
        tmp,
        seconds: env_u64("WS_BENCH_SECONDS", 5)?,
        cpus: std::thread::available_parallelism()?.get(),
    };
    let mut runs: Vec<Vec<Run>> = CONFIGS.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        // Rotate the start so no configuration always runs first.
        for i in (0..CONFIGS.len()).map(|i| (i + round - 1) % CONFIGS.len()) {
            let p = CONFIGS[i];
            let r = measure(&setup, p).with_context(|| format!("round {round}, {p}"))?;
            let name = p.to_string();
            eprintln!(
                "round {round}/{rounds} {name:<18} {:>9.1} it/s",
                r.throughput
            );
            runs[i].push(r);
        }
    }
    let report = render(&setup, rounds, &runs)?;
    print!("{report}");
    let out = Path::new(ROOT).join("bench/results/oncpu.md");
    fs::create_dir_all(Path::new(ROOT).join("bench/results"))?;
    fs::write(&out, report).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

fn env_u64(name: &str, default: u64) -> Result<u64> {
    let Ok(s) = std::env::var(name) else {
        return Ok(default);
    };
    match s.parse() {
        Ok(v) if v > 0 => Ok(v),
        _ => bail!("{name}={s:?} is not a positive integer"),
    }
}

/// Runs `cmd` to completion, failing with its stderr if it fails.
fn check(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "{cmd:?} failed: {stderr}");
    Ok(())
}

fn build_workload(dir: &Path) -> Result<PathBuf> {
    let out = dir.join("cpu_shares");
    let flags = "-O1 -g -fno-omit-frame-pointer -fno-inline -pthread -o".split(' ');
    let src = Path::new(ROOT).join("tests/workloads/cpu_shares.c");
    check(Command::new("gcc").args(flags).arg(&out).arg(src))?;
    Ok(out)
}

/// The release daemon, built first if missing.
fn daemon_binary() -> Result<PathBuf> {
    let bin = Path::new(ROOT).join("target/release/wallscope");
    if !bin.exists() {
        eprintln!("building {}", bin.display());
        let args = ["build", "--release", "--bin", "wallscope"];
        check(Command::new("cargo").args(args).current_dir(ROOT))?;
    }
    Ok(bin)
}

/// One workload run with `p` attached.
fn measure(setup: &Setup, p: Profiler) -> Result<Run> {
    let log = setup.tmp.path().join("profiler.log");
    let perf_data = setup.tmp.path().join("perf.data");
    let port = free_port()?;
    let (mut cmd, stop_signal) = match p {
        Profiler::Baseline => {
            let throughput = workload(setup)?;
            return Ok(Run::new(throughput, None, None));
        }
        Profiler::Wallscope(hz) => {
            let mut c = Command::new(&setup.daemon);
            c.args(["serve", "--frequency", &hz.to_string()]);
            c.arg("--listen").arg(format!("127.0.0.1:{port}"));
            (c, libc::SIGTERM)
        }
        Profiler::Perf(hz) => {
            let mut c = Command::new("perf");
            c.args("record -a -g -e cpu-clock -o".split(' '))
                .arg(&perf_data);
            c.arg("-F").arg(hz.to_string());
            (c, libc::SIGINT)
        }
    };
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let mut tool = Guard(cmd.stderr(fs::File::create(&log)?).spawn()?);
    let log = || fs::read_to_string(&log).unwrap_or_default();
    let wallscope = matches!(p, Profiler::Wallscope(_));
    if wallscope {
        wait_healthy(&mut tool, port).with_context(|| format!("log:\n{}", log()))?;
    }
    sleep(SETTLE);
    if let Some(status) = tool.0.try_wait()? {
        bail!("profiler exited with {status}; log:\n{}", log());
    }
    let before = if wallscope { samples(port)? } else { 0 };
    let throughput = workload(setup)?;
    let mut taken = None;
    if wallscope {
        sleep(DRAIN_WAIT);
        taken = Some(samples(port)?.saturating_sub(before));
    }
    let tool_cpu_s = Some(tool.cpu_seconds()?);
    tool.stop(stop_signal)?;
    let samples = taken.or_else(|| perf_samples(&log()));
    let _ = fs::remove_file(&perf_data);
    Ok(Run::new(throughput, samples, tool_cpu_s))
}

/// Runs the workload with one thread per CPU; returns iterations per second.
fn workload(setup: &Setup) -> Result<f64> {
    let mut cmd = Command::new(&setup.workload);
    cmd.args([setup.seconds.to_string(), setup.cpus.to_string()]);
    let mut child = Guard(cmd.stdout(Stdio::piped()).spawn()?);
    let stdout = child.0.stdout.take().context("no workload stdout")?;
    let lines: Vec<String> = BufReader::new(stdout).lines().collect::<Result<_, _>>()?;
    ensure!(child.0.wait()?.success(), "workload failed: {lines:?}");
    let iterations = lines.iter().find_map(|l| l.strip_prefix("iterations "));
    let iterations: f64 = iterations.context("no iterations printed")?.parse()?;
    Ok(iterations / setup.seconds as f64)
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// `/healthz` as JSON, or `None` while it does not answer 200.
fn healthz(port: u16) -> Option<serde_json::Value> {
    let url = format!("http://127.0.0.1:{port}/healthz");
    let req = ureq::get(&url).timeout(Duration::from_secs(2));
    serde_json::from_str(&req.call().ok()?.into_string().ok()?).ok()
}

fn wait_healthy(daemon: &mut Guard, port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while healthz(port).is_none() {
        if let Some(status) = daemon.0.try_wait()? {
            bail!("daemon exited with {status}");
        }
        ensure!(Instant::now() < deadline, "timed out after 30 s");
        sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// wallscope's total sample count so far, from `/healthz`.
fn samples(port: u16) -> Result<u64> {
    let health = healthz(port).context("/healthz stopped answering")?;
    let samples = health["samples"].as_u64();
    samples.context("/healthz has no samples")
}

/// Parses perf's "[ perf record: Captured and wrote ... (N samples) ]".
fn perf_samples(log: &str) -> Option<u64> {
    let count = log.rsplit_once('(')?.1.split_whitespace().next()?;
    count.parse().ok()
}

/// Median of `f` over the runs where it is present.
fn median(runs: &[Run], f: impl Fn(&Run) -> Option<f64>) -> Option<f64> {
    let mut v: Vec<f64> = runs.iter().filter_map(f).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    (n > 0).then(|| (v[(n - 1) / 2] + v[n / 2]) / 2.0)
}

/// Lowest and highest throughput, as % above (+) or below (-) `base`.
fn spread(runs: &[Run], base: f64) -> (f64, f64) {
    let pct = |r: &Run| (r.throughput / base - 1.0) * 100.0;
    let lo = runs.iter().map(pct).fold(f64::INFINITY, f64::min);
    (lo, runs.iter().map(pct).fold(f64::NEG_INFINITY, f64::max))
}

fn render(setup: &Setup, rounds: usize, runs: &[Vec<Run>]) -> Result<String> {
    let tput = |r: &[Run]| median(r, |r| Some(r.throughput)).unwrap_or(f64::NAN);
    let base = tput(&runs[0]);
    let (bmin, bmax) = spread(&runs[0], base);
    let date = Command::new("date").arg("-uR").output()?;
    let mut s = format!(
        "# On-CPU sampling overhead\n\n- date: {}\n- kernel: {}\n\
         - CPUs: {cpus}, workload threads: {cpus} (`tests/workloads/cpu_shares.c`)\n\
         - {rounds} rounds, round-robin (start rotated each round), {secs} s per run\n\
         - load average after the runs: {}\n\
         - baseline noise (min / max vs median): {bmin:+.2} % / {bmax:+.2} %\n\n\
         | configuration | median it/s | min / max vs baseline | overhead (ratio) \
         | samples/run (expected) | profiler CPU s/run |\n|---|---:|---:|---:|---:|---:|\n",
        String::from_utf8_lossy(&date.stdout).trim(),
        fs::read_to_string("/proc/sys/kernel/osrelease")?.trim(),
        fs::read_to_string("/proc/loadavg")?.trim(),
        cpus = setup.cpus,
        secs = setup.seconds,
    );
    let mut ws99 = f64::NAN;
    for (p, r) in CONFIGS.iter().zip(runs) {
        let m = tput(r);
        let (lo, hi) = spread(r, base);
        let (ratio, pct) = (base / m, (base / m - 1.0) * 100.0);
        s += &format!("| {p} | {m:.1} | {lo:+.2} % / {hi:+.2} % ");
        let (Profiler::Wallscope(hz) | Profiler::Perf(hz)) = *p else {
            s += "| - | - | - |\n";
            continue;
        };
        if *p == Profiler::Wallscope(99) {
            ws99 = pct;
        }
        let expected = hz * setup.cpus as u64 * setup.seconds;
        let samples = median(r, |r| r.samples.map(|n| n as f64)).unwrap_or(f64::NAN);
        let cpu = median(r, |r| r.tool_cpu_s).unwrap_or(f64::NAN);
        s += &format!("| {pct:+.2} % ({ratio:.4}) | {samples:.0} ({expected}) | {cpu:.2} |\n");
    }
    let noise = bmin.abs().max(bmax.abs());
    let met = if ws99 < 1.0 { "MEETS" } else { "MISSES" };
    let within = if ws99.abs() <= noise {
        ", within noise"
    } else {
        ""
    };
    s += &format!(
        "\nVerdict: wallscope at 99 Hz costs {ws99:+.2} %: {met} the target (< 1 % at 99 Hz); \
         baseline noise is ±{noise:.2} %{within}.\n\n\
         Samples: wallscope's are the `/healthz` count over the workload run; perf's \
         cover its whole recording, including the {SETTLE:?} it gets to attach first. \
         Profiler CPU is the profiler process's own user + system time over its lifetime.\n"
    );
    Ok(s)
}
