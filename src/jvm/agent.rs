//! The thread that talks to JVMs: attaches once, has them write their perf
//! map while they compile, and reads thread names when new threads show up.
//! The jobs run on a few long-lived workers ([`super::workers`]); a JVM
//! whose user is over their CPU budget ([`crate::budget::cpu`]) waits for
//! its next turn until it refilled (counted `jvm_attach`/`user_cpu`).

use std::{
    collections::{HashMap, HashSet},
    sync::{mpsc, Arc},
    thread,
    time::{Duration, Instant},
};

use super::{
    attach::Target,
    jobs::{Done, Finished, Job},
    leftover::WrittenMap,
    turns::{Candidate, Turns},
    workers::{Work, Workers},
    AttachStatus, Jvms,
};
use crate::{
    budget::cpu,
    process::{ChangeKind, ProcKey, ProcessTable, Subscription},
    untrusted::{refusals, Reason, What},
};

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
    /// The JVM, as the process table knows it.
    pub key: ProcKey,
    /// Some of its samples were in JIT code its perf map does not cover.
    pub jit_misses: bool,
    /// Threads seen for which no Java name is known.
    pub unnamed_tids: Vec<u32>,
}

/// Wait before the next try after a target timed out, doubled at each
/// time-out in a row up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Wait before trying again a JVM another client is attaching to,
/// doubled while its trigger stays (a client that died leaves it), up to
/// 8 times this.
const BUSY_BACKOFF: Duration = Duration::from_secs(1);
/// Least time between two perf map writes or thread dumps of one JVM.
const MIN_INTERVAL: Duration = Duration::from_secs(2);
/// Perf maps and names are refreshed this often even without misses:
/// the JIT reuses addresses, threads get renamed.
const REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// How often the agent looks for finished jobs and exited JVMs when no
/// sighting comes.
const TICK: Duration = Duration::from_millis(100);
/// JVMs whose perf maps are tracked for removal at exit (each holds a
/// descriptor of its `/tmp`).
const MAX_HELD_MAPS: usize = 1024;
/// How often the table's changes are looked at for JVMs that ended.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Sightings waiting for the agent; more are dropped (and counted by the
/// symbolizer): the next batch sends them again. The agent never blocks on
/// a JVM, so only a flood of batches fills it.
const QUEUE: usize = 256;

/// Starts the agent thread; the symbolizer sends [`Sighting`]s through the
/// returned channel. JVMs are forgotten when `table` says they ended. The
/// thread ends when the sender is dropped.
pub fn spawn(
    jvms: Arc<Jvms>,
    mode: JvmMode,
    table: &Arc<ProcessTable>,
) -> std::io::Result<(mpsc::SyncSender<Sighting>, thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let changes = table.subscribe();
    let handle = thread::Builder::new()
        .name("ws-jvm".into())
        .spawn(move || Agent::new(jvms, mode, changes).run(&rx))?;
    Ok((tx, handle))
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Pending { tries: u32 },
    Attached { perf_map: bool },
    Refused,
}

struct Tracked {
    key: ProcKey,
    target: Target,
    /// The JVM's user: turns are shared by user.
    uid: u32,
    phase: Phase,
    last_perf_map: Instant,
    last_dump: Instant,
    /// Tids the last thread dump was asked to name.
    asked: HashSet<u32>,
    /// Work wanted at its next turn.
    wanted: Option<Job>,
    /// A job runs on it now.
    running: bool,
    /// No turn before this (back-off after time-outs or a busy trigger).
    not_before: Instant,
    /// Time-outs in a row.
    timeouts: u32,
    /// Tries that found another client's trigger.
    busy: u32,
    /// A back-off's sighting was counted as [`Reason::Budget`] already.
    budget_counted: bool,
    /// Its wanted job was held back for its user's CPU budget, counted.
    cpu_counted: bool,
    /// Its last turn (see [`turns::Candidate::served`]).
    served: u64,
    /// The perf map it wrote at our request, removed when it exits.
    map: Option<WrittenMap>,
}

struct Agent {
    jvms: Arc<Jvms>,
    mode: JvmMode,
    tracked: HashMap<u32, Tracked>,
    /// JVMs that ended, forgotten once no job runs on them.
    ended: HashSet<ProcKey>,
    /// JVMs that exited, their perf maps removed once no job runs on them.
    exited: HashSet<ProcKey>,
    changes: Subscription,
    turns: Turns,
    workers: Workers,
    done_rx: mpsc::Receiver<Finished>,
}

impl Agent {
    fn new(jvms: Arc<Jvms>, mode: JvmMode, changes: Subscription) -> Agent {
        let (done_tx, done_rx) = mpsc::channel();
        Agent {
            jvms,
            mode,
            tracked: HashMap::new(),
            ended: HashSet::new(),
            exited: HashSet::new(),
            changes,
            turns: Turns::default(),
            workers: Workers::new(done_tx),
            done_rx,
        }
    }

