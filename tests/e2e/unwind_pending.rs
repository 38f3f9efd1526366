//! No frame lost while unwind tables load (issue 40): a program started
//! with a new daemon on a busy host is walked before its tables are built.
//! Its code keeps frame pointers, but not in its leaf function (GCC's
//! default): a plain frame-pointer walk from there skips the caller. Every
//! stack must be whole, or end with the `[tables pending]` frame where the
//! walk could not vouch for the callers. Needs root (eBPF).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::support::{
    get,
    rows::{folded_at, json_at, show, Rows},
    settle, Daemon, Fixture, Workload,
};

const PENDING: &str = "[tables pending]";
const WORKERS: [&str; 3] = ["worker_a", "worker_b", "worker_c"];
/// Their shares of the work by construction (6, 3 and 1 leaf calls).
const NOMINAL: [f64; 3] = [0.6, 0.3, 0.1];

/// Busy loops beside the daemon, killed when dropped.
struct Busy(Vec<Child>);

impl Busy {
    fn start(n: usize) -> Busy {
        Busy(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("starting a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `tests/workloads/NAME.c` built with the system's C compiler as a C
/// programmer builds with frame pointers (GCC leaves them out of leaf
/// functions; the other workloads are built by clang, which does not).
fn cc_workload(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/workloads/{name}.c"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(["-O1", "-fno-omit-frame-pointer", "-g", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("running cc");
    assert!(status.success(), "compiling {}", src.display());
    out
}

/// Whether `chain` appears in `stack` as consecutive frames.
fn holds_run(stack: &[String], chain: &[&str]) -> Option<usize> {
    stack
        .windows(chain.len())
        .position(|w| w.iter().zip(chain).all(|(f, c)| f == c))
}

/// The work samples (innermost frame the leaf or a worker), sorted out.
#[derive(Debug, Default)]
struct Tally {
    /// By worker, stacks with main;handler;worker[;leaf] whole.
    credited: [u64; 3],
    /// Stacks ending in the pending frame without a worker (callers unknown).
    pending_only: u64,
    /// Whole stacks whose root below main is the pending frame.
    pending_root: u64,
    /// Stacks that lost a frame without saying so.
    wrong: Vec<(Vec<String>, u64)>,
    total: u64,
}

fn tally(rows: &Rows) -> Tally {
    let mut t = Tally::default();
    for (stack, v) in rows {
        let Some(last) = stack.last() else { continue };
        if last != "leaf" && !WORKERS.contains(&last.as_str()) {
            continue;
        }
        t.total += v;
        let whole = WORKERS.iter().enumerate().find_map(|(i, w)| {
            let chain: &[&str] = if last == "leaf" {
                &["main", "handler", w, "leaf"]
            } else {
                &["main", "handler", w]
            };
            let at = holds_run(stack, chain)?;
            (at + chain.len() == stack.len()).then_some((i, at))
        });
        match whole {
            // Below main: the C runtime's frames (libc's table loaded), or
            // the pending frame.
            Some((i, at)) if at > 0 && stack[at - 1] == "__libc_start_call_main" => {
                t.credited[i] += v
            }
            Some((i, at)) if at > 0 && stack[at - 1] == PENDING => {
                t.credited[i] += v;
                t.pending_root += v;
            }
            // Only the innermost frame, then the pending frame.
            None if stack.len() >= 2 && stack[stack.len() - 2] == PENDING => t.pending_only += v,
            _ => t.wrong.push((stack.clone(), *v)),
        }
    }
    t
}

#[test]
fn a_frame_pointer_program_started_with_the_daemon_loses_no_frame() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let bin = cc_workload("handler_shares");
    let _busy = Busy::start(2);
    // It answers once its programs are attached (the program's exec is
    // then seen); loading them takes minutes on a saturated host.
    let daemon = Daemon::spawn(&["--frequency", "599"]);
    let deadline = Instant::now() + Duration::from_secs(600);
    while get(&format!("{}/healthz", daemon.url)).0 != 200 {
        assert!(Instant::now() < deadline, "the daemon did not start");
        thread::sleep(Duration::from_millis(20));
    }
    let w = Workload::start(&bin, &["10"]);
    let pid = w.pid;
    let out = w.wait();
    settle(&daemon.url);
    let rows = folded_at(&daemon.url, &format!("pid={pid}&kind=cpu&seconds=300"));
    let health = json_at(&daemon.url, "/healthz");

    // The kernel's account of each worker's CPU, as the program took it.
    let ns: Vec<f64> = out
        .lines()
        .find_map(|l| l.strip_prefix("cpu_ns "))
        .unwrap_or_else(|| panic!("no cpu_ns line in {out:?}"))
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let own: Vec<f64> = ns.iter().map(|n| n / ns.iter().sum::<f64>()).collect();

    let t = tally(&rows);
    let total = t.total.max(1) as f64;
    let shares: Vec<f64> = t.credited.iter().map(|c| *c as f64 / total).collect();
    eprintln!(
        "work samples {}: shares {:.3?} (kernel {:.3?}), pending frame alone {:.3}, \
         whole above a pending root {:.3}, wrong {}; /healthz unwind_pending_walks {}, \
         unwind_tables_pending {}",
        t.total,
        shares,
        own,
        t.pending_only as f64 / total,
        t.pending_root as f64 / total,
        t.wrong.iter().map(|w| w.1).sum::<u64>(),
        health["events"]["unwind_pending_walks"],
        health["lost"]["unwind_tables_pending"],
    );
    assert!(t.total >= 100, "too few samples:\n{}", show(&rows));
    assert!(
        t.wrong.is_empty(),
        "stacks that lost a frame silently:\n{}",
        show(&t.wrong)
    );
    for i in 0..3 {
        assert!(
            (own[i] - NOMINAL[i]).abs() < 0.03,
            "the workload's own split {own:?}"
        );
        assert!(
            (shares[i] - own[i]).abs() <= 0.05,
            "{}: {:.3} against the kernel's {:.3}\n{}",
            WORKERS[i],
            shares[i],
            own[i],
            show(&rows)
        );
    }
    // It was walked while its tables were pending, and that is counted.
    assert!(
        health["events"]["unwind_pending_walks"].as_u64() > Some(0),
        "{}",
        health["events"]
    );
    assert!(health["pipeline"]["unwind"]["processes_tables_pending"].is_u64());
}
