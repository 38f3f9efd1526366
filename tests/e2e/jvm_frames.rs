//! Java frames as complete as async-profiler's (issue #12), on the JDK on
//! the machine (17) and on HotSpot 25: C2 and C1 frames (`_[j]`, `_[1]`),
//! one `_[i]` frame per inlined scope, interpreted frames named (`_[0]`)
//! instead of one `Interpreter` frame, and lambda and hidden class names
//! without numbers or addresses. The JVMs run `Inline` as an unprivileged
//! user with only `-XX:+PreserveFramePointer`. Needs root (eBPF) and both
//! JDKs (`scripts/deps.sh` installs them).
//!
//! The checks are shares of the workers' sampled CPU and frame names, never
//! absolute CPU: a busy host runs the workers less, not differently.

use std::{thread, time::Duration};

use crate::support::{
    daemon,
    java::{self, JavaRun, Jdk, Jvm},
    java_frames::{by_innermost_java, has_frame, java_method, under, unstable_names},
    rows::{folded_at, show, within, Rows},
    settle, share_of, Fixture, CATCH_UP,
};

/// The pool frame of Inline's worker threads (`group=pool`).
const WORKERS: &str = "inline-worker-*";

/// Inline's hot methods and the share of the workers' CPU each is made to
/// take (its loop runs 5, 3 and 2 units of work a round).
const HOT: [(&str, f64); 3] = [
    ("Inline.mix", 0.5),
    ("Inline.fold", 0.3),
    ("Inline.scramble", 0.2),
];

/// Seconds of profile the checks read, all of it after the warm-up.
const WINDOW: u64 = 10;

crate::on_both_jdks!(
    inline_runs_and_is_attached,
    inlined_hot_methods_keep_their_names,
    interpreted_frames_are_named,
    lambda_and_hidden_class_names_are_stable,
);

/// Runs `scenario` with the shared daemon and `Inline` (two workers) on
/// `jdk` with `jvm_opts`, one scenario at a time; skips without root or
/// the JDK (fails under `CI=true`). The JVM is killed when it returns.
fn with_inline(jdk: Jdk, jvm_opts: &[&str], scenario: impl FnOnce(&str, &Jvm)) {
    let Some(_fx) = Fixture::ebpf_serial().filter(|_| jdk.available()) else {
        return;
    };
    let url = daemon();
    let jvm = JavaRun {
        jdk,
        jvm_opts: jvm_opts.iter().map(|o| o.to_string()).collect(),
        ..JavaRun::default()
    }
    .start("Inline", &["3600", "2"]);
    scenario(url, &jvm);
}

/// `/folded` rows of `pid` over the last [`WINDOW`], grouped by pool.
fn folded(url: &str, pid: u32, kind: &str) -> Rows {
    folded_at(
        url,
        &format!("pid={pid}&kind={kind}&group=pool&seconds={WINDOW}"),
    )
}

/// The workers' CPU rows of the last [`WINDOW`].
fn workers_cpu(url: &str, pid: u32) -> Rows {
    under(&folded(url, pid, "cpu"), WORKERS)
}

/// Waits until the workers' CPU rows of the last [`WINDOW`] show `what`
/// (`warm` says when), for at most [`CATCH_UP`]: the JIT and the daemon
/// are slow on a busy host. Then waits a whole window more, so that the
/// next [`WINDOW`] seconds of profile all come after the warm-up.
fn warm_up(url: &str, pid: u32, what: &str, warm: impl Fn(&Rows) -> bool) {
    let mut last = Rows::new();
    let found = within(CATCH_UP, || {
        last = workers_cpu(url, pid);
        warm(&last).then_some(())
    });
    assert!(
        found.is_some(),
        "the workers' stacks never showed {what} within {CATCH_UP:?}; top rows:\n{}",
        show(&last)
    );
    thread::sleep(Duration::from_secs(WINDOW + 2));
    settle(url);
}

/// Prints a passed check's figures; fails with the rows behind a failed one.
fn report(check: Result<String, String>, rows: &Rows) {
    match check {
        Ok(figures) => eprintln!("{figures}"),
        Err(why) => panic!("{why}\ntop rows:\n{}", show(rows)),
    }
}

