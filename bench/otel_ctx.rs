//! The cost of reading the OpenTelemetry thread context (#43), per
//! context switch and per sample: the BPF programs' run time per run
//! (`kernel.bpf_stats_enabled`, `run_time_ns`/`run_cnt`) while two threads
//! ping-pong a byte through pipes (`bench/workloads/otel_pingpong.c`, a
//! switch per hop), without a context and then with one published, side
//! by side under one daemon at 999 Hz. Targets: < 100 ns added per switch
//! for a process without a context, < 300 ns with one. "Added" is against
//! a daemon without the feature when `OTEL_BENCH_BASELINE` names one (a
//! build of the commit before #41–#43); without it, the table shows what a
//! context adds over none.
//!
//! `OTEL_BENCH_DAEMON` picks the daemon (default: the release build; the
//! BPF programs, all that is measured, are the same in a debug build),
//! `OTEL_BENCH_SECONDS` a phase's length (default 10), `OTEL_BENCH_ROUNDS`
//! the rounds (default 3; each round starts the baseline daemon, then
//! this one). Results: `bench/results/otel_ctx.md`.

mod common;

use anyhow::{ensure, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fs};

/// The programs that run at every context switch (sched_switch).
const SWITCH_PROGS: [&str; 2] = ["on_switch", "on_switched_out"];
/// The program that runs at every on-CPU sample.
const SAMPLE_PROG: &str = "on_cpu_sample";
/// Targets: ns added per switch without and with a context.
const ADDED_WITHOUT_NS: f64 = 100.0;
const ADDED_WITH_NS: f64 = 300.0;

/// What one phase measured: ns per switch, ns per sample, switches and
/// round trips.
#[derive(Clone, Copy, Default)]
struct Cost {
    per_switch_ns: f64,
    per_sample_ns: f64,
    switches: u64,
    round_trips: u64,
}

type Stats = BTreeMap<u64, (String, u64, u64)>;

/// Run count and run time summed over the programs named `names`.
fn runs(stats: &Stats, names: &[&str]) -> (u64, u64) {
    let ours = stats
        .values()
        .filter(|(n, _, _)| names.contains(&n.as_str()));
    // Each switch program runs once per switch: the count of one of them.
    ours.fold((0, 0), |(cnt, ns), (_, c, t)| (cnt.max(*c), ns + t))
}

/// Per run of `names` between two snapshots.
fn per_run(before: &Stats, after: &Stats, names: &[&str]) -> (f64, u64) {
    let (c0, t0) = runs(before, names);
    let (c1, t1) = runs(after, names);
    let cnt = c1.saturating_sub(c0);
    (t1.saturating_sub(t0) as f64 / cnt.max(1) as f64, cnt)
}

