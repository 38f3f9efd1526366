//! Accuracy: py-spy and wallscope watching `shares.py` over the same
//! window, against the workload's own measurement.

use super::*;

/// One interpreter's comparison.
pub(super) struct Accuracy {
    pub(super) python: String,
    pub(super) truth: Profile,
    pub(super) pyspy: Profile,
    pub(super) wallscope: Profile,
    pub(super) pyspy_samples: u64,
    pub(super) pyspy_errors: u64,
    pub(super) window_s: f64,
}

impl Accuracy {
    pub(super) fn summary(&self) -> String {
        format!(
            "py-spy {} samples, top-10 vs truth {}/10, max diff {:.1} pts; wallscope {:.0} ms, \
             vs truth {}/10, vs py-spy {}/10",
            self.pyspy_samples,
            overlap(&self.pyspy, &self.truth),
            max_diff(&self.pyspy, &self.truth, &self.truth.top()).unwrap_or(f64::NAN),
            self.wallscope.total / 1000.0,
            overlap(&self.wallscope, &self.truth),
            overlap(&self.wallscope, &self.pyspy),
        )
    }
}

/// Runs shares.py under `python` with py-spy and the daemon at `port`
/// watching the same window.
pub(super) fn compare(
    pyspy: &Path,
    python: &Path,
    port: u16,
    secs: u64,
    tmp: &Path,
) -> Result<Accuracy> {
    let truth_path = tmp.join("truth.json");
    let _ = fs::remove_file(&truth_path);
    let truth_arg = truth_path.to_string_lossy().to_string();
    let (mut workload, pid) = start_python(python, "shares.py", &["--truth", &truth_arg])?;
    sleep(WARMUP);
    let before = read_json(&truth_path)?;
    let out = tmp.join("pyspy.txt");
    let log = tmp.join("pyspy.log");
    let mut cmd = Command::new(pyspy);
    cmd.args(["record", "--format", "raw", "--nonblocking", "--threads"])
        .args(["--rate", &HZ.to_string(), "--duration", &secs.to_string()])
        .args(["--pid", &pid.to_string(), "-o"])
        .arg(&out);
    // py-spy prints its sample and error counts on stdout.
    let file = fs::File::create(&log)?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    let mut spy = Guard(cmd.spawn().context("starting py-spy")?);
    let status = spy.0.wait()?;
    // py-spy samples for `secs` once attached: the window ends now.
    let until = unix_now();
    let from = until - secs as f64;
    let after = read_json(&truth_path)?;
    let spy_log = fs::read_to_string(&log).unwrap_or_default();
    ensure!(status.success(), "py-spy failed ({status}):\n{spy_log}");
    ensure!(workload.0.try_wait()?.is_none(), "shares.py exited early");
    sleep(Duration::from_millis(1500));
    settle(port)?;
    let query = format!("/folded?pid={pid}&group=thread&from={from:.3}&until={until:.3}");
    let body = common::get(port, &query)?;
    workload.stop(libc::SIGKILL)?;
    let pyspy_text = fs::read_to_string(&out)?;
    let (samples, errors) = pyspy_counts(&spy_log);
    let before_s = before["total_ns"].as_f64().unwrap_or(0.0);
    let after_s = after["total_ns"].as_f64().unwrap_or(0.0);
    Ok(Accuracy {
        python: after["python"].as_str().unwrap_or("?").to_string(),
        truth: truth_profile(&before, &after)?,
        pyspy: pyspy_profile(&pyspy_text, pid),
        wallscope: wallscope_profile(&body, pid),
        pyspy_samples: samples,
        pyspy_errors: errors,
        window_s: (after_s - before_s) / 1e9,
    })
}

/// py-spy's "Samples: N Errors: M".
pub(super) fn pyspy_counts(log: &str) -> (u64, u64) {
    let after = |word: &str| {
        let rest = log.rsplit_once(word)?.1;
        rest.split_whitespace().next()?.parse().ok()
    };
    (
        after("Samples:").unwrap_or(0),
        after("Errors:").unwrap_or(0),
    )
}

