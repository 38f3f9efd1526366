//! Python frames on and off CPU, for every CPython on the host at once:
//! the system's (Debian 12: 3.11, static, stripped to its dynamic
//! symbols) always, and each pyenv 3.10-3.13 found. Each runs `tests/workloads/python/shares.py`,
//! which measures its own CPU per function (the truth the daemon's shares
//! are held to), keeps a thread blocked on a lock and a named pool asleep;
//! `gil.py` has four threads fighting for the GIL. A fake interpreter
//! started as `nobody` must be refused and counted while the others are
//! profiled. Nothing is loaded into or written to the interpreters.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::support::{
    rows::{folded_at, json_at, show, within, Rows},
    settle, users, Fixture, Workload, CATCH_UP,
};

/// The window the GIL waits are taken over.
const GIL_WINDOW_S: u64 = 10;
/// Points (of 100) a function's share may differ from the truth.
const SHARE_TOLERANCE: f64 = 0.05;
/// The CPU the main threads use in the window the shares are taken over:
/// ~2,000 samples at 99 Hz, so that the 5-point tolerance is several
/// standard deviations of sampling.
const CPU_S: u64 = 20;
/// The window of the other checks.
const WINDOW_S: u64 = 10;

/// The interpreters to test: `(label, binary)`.
fn interpreters() -> Vec<(String, PathBuf)> {
    // The distribution's (scripts/deps.sh installs it): Debian 12's is a
    // static 3.11 stripped to its dynamic symbols.
    let system = std::fs::canonicalize("/usr/bin/python3")
        .expect("/usr/bin/python3 is missing (scripts/deps.sh installs it)");
    let name = system.file_name().unwrap().to_string_lossy().into_owned();
    let mut found = vec![(format!("system-{name}"), system)];
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    let mut pyenv: Vec<(String, PathBuf)> = std::fs::read_dir(Path::new(&root).join("versions"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().into_owned();
            let minor: u32 = version
                .strip_prefix("3.")?
                .split('.')
                .next()?
                .parse()
                .ok()?;
            let bin = e.path().join(format!("bin/python3.{minor}"));
            ((10..=13).contains(&minor) && bin.exists()).then(|| (format!("pyenv-{version}"), bin))
        })
        .collect();
    pyenv.sort();
    found.extend(pyenv);
    found
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/workloads/python/{name}"))
}

/// One interpreter running `shares.py`, and where it writes its truth.
struct Shares {
    label: String,
    work: Workload,
    truth: PathBuf,
}

/// Whether any frame of `stack` is the Python function `qualname`
/// (`qualname (file:line)_[py]`).
fn is_function(frame: &str, qualname: &str) -> bool {
    frame.ends_with("_[py]") && frame.starts_with(&format!("{qualname} ("))
}

fn share_of_function(rows: &Rows, qualname: &str) -> f64 {
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let with: u64 = rows
        .iter()
        .filter(|(stack, _)| stack.iter().any(|f| is_function(f, qualname)))
        .map(|r| r.1)
        .sum();
    with as f64 / total.max(1) as f64
}

/// The functions whose shares are checked: nested functions, a method, a
/// static method, a generator, a lambda.
const FUNCTIONS: [&str; 8] = [
    "outer_a",
    "outer_a.<locals>.inner_a",
    "outer_a.<locals>.inner_a.<locals>.leaf_a",
    "Worker.crunch",
    "Worker.mix",
    "consume",
    "produce",
    "<lambda>",
];

