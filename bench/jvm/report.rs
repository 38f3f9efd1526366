//! The markdown report of one JVM run: `render` compares the two profiles'
//! top-10 Java methods by self time (overlap and share differences, the
//! PASS/FAIL verdict), lists every method against the workload's design,
//! the samples each tool took, the kinds of their innermost Java frames and
//! their unattributed rows, and how the run was made; `heaviest`, `fmt_pct`
//! and `shorten` format its pieces.

use crate::async_profiler::AP_VERSION;
use crate::common::{self, ROOT};
use crate::profile::{Profile, ENTRY_METHOD, JAVA_SUFFIXES, UNNAMED};
use crate::{
    Run, Setup, AP_INTERVAL, DESIGN, MAX_DIFF_PP, MAX_ENTRY_DIFF_PP, MIN_OVERLAP, TAIL_S, TOP,
};
use crate::{WARMUP_S, WARM_DRAINS};
use anyhow::{bail, Result};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The `n` heaviest `rows`, one per line, long ones cut in the middle.
pub fn heaviest(rows: &[(f64, String)], n: usize) -> String {
    let mut s = String::new();
    for (_, row) in rows.iter().take(n) {
        let chars: Vec<char> = row.chars().collect();
        if chars.len() > 320 {
            let head: String = chars[..100].iter().collect();
            let tail: String = chars[chars.len() - 200..].iter().collect();
            let _ = writeln!(s, "{head} … {tail}");
        } else {
            let _ = writeln!(s, "{row}");
        }
    }
    s
}

fn fmt_pct(share: Option<f64>) -> String {
    share.map_or("-".into(), |s| format!("{s:.2} %"))
}

