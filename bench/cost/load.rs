//! The cost bench's own services and the busy host around them, each a
//! [`Group`] that dies with the bench: a CPython service whose background
//! thread holds the GIL (`bench/workloads/cost_service.py`), a JVM of 16
//! pool workers run without any profiling flag (`SoakJvm`), a C program
//! built without frame pointers (`tests/workloads/nofp.c`); on the busy
//! host also two `yes` loops and ~20 short-lived `/bin/true` a second
//! (`soak_spawner`).

use crate::common::{build_c, check, find_tool, group::Group, log_tail, ROOT};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// How long the C program without frame pointers burns (longer than any
/// run; it is killed with the bench).
const NOFP_SECONDS: &str = "86400";
/// The CPython of the services and of the hostile mix.
const PYTHON: &str = "/usr/bin/python3.11";
/// Short-lived processes the busy host starts a second.
pub const SPAWN_RATE: u32 = 20;
/// The `yes` loops of the busy host.
pub const BUSY_LOOPS: usize = 2;
/// The JVM's flags: a heap bound only; no profiling flag (no
/// `-XX:+PreserveFramePointer`, no agent).
pub const JVM_FLAGS: [&str; 1] = ["-Xmx256m"];

/// What the workloads run from, built once.
pub struct Built {
    pub dir: PathBuf,
    pub java: PathBuf,
    pub python: PathBuf,
    pub nofp: PathBuf,
    pub spawner: PathBuf,
}

/// Compiles the C programs and the JVM's class into `dir`.
pub fn build(dir: &Path) -> Result<Built> {
    let java = find_tool("java", "openjdk-17-jdk-headless")?;
    let javac = find_tool("javac", "openjdk-17-jdk-headless")?;
    // Debian's, not a pyenv shim on PATH: `nobody` cannot read root's
    // pyenv.
    let python = PathBuf::from(PYTHON);
    if !python.is_file() {
        bail!("{PYTHON} not found: install the python3.11 package");
    }
    let nofp = dir.join("nofp");
    let src = Path::new(ROOT).join("tests/workloads/nofp.c");
    build_c(&src, &nofp, &["-O2", "-fomit-frame-pointer"])?;
    let spawner = dir.join("soak_spawner");
    let src = Path::new(ROOT).join("bench/workloads/soak_spawner.c");
    build_c(&src, &spawner, &["-O2"])?;
    let src = Path::new(ROOT).join("bench/workloads/SoakJvm.java");
    check(Command::new(javac).arg("-d").arg(dir).arg(src))?;
    Ok(Built {
        dir: dir.to_path_buf(),
        java,
        python,
        nofp,
        spawner,
    })
}

impl Drop for Load {
    /// Kills the processes, then removes the perf maps they (the
    /// attackers) or the daemon (a JVM's, through its attach) left in /tmp.
    fn drop(&mut self) {
        let pids: Vec<u32> = self.procs.iter().map(|p| p.group.pid()).collect();
        self.procs.clear();
        for pid in pids {
            let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
            let _ = fs::remove_file(format!("/tmp/perf-{pid}.map.tmp"));
        }
    }
}

/// A running process of the load, named for the report.
pub struct Running {
    pub name: String,
    pub group: Group,
}

/// The processes of a scenario's load.
pub struct Load {
    pub procs: Vec<Running>,
    /// Where their stderr goes, a file each.
    logs: PathBuf,
}

impl Load {
    pub fn new(logs: &Path) -> Load {
        Load {
            procs: Vec::new(),
            logs: logs.to_path_buf(),
        }
    }

    /// Spawns `cmd` (named `name`); with `ready`, waits for its `ready PID`
    /// line (an error shows the end of its stderr).
    pub fn spawn(&mut self, name: &str, cmd: &mut Command, ready: bool) -> Result<()> {
        let file: String = name
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(40)
            .collect();
        let log = self.logs.join(format!("{}-{file}.log", self.procs.len()));
        cmd.stdin(Stdio::null()).stderr(fs::File::create(&log)?);
        cmd.stdout(if ready { Stdio::piped() } else { Stdio::null() });
        Group::ignore_sigpipe(cmd);
        let mut group = Group::spawn(cmd, libc::SIGKILL)?;
        if ready {
            let started = group.wait_ready(name);
            started.with_context(|| format!("its stderr:\n{}", log_tail(&log, 20)))?;
        }
        self.procs.push(Running {
            name: name.to_string(),
            group,
        });
        Ok(())
    }

    /// Fails if a process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.group.0 .0.try_wait()? {
                bail!("{} exited with {status}", p.name);
            }
        }
        Ok(())
    }

    /// Sends `sig` to each process's group: SIGSTOP holds the load while a
    /// daemon starts (loading its programs took over 180 s beside it on a
    /// shared 2-CPU host), SIGCONT lets it go on.
    pub fn signal(&self, sig: libc::c_int) {
        for p in &self.procs {
            // SAFETY: kill(2) on the group our child leads.
            unsafe { libc::kill(-(p.group.pid() as libc::pid_t), sig) };
        }
    }

    /// `name (pid)` of each process, for the report.
    pub fn describe(&self) -> Vec<String> {
        let one = |p: &Running| format!("`{}` (pid {})", p.name, p.group.pid());
        self.procs.iter().map(one).collect()
    }
}

/// Our own services: the CPython service, the JVM and the C program
/// without frame pointers (the calm host of the side-by-side part).
pub fn services(b: &Built) -> Result<Load> {
    let mut load = Load::new(&b.dir);
    let script = Path::new(ROOT).join("bench/workloads/cost_service.py");
    let mut cmd = Command::new(&b.python);
    load.spawn("cost_service.py", cmd.arg(script), true)?;
    let mut cmd = Command::new(&b.java);
    cmd.args(JVM_FLAGS).arg("-cp").arg(&b.dir).arg("SoakJvm");
    load.spawn("java -Xmx256m SoakJvm", &mut cmd, true)?;
    let mut cmd = Command::new(&b.nofp);
    load.spawn(
        "nofp (-O2 -fomit-frame-pointer)",
        cmd.arg(NOFP_SECONDS),
        true,
    )?;
    Ok(load)
}

/// What makes the host busy besides the services: the `yes` loops and the
/// short-lived processes.
pub fn busy(b: &Built) -> Result<Load> {
    let mut load = Load::new(&b.dir);
    let yes = find_tool("yes", "coreutils")?;
    for _ in 0..BUSY_LOOPS {
        load.spawn("yes", &mut Command::new(&yes), false)?;
    }
    let mut cmd = Command::new(&b.spawner);
    let name = format!("soak_spawner {SPAWN_RATE} (/bin/true)");
    load.spawn(&name, cmd.arg(SPAWN_RATE.to_string()), false)?;
    Ok(load)
}