#[test]
fn python_frames_shares_blocked_threads_and_names_on_every_cpython() {
    let Some(fx) = Fixture::ebpf() else {
        return;
    };
    let ws = fx.daemon();
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<Shares> = interpreters()
        .into_iter()
        .map(|(label, bin)| {
            let truth = dir.path().join(format!("{label}.json"));
            let mut cmd = Command::new(&bin);
            cmd.arg(script("shares.py")).arg("--truth").arg(&truth);
            Shares {
                label,
                work: Workload::spawn(cmd),
                truth,
            }
        })
        .collect();
    println!(
        "interpreters: {:?}",
        all.iter()
            .map(|s| (&s.label, s.work.pid))
            .collect::<Vec<_>>()
    );
    for s in &all {
        wait_for_python_frames(ws, s);
    }
    // One window for all, after every interpreter showed its frames, with
    // the workloads' own account over the same seconds. It lasts until
    // each main thread used CPU_S of CPU (however busy the host): the
    // samples the shares rest on, not the seconds, set their precision.
    let from = now_s() + 1;
    within(CATCH_UP, || (now_s() >= from).then_some(()));
    let before: Vec<Value> = all.iter().map(truth).collect();
    let cpu_ns = |now: &Value, then: &Value| {
        now["total_ns"].as_f64().unwrap() - then["total_ns"].as_f64().unwrap()
    };
    let after = within(CATCH_UP, || {
        let now: Vec<Value> = all.iter().map(truth).collect();
        let enough = now
            .iter()
            .zip(&before)
            .all(|(n, b)| cpu_ns(n, b) >= CPU_S as f64 * 1e9);
        enough.then_some((now_s(), now))
    });
    let (until, after) = after.expect("the workloads never used enough CPU");
    settle(ws);
    for (s, (before, after)) in all.iter().zip(before.iter().zip(&after)) {
        check_shares(ws, s, (from, until), before, after);
        check_blocked_and_names(ws, s);
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// What the workload measured so far.
fn truth(s: &Shares) -> Value {
    serde_json::from_str(&std::fs::read_to_string(&s.truth).unwrap()).unwrap()
}

/// The name a function's frame has: its qualified name, but CPython 3.10
/// code objects have their plain name only.
fn frame_name<'a>(s: &Shares, qualname: &'a str) -> &'a str {
    if s.label.contains("3.10") {
        qualname.rsplit('.').next().unwrap_or(qualname)
    } else {
        qualname
    }
}

fn main_thread_rows(ws: &str, query: &str) -> Rows {
    folded_at(ws, query)
        .into_iter()
        .filter(|(stack, _)| stack.iter().any(|f| f.starts_with("MainThread [tid")))
        .collect()
}

/// Waits until every function shows in the main thread's last seconds
/// (its unwind tables and interpreter registered).
fn wait_for_python_frames(ws: &str, s: &Shares) {
    let query = format!("pid={}&seconds=5&group=thread", s.work.pid);
    let seen = within(CATCH_UP, || {
        let rows = main_thread_rows(ws, &query);
        let named = FUNCTIONS
            .iter()
            .all(|f| share_of_function(&rows, frame_name(s, f)) > 0.0);
        (named && share_of_function(&rows, "<module>") > 0.97).then_some(())
    });
    assert!(
        seen.is_some(),
        "{}: the main thread's Python functions never all showed:\n{}",
        s.label,
        show(&folded_at(ws, &query))
    );
}

/// The main thread's CPU by function over `from..until`, against what
/// the workload measured over it.
fn check_shares(ws: &str, s: &Shares, (from, until): (u64, u64), before: &Value, after: &Value) {
    let query = format!("pid={}&from={from}&until={until}&group=thread", s.work.pid);
    let rows = main_thread_rows(ws, &query);
    let total: u64 = rows.iter().map(|r| r.1).sum();
    assert!(total > 0, "{}: no samples in the window", s.label);
    let diff = |k: &str, f: &str| after[k][f].as_f64().unwrap() - before[k][f].as_f64().unwrap();
    let total_ns = after["total_ns"].as_f64().unwrap() - before["total_ns"].as_f64().unwrap();
    for f in FUNCTIONS {
        let daemon = share_of_function(&rows, frame_name(s, f));
        let want = diff("inclusive", f) / total_ns;
        println!("{} {f}: daemon {daemon:.3}, truth {want:.3}", s.label);
        assert!(
            (daemon - want).abs() <= SHARE_TOLERANCE,
            "{} {f}: {daemon:.3} of the main thread's CPU, the workload measured {want:.3}\n{}",
            s.label,
            show(&rows)
        );
    }
    // Each eval-loop call's frames stand where its native frame was: no
    // interpreter eval frame is left in a stack with Python frames.
    let leftover: u64 = rows
        .iter()
        .filter(|(stack, _)| stack.iter().any(|f| f == "_PyEval_EvalFrameDefault"))
        .map(|r| r.1)
        .sum();
    assert!(
        leftover * 20 <= total,
        "{}: {leftover} of {total} samples keep a native eval frame\n{}",
        s.label,
        show(&rows)
    );
}

