//! Off-CPU tracing overhead: run time of two scheduler-heavy `perf bench sched`
//! workloads with nothing attached, with wallscope (all programs), without
//! its runqueue culprit attribution (`--culprits off`), with
//! wallscope walking a stack at every switch-out as before issue 11 (its
//! fallback on kernels without `sched_exit_tp`), with libbpf-tools
//! `offcputime` and `runqlat`, and with `perf sched record`, measured
//! round-robin in one run. A final pass with `kernel.bpf_stats_enabled`
//! on measures each BPF program's own run time per event. Prints a table and
//! writes `bench/results/offcpu.md`.
//!
//! Needs root. Env: `WS_BENCH_ROUNDS` (default 5).

#[path = "common/mod.rs"]
mod common;

use anyhow::{bail, ensure, Context, Result};
use common::{free_port, median, Guard};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};
use std::{fmt, fs};

/// Time a tool gets after attaching before the workload starts.
const SETTLE: Duration = Duration::from_secs(1);

/// The `perf bench sched` workloads, by name, each sized to take ~3–5 s
/// here. `pipe` is pinned to one CPU: unpinned, its time here is bimodal (2 s
/// or 15 s for the same run, by where its two processes land).
const WORKLOADS: [(&str, &str); 2] = [
    ("pipe", "taskset -c 0 perf bench sched pipe -l 1000000"),
    ("messaging", "perf bench sched messaging -g 5 -l 2000"),
];

/// Programs every run needs, with their Debian packages.
const NEEDED: [(&str, &str); 3] = [
    ("perf", "linux-perf"),
    ("taskset", "util-linux"),
    ("bpftool", "bpftool"),
];

/// How to tell that a tool is attached.
#[derive(Clone, Copy, PartialEq)]
enum Ready {
    /// Nothing runs.
    Nothing,
    /// wallscope's `/healthz` answers.
    Healthz,
    /// The process holds links to this many BPF programs.
    Links(usize),
    /// The process has a child running this command (perf's workload, which
    /// it starts once its events are enabled).
    Child(&'static str),
}

/// A configuration: the command running alongside the workload (stopped
/// with SIGINT; `{daemon}`, `{port}` and `{data}` are substituted), the
/// Debian package providing it, and how to tell it is attached.
struct Config {
    name: &'static str,
    cmd: &'static str,
    package: &'static str,
    ready: Ready,
}

impl Config {
    const fn new(
        name: &'static str,
        cmd: &'static str,
        package: &'static str,
        ready: Ready,
    ) -> Self {
        Config {
            name,
            cmd,
            package,
            ready,
        }
    }

    fn program(&self) -> &'static str {
        self.cmd.split(' ').next().unwrap_or_default()
    }
}

/// The configurations, in the order they run each round (rotated).
const CONFIGS: [Config; 7] = [
    Config::new("baseline", "", "", Ready::Nothing),
    Config::new(
        "wallscope",
        "{daemon} serve --listen 127.0.0.1:{port}",
        "",
        Ready::Healthz,
    ),
    Config::new(
        "wallscope, no culprit attribution",
        "{daemon} serve --listen 127.0.0.1:{port} --culprits off",
        "",
        Ready::Healthz,
    ),
    Config::new(
        "wallscope, stacks at switch-out (before)",
        "{daemon} serve --listen 127.0.0.1:{port} --offcpu-stacks switch-out --offcpu-sample-us 0",
        "",
        Ready::Healthz,
    ),
    Config::new(
        "offcputime",
        "offcputime 60",
        "libbpf-tools",
        Ready::Links(1),
    ),
    Config::new("runqlat", "runqlat 60", "libbpf-tools", Ready::Links(3)),
    Config::new(
        "perf sched record",
        "perf sched record -a -o {data} -- sleep 60",
        "linux-perf",
        Ready::Child("sleep"),
    ),
];

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// One workload run: seconds it took, the context switches (all CPUs,
/// from `/proc/stat`) during it, and the CPU seconds the tool used meanwhile
/// (user + system, all its threads).
struct Run {
    secs: f64,
    switches: u64,
    tool_cpu: Option<f64>,
}

