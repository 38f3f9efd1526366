//! The soak's load: the 10,000-thread process, the process spawner, the JVM
//! and `perf bench sched messaging` in a loop, plus a `cargo build` loop
//! and the hostile inputs (`extra.rs`), each started as a [`Group`] so
//! that it dies with the bench.

pub use crate::common::group::Group;
use crate::common::{check, find_tool, ROOT};
use crate::extra::{self, Hostile, Repeat};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Threads of the many-threads process.
pub const THREADS: u32 = 10_000;
/// Processes the spawner starts per second.
pub const SPAWN_RATE: u32 = 100;
/// The scheduler stress run back to back for the whole soak: 5 groups of
/// 20 senders and 20 receivers (200 tasks, ~2 s here), a fifth of perf's
/// default 10 groups so the host's other users keep some CPU.
pub const MESSAGING: [&str; 5] = ["bench", "sched", "messaging", "-g", "5"];
/// JVM flags: frame pointers in JIT-ed code, as wallscope needs.
pub const JVM_FLAGS: [&str; 2] = ["-XX:+PreserveFramePointer", "-Xmx256m"];
/// The running load.
pub struct Load {
    pub threads: Group,
    pub spawner: Group,
    pub jvm: Group,
    pub messaging: Messaging,
    pub cargo: Repeat,
    pub hostile: Hostile,
}

/// Builds the workloads into `dir` and starts them all; returns once each
/// is running.
pub fn start(dir: &Path) -> Result<Load> {
    let java = find_tool("java", "openjdk-17-jdk-headless")?;
    let javac = find_tool("javac", "openjdk-17-jdk-headless")?;
    let perf = find_tool("perf", "linux-perf")?;
    let unshare = find_tool("unshare", "util-linux")?;
    let threads_bin = build_c(dir, "soak_threads", &["-pthread"])?;
    let spawner_bin = build_c(dir, "soak_spawner", &[])?;
    let src = Path::new(ROOT).join("bench/workloads/SoakJvm.java");
    check(Command::new(javac).arg("-d").arg(dir).arg(src))?;

    let piped = |cmd: &mut Command| {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
    };
    let mut cmd = Command::new(threads_bin);
    piped(cmd.arg(THREADS.to_string()));
    let mut threads = Group::spawn(&mut cmd, libc::SIGKILL)?;
    threads.wait_ready("soak_threads")?;
    let mut cmd = Command::new(spawner_bin);
    piped(cmd.arg(SPAWN_RATE.to_string()));
    let spawner = Group::spawn(&mut cmd, libc::SIGKILL)?;
    let mut cmd = Command::new(&java);
    piped(cmd.args(JVM_FLAGS).arg("-cp").arg(dir).arg("SoakJvm"));
    let mut jvm = Group::spawn(&mut cmd, libc::SIGKILL)?;
    jvm.wait_ready("SoakJvm")?;
    let messaging = start_messaging(perf, unshare);
    let cargo = extra::cargo_loop(dir)?;
    let hostile = extra::start_attackers(&java)?;
    Ok(Load {
        threads,
        spawner,
        jvm,
        messaging,
        cargo,
        hostile,
    })
}

/// Compiles `bench/workloads/NAME.c` to `dir/NAME`.
fn build_c(dir: &Path, name: &str, flags: &[&str]) -> Result<PathBuf> {
    let out = dir.join(name);
    let src = Path::new(ROOT).join(format!("bench/workloads/{name}.c"));
    let mut cmd = Command::new("gcc");
    cmd.args(["-O2", "-g", "-fno-omit-frame-pointer", "-Wall"]);
    check(cmd.args(flags).arg("-o").arg(&out).arg(src))?;
    Ok(out)
}

impl Load {
    /// Fails if a workload has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for (name, g) in [
            ("soak_threads", &mut self.threads),
            ("soak_spawner", &mut self.spawner),
            ("SoakJvm", &mut self.jvm),
        ] {
            if let Some(status) = g.0 .0.try_wait()? {
                bail!("{name} exited with {status}");
            }
        }
        self.hostile.check_alive()
    }

    /// Stops the spawner; returns how many processes it started and how
    /// many spawns failed.
    pub fn stop_spawner(&mut self) -> Result<(u64, u64)> {
        let counts = self.spawner.stop_counts(["spawned", "failed"]);
        counts.context("soak_spawner")
    }
}

/// `perf bench sched messaging` run back to back on a thread of the bench.
pub type Messaging = Repeat;

fn start_messaging(perf: PathBuf, unshare: PathBuf) -> Messaging {
    Repeat::start(move || {
        // perf's workers are its forks, which PR_SET_PDEATHSIG does not
        // follow: perf runs as init of its own pid namespace, killed when
        // unshare dies (`--kill-child`), which takes every worker with it.
        let mut cmd = Command::new(&unshare);
        cmd.args(["--pid", "--kill-child", "--"])
            .arg(&perf)
            .args(MESSAGING)
            .stderr(Stdio::null());
        vec![cmd]
    })
}