pub(super) fn render_accuracy(seconds: u64, accuracy: &[Accuracy]) -> Result<String> {
    let mut s = format!(
        "## Accuracy\n\n`tests/workloads/python/shares.py`, {seconds} s watched by both at once, \
         against the CPU time the workload measured itself per function over the same \
         window. Shares are of the main thread's samples (the other threads only \
         block; the share of samples a profiler put on them is listed). Inclusive \
         share: of those samples, the ones whose stack contains the function (truth: \
         its CPU time with its callees' over the main thread's). \
         Leaf share: those whose innermost Python frame it is (truth: its self time). \
         Functions match by the innermost part of the qualname. Targets: wallscope's \
         and py-spy's top-{TOP} by inclusive share share >= {MIN_OVERLAP}, each \
         differing by <= {MAX_DIFF} points (verdict); the same against the truth (last \
         column). {measured}",
        measured = measured()?
    );
    let mut rows = Vec::new();
    for a in accuracy {
        let keys = a.truth.top();
        let both: Vec<String> = {
            let mut k = a.pyspy.top();
            k.extend(a.wallscope.top());
            k.sort();
            k.dedup();
            k
        };
        let ws_vs_spy = max_diff(&a.wallscope, &a.pyspy, &both);
        let verdict = if !a.wallscope.has_frames() {
            "wallscope: NO PYTHON FRAMES".to_string()
        } else if overlap(&a.wallscope, &a.pyspy) >= MIN_OVERLAP
            && ws_vs_spy.is_some_and(|d| d <= MAX_DIFF)
        {
            "MEETS".to_string()
        } else {
            "MISSES".to_string()
        };
        let vs_truth = |p: &Profile| {
            let meets = p.has_frames()
                && overlap(p, &a.truth) >= MIN_OVERLAP
                && max_diff(p, &a.truth, &keys).is_some_and(|d| d <= MAX_DIFF);
            if meets {
                "meets"
            } else {
                "misses"
            }
        };
        rows.push(vec![
            a.python.clone(),
            format!(
                "{:.0} / {} ({} errors)",
                a.pyspy.total, a.pyspy_samples, a.pyspy_errors
            ),
            format!("{:.1}", other_pct(&a.pyspy)),
            format!("{:.0}", a.wallscope.total / 1000.0),
            format!("{:.1}", other_pct(&a.wallscope)),
            format!("{}/{TOP}", overlap(&a.pyspy, &a.truth)),
            format!("{}/{TOP}", overlap(&a.wallscope, &a.truth)),
            format!("{}/{TOP}", overlap(&a.wallscope, &a.pyspy)),
            pts(max_diff(&a.pyspy, &a.truth, &keys)),
            pts(max_diff(&a.wallscope, &a.truth, &keys)),
            pts(ws_vs_spy),
            verdict,
            format!("{} / {}", vs_truth(&a.pyspy), vs_truth(&a.wallscope)),
        ]);
    }
    s += &common::table(
        &[
            "CPython",
            "py-spy samples: main thread / all",
            "py-spy other threads %",
            "wallscope CPU ms, main thread",
            "wallscope other threads %",
            "top-10 py-spy ∩ truth",
            "wallscope ∩ truth",
            "wallscope ∩ py-spy",
            "max Δ py-spy/truth (pts)",
            "max Δ wallscope/truth",
            "max Δ wallscope/py-spy",
            "verdict",
            "vs truth: py-spy / wallscope",
        ],
        &rows,
    );
    for a in accuracy {
        s += &format!(
            "\n### CPython {} (truth window {:.1} s of main-thread CPU)\n\n",
            a.python, a.window_s
        );
        let mut keys = a.truth.top();
        for k in a.pyspy.top().into_iter().chain(a.wallscope.top()) {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let rows: Vec<Vec<String>> = keys
            .iter()
            .map(|k| {
                let name = [&a.truth, &a.wallscope, &a.pyspy]
                    .iter()
                    .find_map(|p| p.names.get(k))
                    .cloned()
                    .unwrap_or_else(|| k.clone());
                let incl = |p: &Profile| {
                    p.has_frames()
                        .then(|| p.inclusive.get(k).copied().unwrap_or(0.0))
                };
                let leaf = |p: &Profile| {
                    p.has_frames()
                        .then(|| p.leaf.get(k).copied().unwrap_or(0.0))
                };
                let diff = incl(&a.wallscope)
                    .zip(incl(&a.pyspy))
                    .map(|(w, p)| (w - p).abs() * 100.0);
                vec![
                    format!("`{name}`"),
                    pct(incl(&a.truth)),
                    pct(incl(&a.pyspy)),
                    pct(incl(&a.wallscope)),
                    pct(leaf(&a.truth)),
                    pct(leaf(&a.pyspy)),
                    pct(leaf(&a.wallscope)),
                    pts(diff),
                ]
            })
            .collect();
        s += &common::table(
            &[
                "function",
                "inclusive % truth",
                "py-spy",
                "wallscope",
                "leaf % truth",
                "py-spy",
                "wallscope",
                "Δ inclusive wallscope/py-spy (pts)",
            ],
            &rows,
        );
    }

    s += "\n";
    Ok(s)
}
