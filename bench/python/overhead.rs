//! Overhead: `tight.py`'s own rate alone, with py-spy attached and with
//! the wallscope daemon running, in rotated rounds on a quiet host.

use super::*;

/// What runs beside tight.py in an overhead window.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Config {
    Alone,
    PySpy,
    Wallscope,
}

pub(super) const CONFIGS: [Config; 3] = [Config::Alone, Config::PySpy, Config::Wallscope];

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Config::Alone => write!(f, "alone"),
            Config::PySpy => write!(f, "py-spy {HZ} Hz nonblocking"),
            Config::Wallscope => write!(f, "wallscope {HZ} Hz --python on"),
        }
    }
}

/// A configuration's name in the per-round table.
pub(super) fn short(c: Config) -> &'static str {
    match c {
        Config::Alone => "alone",
        Config::PySpy => "py-spy",
        Config::Wallscope => "wallscope",
    }
}

/// tight.py, running through all the overhead windows.
pub(super) struct Tight {
    pub(super) child: Guard,
    pub(super) pid: u32,
    pub(super) report: PathBuf,
}

impl Tight {
    /// `tight.py --depth 30` and `args`.
    pub(super) fn start(python: &Path, tmp: &Path, args: &[&str]) -> Result<Tight> {
        let report = tmp.join("tight.json");
        let _ = fs::remove_file(&report);
        let out = report.to_string_lossy().to_string();
        let mut all = vec!["--depth", "30", "--out", &out];
        all.extend(args);
        let (child, pid) = start_python(python, "tight.py", &all)?;
        sleep(Duration::from_millis(2500));
        Ok(Tight { child, pid, report })
    }

    /// Iterations and ns since its loop started, and the iterations/s of
    /// the second before, as last reported.
    pub(super) fn counters(&self) -> Result<(f64, f64, f64)> {
        let v = read_json(&self.report)?;
        let n = |f: &str| {
            v[f].as_f64()
                .with_context(|| format!("no {f} in tight.json"))
        };
        Ok((n("iterations")?, n("elapsed_ns")?, n("rate")?))
    }
}

impl Drop for Tight {
    fn drop(&mut self) {
        let _ = self.child.stop(libc::SIGKILL);
    }
}

/// Profilers running that this bench did not start (another wallscope,
/// py-spy, perf): the `alone` runs are not alone then.
pub(super) fn foreign_profilers() -> Vec<String> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id().to_string();
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().into_string().ok()?;
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            let ours = fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, r)| r.split_whitespace().nth(1) == Some(&me))
                })
                .unwrap_or(false);
            let comm = comm.trim();
            let profiler = ["wallscope", "py-spy", "perf"].contains(&comm);
            (profiler && !ours).then(|| {
                let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                format!("{comm} (pid {pid}): `{}`", cmd.trim())
            })
        })
        .collect()
}

/// The overhead windows' results, by [`CONFIGS`].
pub(super) struct Overhead {
    pub(super) rounds: usize,
    pub(super) seconds: u64,
    pub(super) runs: Vec<Vec<Run>>,
    pub(super) foreign: BTreeSet<String>,
    pub(super) quiet: Quiet,
    /// tight.py's interpreter.
    pub(super) python: String,
}

pub(super) struct Run {
    /// Loop iterations per second.
    pub(super) rate: f64,
    /// The median of the window's per-second rates: the VM's dips of a
    /// few seconds (the loop slowed by a third, with or without a
    /// profiler) weigh less.
    pub(super) second_median: f64,
    /// CPU seconds the profiler used during the window.
    pub(super) tool_cpu_s: Option<f64>,
    /// CPUs the rest of the host kept busy on average over the window
    /// (neither tight.py nor the profiler).
    pub(super) others: f64,
}