pub fn render(setup: &Setup, run: &Run, failed: &[String]) -> Result<String> {
    let Ok(ap) = &run.ap else {
        bail!("no async-profiler profile")
    };
    let ws = &run.ws;
    let ws_top = ws.top(TOP);
    let ap_top = ap.top(TOP);
    let ws_set: BTreeSet<&str> = ws_top.iter().map(|(m, _)| m.as_str()).collect();
    let ap_set: BTreeSet<&str> = ap_top.iter().map(|(m, _)| m.as_str()).collect();
    let both: BTreeSet<&str> = ws_set.intersection(&ap_set).copied().collect();
    let diffs: Vec<(&str, f64)> = both
        .iter()
        .filter_map(|m| Some((*m, ws.share(m)? - ap.share(m)?)))
        .collect();
    let max_diff = diffs.iter().map(|d| d.1.abs()).fold(0.0, f64::max);
    let entry_diff = ws.entry_pct() - ap.entry_pct();
    let pass = both.len() >= MIN_OVERLAP
        && max_diff <= MAX_DIFF_PP
        && entry_diff.abs() <= MAX_ENTRY_DIFF_PP;

    let (date, kernel, load) = common::system()?;
    let java_version = common::java::java_version(&setup.java)?;
    let cpus = std::thread::available_parallelism()?.get();
    let ap_interval_ms = AP_INTERVAL.trim_end_matches("ms").parse::<f64>()?;
    let mut s = format!(
        "# Java CPU profile: wallscope vs async-profiler\n\n\
         - date: {date}\n- kernel: {kernel}\n- CPUs: {cpus}\n- JVM: {java_version}\n\
         - async-profiler {AP_VERSION} (Maven Central `tools.profiler:async-profiler`), \
         event `{event}`, interval {AP_INTERVAL}\n\
         - wallscope: `serve` at its default 99 Hz, {frames}\n\
         - workload: `bench/workloads/Burn.java`, 2 threads, {WARMUP_S} s warmup + \
         {steady} s steady + {TAIL_S} s tail; the steady window is compared\n\
         - load average after the run: {load}\n\n",
        event = run.event,
        steady = setup.steady_s,
        frames = if setup.full_frames {
            "`--jvm-frames full` (Java frames from HotSpot's own structures)"
        } else {
            "a daemon without `--jvm-frames` (before issue #12: compiled code named \
             from the perf map only, one frame per compiled blob; a FAIL is expected)"
        },
    );
    let verdict = if pass { "PASS" } else { "FAIL" };
    let _ = write!(
        s,
        "Verdict: **{verdict}** — top-{TOP} overlap {overlap} (need ≥ {MIN_OVERLAP}), \
         largest share difference {max_diff:.2} pp (need ≤ {MAX_DIFF_PP} pp each), \
         samples reaching the thread's entry (`{ENTRY_METHOD}`): wallscope {we:.1} %, \
         async-profiler {ae:.1} % ({entry_diff:+.1} pp, need within ±{MAX_ENTRY_DIFF_PP}).\n\n\
         JVM flags: {flags}.\n\n",
        overlap = both.len(),
        we = ws.entry_pct(),
        ae = ap.entry_pct(),
        flags = if setup.jvm_flags.is_empty() {
            "none (the JIT's defaults, no frame pointers)".to_string()
        } else {
            format!("`{}`", setup.jvm_flags.join(" "))
        },
    );

    s += "## Top 10 Java methods by self time\n\n";
    let rows: Vec<Vec<String>> = (0..TOP)
        .map(|i| {
            let cell = |top: &[(String, f64)]| match top.get(i) {
                Some((m, share)) => [format!("`{m}`"), format!("{share:.2} %")],
                None => ["-".into(), "-".into()],
            };
            let [wm, wsh] = cell(&ws_top);
            let [am, ash] = cell(&ap_top);
            vec![(i + 1).to_string(), wm, wsh, am, ash]
        })
        .collect();
    s += &common::table(
        &["rank", "wallscope", "share", "async-profiler", "share"],
        &rows,
    );

    s += "\n## Per method\n\nEvery method in either top 10 or in the workload's design; \
          design = share of a round the method's loop runs (of the Burn leaf methods \
          only; the driver methods `round` and `work` take a little of the measured time).\n\n";
    let mut methods: Vec<&str> = ws_set.union(&ap_set).copied().collect();
    for (m, _) in DESIGN {
        if !methods.contains(&m) {
            methods.push(m);
        }
    }
    let design = |m: &str| DESIGN.iter().find(|d| d.0 == m).map(|d| d.1);
    methods.sort_by(|a, b| {
        let key = |m: &str| ap.share(m).unwrap_or(0.0).max(ws.share(m).unwrap_or(0.0));
        key(b).total_cmp(&key(a)).then_with(|| a.cmp(b))
    });
    let rows: Vec<Vec<String>> = methods
        .iter()
        .map(|m| {
            let diff = match (ws.share(m), ap.share(m)) {
                (Some(w), Some(a)) => format!("{:+.2}", w - a),
                _ => "-".into(),
            };
            let in_both = if both.contains(m) {
                "yes"
            } else if ws_set.contains(m) {
                "wallscope only"
            } else if ap_set.contains(m) {
                "async-profiler only"
            } else {
                "neither"
            };
            vec![
                format!("`{m}`"),
                design(m).map_or("-".into(), |d| format!("{d:.0} %")),
                fmt_pct(ws.share(m)),
                fmt_pct(ap.share(m)),
                diff,
                in_both.into(),
            ]
        })
        .collect();
    s += &common::table(
        &[
            "method",
            "design",
            "wallscope",
            "async-profiler",
            "diff (pp)",
            "in top 10 of",
        ],
        &rows,
    );

    s += "\n## Samples\n\n";
    // `ms`: what one unit of the tool's weight is worth in CPU milliseconds.
    let row = |name: &str, p: &Profile, unit: &str, scale: f64, ms: f64| {
        vec![
            name.to_string(),
            p.rows.to_string(),
            format!("{:.0} {unit}", p.total / scale),
            format!("{:.1} %", p.total * ms / (run.jvm_cpu_s * 1000.0) * 100.0),
            format!("{:.2} %", p.java / p.total * 100.0),
            format!("{:.2} %", p.weight_pct(&p.no_java)),
            format!("{} ({:.2} %)", p.unknown.len(), p.weight_pct(&p.unknown)),
            format!("{} ({:.2} %)", p.unnamed.len(), p.weight_pct(&p.unnamed)),
        ]
    };
    s += &common::table(
        &[
            "tool",
            "rows",
            "total",
            "of the JVM's CPU time",
            "with a Java frame",
            "no Java frame",
            "rows with `[unknown]` / `module+0x…`",
            "leaf Java frame unnamed",
        ],
        &[
            row("wallscope", ws, "ms CPU", 1000.0, 0.001),
            row("async-profiler", ap, "samples", 1.0, ap_interval_ms),
        ],
    );
    s += &kinds_table(ws, ap);
    // wallscope's rows are in µs, one sample = 1/99 s of CPU at 99 Hz.
    let ws_samples = ws.java / (1e6 / 99.0);
    let p = ws_top.first().map_or(0.0, |t| t.1) / 100.0;
    let sigma = (p * (1.0 - p) * (1.0 / ws_samples + 1.0 / ap.java)).sqrt() * 100.0;
    let _ = write!(
        s,
        "\nThe JVM used {cpu:.1} CPU-s in the steady window (`/proc/PID/stat`; \
         {steady} s × 2 threads would be {max} s, the rest went to other processes on \
         the host): about {cpu_ms:.0} ms of wallscope rows and {ap_n:.0} async-profiler \
         samples at {AP_INTERVAL} are expected. Percentages are of the tool's total weight. \
         Unnamed leaf Java frames (wallscope): `Interpreter` or `[jvm code not in perf \
         map]` as the innermost Java frame; they count as Java time under that name. \
         Sampling noise: with ~{ws_samples:.0} wallscope and {ap_java:.0} async-profiler \
         samples, the difference of a {pct:.0} % share has a standard deviation of about \
         {sigma:.2} pp.\n",
        cpu = run.jvm_cpu_s,
        steady = setup.steady_s,
        max = 2 * setup.steady_s,
        cpu_ms = run.jvm_cpu_s * 1000.0,
        ap_n = run.jvm_cpu_s * 1000.0 / ap_interval_ms,
        ap_java = ap.java,
        pct = p * 100.0,
    );
    if !run.lost.is_empty() {
        let lost: Vec<String> = run.lost.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            s,
            "\nwallscope's `/healthz` loss counters during the run (whole host): {}.",
            lost.join(", ")
        );
    }
    for (title, rows) in [
        ("wallscope rows with no Java frame", &ws.no_java),
        (
            "wallscope rows with `[unknown]` or `module+0x…`",
            &ws.unknown,
        ),
        (
            "wallscope rows with an unnamed leaf Java frame",
            &ws.unnamed,
        ),
    ] {
        if !rows.is_empty() {
            let _ = write!(
                s,
                "\n{title}, heaviest first (value in µs):\n\n```\n{}```\n",
                heaviest(rows, 8)
            );
        }
    }

    s += "\n## How\n\n";
    let _ = write!(
        s,
        "- wallscope: `wallscope serve --listen 127.0.0.1:PORT`, started (and drained \
         {WARM_DRAINS} times) before the JVM; it makes the JVM write its perf map through \
         the attach mechanism (no perf-map flags on the JVM). Queried \
         `GET {query}` 1.5 s after the steady window's end, so its one-second slices cover \
         that window to within about a second.\n\
         - JVM with async-profiler loaded at startup (temporary paths shortened):\n\n  \
         ```\n  {command}\n  ```\n\n  `loop={WARMUP_S}s` with `%n` in the file name: one \
         collapsed file per {WARMUP_S} s; file 0 (the warmup) and the last (the tail and \
         exit) are dropped, files 1–{n} are the steady window. `ann` marks Java frames \
         (`_[j]` JIT, `_[i]` inlined, `_[0]` interpreted, `_[1]` C1).\n\
         - Both sides: self time of a method = weight of the rows whose innermost Java \
         frame is that method (frames above it — JVM stubs, native, kernel — are charged \
         to it); shares are of the rows with any Java frame. Names normalized to \
         `pkg.Class.method` (kind suffix `_[j]`/`_[1]`/`_[i]`/`_[0]` stripped, `/` → `.`, \
         hidden and lambda classes without address and counter: `Pools$$Lambda.run`). \
         wallscope also sees async-profiler's own work in the JVM: its timer thread (no \
         Java frame, left out) and its `PerfEvents::signalHandler` on the Java threads \
         (charged to the Java frame below the signal frame).\n\
         - The JIT's defaults (no `CompileCommand`): C2 inlines the Burn leaf methods \
         into `round` and `work`, so most samples are in inlined code. async-profiler \
         reports inlined methods as frames of their own (`_[i]`) from the JIT's debug \
         info; its agent, loaded at startup, turns on `-XX:+DebugNonSafepoints` in the \
         JVM, so that info covers every instruction, for wallscope too. wallscope with \
         `--jvm-frames full` reads the same info from outside (issue #12); from the \
         perf map alone it names only the outer compiled method of a blob. \
         The JVM runs without `-XX:+PreserveFramePointer`: wallscope's BPF walk \
         steps through compiled frames by their code blob's frame size (issue #27).\n",
        query = run.query,
        command = shorten(&run.command, setup),
        n = setup.steady_s / WARMUP_S,
    );
    if !failed.is_empty() {
        let _ = writeln!(
            s,
            "- async-profiler failed first with: {}; `{}` was used instead.",
            failed.join("; "),
            run.event
        );
    }
    let messages: Vec<&String> = run
        .ap_messages
        .iter()
        .filter(|m| m.as_str() != "Profiling started")
        .collect();
    if messages.is_empty() {
        s += "- async-profiler printed no warning or error.\n";
    } else {
        let _ = writeln!(s, "- JVM / async-profiler messages: {messages:?}");
    }
    let kernel_frames = ap.kernel_rows > 0;
    let _ = writeln!(
        s,
        "- async-profiler's profile {} kernel frames (`_[k]`){}.",
        if kernel_frames { "has" } else { "has no" },
        if run.event == "cpu" && kernel_frames {
            ": `cpu` ran on perf_events (cpu-clock), not the ctimer/itimer fallback, \
             which cannot see kernel stacks"
        } else {
            ""
        }
    );
    if run.daemon_jvm_log.is_empty() {
        s += "- wallscope logged nothing about this JVM.\n";
    } else {
        let _ = writeln!(
            s,
            "- wallscope's log about this JVM: `{}`",
            run.daemon_jvm_log.join("` / `")
        );
    }
    Ok(s)
}

