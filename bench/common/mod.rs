//! Helpers shared by the benchmarks: child processes, the wallscope daemon,
//! BPF program stats, statistics and the markdown report; Java workloads in
//! `java.rs`, children that die with the bench in `group.rs`, `/proc` in
//! `procfs.rs`. Each bench uses a subset.
#![allow(dead_code)]

pub mod group;
pub mod java;
pub mod procfs;

use anyhow::{bail, ensure, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};
use std::{env, fs};

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A child process, killed if dropped while still running.
pub struct Guard(pub Child);

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
    pub fn stop(&mut self, sig: libc::c_int) -> Result<()> {
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
    pub fn cpu_seconds(&self) -> Result<f64> {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.0.id()))?;
        Ok(procfs::stat_ticks(&stat)?.1 as f64 / procfs::clock_ticks())
    }
}

/// Context switches on all CPUs since boot (`ctxt` in `/proc/stat`).
pub fn context_switches() -> Result<u64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let ctxt = stat.lines().find_map(|l| l.strip_prefix("ctxt "));
    Ok(ctxt.context("no ctxt in /proc/stat")?.trim().parse()?)
}

/// Fails with `why` unless running as root.
pub fn require_root(why: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("must run as root: {why}");
    }
    Ok(())
}

pub fn env_u64(name: &str, default: u64) -> Result<u64> {
    let Ok(s) = env::var(name) else {
        return Ok(default);
    };
    match s.parse() {
        Ok(v) if v > 0 => Ok(v),
        _ => bail!("{name}={s:?} is not a positive integer"),
    }
}

/// Runs `cmd` to completion, failing with its stderr if it fails.
pub fn check(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "{cmd:?} failed: {stderr}");
    Ok(())
}

/// `program` on `PATH` or in an sbin directory, or an error naming the
/// Debian `package` that provides it.
pub fn find_tool(program: &str, package: &str) -> Result<PathBuf> {
    let path = env::var("PATH").unwrap_or_default() + ":/usr/sbin:/sbin";
    let found = env::split_paths(&path).map(|d| d.join(program));
    let found = found.into_iter().find(|p| p.is_file());
    found.with_context(|| {
        format!("{program} not found: install the {package} package (`scripts/deps.sh bench`)")
    })
}

/// Compiles the C workload `src` to `out` with the tests' flags
/// (`tests/support/mod.rs`: frame pointers, no inlining, no sibling
/// calls, so every function shows in its stacks), runnable by everyone.
pub fn build_workload(src: &Path, out: &Path) -> Result<()> {
    let fp = [
        "-O1",
        "-fno-omit-frame-pointer",
        "-mno-omit-leaf-frame-pointer",
    ];
    build_c(src, out, &fp)
}

