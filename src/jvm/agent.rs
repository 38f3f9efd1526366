//! The thread that talks to JVMs: attaches once, has them write their perf
//! map while they compile, and reads thread names when new threads show up.

use std::{
    collections::{HashMap, HashSet},
    fs,
    sync::{mpsc, Arc},
    thread,
    time::{Duration, Instant},
};

use super::{
    attach::{AttachError, Target},
    output, JvmReport, Jvms, NO_FRAME_POINTER_WARNING,
};
use crate::procinfo;

/// Whether wallscope attaches to JVMs (`--jvm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum JvmMode {
    /// Attach to every HotSpot JVM seen running.
    #[default]
    Auto,
    /// Never attach; perf maps the JVMs write themselves are still used.
    Off,
}

/// One JVM seen in a batch, sent by the symbolizer.
#[derive(Debug, Clone, Default)]
pub struct Sighting {
    pub pid: u32,
    /// Some of its samples were in JIT code its perf map does not cover.
    pub jit_misses: bool,
    /// Threads seen for which no Java name is known.
    pub unnamed_tids: Vec<u32>,
}

/// Time the JVM gets to open its attach socket after SIGQUIT.
const START_TIMEOUT: Duration = Duration::from_secs(5);
/// Least time between two perf map writes or thread dumps of one JVM.
const MIN_INTERVAL: Duration = Duration::from_secs(2);
/// Perf maps and names are refreshed this often even without misses:
/// the JIT reuses addresses, threads get renamed.
const REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// A JVM not seen for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Attempts on a JVM that is still starting before giving up.
const STARTING_RETRIES: u32 = 3;

/// Sightings waiting for the agent; more are dropped (and counted by the
/// symbolizer): the next batch sends them again.
const QUEUE: usize = 256;

/// Starts the agent thread; the symbolizer sends [`Sighting`]s through the
/// returned channel. The thread ends when the sender is dropped.
pub fn spawn(jvms: Arc<Jvms>, mode: JvmMode) -> std::io::Result<mpsc::SyncSender<Sighting>> {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    thread::Builder::new()
        .name("ws-jvm".into())
        .spawn(move || Agent::new(jvms, mode).run(&rx))?;
    Ok(tx)
}

enum Phase {
    Pending { tries: u32, next_try: Instant },
    Attached { perf_map: bool },
    Refused,
}

struct Tracked {
    target: Target,
    phase: Phase,
    last_perf_map: Instant,
    last_dump: Instant,
    /// Tids the last thread dump was asked to name.
    asked: HashSet<u32>,
    last_seen: Instant,
}

struct Agent {
    jvms: Arc<Jvms>,
    mode: JvmMode,
    tracked: HashMap<u32, Tracked>,
}

impl Agent {
    fn new(jvms: Arc<Jvms>, mode: JvmMode) -> Agent {
        Agent {
            jvms,
            mode,
            tracked: HashMap::new(),
        }
    }

    fn run(mut self, rx: &mpsc::Receiver<Sighting>) {
        loop {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(s) => self.on_sighting(s),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            let now = Instant::now();
            let gone: Vec<u32> = self
                .tracked
                .iter()
                .filter(|(pid, t)| {
                    now - t.last_seen > FORGET_AFTER
                        || !fs::exists(format!("/proc/{pid}")).unwrap_or(false)
                })
                .map(|(pid, _)| *pid)
                .collect();
            for pid in gone {
                self.tracked.remove(&pid);
                self.jvms.forget(pid);
            }
        }
    }

    fn on_sighting(&mut self, s: Sighting) {
        let now = Instant::now();
        let jvms = self.jvms.clone();
        let t = self.tracked.entry(s.pid).or_insert_with(|| {
            let long_ago = now.checked_sub(REFRESH_INTERVAL).unwrap_or(now);
            Tracked {
                target: Target {
                    pid: s.pid,
                    ns_pid: procinfo::Status::read(s.pid).map_or(s.pid, |st| st.ns_pid),
                },
                phase: Phase::Pending {
                    tries: 0,
                    next_try: now,
                },
                last_perf_map: long_ago,
                last_dump: long_ago,
                asked: HashSet::new(),
                last_seen: now,
            }
        });
        t.last_seen = now;
        if self.mode == JvmMode::Off {
            jvms.update(s.pid, |e| e.report.attach = "off");
            return;
        }
        // Once per JVM, unless the process table did it at its start.
        super::flags::prepare(s.pid, &jvms);
        match t.phase {
            Phase::Pending { tries, next_try } if now >= next_try => attach(&jvms, t, tries),
            Phase::Attached { perf_map } => {
                let since_map = now - t.last_perf_map;
                if perf_map
                    && (since_map >= REFRESH_INTERVAL
                        || (s.jit_misses && since_map >= MIN_INTERVAL))
                {
                    write_perf_map(&jvms, t);
                }
                let new_tids = s.unnamed_tids.iter().any(|tid| !t.asked.contains(tid));
                let since_dump = now - t.last_dump;
                if since_dump >= REFRESH_INTERVAL || (new_tids && since_dump >= MIN_INTERVAL) {
                    t.asked = s.unnamed_tids.iter().copied().collect();
                    read_thread_names(&jvms, t);
                }
            }
            _ => {}
        }
    }
}

