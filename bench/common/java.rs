//! Java workloads shared by the JVM benches: starting one and waiting for
//! its `ready PID` line, the JVM's version for a report, and asking the
//! daemon whether it has issue #12's `--jvm-frames` option.

use super::Guard;
use anyhow::{Context, Result};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Longest a workload may take to print `ready PID`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running JVM workload that has printed `ready PID`.
pub struct Workload {
    pub jvm: Guard,
    pub pid: u32,
    /// Its stdout after the `ready` line, line by line.
    pub lines: mpsc::Receiver<String>,
    /// Its stdout before the `ready` line (agent messages).
    pub messages: Vec<String>,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Workload {
    /// Spawns `cmd` (stdout read here, stderr to `log`) and waits for its
    /// `ready PID` line.
    pub fn start(cmd: &mut Command, log: &Path) -> Result<Workload> {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        cmd.stderr(fs::File::create(log)?);
        let mut jvm = Guard(cmd.spawn().with_context(|| format!("starting {cmd:?}"))?);
        let (tx, lines) = mpsc::channel();
        let stdout = jvm.0.stdout.take().context("no JVM stdout")?;
        // A thread, so the JVM never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut messages = Vec::new();
        let pid = loop {
            let line = lines.recv_timeout(READY_TIMEOUT).with_context(|| {
                let stderr = fs::read_to_string(log).unwrap_or_default();
                format!("no `ready PID` from the JVM; stdout {messages:?}, stderr:\n{stderr}")
            })?;
            match line.strip_prefix("ready ") {
                Some(pid) => break pid.trim().parse::<u32>()?,
                None => messages.push(line),
            }
        };
        Ok(Workload {
            jvm,
            pid,
            lines,
            messages,
            log: log.to_path_buf(),
        })
    }

    /// What the JVM wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Whether `daemon serve` has `--jvm-frames` (issue #12: Java frames
/// from HotSpot's own structures, `full`, or from the perf map only,
/// `perf-map`); a daemon from before it names compiled code from the perf
/// map only.
pub fn has_jvm_frames(daemon: &Path) -> Result<bool> {
    let out = Command::new(daemon).args(["serve", "--help"]).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{} serve --help failed",
        daemon.display()
    );
    Ok(String::from_utf8_lossy(&out.stdout).contains("--jvm-frames"))
}

/// The runtime line of `java -version` (`OpenJDK Runtime Environment (build
/// ...)`), for a report's header.
pub fn java_version(java: &Path) -> Result<String> {
    let out = Command::new(java).arg("-version").output()?;
    let text = String::from_utf8_lossy(&out.stderr);
    Ok(text.lines().nth(1).unwrap_or("?").trim().to_string())
}