/// The blocked thread's Python stack in `kind=futex` and `/blocked`, and
/// Python's thread names in `/threads` (the pool grouped).
fn check_blocked_and_names(ws: &str, s: &Shares) {
    let pid = s.work.pid;
    let futex = folded_at(ws, &format!("pid={pid}&seconds={WINDOW_S}&kind=futex"));
    let chain = |stack: &[String]| {
        let at = |q: &str| stack.iter().position(|f| is_function(f, q));
        matches!((at("Thread.run"), at("wait_for_lock")), (Some(run), Some(wait)) if run < wait)
            || matches!((at("run"), at("wait_for_lock")), (Some(run), Some(wait)) if run < wait)
    };
    assert!(
        futex.iter().any(|(stack, _)| chain(stack)),
        "{}: no futex stack Thread.run;...;wait_for_lock\n{}",
        s.label,
        show(&futex)
    );
    // `late-worker` blocked after its interpreter was registered: its
    // Python frames come from a walk made once its thread was known.
    let blocked = json_at(ws, &format!("/blocked?pid={pid}"));
    for name in ["blocked-worker", "late-worker"] {
        let worker = blocked["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {name} in /blocked: {blocked}", s.label));
        let stack: Vec<String> = worker["stack"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_string())
            .collect();
        assert!(
            stack.iter().any(|f| is_function(f, "wait_for_lock")),
            "{} {name}: /blocked stack {stack:?}",
            s.label
        );
    }
    let threads = json_at(ws, &format!("/threads?pid={pid}&seconds={WINDOW_S}"));
    let names: Vec<&str> = threads["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for want in [
        "MainThread",
        "blocked-worker",
        "late-worker",
        "pool_0",
        "pool_1",
    ] {
        assert!(names.contains(&want), "{}: thread names {names:?}", s.label);
    }
    let pools: HashMap<&str, u64> = threads["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pool"].as_str().unwrap(), p["threads"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        pools.get("pool_*"),
        Some(&2),
        "{}: pools {pools:?}",
        s.label
    );
}

#[test]
fn threads_fighting_for_the_gil_wait_under_a_gil_frame() {
    let Some(fx) = Fixture::ebpf() else {
        return;
    };
    let ws = fx.daemon();
    let work: Vec<(String, Workload)> = interpreters()
        .into_iter()
        .map(|(label, bin)| {
            (
                label,
                Workload::start(&bin, &[&script("gil.py").to_string_lossy()]),
            )
        })
        .collect();
    let spins = |query: &str| -> Vec<Value> {
        let t = json_at(ws, &format!("/threads?{query}"));
        t["threads"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("spin-")))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    // Once every interpreter's four threads were seen waiting for the GIL
    // (registered), one window for all.
    for (label, w) in &work {
        let seen = within(CATCH_UP, || {
            let s = spins(&format!("pid={}&seconds=3", w.pid));
            (s.len() == 4 && s.iter().all(|t| t["gil_us"].as_u64().unwrap_or(0) > 0)).then_some(())
        });
        assert!(
            seen.is_some(),
            "{label}: four threads never waited under [GIL]"
        );
    }
    let from = now_s() + 1;
    within(CATCH_UP, || (now_s() > from + GIL_WINDOW_S).then_some(()));
    settle(ws);
    let window = format!("from={from}&until={}", from + GIL_WINDOW_S);
    for (label, w) in &work {
        let pid = w.pid;
        let spins = spins(&format!("pid={pid}&{window}"));
        assert_eq!(spins.len(), 4, "{label}: {spins:?}");
        // Blocked time, not runqueue time: on a busy host the threads also
        // wait for a CPU, which no GIL explains.
        for t in &spins {
            let blocked: u64 = ["futex_us", "io_us", "sleep_us"]
                .iter()
                .map(|k| t[k].as_u64().unwrap())
                .sum();
            let gil = t["gil_us"].as_u64().unwrap_or(0);
            println!(
                "{label} {}: GIL {gil} us of {blocked} us blocked",
                t["name"]
            );
            assert!(
                gil * 2 > blocked,
                "{label}: {} waited {gil} us for the GIL of {blocked} us blocked: {t}",
                t["name"]
            );
        }
        let futex = folded_at(ws, &format!("pid={pid}&{window}&kind=futex"));
        let under_gil = crate::support::share_of(&futex, "[GIL]");
        assert!(
            under_gil > 0.5,
            "{label}: {under_gil:.2} under [GIL]\n{}",
            show(&futex)
        );
    }
}

