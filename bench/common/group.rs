//! Children of a bench that die with it: each runs in its own process
//! group (a ctrl-c at the terminal reaches the bench alone), gets
//! `PR_SET_PDEATHSIG` (a bench that is killed takes them with it) and has
//! its whole group killed when its [`Group`] is dropped (a bench that fails
//! or panics unwinds through the drops).

use super::Guard;
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

/// Longest a workload may take to print its `ready` line.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A child in its own process group; dropping it kills the group.
pub struct Group(pub Guard);

impl Group {
    /// Has `cmd` run with SIGPIPE ignored: a child that prints after its
    /// `ready` line, once the bench has stopped reading, or that a daemon
    /// hangs up on, is not killed by it.
    pub fn ignore_sigpipe(cmd: &mut Command) -> &mut Command {
        // SAFETY: signal(2) is async-signal-safe; an ignored signal stays
        // ignored across exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                Ok(())
            })
        }
    }

    /// Spawns `cmd` in a new process group, killed with `death_signal` if
    /// the bench's main thread dies.
    pub fn spawn(cmd: &mut Command, death_signal: libc::c_int) -> Result<Group> {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: prctl and getppid are async-signal-safe; nothing else runs
        // between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, death_signal);
                // The bench died before the prctl: nobody would signal us.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = cmd.process_group(0).spawn();
        Ok(Group(Guard(
            child.with_context(|| format!("starting {cmd:?}"))?,
        )))
    }

    pub fn pid(&self) -> u32 {
        self.0 .0.id()
    }

    /// Reads the child's stdout up to its `ready PID` line.
    pub fn wait_ready(&mut self, what: &str) -> Result<()> {
        let stdout = self.0 .0.stdout.take().context("stdout not piped")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(line) if line.starts_with("ready ") => Ok(()),
            Ok(line) => bail!("{what} did not start: {line:?}"),
            Err(_) => bail!("{what} not ready after {READY_TIMEOUT:?}"),
        }
    }
}

impl Group {
    /// Stops the child with SIGTERM and reads the counts it prints as it
    /// exits, `KEY0 N KEY1 M` (its stdout, piped and not read before).
    pub fn stop_counts(&mut self, keys: [&str; 2]) -> Result<(u64, u64)> {
        let mut stdout = self.0 .0.stdout.take().context("stdout not piped")?;
        self.0.stop(libc::SIGTERM)?;
        let mut out = String::new();
        stdout.read_to_string(&mut out)?;
        let num = |key: &str| -> Option<u64> {
            let mut words = out.split_whitespace();
            words.find(|w| *w == key)?;
            words.next()?.parse().ok()
        };
        match (num(keys[0]), num(keys[1])) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => bail!("it printed {out:?}"),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the group our child leads (its pid).
        unsafe { libc::kill(-(self.pid() as libc::pid_t), libc::SIGKILL) };
    }
}