/// `command` with the temporary directory and the repository root cut.
fn shorten(command: &str, setup: &Setup) -> String {
    let tmp = setup.tmp.path().display().to_string();
    command
        .replace(&tmp, "$TMP")
        .replace(&format!("{ROOT}/"), "")
}

/// The weight of each kind of innermost Java frame, as a share of each
/// tool's Java weight: how much of the self time was named in inlined,
/// interpreted or C1 code rather than by compiled blob.
fn kinds_table(ws: &Profile, ap: &Profile) -> String {
    let labels = [
        ("_[j]", "compiled `_[j]`"),
        ("_[1]", "C1 `_[1]`"),
        ("_[i]", "inlined `_[i]`"),
        ("_[0]", "interpreted `_[0]`"),
        (UNNAMED, "unnamed"),
    ];
    debug_assert!(JAVA_SUFFIXES
        .iter()
        .all(|k| labels.iter().any(|l| l.0 == *k)));
    let mut header = vec!["innermost Java frame".to_string()];
    header.extend(labels.iter().map(|l| l.1.to_string()));
    let row = |name: &str, p: &Profile| {
        let mut row = vec![name.to_string()];
        for (kind, _) in labels {
            let w = p.kinds.get(kind).copied().unwrap_or(0.0);
            row.push(format!("{:.2} %", w / p.java * 100.0));
        }
        row
    };
    format!(
        "\nSelf time by the kind of the innermost Java frame (shares of the rows with a \
         Java frame):\n\n{}",
        common::table(&header, &[row("wallscope", ws), row("async-profiler", ap)])
    )
}