/// Compiles the C program `src` to `out` with clang, `flags` and no
/// inlining or sibling calls, runnable by everyone.
pub fn build_c(src: &Path, out: &Path, flags: &[&str]) -> Result<()> {
    let mut cmd = Command::new("clang");
    cmd.args([
        "-g",
        "-fno-inline",
        "-pthread",
        "-fno-optimize-sibling-calls",
    ])
    .args(flags)
    .arg("-o")
    .arg(out)
    .arg(src)
    .arg("-ldl");
    check(&mut cmd)?;
    fs::set_permissions(out, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The unprivileged user that benches run hostile workloads as.
pub const NOBODY: &str = "65534";

/// A command that runs `program` as `nobody` (uid and gid 65534, no
/// supplementary groups), through `setpriv`. The kernel clears a parent
/// death signal when the uid changes: `--pdeathsig keep` sets it again, so
/// that a [`group::Group`]'s child still dies with the bench.
pub fn as_nobody(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .args(["--pdeathsig", "keep", "--"])
        .arg(program);
    cmd
}

/// The release daemon, built first if missing.
pub fn daemon_binary() -> Result<PathBuf> {
    let bin = Path::new(ROOT).join("target/release/wallscope");
    if !bin.exists() {
        eprintln!("building {}", bin.display());
        let args = ["build", "--release", "--bin", "wallscope"];
        check(Command::new("cargo").args(args).current_dir(ROOT))?;
    }
    Ok(bin)
}

pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// `/healthz` as JSON, or `None` while it does not answer 200.
pub fn healthz(port: u16) -> Option<serde_json::Value> {
    let url = format!("http://127.0.0.1:{port}/healthz");
    let req = ureq::get(&url).timeout(Duration::from_secs(2));
    serde_json::from_str(&req.call().ok()?.into_string().ok()?).ok()
}

/// The body of the daemon's `GET query` (`/folded?...`), or an error with
/// the status and body of a refusal.
pub fn get(port: u16, query: &str) -> Result<String> {
    let url = format!("http://127.0.0.1:{port}{query}");
    match ureq::get(&url).timeout(Duration::from_secs(30)).call() {
        Ok(r) => Ok(r.into_string()?),
        Err(ureq::Error::Status(code, r)) => {
            bail!(
                "GET {query}: {code}: {}",
                r.into_string().unwrap_or_default()
            )
        }
        Err(e) => Err(e).with_context(|| format!("GET {query}")),
    }
}

/// Starts `bin serve` on 127.0.0.1:`port` with `args`, as a [`Group`]
/// stopped with SIGTERM if the bench dies, its stderr to `log`; waits up
/// to 180 s for its `/healthz` (loading the programs on a very busy host
/// takes longer than [`wait_healthy`]'s 30 s). An error ends with the
/// log's tail.
pub fn serve(bin: &Path, port: u16, args: &[String], log: &Path) -> Result<group::Group> {
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(log)?);
    let mut daemon = group::Group::spawn(&mut cmd, libc::SIGTERM)?;
    wait_healthy_within(&mut daemon.0, port, Duration::from_secs(180))
        .with_context(|| format!("log:\n{}", log_tail(log, 30)))?;
    Ok(daemon)
}

/// PASS, FAIL or `n/a` (not measured, or reported without a goal).
pub fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "n/a",
    }
}

/// The last `n` lines of the log at `path` (none if it cannot be read).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Spawns `cmd` with stdin and stdout on /dev/null and stderr to `log`.
pub fn spawn_logged(cmd: &mut Command, log: &Path) -> Result<Guard> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let child = cmd.stderr(fs::File::create(log)?).spawn();
    Ok(Guard(child.with_context(|| format!("starting {cmd:?}"))?))
}

/// Waits up to 30 s for the daemon's `/healthz` to answer.
pub fn wait_healthy(daemon: &mut Guard, port: u16) -> Result<()> {
    wait_healthy_within(daemon, port, Duration::from_secs(30))
}

/// Waits up to `limit` for the daemon's `/healthz` to answer: loading its
/// programs on a very busy host takes longer than 30 s.
pub fn wait_healthy_within(daemon: &mut Guard, port: u16, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while healthz(port).is_none() {
        if let Some(status) = daemon.0.try_wait()? {
            bail!("daemon exited with {status}");
        }
        ensure!(Instant::now() < deadline, "no /healthz after {limit:?}");
        sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Waits (up to 30 s) until the daemon has drained `n` times: its first
/// drains symbolize every binary on the host once, a start-up cost that a
/// long-running daemon does not pay again and benchmarks leave out.
pub fn wait_drains(port: u16, n: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let drains = healthz(port)
            .and_then(|h| h["pipeline"]["drains"].as_u64())
            .unwrap_or(0);
        if drains >= n {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "daemon did not drain {n} times in 30 s"
        );
        sleep(Duration::from_millis(100));
    }
}

/// Ids of the BPF programs that `pid` holds links to (`/proc/PID/fdinfo`).
pub fn linked_progs(pid: u32) -> BTreeSet<u64> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return BTreeSet::new();
    };
    let infos = dir.filter_map(|e| fs::read_to_string(e.ok()?.path()).ok());
    let links = infos.filter(|info| info.contains("link_type:"));
    let id = |info: String| {
        let line = info.lines().find_map(|l| l.strip_prefix("prog_id:"));
        line?.trim().parse().ok()
    };
    links.filter_map(id).collect()
}