/// The fake interpreters, built once.
fn fake_python_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = users::shared_dir("fake-python", 0o755);
        let status = Command::new("sh")
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/workloads/fake_libpython/build.sh"),
            )
            .arg(&dir)
            .status()
            .expect("running build.sh");
        assert!(status.success(), "building the fake interpreters");
        dir
    })
}

/// What the daemon's memory may grow by while the fakes run.
const RSS_GROWTH: u64 = 64 << 20;

fn rss(h: &Value) -> u64 {
    h["memory"]["rss_bytes"].as_u64().expect("memory.rss_bytes")
}

#[test]
fn a_fake_interpreter_is_refused_and_counted_and_others_go_on() {
    // Alone with the shared daemon: its memory is measured.
    let Some(fx) = Fixture::ebpf_serial() else {
        return;
    };
    let ws = fx.daemon();
    let dir = fake_python_dir();
    let refused = |h: &Value| h["refused"]["python"]["implausible"].as_u64().unwrap_or(0);
    let before = json_at(ws, "/healthz");
    let fakes: Vec<Workload> = ["libpython3.12.so", "libpython3.13.so"]
        .iter()
        .map(|lib| {
            let mut cmd = users::as_nobody(dir.join("fake_python"));
            cmd.arg(dir.join(lib));
            Workload::spawn(cmd)
        })
        .collect();
    let (label, bin) = interpreters().remove(0);
    let normal = Workload::start(&bin, &[&script("gil.py").to_string_lossy()]);
    let counted = within(CATCH_UP, || {
        let h = json_at(ws, "/healthz");
        (refused(&h) >= refused(&before) + 2).then_some(h)
    });
    let h = counted.unwrap_or_else(|| {
        panic!(
            "the fake interpreters were never refused: {}",
            json_at(ws, "/healthz")["refused"]
        )
    });
    println!("refused {}", h["refused"]["python"]);
    // The fakes are profiled as the native programs they are, and an
    // interpreter beside them keeps its Python frames.
    for f in &fakes {
        let rows = within(CATCH_UP, || {
            let rows = folded_at(ws, &format!("pid={}&seconds=5", f.pid));
            (!rows.is_empty()).then_some(rows)
        })
        .expect("the fake interpreter's samples");
        assert!(
            !rows
                .iter()
                .any(|(s, _)| s.iter().any(|f| f.ends_with("_[py]"))),
            "Python frames from a fake interpreter:\n{}",
            show(&rows)
        );
    }
    let spin = within(CATCH_UP, || {
        let rows = folded_at(ws, &format!("pid={}&seconds=5", normal.pid));
        let share = share_of_function(&rows, "spin");
        (share > 0.9).then_some(share)
    });
    assert!(
        spin.is_some(),
        "{label} beside the fakes lost its Python frames"
    );
    let after = json_at(ws, "/healthz");
    println!(
        "RSS {} MiB -> {} MiB",
        rss(&before) >> 20,
        rss(&after) >> 20
    );
    assert!(
        rss(&after) < rss(&before) + RSS_GROWTH,
        "RSS grew from {} to {} MiB",
        rss(&before) >> 20,
        rss(&after) >> 20
    );
}
