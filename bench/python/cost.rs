//! The BPF cost of Python frames: the daemon's programs' run time with
//! `--python off` and `--python on`, per Python walk, on and off CPU.

use super::*;

/// What tight.py does beside the daemon in a BPF cost window.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Scenario {
    /// Computes: each on-CPU sample of it walks its Python stack.
    OnCpu,
    /// Sleeps 1 ms at a time: each wakeup's off-CPU stack is walked.
    OffCpu,
}

pub(super) const SCENARIOS: [Scenario; 2] = [Scenario::OnCpu, Scenario::OffCpu];

impl Scenario {
    pub(super) fn tight_args(self) -> &'static [&'static str] {
        match self {
            Scenario::OnCpu => &[],
            Scenario::OffCpu => &["--block"],
        }
    }

    /// The daemon's options besides `--python`: off-CPU, every interval's
    /// stack (not 1 in 50 of 1 ms ones), so that each wakeup walks.
    pub(super) fn daemon_args(self) -> &'static [&'static str] {
        match self {
            Scenario::OnCpu => &[],
            Scenario::OffCpu => &["--offcpu-sample-us", "0"],
        }
    }

    /// The program whose runs walk the workload's Python stack.
    pub(super) fn program(self) -> &'static str {
        match self {
            Scenario::OnCpu => "on_cpu_sample",
            Scenario::OffCpu => "on_switched_in",
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Scenario::OnCpu => "on-CPU (a, per sample)",
            Scenario::OffCpu => "off-CPU (b, per walk at switch-in)",
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Scenario::OnCpu => "(a) on-CPU: `tight.py --depth 30`",
            Scenario::OffCpu => "(b) off-CPU: `tight.py --depth 30 --block`",
        }
    }
}

/// One daemon run of a cost window.
pub(super) struct CostRun {
    pub(super) python: bool,
    pub(super) round: usize,
    /// Wall seconds between the two reads.
    pub(super) secs: f64,
    /// Run count and run time (ns) per program name, over the window.
    pub(super) progs: BTreeMap<String, (u64, u64)>,
    /// `python_stack_walks` over the window.
    pub(super) walks: u64,
    /// tight.py's iterations per second.
    pub(super) rate: f64,
    /// CPUs the host kept busy besides the daemon and tight.py.
    pub(super) others: f64,
    /// The daemon's own timer of user stack walks since it started.
    pub(super) walk_time: Option<WalkTime>,
}

/// The commonest depth of user stack walks (with unwind tables) in the
/// daemon's `wallscope_stack_walk_seconds`, and its median walk.
pub(super) struct WalkTime {
    pub(super) frames: String,
    pub(super) walks: u64,
    /// The upper bound of the slot holding the median, ns.
    pub(super) p50_ns: f64,
}

impl WalkTime {
    pub(super) fn read(port: u16) -> Result<Option<WalkTime>> {
        let text = common::get(port, "/metrics")?;
        let label = |line: &str, name: &str| -> Option<String> {
            let start = line.find(&format!("{name}=\""))? + name.len() + 2;
            let len = line[start..].find('"')?;
            Some(line[start..start + len].to_string())
        };
        let value = |line: &str| line.rsplit_once(' ')?.1.parse::<f64>().ok();
        let rows = text.lines().filter(|l| l.contains("kind=\"user_tables\""));
        let mut counts = Vec::new();
        let mut p50 = BTreeMap::new();
        for line in rows {
            let Some(frames) = label(line, "frames") else {
                continue;
            };
            if line.starts_with("wallscope_stack_walk_seconds_count{") {
                counts.push((frames, value(line).unwrap_or(0.0) as u64));
            } else if label(line, "quantile").as_deref() == Some("0.5") {
                p50.insert(frames, value(line).unwrap_or(f64::NAN) * 1e9);
            }
        }
        let top = counts.into_iter().max_by_key(|(_, n)| *n);
        Ok(top.map(|(frames, walks)| WalkTime {
            p50_ns: p50.get(&frames).copied().unwrap_or(f64::NAN),
            frames,
            walks,
        }))
    }
}