/// The smoke test that runs before issue #12 lands: `Inline` starts on
/// the JDK, the daemon attaches to it and samples its workers.
fn inline_runs_and_is_attached(jdk: Jdk) {
    with_inline(jdk, &[], |url, jvm| {
        let exe = std::fs::canonicalize(format!("/proc/{}/exe", jvm.pid)).unwrap();
        let java = std::fs::canonicalize(jdk.java()).unwrap();
        assert_eq!(exe, java, "the JVM {jdk:?} runs Inline");
        let report = java::report_after_attach(url, jvm.pid, Duration::from_secs(60))
            .expect("the JVM in /processes");
        assert_eq!(report["attach"], "attached", "{report}");
        assert_eq!(report["preserve_frame_pointer"], true, "{report}");
        let sampled = within(CATCH_UP, || {
            (!workers_cpu(url, jvm.pid).is_empty()).then_some(())
        });
        assert!(sampled.is_some(), "no CPU samples of {WORKERS}");
    });
}

/// JIT defaults: C2 inlines the hot methods into the worker loop, and each
/// keeps its time under its own name.
fn inlined_hot_methods_keep_their_names(jdk: Jdk) {
    with_inline(jdk, &[], |url, jvm| {
        // C2 compiles the loop with the hot methods inlined seconds after
        // the start: the first `_[i]` frames of each say it did.
        let inlined = HOT.map(|(m, _)| format!("{m}_[i]"));
        warm_up(url, jvm.pid, "`_[i]` frames of the hot methods", |w| {
            inlined.iter().all(|i| has_frame(w, |f| f == i))
        });
        let workers = workers_cpu(url, jvm.pid);
        report(check_inlined(&workers), &workers);
    });
}

/// `-Xint`: every frame interpreted, each named after its method.
fn interpreted_frames_are_named(jdk: Jdk) {
    with_inline(jdk, &["-Xint"], |url, jvm| {
        // Nothing to compile: named once the daemon knows the JVM.
        warm_up(url, jvm.pid, "`_[0]` frames of Inline", |w| {
            has_frame(w, is_inline_interpreted)
        });
        let workers = workers_cpu(url, jvm.pid);
        report(check_interpreted(&workers), &workers);
    });
}

/// JIT defaults: no frame carries a lambda's number or a hidden class's
/// address, in CPU or in wall stacks, and the lambdas on the workers' path
/// are named `Inline$$Lambda.METHOD`.
fn lambda_and_hidden_class_names_are_stable(jdk: Jdk) {
    with_inline(jdk, &[], |url, jvm| {
        // The per-round lambda gets compiled (alone or inlined into the
        // loop).
        warm_up(url, jvm.pid, "a compiled frame of the lambda", |w| {
            has_frame(w, |f| {
                java_method(f).is_some_and(|(method, mark)| {
                    method.starts_with("Inline$$Lambda")
                        && method.ends_with(".applyAsLong")
                        && mark != "_[0]"
                })
            })
        });
        let cpu = folded(url, jvm.pid, "cpu");
        let mut all = cpu.clone();
        all.extend(folded(url, jvm.pid, "wall"));
        // The message names the unstable frames; the rows to show are the
        // workers', not the idle threads that dominate wall time.
        let workers = under(&cpu, WORKERS);
        report(check_stable_names(&all, &workers), &workers);
    });
}

/// True for an interpreted frame of Inline's code, its lambdas included.
fn is_inline_interpreted(frame: &str) -> bool {
    java_method(frame).is_some_and(|(method, mark)| {
        mark == "_[0]" && (method.starts_with("Inline.") || method.starts_with("Inline$"))
    })
}