/// Name, run count and run time in ns of the programs `ids`, by id, from
/// `bpftool prog show` (counts stay 0 while BPF stats are off).
pub fn prog_stats(ids: &BTreeSet<u64>) -> Result<BTreeMap<u64, (String, u64, u64)>> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()?;
    ensure!(out.status.success(), "bpftool prog show failed");
    let progs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    let num = |p: &serde_json::Value, k: &str| p[k].as_u64().unwrap_or(0);
    let ours = progs.iter().filter(|p| ids.contains(&num(p, "id")));
    let stats = |p: &serde_json::Value| {
        let name = p["name"].as_str().unwrap_or("?").to_string();
        (
            num(p, "id"),
            (name, num(p, "run_cnt"), num(p, "run_time_ns")),
        )
    };
    Ok(ours.map(stats).collect())
}

pub const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// The current `kernel.bpf_stats_enabled`.
pub fn bpf_stats_enabled() -> Result<String> {
    let value = fs::read_to_string(BPF_STATS).context("reading bpf_stats_enabled")?;
    Ok(value.trim().to_string())
}

/// `kernel.bpf_stats_enabled` set to 1; the previous value is restored when
/// dropped.
pub struct BpfStats(String);

impl BpfStats {
    pub fn enable() -> Result<Self> {
        let previous = bpf_stats_enabled()?;
        fs::write(BPF_STATS, "1").context("enabling bpf_stats_enabled")?;
        Ok(BpfStats(previous))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS, &self.0);
    }
}

/// Median of `values`, `None` if there are none.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    (n > 0).then(|| (v[(n - 1) / 2] + v[n / 2]) / 2.0)
}

/// Nearest-rank percentile `p` (0–100) of `values`.
pub fn percentile(values: impl IntoIterator<Item = f64>, p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0 * v.len() as f64).ceil() as usize).max(1);
    v.get(rank - 1).copied()
}

/// Lowest and highest of `values`, as % above (+) or below (-) `base`.
pub fn spread(values: impl IntoIterator<Item = f64>, base: f64) -> (f64, f64) {
    let pct = values.into_iter().map(|v| (v / base - 1.0) * 100.0);
    pct.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p), hi.max(p))
    })
}

/// The report header's facts: UTC date, kernel release and load average.
pub fn system() -> Result<(String, String, String)> {
    let date = Command::new("date").arg("-uR").output()?;
    Ok((
        String::from_utf8_lossy(&date.stdout).trim().to_string(),
        fs::read_to_string("/proc/sys/kernel/osrelease")?
            .trim()
            .to_string(),
        fs::read_to_string("/proc/loadavg")?.trim().to_string(),
    ))
}

/// A markdown table; the first column is left-aligned, the others right.
pub fn table(header: &[impl AsRef<str>], rows: &[Vec<String>]) -> String {
    let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    let header: Vec<String> = header.iter().map(|h| h.as_ref().to_string()).collect();
    let mut s = line(&header) + "|---" + &"|---:".repeat(header.len() - 1) + "|\n";
    rows.iter().for_each(|r| s += &line(r));
    s
}

/// Prints `report` and writes it to `bench/results/NAME.md`.
pub fn write_report(name: &str, report: &str) -> Result<()> {
    write_result(&format!("{name}.md"), report)
}

/// Prints `report` and writes it to `bench/results/FILE`.
pub fn write_result(file: &str, report: &str) -> Result<()> {
    print!("{report}");
    let dir = Path::new(ROOT).join("bench/results");
    fs::create_dir_all(&dir)?;
    let out = dir.join(file);
    fs::write(&out, report).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// Runs a benchmark's `run`: on error, prints it after the bench's name
/// and exits 1.
pub fn main(name: &str, run: fn() -> Result<()>) {
    if let Err(e) = run() {
        eprintln!("{name} bench: {e:#}");
        std::process::exit(1);
    }
}

/// Starts `daemon serve` at 999 Hz on a free port, logging to `log`, and
/// waits until it answers and has drained 3 times (its first drains
/// register unwind tables and symbolize the host's binaries once).
pub fn serve_999hz(daemon: &Path, log: &Path) -> Result<(Guard, u16)> {
    let port = free_port()?;
    let mut cmd = Command::new(daemon);
    cmd.args(["serve", "--frequency", "999", "--listen"])
        .arg(format!("127.0.0.1:{port}"));
    let mut d = spawn_logged(&mut cmd, log)?;
    wait_healthy(&mut d, port)?;
    wait_drains(port, 3)?;
    Ok((d, port))
}
