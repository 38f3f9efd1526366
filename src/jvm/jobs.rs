//! The work of one attach turn, on a worker ([`super::workers`]): first contact
//! (version, flags), perf map, thread names, each within what is left of
//! the turn's time, so that a JVM that answers slowly costs only its own
//! turn.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    attach::{AttachError, Target},
    leftover::WrittenMap,
    output, AttachStatus, JvmReport, Jvms,
};

/// Time the JVM gets to open its attach socket after SIGQUIT.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for the first reply of a JVM (`VM.version`, which any JVM answers
/// at once): a target that takes longer waits for its next turn.
pub const FIRST_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for one whole job on one target (first contact: four commands).
pub const JOB_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts on a JVM that is still starting before giving up.
pub const STARTING_RETRIES: u32 = 3;

/// What one turn on a target does.
#[derive(Debug, Clone, Default)]
pub struct Job {
    /// First contact (a JVM not attached yet; the tries so far): version, flags, then a map and
    /// names.
    pub attach: Option<u32>,
    pub perf_map: bool,
    pub names: bool,
}

/// How a job ended, sent back to the agent by its thread.
#[derive(Debug)]
pub enum Done {
    Attached {
        perf_map: bool,
    },
    /// Try again after this long, `tries` attempts made.
    Retry {
        tries: u32,
        after: Duration,
    },
    /// Another client is attaching (its trigger file is there): try again
    /// after a back-off.
    Busy,
    /// Did not answer the first contact in time: try again after a
    /// back-off.
    TimedOut,
    Refused,
    Gone,
    /// Perf map or names refreshed; `perf_map` false once the JVM said it
    /// cannot write one.
    Worked {
        perf_map: bool,
    },
}

/// A job's end, for the agent.
pub struct Finished {
    pub pid: u32,
    pub done: Done,
    /// A command after the first contact timed out.
    pub timed_out: bool,
    /// The perf map it wrote, when it wrote one.
    pub map: Option<WrittenMap>,
}

/// One turn on `target`, on a worker, within [`JOB_TIMEOUT`].
pub fn run_job(jvms: &Jvms, target: Target, uid: u32, job: &Job) -> Finished {
    let deadline = Instant::now() + JOB_TIMEOUT;
    let first = job.attach.is_some();
    let mut finished = Finished {
        pid: target.pid,
        done: Done::Worked { perf_map: true },
        timed_out: false,
        map: None,
    };
    if let Some(tries) = job.attach {
        finished.done = attach(jvms, target, tries, deadline);
        if !matches!(finished.done, Done::Attached { .. }) {
            return finished;
        }
    }
    let mut perf_map = true;
    if job.perf_map || first {
        match write_perf_map(jvms, target, deadline) {
            Ok(true) => finished.map = WrittenMap::after_write(target.pid, target.ns_pid, uid),
            Ok(false) => {}
            Err(AttachError::Refused { .. }) => perf_map = false,
            Err(_) => finished.timed_out = true,
        }
    }
    if (job.names || first) && !finished.timed_out {
        finished.timed_out = read_thread_names(jvms, target, deadline).is_err();
    }
    finished.done = match first {
        true => Done::Attached { perf_map },
        false => Done::Worked { perf_map },
    };
    finished
}

/// Runs `command` with what is left of the job's time (at most `cap`).
fn jcmd(
    target: Target,
    command: &str,
    deadline: Instant,
    cap: Duration,
) -> Result<String, AttachError> {
    let left = deadline.saturating_duration_since(Instant::now()).min(cap);
    if left.is_zero() {
        return Err(AttachError::Timeout(JOB_TIMEOUT));
    }
    target.jcmd_within(command, START_TIMEOUT, left)
}

/// First contact: version and flags.
fn attach(jvms: &Jvms, target: Target, tries: u32, deadline: Instant) -> Done {
    let pid = target.pid;
    jvms.update(pid, |e| {
        if e.report.attach == AttachStatus::Unknown {
            e.report.attach = AttachStatus::Pending;
        }
    });
    let version = match jcmd(target, "VM.version", deadline, FIRST_REPLY_TIMEOUT) {
        Ok(v) => output::version(&v),
        Err(AttachError::SigquitNotHandled) if tries + 1 < STARTING_RETRIES => {
            return Done::Retry {
                tries: tries + 1,
                after: Duration::from_secs(5),
            };
        }
        Err(AttachError::Busy) => {
            jvms.update(pid, |e| {
                e.report.error = Some(AttachError::Busy.to_string())
            });
            return Done::Busy;
        }
        Err(AttachError::Timeout(_)) => return Done::TimedOut,
        Err(AttachError::Gone) => return Done::Gone,
        Err(err) => {
            tracing::warn!(pid, "not attaching to JVM: {err}");
            jvms.update(pid, |e| {
                e.report.attach = AttachStatus::Refused;
                e.report.error = Some(err.to_string());
            });
            return Done::Refused;
        }
    };
    let pfp = jcmd(target, "VM.flags", deadline, JOB_TIMEOUT)
        .ok()
        .map(|f| output::preserves_frame_pointer(&f));
    tracing::info!(
        pid,
        version = version.as_deref().unwrap_or("?"),
        "attached to JVM"
    );
    jvms.update(pid, |e| {
        e.report = JvmReport {
            attach: AttachStatus::Attached,
            version,
            preserve_frame_pointer: pfp,
            warning: super::frame_pointer_warning(pfp, e.report.frames.as_deref()),
            // Learned without attaching: kept.
            frames: e.report.frames.take(),
            debug_non_safepoints: e.report.debug_non_safepoints,
            ..JvmReport::default()
        }
    });
    Done::Attached { perf_map: true }
}

/// Has the JVM write its perf map: whether it did; `Err` when it cannot
/// (`Refused`: JDK < 17) or did not answer in time.
fn write_perf_map(jvms: &Jvms, target: Target, deadline: Instant) -> Result<bool, AttachError> {
    let pid = target.pid;
    match jcmd(target, "Compiler.perfmap", deadline, JOB_TIMEOUT) {
        Ok(_) => {
            jvms.update(pid, |e| e.report.perf_map_writes += 1);
            Ok(true)
        }
        Err(err @ AttachError::Refused { .. }) => {
            // JDK < 17 has no Compiler.perfmap: say so once, keep the names.
            tracing::warn!(pid, "JVM cannot write a perf map: {err}");
            jvms.update(pid, |e| {
                e.report.error = Some(format!("{err} (Compiler.perfmap needs JDK 17+)"))
            });
            Err(err)
        }
        Err(err @ AttachError::Timeout(_)) => Err(err),
        Err(err) => {
            tracing::debug!(pid, "perf map request failed: {err}");
            Ok(false)
        }
    }
}

/// Reads the JVM's thread names; `Err` when it did not answer in time.
fn read_thread_names(jvms: &Jvms, target: Target, deadline: Instant) -> Result<(), AttachError> {
    let pid = target.pid;
    let dump = match jcmd(target, "Thread.print", deadline, JOB_TIMEOUT) {
        Ok(d) => d,
        Err(err @ AttachError::Timeout(_)) => return Err(err),
        Err(err) => {
            tracing::debug!(pid, "thread dump failed: {err}");
            return Ok(());
        }
    };
    let host = crate::process::live::host_tids_by_ns_tid(pid);
    let names = output::thread_names(pid, &dump)
        .into_iter()
        .filter_map(|(nid, name)| Some((*host.get(&nid)?, Arc::from(name.as_str()))))
        .collect();
    jvms.set_names(pid, names);
    Ok(())
}