/// A BPF tool's cost over one workload run: run count and run time per
/// program name, and the context switches during the run.
struct Cost {
    progs: BTreeMap<String, (u64, u64)>,
    switches: u64,
    /// wallscope only: stack walks (off-CPU, waker, blocked threads) per
    /// second of the run, from its `/healthz`.
    walks_per_sec: Option<f64>,
    /// wallscope only: its user stack walks' (kind, walks, p50 ns, p99 ns)
    /// since it started (it starts afresh for each workload here).
    walk_cost: Vec<(String, u64, u64, u64)>,
}

/// A started tool and, for wallscope, its API port.
type Started = Option<(Guard, u16)>;

/// wallscope's stack walks so far (every kind), from its `/healthz`.
fn stack_walks(port: u16) -> Option<u64> {
    let h = common::healthz(port)?;
    let events = &h["events"];
    [
        "offcpu_stack_walks",
        "waker_stack_walks",
        "blocked_stack_walks",
    ]
    .iter()
    .map(|k| events[*k].as_u64())
    .sum()
}

/// wallscope's user stack walks by kind from its `/healthz`: (kind, walks,
/// p50 ns, p99 ns).
fn walk_costs(port: u16) -> Vec<(String, u64, u64, u64)> {
    let Some(h) = common::healthz(port) else {
        return Vec::new();
    };
    let rows = h["pipeline"]["walk_cost_by_kind"].as_array().cloned();
    rows.unwrap_or_default()
        .iter()
        .filter_map(|r| {
            let kind = r["kind"].as_str()?;
            kind.starts_with("user").then_some(())?;
            let n = |k: &str| r[k].as_u64();
            Some((kind.to_string(), n("walks")?, n("p50_ns")?, n("p99_ns")?))
        })
        .collect()
}

fn main() {
    common::main("offcpu", run);
}

fn run() -> Result<()> {
    common::require_root("the tools load eBPF programs and trace every CPU")?;
    let rounds = common::env_u64("WS_BENCH_ROUNDS", 5)? as usize;
    let tools = CONFIGS.iter().filter(|c| !c.package.is_empty());
    for (program, package) in tools.map(|c| (c.program(), c.package)).chain(NEEDED) {
        common::find_tool(program, package)?;
    }
    let daemon = common::daemon_binary()?;
    let tmp = tempfile::tempdir()?;
    let stats_at_start = common::bpf_stats_enabled()?;
    let new = || WORKLOADS.iter().map(|_| Vec::new()).collect();
    let mut runs: Vec<Vec<Vec<Run>>> = CONFIGS.iter().map(|_| new()).collect();
    for round in 1..=rounds {
        // Rotate the start so no configuration always runs first.
        for i in (0..CONFIGS.len()).map(|i| (i + round - 1) % CONFIGS.len()) {
            let c = &CONFIGS[i];
            for (w, (name, cmd)) in WORKLOADS.iter().enumerate() {
                let ctx = || format!("round {round}, {c}, {name}");
                let mut tool = start(c, &daemon, tmp.path()).with_context(ctx)?;
                let r = run_workload(cmd, tool.as_ref().map(|t| &t.0)).with_context(ctx)?;
                stop(c, tool.as_mut().map(|t| &mut t.0), tmp.path()).with_context(ctx)?;
                let run = format!("{c} {name}");
                eprintln!("round {round}/{rounds} {run:<28} {:>7.3} s", r.secs);
                runs[i][w].push(r);
            }
        }
    }
    let stats = format!("{stats_at_start} / {}", common::bpf_stats_enabled()?);
    let costs = bpf_costs(&daemon, tmp.path())?;
    common::write_report("offcpu", &render(&stats, &runs, &costs)?)
}

/// Starts `c` (`None` for the baseline) and waits until it is attached,
/// plus [`SETTLE`].
fn start(c: &Config, daemon: &Path, tmp: &Path) -> Result<Started> {
    if c.ready == Ready::Nothing {
        return Ok(None);
    }
    let (port, log) = (free_port()?, tmp.join("tool.log"));
    let arg = |a: &str| match a {
        "{daemon}" => daemon.as_os_str().to_owned(),
        "{data}" => tmp.join("perf.data").into_os_string(),
        a => a.replace("{port}", &port.to_string()).into(),
    };
    let argv: Vec<_> = c.cmd.split(' ').map(arg).collect();
    let mut cmd = Command::new(&argv[0]);
    let mut tool = common::spawn_logged(cmd.args(&argv[1..]), &log)?;
    let log = || fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = tool.0.try_wait()? {
            bail!("{} exited with {status}; log:\n{}", c.program(), log());
        }
        let pid = tool.0.id();
        let attached = match c.ready {
            Ready::Healthz => {
                common::healthz(port).is_some() && common::wait_drains(port, WARM_DRAINS).is_ok()
            }
            Ready::Links(n) => common::linked_progs(pid).len() >= n,
            Ready::Child(comm) => has_child(pid, comm),
            Ready::Nothing => true,
        };
        if attached {
            break;
        }
        ensure!(Instant::now() < deadline, "attach timed out: {}", log());
        sleep(Duration::from_millis(100));
    }
    sleep(SETTLE);
    Ok(Some((tool, port)))
}