/// Runs the ping-pong for `seconds` (with a context or not) beside the
/// daemon holding `ids`; its cost per switch and per sample.
fn phase(pingpong: &Path, ids: &BTreeSet<u64>, seconds: u64, ctx: bool) -> Result<Cost> {
    let mut cmd = Command::new(pingpong);
    cmd.arg(seconds.to_string()).stdout(Stdio::piped());
    if ctx {
        cmd.arg("--ctx");
    }
    let mut child = common::Guard(cmd.spawn().context("starting otel_pingpong")?);
    let mut out = BufReader::new(child.0.stdout.take().context("stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    ensure!(line.starts_with("ready "), "otel_pingpong printed {line:?}");
    // Discovery registers a context within a drain or two: leave it
    // that long before measuring.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let before = common::prog_stats(ids)?;
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest)?;
    let after = common::prog_stats(ids)?;
    ensure!(child.0.wait()?.success(), "otel_pingpong failed");
    let round_trips = rest
        .lines()
        .find_map(|l| l.strip_prefix("round_trips "))
        .and_then(|n| n.trim().parse().ok())
        .context("no round_trips line")?;
    let (per_switch_ns, switches) = per_run(&before, &after, &SWITCH_PROGS);
    let (per_sample_ns, _) = per_run(&before, &after, &[SAMPLE_PROG]);
    Ok(Cost {
        per_switch_ns,
        per_sample_ns,
        switches,
        round_trips,
    })
}

/// One round under `daemon` (started for it, stopped after): a phase
/// without a context and, `with_ctx`, one with (a baseline daemon cannot
/// read one).
fn round(daemon: &Path, pingpong: &Path, with_ctx: bool) -> Result<(Cost, Option<Cost>)> {
    let seconds = common::env_u64("OTEL_BENCH_SECONDS", 10)?;
    let log = env::temp_dir().join(format!("otel_ctx-{}.log", std::process::id()));
    let (d, _port) = common::serve_999hz(daemon, &log)?;
    let ids = common::linked_progs(d.0.id());
    ensure!(!ids.is_empty(), "the daemon holds no BPF links");
    let none = phase(pingpong, &ids, seconds, false)?;
    let some = if with_ctx {
        Some(phase(pingpong, &ids, seconds, true)?)
    } else {
        None
    };
    Ok((none, some))
}

fn median_cost(costs: &[Cost]) -> Cost {
    let med = |f: fn(&Cost) -> f64| common::median(costs.iter().map(f)).unwrap_or(0.0);
    Cost {
        per_switch_ns: med(|c| c.per_switch_ns),
        per_sample_ns: med(|c| c.per_sample_ns),
        switches: med(|c| c.switches as f64) as u64,
        round_trips: med(|c| c.round_trips as f64) as u64,
    }
}

fn row(label: &str, c: &Cost, base: Option<&Cost>, target: Option<f64>) -> Vec<String> {
    let added = base.map(|b| c.per_switch_ns - b.per_switch_ns);
    vec![
        label.to_string(),
        format!("{:.0}", c.per_switch_ns),
        format!("{:.0}", c.per_sample_ns),
        c.switches.to_string(),
        c.round_trips.to_string(),
        added.map_or("—".into(), |a| format!("{a:+.0}")),
        match (added, target) {
            (Some(a), Some(t)) => format!("{} (< {t:.0})", common::verdict(Some(a < t))),
            _ => common::verdict(None).to_string(),
        },
    ]
}

fn run() -> Result<()> {
    common::require_root("loads BPF programs and enables kernel.bpf_stats_enabled")?;
    common::find_tool("bpftool", "bpftool")?;
    let _stats = common::BpfStats::enable()?;
    let daemon = match env::var_os("OTEL_BENCH_DAEMON") {
        Some(path) => PathBuf::from(path),
        None => common::daemon_binary()?,
    };
    let pingpong = env::temp_dir().join(format!("otel_pingpong-{}", std::process::id()));
    let src = Path::new(common::ROOT).join("bench/workloads/otel_pingpong.c");
    common::build_c(&src, &pingpong, &["-O2", "-pthread", "-rdynamic"])?;

    // Rounds alternate the daemons, so that a host getting busier or
    // quieter during the run weighs on both alike.
    let baseline_daemon = env::var_os("OTEL_BENCH_BASELINE").map(PathBuf::from);
    let rounds = common::env_u64("OTEL_BENCH_ROUNDS", 3)?;
    let (mut base, mut none, mut some) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        if let Some(b) = &baseline_daemon {
            base.push(round(b, &pingpong, false)?.0);
        }
        let (n, s) = round(&daemon, &pingpong, true)?;
        none.push(n);
        some.extend(s);
    }
    let baseline = (!base.is_empty()).then(|| median_cost(&base));
    let none = median_cost(&none);
    ensure!(!some.is_empty(), "no context phase ran");
    let some = median_cost(&some);
    let _ = fs::remove_file(&pingpong);

    let header = [
        "daemon, workload",
        "ns/switch",
        "ns/sample",
        "switches",
        "round trips",
        "added ns/switch",
        "target",
    ];
    let mut rows = Vec::new();
    if let Some(b) = &baseline {
        rows.push(row(
            "baseline daemon (`OTEL_BENCH_BASELINE`), no context",
            b,
            None,
            None,
        ));
    }
    rows.push(row(
        "#43, no context",
        &none,
        baseline.as_ref(),
        Some(ADDED_WITHOUT_NS),
    ));
    let ctx_base = baseline.as_ref().unwrap_or(&none);
    let ctx_target = baseline.is_some().then_some(ADDED_WITH_NS);
    rows.push(row(
        "#43, context published",
        &some,
        Some(ctx_base),
        ctx_target,
    ));
    let (date, kernel, load) = common::system()?;
    let report = format!(
        "# Cost of reading the OpenTelemetry thread context (#43)\n\n\
         `cargo bench --bench otel_ctx`: two threads ping-pong a byte through pipes \
         (`bench/workloads/otel_pingpong.c`), a context switch per hop, beside the daemon \
         at 999 Hz; the BPF programs' run time per run from `kernel.bpf_stats_enabled` \
         (switch: {}; sample: {SAMPLE_PROG}). Medians of the rounds. \"Added\" is against \
         the baseline daemon (`OTEL_BENCH_BASELINE`) when one ran, else (context row) \
         against no context.\n\nRun {date}, kernel {kernel}, load {load}.\n\n{}\n",
        SWITCH_PROGS.join(" + "),
        common::table(&header, &rows),
    );
    common::write_result("otel_ctx.md", &report)
}

fn main() {
    common::main("otel_ctx", run);
}