pub(super) fn measure(
    c: Config,
    tight: &Tight,
    pyspy: &Path,
    daemon: &Path,
    secs: u64,
    tmp: &Path,
) -> Result<Run> {
    ensure!(
        Path::new(&format!("/proc/{}", tight.pid)).exists(),
        "tight.py is gone"
    );
    let log = tmp.join("overhead.log");
    let (mut tool, signal) = match c {
        Config::Alone => (None, 0),
        Config::PySpy => {
            let mut cmd = Command::new(pyspy);
            cmd.args(["record", "--format", "raw", "--nonblocking"])
                .args(["--rate", &HZ.to_string(), "--pid", &tight.pid.to_string()])
                .arg("-o")
                .arg(tmp.join("overhead-pyspy.txt"));
            (Some(common::spawn_logged(&mut cmd, &log)?), libc::SIGINT)
        }
        Config::Wallscope => (
            Some(serve(daemon, &log, &["--python", "on"])?.0),
            libc::SIGTERM,
        ),
    };
    sleep(SETTLE);
    if let Some(t) = tool.as_mut() {
        if let Some(status) = t.0.try_wait()? {
            bail!("{c} exited with {status}: {}", fs::read_to_string(&log)?);
        }
    }
    // Whole reports only: wait for the next one, then count to the one
    // `secs` later, keeping each second's rate on the way.
    let (i0, t0) = next_report(tight, None)?;
    let cpu0 = tool.as_ref().map(|t| t.cpu_seconds()).transpose()?;
    let (host0, tight0, wall0) = (host_busy_s()?, tight.child.cpu_seconds()?, Instant::now());
    let until = t0 + (secs as f64 - 0.5) * 1e9;
    let deadline = Instant::now() + Duration::from_secs(secs + 30);
    let (mut seen, mut seconds) = (t0, Vec::new());
    let (i1, t1) = loop {
        let (i, t, rate) = tight.counters()?;
        if t > seen {
            seconds.push(rate);
            seen = t;
            if t >= until {
                break (i, t);
            }
        }
        ensure!(Instant::now() < deadline, "tight.py stopped reporting");
        sleep(Duration::from_millis(50));
    };
    let cpu1 = tool.as_ref().map(|t| t.cpu_seconds()).transpose()?;
    let (host1, tight1) = (host_busy_s()?, tight.child.cpu_seconds()?);
    let tool_cpu_s = cpu0.zip(cpu1).map(|(a, b)| b - a);
    let others = (host1 - host0) - (tight1 - tight0) - tool_cpu_s.unwrap_or(0.0);
    let others = others.max(0.0) / wall0.elapsed().as_secs_f64();
    if let Some(t) = tool.as_mut() {
        t.stop(signal)?;
    }
    Ok(Run {
        rate: (i1 - i0) * 1e9 / (t1 - t0),
        second_median: common::median(seconds).unwrap_or(f64::NAN),
        tool_cpu_s,
        others,
    })
}