/// The innermost Java frames of the heaviest rows, for messages.
fn innermost_table(workers: &Rows) -> String {
    let mut by: Vec<(&str, u64)> = by_innermost_java(workers).into_iter().collect();
    by.sort_by_key(|(_, v)| std::cmp::Reverse(*v));
    let total: u64 = workers.iter().map(|r| r.1).sum();
    by.iter()
        .take(10)
        .map(|(f, v)| format!("  {:5.1} %  {f}", 100.0 * *v as f64 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue #12's measure of inlined frames, on the workers' CPU rows.
///
/// A sample belongs to the method its innermost Java frame names. A hot
/// method's own time is the samples in it (with any mark); a profile that
/// knows only the compiled methods (a perf map) charges time in inlined
/// code to the compiled caller instead, so what every other Java frame got
/// (the loop, the lambda, `round`, or unnamed JIT code) is what each hot
/// method could have lost. Which hot method lost it cannot be told, so
/// each must keep ≥ 90 % of its own time plus all of it. Besides:
/// - the hot methods together have ≥ 80 % of the workers' CPU (samples
///   lost to unwinding or unnamed code count against this);
/// - each has its designed share of their time, within 40 % of it (time
///   charged to a sibling would show there);
/// - each shows as an inlined frame `_[i]` at least once.
fn check_inlined(workers: &Rows) -> Result<String, String> {
    let total: u64 = workers.iter().map(|r| r.1).sum();
    if total == 0 {
        return Err(format!("no CPU samples of {WORKERS}"));
    }
    let by = by_innermost_java(workers);
    let own_of = |hot: &str| -> u64 {
        by.iter()
            .filter(|(f, _)| java_method(f).is_some_and(|(m, _)| m == hot))
            .map(|(_, v)| v)
            .sum()
    };
    let own: Vec<u64> = HOT.iter().map(|(m, _)| own_of(m)).collect();
    let hot: u64 = own.iter().sum();
    let callers: u64 = by.values().sum::<u64>() - hot;
    let mut failed = Vec::new();
    let mut figures = vec![format!(
        "hot methods {:.1} % of the workers' CPU, other Java frames innermost {:.1} %",
        100.0 * hot as f64 / total as f64,
        100.0 * callers as f64 / total as f64
    )];
    if (hot as f64) < 0.8 * total as f64 {
        failed.push("the hot methods have under 80 % of the workers' CPU".to_string());
    }
    for ((method, designed), own) in HOT.iter().zip(own) {
        let kept = own as f64 / (own + callers).max(1) as f64;
        let share = own as f64 / hot.max(1) as f64;
        figures.push(format!(
            "{method}: kept {:.1} % of its time, {:.1} % of the hot time (designed {:.0} %)",
            100.0 * kept,
            100.0 * share,
            100.0 * designed
        ));
        if kept < 0.9 {
            failed.push(format!("{method} kept under 90 % of its time"));
        }
        if (share / designed - 1.0).abs() > 0.4 {
            failed.push(format!("{method} is off its designed share"));
        }
        let inlined = format!("{method}_[i]");
        if !has_frame(workers, |f| f == inlined) {
            failed.push(format!("no inlined frame {method}_[i]"));
        }
    }
    let figures = figures.join("\n");
    if failed.is_empty() {
        return Ok(figures);
    }
    Err(format!(
        "{}\n{figures}\ninnermost Java frames:\n{}",
        failed.join("; "),
        innermost_table(workers)
    ))
}

/// Issue #12's measure of interpreted frames, on the workers' CPU rows
/// under `-Xint`: ≥ 90 % of the samples have as innermost Java frame an
/// interpreted frame `_[0]` of Inline's code, named; rows with a frame
/// named just `Interpreter` weigh < 5 %.
fn check_interpreted(workers: &Rows) -> Result<String, String> {
    let total: u64 = workers.iter().map(|r| r.1).sum();
    if total == 0 {
        return Err(format!("no CPU samples of {WORKERS}"));
    }
    let named: u64 = by_innermost_java(workers)
        .iter()
        .filter(|(f, _)| is_inline_interpreted(f))
        .map(|(_, v)| v)
        .sum();
    let named = named as f64 / total as f64;
    let unnamed = share_of(workers, "Interpreter");
    let figures = format!(
        "innermost Java frame a named `_[0]` frame of Inline: {:.1} %; `Interpreter` frames: {:.1} %",
        100.0 * named,
        100.0 * unnamed
    );
    if named >= 0.9 && unnamed < 0.05 {
        Ok(figures)
    } else {
        Err(format!(
            "{figures}\ninnermost Java frames:\n{}",
            innermost_table(workers)
        ))
    }
}

/// Issue #12's measure of stable names: no frame of `all` (any thread,
/// CPU and wall) with a lambda number or a hidden class address, and the
/// workers' lambdas named `Inline$$Lambda.METHOD`: the per-round
/// `applyAsLong`, compiled, and the thread's `run`, interpreted.
fn check_stable_names(all: &Rows, workers: &Rows) -> Result<String, String> {
    let unstable = unstable_names(all);
    let mut failed = Vec::new();
    if !unstable.is_empty() {
        failed.push(format!("names that change between runs: {unstable:?}"));
    }
    let compiled = ["_[j]", "_[1]", "_[i]"].map(|m| format!("Inline$$Lambda.applyAsLong{m}"));
    if !has_frame(workers, |f| compiled.iter().any(|c| c == f)) {
        failed.push(format!("no frame of the workers is one of {compiled:?}"));
    }
    if !has_frame(workers, |f| f == "Inline$$Lambda.run_[0]") {
        failed.push("no frame of the workers is Inline$$Lambda.run_[0]".to_string());
    }
    let lambdas: std::collections::BTreeSet<&String> = workers
        .iter()
        .flat_map(|(stack, _)| stack)
        .filter(|f| f.contains("$$Lambda"))
        .collect();
    if failed.is_empty() {
        return Ok(format!("the workers' lambda frames: {lambdas:?}"));
    }
    Err(format!(
        "{}\nthe workers' lambda frames: {lambdas:?}",
        failed.join("\n")
    ))
}

/// The measures themselves, on made-up profiles: they pass the profile
/// issue #12 asks for and fail the ones the daemon gave before it.
mod measures {
    use super::*;

    /// A worker thread from its start to the compiled loop, as
    /// async-profiler shows it once C2 compiled the loop.
    const LOOP: &str = "java;inline-worker-*;start_thread;thread_native_entry(Thread*);\
                        JavaCalls::call_helper;java.lang.Thread.run_[0];\
                        Inline$$Lambda.run_[0];Inline.lambda$main$1_[0];Inline.work_[j]";

    fn row(stack: &str, value: u64) -> (Vec<String>, u64) {
        (stack.split(';').map(str::to_string).collect(), value)
    }

    /// A sample in `leaf`, under the scopes C2 inlined into the loop.
    fn worker(leaf: &str, value: u64) -> (Vec<String>, u64) {
        let inlined = "Inline$$Lambda.applyAsLong_[i];Inline.lambda$main$0_[i];Inline.round_[i]";
        row(&format!("{LOOP};{inlined};{leaf}"), value)
    }

    fn complete() -> Rows {
        vec![
            worker("Inline.mix_[i]", 500),
            worker("Inline.fold_[i]", 290),
            worker("Inline.scramble_[i]", 190),
            worker("Inline.mix_[i];asm_exc_page_fault_[k]", 5),
            row("java;inline-worker-*;[unknown]", 10),
        ]
    }

    /// Every frame's mark changed from `from` to `to`.
    fn remarked(rows: &Rows, from: &str, to: &str) -> Rows {
        rows.iter()
            .map(|(s, v)| (s.iter().map(|f| f.replace(from, to)).collect(), *v))
            .collect()
    }

    /// What a perf-map-only symbolizer makes of the same samples: inlined
    /// code is the compiled caller's, interpreted frames are `Interpreter`.
    fn perf_map_only(rows: &Rows) -> Rows {
        rows.iter()
            .map(|(stack, v)| {
                let mut out: Vec<String> = Vec::new();
                for f in stack {
                    match java_method(f) {
                        Some((_, "_[i]")) => {}
                        Some((_, "_[0]")) if out.last().is_some_and(|l| l == "Interpreter") => {}
                        Some((_, "_[0]")) => out.push("Interpreter".into()),
                        _ => out.push(f.clone()),
                    }
                }
                (out, *v)
            })
            .collect()
    }

    #[test]
    fn inlined_measure_tells_inlined_frames_from_a_perf_map() {
        let rows = complete();
        assert!(check_inlined(&rows).is_ok(), "{:?}", check_inlined(&rows));
        let lost = check_inlined(&perf_map_only(&rows)).unwrap_err();
        assert!(lost.contains("Inline.mix kept under 90 %"), "{lost}");
        // Compiled alone instead of inlined: named, but not `_[i]`.
        let alone = remarked(&rows, "scramble_[i]", "scramble_[j]");
        let why = check_inlined(&alone).unwrap_err();
        assert!(
            why.contains("no inlined frame Inline.scramble_[i]"),
            "{why}"
        );
        // 30 samples charged to the loop: too many for scramble's 190 and
        // fold's 290, not for mix's 505.
        let mut charged = rows.clone();
        charged.push(row(LOOP, 30));
        let why = check_inlined(&charged).unwrap_err();
        assert!(why.contains("Inline.scramble kept under 90 %"), "{why}");
        assert!(!why.contains("Inline.mix kept"), "{why}");
        // mix's time charged to fold.
        let mut swapped = rows.clone();
        swapped[0] = worker("Inline.fold_[i]", 500);
        let why = check_inlined(&swapped).unwrap_err();
        assert!(
            why.contains("Inline.mix is off its designed share"),
            "{why}"
        );
    }

    #[test]
    fn interpreted_measure_wants_named_frames() {
        let rows = remarked(&remarked(&complete(), "_[i]", "_[0]"), "_[j]", "_[0]");
        assert!(
            check_interpreted(&rows).is_ok(),
            "{:?}",
            check_interpreted(&rows)
        );
        assert!(check_interpreted(&perf_map_only(&rows)).is_err());
    }

    #[test]
    fn stable_name_measure_wants_plain_lambda_names() {
        let rows = complete();
        assert!(check_stable_names(&rows, &rows).is_ok());
        let numbered = remarked(
            &rows,
            "Inline$$Lambda.",
            "Inline$$Lambda$3/0x00007f1070000c28.",
        );
        let why = check_stable_names(&numbered, &numbered).unwrap_err();
        assert!(why.contains("change between runs"), "{why}");
        // JDK 21+ lambda classes have no number, only the address.
        let jdk25 = remarked(
            &rows,
            "Inline$$Lambda.",
            "Inline$$Lambda/0x0000000091080438.",
        );
        assert!(check_stable_names(&jdk25, &jdk25).is_err());
    }

    #[test]
    fn innermost_java_frame_skips_jvm_and_kernel_frames() {
        let rows = vec![
            row(
                "java;w;Inline.work_[j];Inline.mix_[i];SharedRuntime::x;irq_[k]",
                3,
            ),
            row("java;w;Inline.work_[j];Interpreter", 2),
            row("java;w;start_thread;[unknown]", 1),
        ];
        let by = by_innermost_java(&rows);
        assert_eq!(by.get("Inline.mix_[i]"), Some(&3));
        assert_eq!(by.get("Interpreter"), Some(&2));
        assert_eq!(by.len(), 2);
        assert_eq!(java_method("Inline.mix_[i]"), Some(("Inline.mix", "_[i]")));
        assert_eq!(java_method("mix_[k]"), None);
    }

    #[test]
    fn addresses_and_lambda_numbers_are_unstable() {
        let rows = vec![row(
            "java;Pools$$Lambda$2/0x00007f005c000c30.run_[j];Inline$$Lambda+0x10.run_[0];\
             Inline$$Lambda$14.run_[0];Inline$$Lambda.run_[0];Inline.lambda$main$0_[i];f+0x10",
            1,
        )];
        let unstable: Vec<String> = unstable_names(&rows).into_iter().collect();
        assert_eq!(
            unstable,
            [
                "Inline$$Lambda$14.run_[0]",
                "Inline$$Lambda+0x10.run_[0]",
                "Pools$$Lambda$2/0x00007f005c000c30.run_[j]",
            ]
        );
    }
}