    fn run(mut self, rx: &mpsc::Receiver<Sighting>) {
        let mut last_sweep = Instant::now();
        loop {
            match rx.recv_timeout(TICK) {
                Ok(s) => self.on_sighting(s),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            while let Ok(f) = self.done_rx.try_recv() {
                self.on_done(f);
            }
            self.dispatch();
            if last_sweep.elapsed() >= SWEEP_EVERY {
                last_sweep = Instant::now();
                self.sweep();
            }
        }
    }

    /// Forgets JVMs whose program ended (see
    /// [`crate::process::Subscription`]), removing the perf maps they
    /// wrote for us; one a job runs on waits for the job.
    fn sweep(&mut self) {
        let due = self.changes.poll(Instant::now());
        // A perf map we had a JVM write goes as soon as its program ends
        // (once no job runs on it): /tmp is not kept waiting for the
        // names, which are kept for the last samples.
        let exits = due.changes.iter().filter(|c| c.kind == ChangeKind::Exit);
        self.exited.extend(exits.map(|c| c.key));
        let tracked = &mut self.tracked;
        self.exited.retain(|key| match tracked.get_mut(&key.pid) {
            Some(t) if t.key == *key && t.running => true,
            Some(t) if t.key == *key => {
                remove_map(key.pid, t.map.take());
                false
            }
            _ => false,
        });
        let gone = self.changes.gone(due, self.tracked.values().map(|t| t.key));
        self.ended.extend(gone);
        let ended = std::mem::take(&mut self.ended);
        for key in ended {
            match self.tracked.get(&key.pid) {
                Some(t) if t.key == key && t.running => {
                    self.ended.insert(key);
                }
                Some(t) if t.key == key => self.forget(key.pid),
                _ => {}
            }
        }
        let tracked = &self.tracked;
        self.turns
            .retain_users(|uid| tracked.values().any(|t| t.uid == uid));
    }

    /// Stops tracking `pid`'s JVM and drops what is known of it.
    fn forget(&mut self, pid: u32) {
        let Some(t) = self.tracked.remove(&pid) else {
            return;
        };
        remove_map(pid, t.map);
        self.jvms.forget(t.key);
    }

    fn on_sighting(&mut self, s: Sighting) {
        let now = Instant::now();
        let pid = s.key.pid;
        match self.tracked.get(&pid) {
            // The pid now names another process (or program): the old one
            // goes, once its job is done.
            Some(t) if t.key != s.key && t.running => return,
            Some(t) if t.key != s.key => self.forget(pid),
            _ => {}
        }
        self.jvms.track(s.key);
        let table = self.changes.table();
        let t = self.tracked.entry(pid).or_insert_with(|| {
            let long_ago = now.checked_sub(REFRESH_INTERVAL).unwrap_or(now);
            let facts = table.facts(s.key);
            Tracked {
                key: s.key,
                target: Target {
                    pid,
                    ns_pid: facts.as_ref().map_or(pid, |f| f.ns_pid),
                },
                uid: facts.as_ref().map_or(u32::MAX, |f| f.euid),
                phase: Phase::Pending { tries: 0 },
                last_perf_map: long_ago,
                last_dump: long_ago,
                asked: HashSet::new(),
                wanted: None,
                running: false,
                not_before: now,
                timeouts: 0,
                busy: 0,
                budget_counted: false,
                cpu_counted: false,
                served: 0,
                map: None,
            }
        });
        if self.mode == JvmMode::Off {
            self.jvms
                .update(pid, |e| e.report.attach = AttachStatus::Off);
            return;
        }
        // Once per JVM, unless the process table did it at its start.
        super::flags::prepare(pid, &self.jvms);
        if t.running {
            return;
        }
        if now < t.not_before {
            // Used up its time for now: counted once per back-off.
            if t.timeouts > 0 && !t.budget_counted {
                t.budget_counted = true;
                refusals::count_for(What::JvmAttach, Reason::Budget, pid);
            }
            return;
        }
        let job = match t.phase {
            Phase::Pending { tries } => Some(Job {
                attach: Some(tries),
                ..Job::default()
            }),
            Phase::Attached { perf_map } => {
                let since_map = now - t.last_perf_map;
                let map = perf_map
                    && (since_map >= REFRESH_INTERVAL
                        || (s.jit_misses && since_map >= MIN_INTERVAL));
                let new_tids = s.unnamed_tids.iter().any(|tid| !t.asked.contains(tid));
                let since_dump = now - t.last_dump;
                let names =
                    since_dump >= REFRESH_INTERVAL || (new_tids && since_dump >= MIN_INTERVAL);
                if names {
                    t.asked = s.unnamed_tids.iter().copied().collect();
                }
                (map || names).then_some(Job {
                    attach: None,
                    perf_map: map,
                    names,
                })
            }
            Phase::Refused => None,
        };
        if let Some(job) = job {
            let wanted = t.wanted.get_or_insert_with(Job::default);
            wanted.attach = job.attach.or(wanted.attach);
            wanted.perf_map |= job.perf_map;
            wanted.names |= job.names;
        }
    }

    /// Starts wanted jobs while turns are free, fairly (see [`Turns`]),
    /// but none of a user over their CPU budget.
    fn dispatch(&mut self) {
        let now = Instant::now();
        let mut candidates = Vec::new();
        for (&pid, t) in &mut self.tracked {
            if t.wanted.is_none() || t.running || now < t.not_before {
                continue;
            }
            if !cpu::allows(t.uid) {
                if !t.cpu_counted {
                    t.cpu_counted = true;
                    cpu::refuse(t.uid, pid, What::JvmAttach);
                }
                continue;
            }
            candidates.push(Candidate {
                pid,
                uid: t.uid,
                served: t.served,
            });
        }
        while let Some((pid, seq)) = self.turns.pick(&candidates) {
            candidates.retain(|c| c.pid != pid);
            let Some(t) = self.tracked.get_mut(&pid) else {
                continue;
            };
            let Some(job) = t.wanted.take() else {
                self.turns.done(t.uid);
                continue;
            };
            t.served = seq;
            t.running = true;
            t.cpu_counted = false;
            if job.perf_map || job.attach.is_some() {
                t.last_perf_map = now;
            }
            if job.names || job.attach.is_some() {
                t.last_dump = now;
            }
            let work = Work {
                jvms: self.jvms.clone(),
                target: t.target,
                uid: t.uid,
                job,
            };
            if let Err(err) = self.workers.submit(work, self.turns.running()) {
                tracing::warn!(pid, "cannot start an attach job: {err}");
                t.running = false;
                self.turns.done(t.uid);
            }
        }
    }

    fn on_done(&mut self, mut f: Finished) {
        let held = self.tracked.values().filter(|t| t.map.is_some()).count();
        let Some(t) = self.tracked.get_mut(&f.pid) else {
            return;
        };
        self.turns.done(t.uid);
        t.running = false;
        if t.map.is_none() && f.map.is_some() && held >= MAX_HELD_MAPS {
            // Its map stays in /tmp when it exits: counted.
            refusals::count_for(What::PerfMap, Reason::TooManyEntries, f.pid);
            f.map = None;
        }
        if f.map.is_some() {
            t.map = f.map;
        }
        let now = Instant::now();
        match f.done {
            Done::Attached { perf_map } => {
                t.phase = Phase::Attached { perf_map };
                t.busy = 0;
            }
            Done::Worked { perf_map } => {
                if let Phase::Attached { perf_map: p } = &mut t.phase {
                    *p &= perf_map;
                }
            }
            Done::Retry { tries, after } => {
                t.phase = Phase::Pending { tries };
                t.not_before = now + after;
            }
            Done::Busy => {
                t.not_before = now + BUSY_BACKOFF.saturating_mul(1 << t.busy.min(3));
                t.busy += 1;
            }
            Done::TimedOut => {}
            Done::Refused => t.phase = Phase::Refused,
            Done::Gone => {
                t.phase = Phase::Refused;
                self.jvms.forget(t.key);
            }
        }
        if f.timed_out || matches!(f.done, Done::TimedOut) {
            // Its turns cost the others their time: it waits longer and
            // longer before the next.
            refusals::count_for(What::JvmAttach, Reason::Timeout, f.pid);
            let backoff = FIRST_BACKOFF
                .saturating_mul(1 << t.timeouts.min(16))
                .min(MAX_BACKOFF);
            t.timeouts += 1;
            t.budget_counted = false;
            t.not_before = now + backoff;
            tracing::debug!(pid = f.pid, ?backoff, "JVM did not answer in time");
        } else {
            t.timeouts = 0;
        }
    }
}

/// Removes the perf map JVM `pid` wrote for us, if it is still that file.
fn remove_map(pid: u32, map: Option<WrittenMap>) {
    if map.is_some_and(|map| map.remove()) {
        tracing::debug!(pid, "removed the perf map of an exited JVM");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(jvms: Arc<Jvms>, mode: JvmMode) -> Agent {
        Agent::new(jvms, mode, Arc::new(ProcessTable::default()).subscribe())
    }

    fn sighting(pid: u32) -> Sighting {
        Sighting {
            key: ProcKey::of_pid(pid),
            ..Sighting::default()
        }
    }

    #[test]
    fn a_reused_pid_never_gets_the_previous_jvms_names() {
        let jvms = Arc::new(Jvms::default());
        let mut agent = agent(jvms.clone(), JvmMode::Off);
        let old = ProcKey {
            pid: 42,
            start_ns: 1,
            exec: 0,
        };
        let new = ProcKey {
            pid: 42,
            start_ns: 2,
            exec: 0,
        };
        agent.on_sighting(Sighting {
            key: old,
            ..Sighting::default()
        });
        jvms.set_names(42, HashMap::from([(43, Arc::from("pool-1-thread-1"))]));
        assert!(jvms.knows_thread(old, 43));
        assert!(!jvms.knows_thread(new, 43), "names are the process's");
        agent.on_sighting(Sighting {
            key: new,
            ..Sighting::default()
        });
        assert!(!jvms.knows_thread(old, 43) && !jvms.knows_thread(new, 43));
        assert_eq!(agent.tracked[&42].key, new);
    }

    #[test]
    fn off_mode_reports_without_attaching() {
        let jvms = Arc::new(Jvms::default());
        let mut agent = agent(jvms.clone(), JvmMode::Off);
        agent.on_sighting(sighting(std::process::id()));
        assert_eq!(
            jvms.report(std::process::id()).unwrap().attach,
            AttachStatus::Off
        );
    }

    /// Runs the agent's jobs for `pid` until none is running.
    fn finish_jobs(agent: &mut Agent, pid: u32) {
        agent.dispatch();
        while agent.tracked[&pid].running {
            let f = agent.done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
            agent.on_done(f);
        }
    }

    #[test]
    fn a_non_jvm_is_refused_once_and_not_retried() {
        let jvms = Arc::new(Jvms::default());
        let mut agent = agent(jvms.clone(), JvmMode::Auto);
        let me = std::process::id();
        let seen = sighting(me);
        agent.on_sighting(seen.clone());
        finish_jobs(&mut agent, me);
        let report = jvms.report(me).unwrap();
        assert_eq!(report.attach, AttachStatus::Refused);
        assert!(report.error.unwrap().contains("libjvm"));
        assert!(matches!(agent.tracked[&me].phase, Phase::Refused));
        agent.on_sighting(seen);
        assert!(agent.tracked[&me].wanted.is_none(), "not retried");
    }

    #[test]
    fn a_timed_out_target_backs_off_longer_each_time_and_is_counted() {
        let jvms = Arc::new(Jvms::default());
        let mut agent = agent(jvms, JvmMode::Auto);
        let me = std::process::id();
        agent.on_sighting(sighting(me));
        let before = refusals::get(What::JvmAttach, Reason::Timeout);
        let mut waits = Vec::new();
        for _ in 0..3 {
            let now = Instant::now();
            agent.tracked.get_mut(&me).unwrap().running = true;
            agent.turns.pick(&[Candidate {
                pid: me,
                uid: agent.tracked[&me].uid,
                served: 0,
            }]);
            agent.on_done(Finished {
                pid: me,
                done: Done::TimedOut,
                timed_out: false,
                map: None,
            });
            waits.push(agent.tracked[&me].not_before - now);
        }
        assert!(refusals::get(What::JvmAttach, Reason::Timeout) >= before + 3);
        assert!(waits[0] >= FIRST_BACKOFF && waits[1] >= waits[0] * 2 - Duration::from_millis(50));
        assert!(
            waits[2] >= waits[1] * 2 - Duration::from_millis(50),
            "{waits:?}"
        );
        assert_eq!(agent.turns.running(), 0, "its turns given back");
        // Sightings while it waits ask for nothing and count its budget.
        let budget = refusals::get(What::JvmAttach, Reason::Budget);
        agent.tracked.get_mut(&me).unwrap().wanted = None;
        agent.on_sighting(sighting(me));
        assert!(agent.tracked[&me].wanted.is_none());
        assert_eq!(refusals::get(What::JvmAttach, Reason::Budget), budget + 1);
    }

    #[test]
    fn a_jvm_of_a_user_over_their_cpu_budget_waits_counted_once() {
        let jvms = Arc::new(Jvms::default());
        let mut agent = agent(jvms, JvmMode::Auto);
        let me = std::process::id();
        agent.on_sighting(sighting(me));
        // A user of its own, deep in debt (a minute of the pool).
        const HOG: u32 = 3_999_999_001;
        agent.tracked.get_mut(&me).unwrap().uid = HOG;
        cpu::charge(HOG, 60_000_000_000);
        let before = refusals::get(What::JvmAttach, Reason::UserCpu);
        agent.dispatch();
        agent.dispatch();
        assert!(!agent.tracked[&me].running, "dispatched over budget");
        assert!(agent.tracked[&me].wanted.is_some(), "its job still wanted");
        assert_eq!(agent.workers.started(), 0);
        assert_eq!(
            refusals::get(What::JvmAttach, Reason::UserCpu),
            before + 1,
            "counted once per wait"
        );
    }
}
