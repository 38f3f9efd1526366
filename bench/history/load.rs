//! The history bench's load, issue #39's "busy, churning host": ten
//! long-lived processes of varied behaviour (CPU, sleeps, futex waits,
//! I/O, stacks that change), about 150 threads in all, one of which starts
//! ~15 short-lived processes a second; optionally a process of 10,000
//! mostly sleeping threads beside them. Each is a [`Group`]: it dies with
//! the bench.

use crate::common::{build_workload, group::Group, procfs, ROOT};
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};

/// One long-lived process: its C source (from the repository's root), its
/// arguments (`{s}`: seconds it must run, `{dir}`: a scratch directory on
/// disk) and what it does, for the report.
pub struct Workload {
    pub src: &'static str,
    pub args: &'static [&'static str],
    pub what: &'static str,
}

/// The long-lived processes: 148 threads.
pub const LONG_LIVED: [Workload; 10] = [
    Workload {
        src: "tests/workloads/cpu_shares.c",
        args: &["{s}", "2"],
        what: "2 CPU-bound threads: the 2 CPUs kept busy",
    },
    Workload {
        src: "tests/workloads/churn.c",
        args: &["32", "{s}"],
        what: "32 workers parked on a condition variable, woken in bursts every 2 ms (futex)",
    },
    Workload {
        src: "tests/workloads/churn.c",
        args: &["8", "{s}"],
        what: "the same with 8 workers",
    },
    Workload {
        src: "tests/workloads/mixed.c",
        args: &["{s}"],
        what: "mutex holders and waiters (futex), a sleeper, a pipe reader, a spinner",
    },
    Workload {
        src: "tests/workloads/many_threads.c",
        args: &["40", "{s}"],
        what: "40 threads sleeping 200-300 ms, then working briefly",
    },
    Workload {
        src: "tests/workloads/many_threads.c",
        args: &["20", "{s}"],
        what: "the same with 20 threads",
    },
    Workload {
        src: "tests/workloads/convoy.c",
        args: &["8"],
        what: "a lock convoy of 8 threads and a 2 ms napper",
    },
    Workload {
        src: "tests/workloads/lockorder.c",
        args: &[],
        what: "a lock-order deadlock (2 threads) and 2 idle waiters",
    },
    Workload {
        src: "bench/workloads/history_phases.c",
        args: &["16", "{dir}"],
        what: "16 threads changing call chain and depth every 20 s; 2 writers in fdatasync (I/O)",
    },
    Workload {
        src: "tests/workloads/spawner.c",
        args: &["15", "{s}", "10"],
        what: "the churn: 15 short-lived processes a second, 10 ms of CPU each",
    },
];

/// The variant's process of mostly sleeping threads (its thread count from
/// `HISTORY_BENCH_MANY_THREADS`).
pub const MANY_THREADS_SRC: &str = "tests/workloads/many_threads.c";

/// A running long-lived process.
pub struct Running {
    pub group: Group,
    /// The workload's program name and arguments, for the report.
    pub command: String,
    pub what: &'static str,
    /// Its threads when the measured run started (see [`Load::mark`]).
    pub tids: BTreeSet<u32>,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.group.pid()
    }
}

/// The running load.
pub struct Load {
    pub procs: Vec<Running>,
}

/// Builds the workloads into `dir` and starts them, each for `seconds`
/// (plus a margin) and the many-threads process when `many` is set;
/// returns once each has printed its `ready` line.
pub fn start(dir: &Path, seconds: u64, many: Option<u64>) -> Result<Load> {
    let run_s = (seconds + 600).to_string();
    let scratch = dir.display().to_string();
    let mut procs = Vec::new();
    let mut add = |src: &str, args: Vec<String>, what: &'static str| -> Result<()> {
        let name = Path::new(src).file_stem().context("no name")?;
        let bin = dir.join(name);
        if !bin.exists() {
            build_workload(&Path::new(ROOT).join(src), &bin)?;
        }
        let mut cmd = Command::new(&bin);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        Group::ignore_sigpipe(&mut cmd);
        let command = format!("{} {}", name.to_string_lossy(), args.join(" "));
        let command = command.trim_end().to_string();
        let mut group = Group::spawn(&mut cmd, libc::SIGKILL)?;
        group.wait_ready(&command)?;
        procs.push(Running {
            group,
            command,
            what,
            tids: BTreeSet::new(),
        });
        Ok(())
    };
    for w in &LONG_LIVED {
        let args = w.args.iter().map(|a| match *a {
            "{s}" => run_s.clone(),
            "{dir}" => scratch.clone(),
            a => a.to_string(),
        });
        add(w.src, args.collect(), w.what)?;
    }
    if let Some(n) = many {
        let what = "the variant's mostly sleeping threads (200-300 ms naps)";
        add(MANY_THREADS_SRC, vec![n.to_string(), run_s.clone()], what)?;
    }
    Ok(Load { procs })
}

impl Load {
    /// Notes each process's threads as the measured run starts.
    pub fn mark(&mut self) -> Result<()> {
        for p in &mut self.procs {
            p.tids = procfs::thread_ticks(p.pid())?.into_keys().collect();
        }
        Ok(())
    }

    /// Fails if a workload has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.group.0 .0.try_wait()? {
                bail!("{} exited with {status}", p.command);
            }
        }
        Ok(())
    }
}