impl CostRun {
    pub(super) fn bpf_ns_per_s(&self) -> f64 {
        self.progs.values().map(|p| p.1).sum::<u64>() as f64 / self.secs
    }

    pub(super) fn walks_per_s(&self) -> f64 {
        self.walks as f64 / self.secs
    }

    /// `name`'s ns per run and runs per second.
    pub(super) fn prog(&self, name: &str) -> Option<(f64, f64)> {
        let (cnt, ns) = *self.progs.get(name)?;
        (cnt > 0).then(|| (ns as f64 / cnt as f64, cnt as f64 / self.secs))
    }

    /// `name`'s run time per second.
    pub(super) fn prog_ns_per_s(&self, name: &str) -> f64 {
        self.progs.get(name).map_or(0.0, |p| p.1 as f64) / self.secs
    }
}

pub(super) struct Cost {
    pub(super) rounds: usize,
    pub(super) seconds: u64,
    /// `kernel.bpf_stats_enabled` during, before and after the part.
    pub(super) stats: String,
    pub(super) python: String,
    /// Per scenario, every run in the order run.
    pub(super) runs: Vec<(Scenario, Vec<CostRun>)>,
    /// Other Python processes running meanwhile: their walks count too.
    pub(super) other_pythons: BTreeSet<String>,
}

/// The BPF cost part: each scenario's workload, the daemon with
/// `--python off` and `on` in turn beside it.
pub(super) fn cost(daemon: &Path, python: &Path, tmp: &Path) -> Result<Cost> {
    find_tool("bpftool", "bpftool")?;
    let rounds = env_u64("WS_BENCH_COST_ROUNDS", 5)? as usize;
    let seconds = env_u64("WS_BENCH_COST_SECONDS", 10)?;
    let stats_before = common::bpf_stats_enabled()?;
    let stats = common::BpfStats::enable()?;
    let stats_during = common::bpf_stats_enabled()?;
    let mut all = Vec::new();
    let mut other_pythons = BTreeSet::new();
    for scenario in SCENARIOS {
        let tight = Tight::start(python, tmp, scenario.tight_args())?;
        let mut runs = Vec::new();
        for round in 1..=rounds {
            // Alternate which side goes first, so drift does not favour one.
            let order = if round % 2 == 1 {
                [false, true]
            } else {
                [true, false]
            };
            for on in order {
                other_pythons.extend(other_pythons_running(tight.pid));
                let r = cost_window(daemon, scenario, on, round, seconds, &tight, tmp)
                    .with_context(|| {
                        format!(
                            "{}, round {round}, --python {}",
                            scenario.describe(),
                            on_off(on)
                        )
                    })?;
                let prog = r.prog(scenario.program()).unwrap_or_default();
                eprintln!(
                    "cost {} round {round}/{rounds} --python {:<3}: BPF {:>10.0} ns/s, \
                     {:>6.1} Python walks/s, {} {:.0} ns x {:.0}/s, rest of host {:.2} CPUs",
                    scenario.program(),
                    on_off(on),
                    r.bpf_ns_per_s(),
                    r.walks_per_s(),
                    scenario.program(),
                    prog.0,
                    prog.1,
                    r.others
                );
                runs.push(r);
            }
        }
        drop(tight);
        all.push((scenario, runs));
    }
    drop(stats);
    Ok(Cost {
        rounds,
        seconds,
        stats: format!(
            "{stats_during} during the part; {stats_before} before it, {} after",
            common::bpf_stats_enabled()?
        ),
        python: python_version(python),
        runs: all,
        other_pythons,
    })
}

pub(super) fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// Python processes other than `pid`: the daemon walks their stacks too.
pub(super) fn other_pythons_running(pid: u32) -> Vec<String> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    dir.flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let exe = fs::read_link(e.path().join("exe")).ok()?;
            let name = exe.file_name()?.to_string_lossy().to_string();
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim();
            let python = name.starts_with("python") && !name.contains('-');
            (p != pid && p != me && python).then(|| {
                let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                format!("{comm} (pid {p}): `{}`", cmd.trim())
            })
        })
        .collect()
}