/// CPU seconds all CPUs spent busy since boot (`/proc/stat`: user, nice,
/// system, irq, softirq, steal).
pub(super) fn host_busy_s() -> Result<f64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().find_map(|l| l.strip_prefix("cpu "));
    let ticks: Vec<u64> = cpu
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .map(|t| t.parse().unwrap_or(0))
        .collect();
    ensure!(ticks.len() >= 8, "short cpu line in /proc/stat");
    let busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7];
    // SAFETY: sysconf has no preconditions.
    Ok(busy as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// CPUs the host keeps busy on average over `over`.
pub(super) fn host_busy(over: Duration) -> Result<f64> {
    let (b0, t0) = (host_busy_s()?, Instant::now());
    sleep(over);
    Ok((host_busy_s()? - b0) / t0.elapsed().as_secs_f64())
}

/// The host's load before the overhead part: waited for, up to `max`,
/// until [`QUIET_CPUS`] or less over [`QUIET_OVER`].
pub(super) struct Quiet {
    /// CPUs busy over the last look.
    pub(super) busy: f64,
    pub(super) waited: Duration,
    pub(super) reached: bool,
}

/// A host is quiet when the rest of it keeps no more CPU than this busy.
pub(super) const QUIET_CPUS: f64 = 0.25;
pub(super) const QUIET_OVER: Duration = Duration::from_secs(5);

pub(super) fn wait_quiet(max: Duration) -> Result<Quiet> {
    let start = Instant::now();
    loop {
        let busy = host_busy(QUIET_OVER)?;
        let reached = busy <= QUIET_CPUS;
        if reached || start.elapsed() >= max {
            eprintln!(
                "overhead: host {} ({busy:.2} CPUs busy) after {:.0} s",
                if reached { "quiet" } else { "still busy" },
                start.elapsed().as_secs_f64()
            );
            return Ok(Quiet {
                busy,
                waited: start.elapsed(),
                reached,
            });
        }
        eprintln!("overhead: host busy ({busy:.2} CPUs), waiting for it to quieten");
        sleep(Duration::from_secs(10));
    }
}

/// The first report tight.py writes after now (and at or after
/// `min_elapsed_ns` of its clock).
pub(super) fn next_report(tight: &Tight, min_elapsed_ns: Option<f64>) -> Result<(f64, f64)> {
    let (_, now, _) = tight.counters()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (i, t, _) = tight.counters()?;
        if t > now && t >= min_elapsed_ns.unwrap_or(0.0) {
            return Ok((i, t));
        }
        ensure!(Instant::now() < deadline, "tight.py stopped reporting");
        sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- BPF cost

/// Largest slowdown of the workload with wallscope (medians) that meets
/// the target, %.
pub(super) const MAX_SLOWDOWN: f64 = 1.0;

pub(super) fn render_overhead(o: &Overhead) -> Result<String> {
    let (rounds, overhead_s, runs) = (o.rounds, o.seconds, &o.runs);
    // Rounds none of whose windows had the rest of the host busy; the
    // figures are theirs when there are at least 5.
    let quiet_round = |k: usize| {
        runs.iter()
            .all(|r| r.get(k).is_some_and(|r| r.others <= QUIET_CPUS))
    };
    let quiet: Vec<usize> = (0..rounds).filter(|k| quiet_round(*k)).collect();
    let used: Vec<usize> = if quiet.len() >= 5 {
        quiet.clone()
    } else {
        (0..rounds).collect()
    };
    let q = &o.quiet;
    let mut s = format!(
        "## Overhead\n\n`tests/workloads/python/tight.py --depth 30` under {py} (one \
         process throughout), its own loop iterations/s over {overhead_s} s windows: alone, \
         with py-spy attached, with the wallscope daemon running (`--python on`: each \
         sample walks the 30 Python frames); {rounds} rounds, the first configuration \
         rotated each round. Per window, two rates: iterations over the window's time \
         (mean), and the median of its per-second rates (robust to this VM's dips: the \
         loop's speed drops by up to a third for a few seconds, profiler or not). \
         Slowdown: alone / with - 1, of the medians over rounds and (paired) the median \
         of each round's own; target with wallscope: < {MAX_SLOWDOWN} %. Profiler CPU: \
         the profiler process's user + system time over the window. Rest of host: the \
         CPUs that neither tight.py nor the profiler kept busy, from `/proc/stat`, \
         averaged over the window. Before the part the host was {state} \
         ({busy:.2} CPUs busy over {over} s, after waiting {waited:.0} s); rounds with \
         every window quiet (rest of host <= {QUIET_CPUS} CPUs): {nquiet} of {rounds}, \
         the figures below are of {which}. {measured}",
        py = o.python,
        state = if q.reached { "quiet" } else { "NOT quiet" },
        busy = q.busy,
        over = QUIET_OVER.as_secs(),
        waited = q.waited.as_secs_f64(),
        nquiet = quiet.len(),
        which = if used.len() == rounds {
            "all rounds".to_string()
        } else {
            format!("those {}", used.len())
        },
        measured = measured()?,
    );
    let pick = |c: usize, f: fn(&Run) -> f64| -> Vec<f64> {
        used.iter().filter_map(|k| runs[c].get(*k)).map(f).collect()
    };
    let mean = |r: &Run| r.rate;
    let second = |r: &Run| r.second_median;
    // Slowdown of configuration `c` by `f`: of the medians, and paired:
    // median, min and max of the rounds' own.
    let slowdown = |c: usize, f: fn(&Run) -> f64| -> (f64, f64, f64, f64) {
        let (base, with) = (pick(0, f), pick(c, f));
        let of_medians = common::median(base.iter().copied()).unwrap_or(f64::NAN)
            / common::median(with.iter().copied()).unwrap_or(f64::NAN);
        let per_round: Vec<f64> = base
            .iter()
            .zip(&with)
            .map(|(b, x)| (b / x - 1.0) * 100.0)
            .collect();
        let (lo, hi) = per_round
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
                (lo.min(*p), hi.max(*p))
            });
        let paired = common::median(per_round.iter().copied()).unwrap_or(f64::NAN);
        ((of_medians - 1.0) * 100.0, paired, lo, hi)
    };
    let mut rows = Vec::new();
    for (i, c) in CONFIGS.iter().enumerate() {
        let m = common::median(pick(i, mean)).unwrap_or(f64::NAN);
        let (lo, hi) = common::spread(pick(i, mean), m);
        let cpu = common::median(
            used.iter()
                .filter_map(|k| runs[i].get(*k))
                .filter_map(|r| r.tool_cpu_s),
        );
        let others = pick(i, |r| r.others);
        let max_others = others.iter().copied().fold(0.0, f64::max);
        let others = common::median(others).unwrap_or(f64::NAN);
        let dash = || "-".to_string();
        let slow = |f: fn(&Run) -> f64| {
            if i == 0 {
                return [dash(), dash()];
            }
            let (m, p, lo, hi) = slowdown(i, f);
            [
                format!("{m:+.2} %"),
                format!("{p:+.2} % ({lo:+.2} / {hi:+.2})"),
            ]
        };
        let [mean_m, mean_p] = slow(mean);
        let [sec_m, sec_p] = slow(second);
        rows.push(vec![
            c.to_string(),
            format!("{m:.0}"),
            format!("{lo:+.2} % / {hi:+.2} %"),
            mean_m,
            mean_p,
            sec_m,
            sec_p,
            cpu.map_or_else(dash, |c| format!("{c:.2}")),
            format!("{others:.2} (max {max_others:.2})"),
        ]);
    }
    s += &common::table(
        &[
            "configuration",
            "it/s (mean): median",
            "min / max vs median",
            "slowdown, means: of medians",
            "paired: median (min / max)",
            "slowdown, per-second medians: of medians",
            "paired: median (min / max)",
            "profiler CPU s/window",
            "rest of host, CPUs: median (max)",
        ],
        &rows,
    );
    for (i, c) in CONFIGS.iter().enumerate().skip(1) {
        let (m, p, _, _) = slowdown(i, mean);
        let (sm, sp, _, _) = slowdown(i, second);
        let verdict = if *c == Config::Wallscope {
            let all = [m, p, sm, sp];
            format!(
                " (target < {MAX_SLOWDOWN} %: {})",
                if all.iter().all(|v| *v < MAX_SLOWDOWN) {
                    "meets"
                } else if all.iter().all(|v| *v >= MAX_SLOWDOWN) {
                    "MISSES"
                } else {
                    "neither shown nor refuted: the estimates disagree"
                }
            )
        } else {
            String::new()
        };
        s += &format!(
            "\nWith {c}: {m:+.2} % / {p:+.2} % (means: of medians / paired), \
             {sm:+.2} % / {sp:+.2} % (per-second medians){verdict}.\n"
        );
    }
    s += "\nPer round (it/s; the slowdowns against that round's `alone`; the \
          busiest window's rest of host):\n\n";
    let mut rows = Vec::new();
    for round in 0..rounds {
        let order: Vec<String> = (0..CONFIGS.len())
            .map(|i| short(CONFIGS[(i + round) % CONFIGS.len()]).to_string())
            .collect();
        let mut row = vec![format!("{}", round + 1), order.join(", ")];
        let rates: Vec<Option<f64>> = runs.iter().map(|r| r.get(round).map(|r| r.rate)).collect();
        for r in &rates {
            row.push(r.map_or_else(|| "-".into(), |r| format!("{r:.0}")));
        }
        for r in &rates[1..] {
            let slow = rates[0].zip(*r).map(|(b, x)| (b / x - 1.0) * 100.0);
            row.push(slow.map_or_else(|| "-".into(), |p| format!("{p:+.2} %")));
        }
        let busiest = runs.iter().filter_map(|r| r.get(round)).map(|r| r.others);
        let busiest = busiest.fold(0.0, f64::max);
        row.push(format!(
            "{busiest:.2}{}",
            if used.contains(&round) {
                ""
            } else {
                " (left out)"
            }
        ));
        rows.push(row);
    }
    let mut header = vec!["round".to_string(), "order".to_string()];
    header.extend(CONFIGS.iter().map(|c| short(*c).to_string()));
    header.extend(
        CONFIGS[1..]
            .iter()
            .map(|c| format!("slowdown {}", short(*c))),
    );
    header.push("rest of host, CPUs".into());
    s += &common::table(&header, &rows);
    if !o.foreign.is_empty() {
        s += "\nNot alone: profilers this bench did not start ran during the `alone` \
              windows (and so during all of them):\n\n";
        o.foreign.iter().for_each(|f| s += &format!("- {f}\n"));
    }
    let alone = pick(0, mean);
    let m = common::median(alone.iter().copied()).unwrap_or(f64::NAN);
    let (lo, hi) = common::spread(alone, m);
    s += &format!(
        "\nNoise: the `alone` windows alone span {lo:+.1} % to {hi:+.1} % around their \
         median. On this VM the loop's speed swings by 10-20 % over seconds while its \
         CPU time stays at 1.00 s/s and no steal time shows (the physical host's other \
         tenants, presumably): timing cannot resolve 1 %. The measured direct cost is in \
         the BPF cost section: the sampling program's run time per second on the \
         sampled CPU.\n"
    );
    s += "\nWith more than one CPU the single-threaded workload leaves the profilers \
          a CPU of their own: the overhead is what sampling costs the workload's \
          thread (py-spy's reads of its memory, wallscope's in-kernel walk); the \
          profiler's own CPU is listed apart.\n\n";
    Ok(s)
}