/// First contact: version, flags, perf map, thread names.
fn attach(jvms: &Jvms, t: &mut Tracked, tries: u32) {
    let pid = t.target.pid;
    jvms.update(pid, |e| {
        if e.report.attach.is_empty() {
            e.report.attach = "pending";
        }
    });
    let version = match t.target.jcmd("VM.version", START_TIMEOUT) {
        Ok(v) => output::version(&v),
        Err(AttachError::SigquitNotHandled) if tries + 1 < STARTING_RETRIES => {
            t.phase = Phase::Pending {
                tries: tries + 1,
                next_try: Instant::now() + Duration::from_secs(5),
            };
            return;
        }
        Err(AttachError::Gone) => {
            t.phase = Phase::Refused;
            jvms.forget(pid);
            return;
        }
        Err(err) => {
            tracing::warn!(pid, "not attaching to JVM: {err}");
            t.phase = Phase::Refused;
            jvms.update(pid, |e| {
                e.report.attach = "refused";
                e.report.error = Some(err.to_string());
            });
            return;
        }
    };
    let pfp = t
        .target
        .jcmd("VM.flags", START_TIMEOUT)
        .ok()
        .map(|f| output::preserves_frame_pointer(&f));
    tracing::info!(
        pid,
        version = version.as_deref().unwrap_or("?"),
        "attached to JVM"
    );
    jvms.update(pid, |e| {
        e.report = JvmReport {
            attach: "attached",
            version,
            preserve_frame_pointer: pfp,
            warning: (pfp == Some(false)).then(|| NO_FRAME_POINTER_WARNING.to_string()),
            // Learned without attaching: kept.
            frames: e.report.frames.take(),
            debug_non_safepoints: e.report.debug_non_safepoints,
            ..JvmReport::default()
        }
    });
    t.phase = Phase::Attached { perf_map: true };
    write_perf_map(jvms, t);
    read_thread_names(jvms, t);
}

fn write_perf_map(jvms: &Jvms, t: &mut Tracked) {
    t.last_perf_map = Instant::now();
    let pid = t.target.pid;
    match t.target.jcmd("Compiler.perfmap", START_TIMEOUT) {
        Ok(_) => jvms.update(pid, |e| e.report.perf_map_writes += 1),
        Err(err @ AttachError::Refused { .. }) => {
            // JDK < 17 has no Compiler.perfmap: say so once, keep the names.
            tracing::warn!(pid, "JVM cannot write a perf map: {err}");
            t.phase = Phase::Attached { perf_map: false };
            jvms.update(pid, |e| {
                e.report.error = Some(format!("{err} (Compiler.perfmap needs JDK 17+)"))
            });
        }
        Err(err) => tracing::debug!(pid, "perf map request failed: {err}"),
    }
}

fn read_thread_names(jvms: &Jvms, t: &mut Tracked) {
    t.last_dump = Instant::now();
    let pid = t.target.pid;
    let dump = match t.target.jcmd("Thread.print", START_TIMEOUT) {
        Ok(d) => d,
        Err(err) => {
            tracing::debug!(pid, "thread dump failed: {err}");
            return;
        }
    };
    let host = host_tids(pid);
    let names = output::thread_names(pid, &dump)
        .into_iter()
        .filter_map(|(nid, name)| Some((*host.get(&nid)?, Arc::from(name.as_str()))))
        .collect();
    jvms.set_names(pid, names);
}

/// Host tids of `pid`'s threads by their tid in the process's own pid
/// namespace (the `nid` of thread dumps).
fn host_tids(pid: u32) -> HashMap<u32, u32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    dir.filter_map(|e| {
        let tid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let status = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
        let ns_tid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))?
            .split_whitespace()
            .last()?
            .parse()
            .ok()?;
        Some((ns_tid, tid))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_threads_map_to_themselves() {
        let me = std::process::id();
        let tids = host_tids(me);
        assert_eq!(tids.get(&me), Some(&me));
    }

    #[test]
    fn off_mode_reports_without_attaching() {
        let jvms = Arc::new(Jvms::default());
        let mut agent = Agent::new(jvms.clone(), JvmMode::Off);
        agent.on_sighting(Sighting {
            pid: std::process::id(),
            ..Sighting::default()
        });
        assert_eq!(jvms.report(std::process::id()).unwrap().attach, "off");
    }

    #[test]
    fn a_non_jvm_is_refused_once_and_not_retried() {
        let jvms = Arc::new(Jvms::default());
        let mut agent = Agent::new(jvms.clone(), JvmMode::Auto);
        let me = std::process::id();
        agent.on_sighting(Sighting {
            pid: me,
            ..Sighting::default()
        });
        let report = jvms.report(me).unwrap();
        assert_eq!(report.attach, "refused");
        assert!(report.error.unwrap().contains("libjvm"));
        assert!(matches!(agent.tracked[&me].phase, Phase::Refused));
    }
}