/// Stops the tool, which must have outlived the workload, and deletes the
/// data it wrote.
fn stop(c: &Config, tool: Option<&mut Guard>, tmp: &Path) -> Result<()> {
    let Some(tool) = tool else {
        return Ok(());
    };
    if let Some(status) = tool.0.try_wait()? {
        bail!("{} exited with {status} during the workload", c.program());
    }
    tool.stop(libc::SIGINT)?;
    let _ = fs::remove_file(tmp.join("perf.data"));
    Ok(())
}

/// Runs the workload `cmd` once beside `tool`; fails unless perf prints its
/// total time.
fn run_workload(cmd: &str, tool: Option<&Guard>) -> Result<Run> {
    let argv: Vec<&str> = cmd.split(' ').collect();
    let before = common::context_switches()?;
    let cpu_before = tool.map(Guard::cpu_seconds).transpose()?;
    let out = Command::new(argv[0]).args(&argv[1..]).output()?;
    let switches = common::context_switches()? - before;
    let tool_cpu = match (tool, cpu_before) {
        (Some(t), Some(b)) => Some(t.cpu_seconds()? - b),
        _ => None,
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "`{cmd}` failed: {stderr}");
    let total = stdout.split("Total time:").nth(1);
    let secs = total.and_then(|t| t.split_whitespace().next()?.parse().ok());
    let secs = secs.with_context(|| format!("no total time in perf's output:\n{stdout}"))?;
    Ok(Run {
        secs,
        switches,
        tool_cpu,
    })
}

/// Whether `pid` has a child process running `comm`.
fn has_child(pid: u32, comm: &str) -> bool {
    let children = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"));
    children.unwrap_or_default().split_whitespace().any(|c| {
        let name = fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
        name.trim() == comm
    })
}

/// Per BPF tool, its [`Cost`] in one run of each workload with BPF stats on.
/// A separate pass, so the stats' own cost (two clock reads per program
/// run) stays out of the timed rounds.
fn bpf_costs(daemon: &Path, tmp: &Path) -> Result<Vec<(&'static str, Vec<Cost>)>> {
    let _stats = common::BpfStats::enable()?;
    let mut costs = Vec::new();
    let bpf = |c: &&Config| matches!(c.ready, Ready::Healthz | Ready::Links(_));
    for c in CONFIGS.iter().filter(bpf) {
        let mut per_workload = Vec::new();
        // A fresh tool per workload, so that wallscope's walk costs since
        // its start are this workload's.
        for (name, cmd) in WORKLOADS {
            let ctx = || format!("BPF stats, {c}, {name}");
            let mut tool = start(c, daemon, tmp).with_context(ctx)?;
            let ids = common::linked_progs(tool.as_ref().map_or(0, |t| t.0 .0.id()));
            let port = tool
                .as_ref()
                .map(|t| t.1)
                .filter(|_| c.ready == Ready::Healthz);
            let before = common::prog_stats(&ids)?;
            let walks_before = port.and_then(stack_walks);
            let r = run_workload(cmd, None).with_context(ctx)?;
            // Walks are counted in BPF, read at the next drain.
            let walks = port.and_then(|p| {
                common::wait_drains(p, 2).ok()?;
                Some(stack_walks(p)?.saturating_sub(walks_before?) as f64 / r.secs)
            });
            let walk_cost = port.map(walk_costs).unwrap_or_default();
            let mut progs = BTreeMap::new();
            for (id, (prog, cnt, ns)) in common::prog_stats(&ids)? {
                let (cnt0, ns0) = before.get(&id).map_or((0, 0), |b| (b.1, b.2));
                let sum: &mut (u64, u64) = progs.entry(prog).or_default();
                sum.0 += cnt.saturating_sub(cnt0);
                sum.1 += ns.saturating_sub(ns0);
            }
            eprintln!("BPF stats {c} {name}: {:.3} s", r.secs);
            stop(c, tool.as_mut().map(|t| &mut t.0), tmp)?;
            per_workload.push(Cost {
                progs,
                switches: r.switches,
                walks_per_sec: walks,
                walk_cost,
            });
        }
        costs.push((c.name, per_workload));
    }
    Ok(costs)
}