/// `/healthz` `events.python_stack_walks`, and the sum of all its
/// counters (which moves at every drain's stats).
pub(super) fn walks_and_counters(port: u16) -> Result<(u64, u64)> {
    let h = healthz(port).context("/healthz stopped answering")?;
    let walks = h["events"]["python_stack_walks"].as_u64();
    let walks = walks.context("/healthz has no events.python_stack_walks: rebuild the daemon")?;
    let sum = |v: &Value| {
        v.as_object()
            .map_or(0, |o| o.values().filter_map(Value::as_u64).sum::<u64>())
    };
    let all = sum(&h["events"]) + sum(&h["lost"]) + h["samples"].as_u64().unwrap_or(0);
    Ok((walks, all))
}

/// Name, run count and run time (ns) of BPF programs, by id.
pub(super) type ProgStats = BTreeMap<u64, (String, u64, u64)>;

/// Waits for the daemon's counters to move (a drain's stats reached its
/// store), then reads the programs' stats at once: the walks and the run
/// times then cover the same seconds, to within a drain's symbolization.
pub(super) fn at_drain(port: u16, ids: &BTreeSet<u64>) -> Result<(u64, ProgStats, Instant)> {
    let (_, before) = walks_and_counters(port)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (walks, now) = walks_and_counters(port)?;
        if now != before {
            return Ok((walks, common::prog_stats(ids)?, Instant::now()));
        }
        ensure!(Instant::now() < deadline, "no drain in 10 s");
        sleep(Duration::from_millis(20));
    }
}

pub(super) fn cost_window(
    daemon: &Path,
    scenario: Scenario,
    on: bool,
    round: usize,
    secs: u64,
    tight: &Tight,
    tmp: &Path,
) -> Result<CostRun> {
    ensure!(
        Path::new(&format!("/proc/{}", tight.pid)).exists(),
        "tight.py is gone"
    );
    let log = tmp.join("cost.log");
    let mut args = vec!["--python", on_off(on)];
    args.extend(scenario.daemon_args());
    let (mut d, port) = serve(daemon, &log, &args)?;
    let log_text = || fs::read_to_string(&log).unwrap_or_default();
    if on {
        // The daemon registers the interpreter at its first drains: its
        // walks have begun once the counter moves.
        let deadline = Instant::now() + Duration::from_secs(30);
        while walks_and_counters(port)?.0 == 0 {
            ensure!(
                Instant::now() < deadline,
                "no Python stack walked in 30 s; log:\n{}",
                log_text()
            );
            sleep(Duration::from_millis(200));
        }
    }
    sleep(SETTLE);
    let ids = common::linked_progs(d.0.id());
    ensure!(!ids.is_empty(), "no BPF programs linked by the daemon");
    let (walks0, progs0, t0) = at_drain(port, &ids)?;
    let (host0, daemon0, tight0) = (host_busy_s()?, d.cpu_seconds()?, tight.child.cpu_seconds()?);
    let (i0, e0, _) = tight.counters()?;
    sleep(Duration::from_secs(secs).saturating_sub(Duration::from_millis(500)));
    let (walks1, progs1, t1) = at_drain(port, &ids)?;
    let (host1, daemon1, tight1) = (host_busy_s()?, d.cpu_seconds()?, tight.child.cpu_seconds()?);
    let (i1, e1, _) = tight.counters()?;
    if let Some(status) = d.0.try_wait()? {
        bail!("wallscope exited with {status}; log:\n{}", log_text());
    }
    let walk_time = WalkTime::read(port)?;
    d.stop(libc::SIGTERM)?;
    let mut progs = BTreeMap::new();
    for (id, (name, cnt, ns)) in progs1 {
        let (cnt0, ns0) = progs0.get(&id).map_or((0, 0), |b| (b.1, b.2));
        let sum: &mut (u64, u64) = progs.entry(name).or_default();
        sum.0 += cnt.saturating_sub(cnt0);
        sum.1 += ns.saturating_sub(ns0);
    }
    let secs = (t1 - t0).as_secs_f64();
    let others = (host1 - host0) - (daemon1 - daemon0) - (tight1 - tight0);
    Ok(CostRun {
        python: on,
        round,
        secs,
        progs,
        walks: walks1.saturating_sub(walks0),
        rate: if e1 > e0 {
            (i1 - i0) * 1e9 / (e1 - e0)
        } else {
            f64::NAN
        },
        others: others.max(0.0) / secs,
        walk_time,
    })
}