fn secs(runs: &[Run]) -> f64 {
    median(runs.iter().map(|r| r.secs)).unwrap_or(f64::NAN)
}

/// `stats`: `kernel.bpf_stats_enabled` before / after the timed rounds.
fn render(stats: &str, runs: &[Vec<Vec<Run>>], costs: &[(&str, Vec<Cost>)]) -> Result<String> {
    let rounds = runs[0][0].len();
    let switches = |r: &[Run]| median(r.iter().map(|r| r.switches as f64)).unwrap_or(f64::NAN);
    let (date, kernel, load) = common::system()?;
    let cpus = std::thread::available_parallelism()?.get();
    let mut s = format!(
        "# Off-CPU tracing overhead\n\n- date: {date}\n- kernel: {kernel}\n- CPUs: {cpus}\n\
         - {rounds} rounds, round-robin (start rotated each round); each run starts the \
         tool, waits until it is attached plus {SETTLE:?}, runs the workload, stops the tool\n\
         - `kernel.bpf_stats_enabled` before / after the timed rounds: {stats}\n\
         - load average after the runs: {load}\n"
    );
    let base = &runs[0];
    for ((name, cmd), b) in WORKLOADS.iter().zip(base) {
        let (lo, hi) = common::spread(b.iter().map(|r| r.secs), secs(b));
        s += &format!(
            "- {name}: `{cmd}`, baseline {:.3} s and {:.0} context switches per run \
             ({:.0} per second), min / max vs median {lo:+.2} % / {hi:+.2} %\n",
            secs(b),
            switches(b),
            switches(b) / secs(b),
        );
    }
    let mut header = vec!["configuration".to_string()];
    for (n, _) in WORKLOADS {
        header.extend([format!("{n} s"), format!("{n} slowdown (min–max)")]);
        header.push(format!("{n} ns/switch"));
        header.push(format!("{n} tool CPU %"));
    }
    let mut rows = Vec::new();
    for (c, per_workload) in CONFIGS.iter().zip(runs) {
        let mut row = vec![c.to_string()];
        for (r, b) in per_workload.iter().zip(base) {
            let (m, bm) = (secs(r), secs(b));
            let (lo, hi) = common::spread(r.iter().map(|r| r.secs), bm);
            let range = format!("{:.2}–{:.2}", 1.0 + lo / 100.0, 1.0 + hi / 100.0);
            row.extend([format!("{m:.3}"), format!("{:.3} ({range})", m / bm)]);
            row.push(format!("{:.0}", (m - bm) * 1e9 / switches(b)));
            let cpu = median(r.iter().filter_map(|r| Some(r.tool_cpu? / r.secs * 100.0)));
            row.push(cpu.map_or("–".into(), |c| format!("{c:.2}")));
        }
        rows.push(row);
    }
    s += &format!("\n{}", common::table(&header, &rows));
    s += "\nslowdown: median run time / baseline median. ns/switch: (median − baseline \
          median) / baseline median context switches. tool CPU: the tool's own user + system \
          time (all threads) during the run, per second of the run (1 % = 1 % of one CPU; \
          /proc ticks of 10 ms).\n\n## BPF program cost\n\n\
          One more run per BPF tool and workload, with `kernel.bpf_stats_enabled=1`: \
          events (`run_cnt`) and `run_time_ns / run_cnt` per program from `bpftool prog \
          show`; the last row per tool is its total run time per context switch.\n\n";
    let mut header = vec!["tool".to_string(), "program".to_string()];
    for (n, _) in WORKLOADS {
        header.extend([format!("{n} events"), format!("{n} ns/event")]);
    }
    let mut rows = Vec::new();
    for (tool, per_workload) in costs {
        let names: BTreeSet<&String> = per_workload.iter().flat_map(|c| c.progs.keys()).collect();
        for name in names {
            let mut row = vec![tool.to_string(), name.to_string()];
            for c in per_workload {
                let (cnt, ns) = c.progs.get(name).copied().unwrap_or_default();
                row.extend([cnt.to_string(), format!("{:.0}", ns as f64 / cnt as f64)]);
            }
            rows.push(row);
        }
        let mut row = vec![tool.to_string(), "all, per context switch".to_string()];
        for c in per_workload {
            let ns = bpf_per_switch(c);
            row.extend([c.switches.to_string(), format!("{ns:.0}")]);
        }
        rows.push(row);
        if per_workload.iter().any(|c| c.walks_per_sec.is_some()) {
            let mut row = vec![tool.to_string(), "stack walks per second".to_string()];
            for c in per_workload {
                let w = c.walks_per_sec.map_or("?".into(), |w| format!("{w:.0}"));
                row.extend([w, String::new()]);
            }
            rows.push(row);
            let kinds: BTreeSet<&String> = per_workload
                .iter()
                .flat_map(|c| c.walk_cost.iter().map(|w| &w.0))
                .collect();
            for kind in kinds {
                let mut row = vec![tool.to_string(), format!("{kind} walks: p50 / p99 ns")];
                for c in per_workload {
                    let w = c.walk_cost.iter().find(|w| &w.0 == kind);
                    row.extend(match w {
                        Some((_, n, p50, p99)) => [n.to_string(), format!("{p50} / {p99}")],
                        None => ["0".into(), String::new()],
                    });
                }
                rows.push(row);
            }
        }
    }
    s += &common::table(&header, &rows);
    s += &verdict(runs, costs);
    Ok(s)
}