pub(super) fn render_cost(c: &Cost) -> Result<String> {
    let mut s = format!(
        "## BPF cost of Python frames\n\nWhat walking Python frames adds to the \
         daemon's BPF programs. `kernel.bpf_stats_enabled`: {stats}; \
         tight.py under {py}; the release daemon at {HZ} Hz, run with `--python off` \
         and with `--python on` in turn ({rounds} rounds, the first side alternating), \
         each run measured over {secs} s once the interpreter is registered. BPF ns/s: \
         the run time of all the programs the daemon linked (`bpftool prog show`), \
         host-wide. Python walks/s: `/healthz` `events.python_stack_walks` (every \
         Python thread on the host). Added per walk: (BPF ns/s on - off) / (walks/s \
         on), of the medians, and per round (paired, min / max). Per program: its \
         `run_time_ns / run_cnt` (every run, most of which walk no Python stack) and \
         its own added ns/s per walk. With `--python on` a Python process's native \
         walks are not reused either (its registers say nothing of its Python stack), \
         so the added cost includes the reuse lost. User stack walk: the daemon's own \
         timer of its user stack walks (`/metrics` `wallscope_stack_walk_seconds`, \
         `kind=\"user_tables\"`, since it started): the upper bound of the slot (19 % \
         wide) holding the median walk of the commonest depth, native and Python \
         frames together, a cross-check of the walk's own cost. {measured}",
        stats = c.stats,
        py = c.python,
        rounds = c.rounds,
        secs = c.seconds,
        measured = measured()?,
    );
    let med = |runs: &[&CostRun], f: &dyn Fn(&CostRun) -> f64| {
        common::median(runs.iter().map(|r| f(r))).unwrap_or(f64::NAN)
    };
    let spread = |runs: &[&CostRun], f: &dyn Fn(&CostRun) -> f64| {
        let m = med(runs, f);
        if m == 0.0 || !m.is_finite() {
            return "-".to_string();
        }
        let (lo, hi) = common::spread(runs.iter().map(|r| f(r)), m);
        format!("{lo:+.0} / {hi:+.0} %")
    };
    let mut summary = Vec::new();
    for (scenario, runs) in &c.runs {
        let program = scenario.program();
        let side = |on: bool| runs.iter().filter(|r| r.python == on).collect::<Vec<_>>();
        let (off, on) = (side(false), side(true));
        let bpf = |r: &CostRun| r.bpf_ns_per_s();
        let walks = |r: &CostRun| r.walks_per_s();
        let prog_ns = |r: &CostRun| r.prog(program).map_or(f64::NAN, |p| p.0);
        let prog_rate = |r: &CostRun| r.prog(program).map_or(f64::NAN, |p| p.1);
        let prog_total = |r: &CostRun| r.prog_ns_per_s(program);
        let walks_on = med(&on, &walks);
        let added = (med(&on, &bpf) - med(&off, &bpf)) / walks_on;
        let added_prog = (med(&on, &prog_total) - med(&off, &prog_total)) / walks_on;
        // Per round: that round's on and off runs.
        let paired: Vec<f64> = (1..=c.rounds)
            .filter_map(|round| {
                let a = on.iter().find(|r| r.round == round)?;
                let b = off.iter().find(|r| r.round == round)?;
                Some((a.bpf_ns_per_s() - b.bpf_ns_per_s()) / a.walks_per_s())
            })
            .collect();
        let (plo, phi) = paired
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
                (lo.min(*p), hi.max(*p))
            });
        let mut rows = Vec::new();
        for (label, runs) in [("--python off", &off), ("--python on", &on)] {
            rows.push(vec![
                label.to_string(),
                format!("{:.0} ({})", med(runs, &bpf), spread(runs, &bpf)),
                format!("{:.1} ({})", med(runs, &walks), spread(runs, &walks)),
                format!("{:.0} ({})", med(runs, &prog_ns), spread(runs, &prog_ns)),
                format!("{:.0}", med(runs, &prog_rate)),
                format!("{:.0}", med(runs, &prog_total)),
                format!("{:.0}", med(runs, &|r: &CostRun| r.rate)),
                format!("{:.2}", med(runs, &|r: &CostRun| r.others)),
            ]);
        }
        s += &format!(
            "### {}\n\nAdded per Python walk: **{added:.0} ns** (all programs; paired per \
             round: median {:.0}, min {plo:.0} / max {phi:.0}); `{program}` alone: \
             {added_prog:.0} ns.\n\n",
            scenario.describe(),
            common::median(paired.iter().copied()).unwrap_or(f64::NAN),
        );
        s += &common::table(
            &[
                "daemon",
                "BPF ns/s, all programs: median (min / max)",
                "Python walks/s",
                &format!("`{program}` ns/run"),
                &format!("`{program}` runs/s"),
                &format!("`{program}` ns/s"),
                "tight.py it/s",
                "rest of host, CPUs",
            ],
            &rows,
        );
        let walk = |side: &[&CostRun]| {
            let p50 = med(side, &|r: &CostRun| {
                r.walk_time.as_ref().map_or(f64::NAN, |w| w.p50_ns)
            });
            let frames = side.iter().find_map(|r| r.walk_time.as_ref());
            let frames = frames.map_or("?", |w| w.frames.as_str());
            format!("{:.1} µs ({frames} frames)", p50 / 1e3)
        };
        s += &format!(
            "\nUser stack walk, median over runs of the median walk: `--python off` {}, \
             `--python on` {}.\n",
            walk(&off),
            walk(&on)
        );
        if *scenario == Scenario::OnCpu {
            let (ns_on, ns_off) = (med(&on, &prog_total), med(&off, &prog_total));
            s += &format!(
                "\nSampling at {HZ} Hz takes `{program}` {ns_on:.0} ns/s with `--python on`, \
                 {:.3} % of a CPU, and {ns_off:.0} ns/s with `--python off`, {:.3} % (the \
                 host's every sample; with the host quiet, nearly all tight.py's): what \
                 the sampled thread loses to it, cache effects aside. Python frames add \
                 {added:.0} ns x {walks_on:.0} walks/s = {:.3} % of its CPU.\n",
                ns_on / 1e7,
                ns_off / 1e7,
                added * walks_on / 1e7,
            );
        }
        s += "\nEach run:\n\n";
        let rows: Vec<Vec<String>> = runs
            .iter()
            .map(|r| {
                let (ns, rate) = r.prog(program).unwrap_or((f64::NAN, f64::NAN));
                vec![
                    format!("{} --python {}", r.round, on_off(r.python)),
                    format!("{:.2}", r.secs),
                    format!("{:.0}", r.bpf_ns_per_s()),
                    format!("{:.1}", r.walks_per_s()),
                    format!("{ns:.0} x {rate:.0}/s"),
                    r.walk_time.as_ref().map_or("-".into(), |w| {
                        format!(
                            "{:.1} µs ({} frames, {} walks)",
                            w.p50_ns / 1e3,
                            w.frames,
                            w.walks
                        )
                    }),
                    format!("{:.2}", r.others),
                ]
            })
            .collect();
        s += &common::table(
            &[
                "round",
                "s",
                "BPF ns/s",
                "Python walks/s",
                &format!("`{program}`"),
                "user stack walk, median (commonest depth)",
                "rest of host, CPUs",
            ],
            &rows,
        );
        s += "\n";
        summary.push(format!(
            "{}: {added:.0} ns (`{program}` alone: {added_prog:.0} ns)",
            scenario.label()
        ));
    }
    s += &format!("Added per 30-deep Python walk: {}.\n\n", summary.join("; "));
    if !c.other_pythons.is_empty() {
        s += "Other Python processes ran meanwhile (their walks are in the counts, \
              their stacks shallower):\n\n";
        c.other_pythons
            .iter()
            .for_each(|p| s += &format!("- {p}\n"));
        s += "\n";
    }
    Ok(s)
}

// ---------------------------------------------------------------- report