/// Total BPF run time per context switch, ns.
fn bpf_per_switch(c: &Cost) -> f64 {
    c.progs.values().map(|p| p.1).sum::<u64>() as f64 / c.switches as f64
}

/// Drains wallscope completes before a run: steady state, not start-up.
const WARM_DRAINS: u64 = 3;

/// Issue 25's targets for wallscope with everything on: pipe slowdown and
/// BPF ns per context switch per workload.
const TARGETS: [(&str, Option<f64>, f64); 2] =
    [("pipe", Some(1.15), 400.0), ("messaging", None, 1000.0)];

/// Lines judging wallscope against [`TARGETS`] (slowdown from the median
/// run times, BPF time per switch from the stats pass), with the switch-out
/// shape (before) and offcputime alongside.
fn verdict(runs: &[Vec<Vec<Run>>], costs: &[(&str, Vec<Cost>)]) -> String {
    let find = |name: &str| {
        CONFIGS
            .iter()
            .position(|c| c.name.starts_with(name))
            .unwrap_or(0)
    };
    let (ws, before, oc, no_culprits) = (
        find("wallscope"),
        find("wallscope, stacks at switch-out"),
        find("offcputime"),
        find("wallscope, no culprit attribution"),
    );
    let bpf = |tool: &str, w: usize| {
        let cost = costs.iter().find(|(t, _)| *t == tool);
        cost.map_or(f64::NAN, |(_, c)| bpf_per_switch(&c[w]))
    };
    let (mut parts, mut met) = (Vec::new(), true);
    for (w, (name, _)) in WORKLOADS.iter().enumerate() {
        let base = secs(&runs[0][w]);
        let slowdown = |i: usize| secs(&runs[i][w]) / base;
        let (_, max_slowdown, max_ns) = TARGETS[w];
        let ns = bpf(CONFIGS[ws].name, w);
        let ok = ns <= max_ns && max_slowdown.is_none_or(|m| slowdown(ws) <= m);
        met &= ok;
        let without = bpf(CONFIGS[no_culprits].name, w);
        parts.push(format!(
            "{name}: x{:.3} and {ns:.0} BPF ns/switch (target{} {max_ns:.0} ns: {}); \
             culprit attribution {:.0} ns/switch of it (x{:.3} and {without:.0} ns without); \
             before x{:.3}, {:.0} ns; offcputime x{:.3}, {:.0} ns",
            slowdown(ws),
            max_slowdown.map_or(String::new(), |m| format!(" x{m}")),
            if ok { "met" } else { "MISSED" },
            ns - without,
            slowdown(no_culprits),
            slowdown(before),
            bpf(CONFIGS[before].name, w),
            slowdown(oc),
            bpf("offcputime", w),
        ));
    }
    format!(
        "\nVerdict (issue 25: wallscope with everything on): {}: {}.\n",
        parts.join("; "),
        if met {
            "MEETS the targets"
        } else {
            "MISSES a target"
        }
    )
}
