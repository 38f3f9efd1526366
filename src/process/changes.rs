//! What the process table tells the stages that keep state per process
//! (the unwind registry, the JVM agent, the symbolizer's JIT and Java
//! caches, the pusher's service names): a process was born, exec'd,
//! exited, or turned out to be a JVM. They subscribe instead of polling
//! `/proc`, key their state by [`ProcKey`] (one program one process ran:
//! an exec makes a new key), and forget a key's state by the one rule
//! here: [`KEEP_ENDED`] after its program ended, by an exit or an exec
//! (its last samples are still being drained and symbolized until then),
//! and at once when the table no longer knows it.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{sync_channel, Receiver, SyncSender, TrySendError},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use super::{ProcessTable, KEEP_ENDED};

/// One program one process ran, for the life of the host: a reused pid
/// starts later, an exec counts up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ProcKey {
    pub pid: u32,
    /// ns since boot (the kernel's `start_time`); 0 for a process found in
    /// `/proc` without an event (running before the daemon started).
    pub start_ns: u64,
    /// Execs the table saw the process make before this program.
    pub exec: u32,
}

impl ProcKey {
    /// A process known only by its pid (not in the table).
    pub fn of_pid(pid: u32) -> ProcKey {
        ProcKey {
            pid,
            ..ProcKey::default()
        }
    }

    /// When the process started, on the wall clock; `None` when unknown.
    /// Exact (the kernel's boot-clock start), unlike `/proc/PID/stat`'s
    /// clock ticks after a boot time given in whole seconds.
    pub fn started_at(&self) -> Option<SystemTime> {
        if self.start_ns == 0 {
            return None;
        }
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid timespec for the call to fill.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } != 0 {
            return None;
        }
        let boot_now = Duration::new(now.tv_sec as u64, now.tv_nsec as u32);
        let age = boot_now.checked_sub(Duration::from_nanos(self.start_ns))?;
        SystemTime::now().checked_sub(age)
    }
}

/// What happened to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Forked, or found in `/proc`.
    New,
    /// Runs another program (same pid and start, the next `exec`); the
    /// previous program's key ends with an [`ChangeKind::Exit`].
    Exec,
    /// The program ended: the process exited (or its exit event was lost
    /// and it is gone from `/proc`), or exec'd another.
    Exit,
    /// Mapped HotSpot's libjvm.
    JvmFound,
}

/// One change, as published to every subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub key: ProcKey,
    pub kind: ChangeKind,
}

/// Changes a subscriber may lag behind by. A fork storm fills it only if
/// the subscriber stalls; what does not fit is dropped and counted, and
/// the subscriber then checks its processes against the table.
pub const QUEUE: usize = 1 << 16;

/// Ended processes a subscriber waits [`KEEP_ENDED`] on; past this the
/// oldest are forgotten early (their last samples may lose a few frames).
const MAX_PENDING_EXITS: usize = 1 << 16;

/// The table's side: one sender per subscriber.
#[derive(Default)]
pub(super) struct Publisher {
    subscribers: Vec<(SyncSender<Change>, Arc<AtomicU64>)>,
    /// Changes dropped for a full queue, all subscribers.
    pub dropped: u64,
}

impl Publisher {
    pub(super) fn add(&mut self) -> (Receiver<Change>, Arc<AtomicU64>) {
        let (tx, rx) = sync_channel(QUEUE);
        let lost = Arc::new(AtomicU64::new(0));
        self.subscribers.push((tx, lost.clone()));
        (rx, lost)
    }

    /// Sends without ever blocking the table (it is called under its lock).
    pub(super) fn publish(&mut self, key: ProcKey, kind: ChangeKind) {
        let change = Change { key, kind };
        let mut dropped = 0;
        self.subscribers
            .retain(|(tx, lost)| match tx.try_send(change) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    lost.fetch_add(1, Ordering::Relaxed);
                    dropped += 1;
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            });
        self.dropped += dropped;
    }
}

/// A stage's subscription to the table's changes.
pub struct Subscription {
    table: Arc<ProcessTable>,
    rx: Receiver<Change>,
    lost: Arc<AtomicU64>,
    lost_seen: u64,
    exits: VecDeque<(Instant, ProcKey)>,
}

/// What a subscriber is to do now (see [`Subscription::poll`]).
#[derive(Debug, Default)]
pub struct Due {
    /// Every change since the last poll, in order.
    pub changes: Vec<Change>,
    /// Keys whose state is to be forgotten: their program ended (exit or
    /// exec) [`KEEP_ENDED`] ago.
    pub forget: Vec<ProcKey>,
    /// Changes were lost: forget every process the table no longer
    /// [knows](ProcessTable::knows).
    pub check_all: bool,
}

impl Subscription {
    pub(super) fn new(
        table: Arc<ProcessTable>,
        rx: Receiver<Change>,
        lost: Arc<AtomicU64>,
    ) -> Self {
        Subscription {
            table,
            rx,
            lost,
            lost_seen: 0,
            exits: VecDeque::new(),
        }
    }

    /// The changes since the last call, and the processes due to be
    /// forgotten at `now`.
    pub fn poll(&mut self, now: Instant) -> Due {
        let mut due = Due::default();
        while let Ok(change) = self.rx.try_recv() {
            match change.kind {
                ChangeKind::Exit => {
                    if self.exits.len() >= MAX_PENDING_EXITS {
                        due.forget.extend(self.exits.pop_front().map(|(_, k)| k));
                    }
                    self.exits.push_back((now, change.key));
                }
                ChangeKind::New | ChangeKind::Exec | ChangeKind::JvmFound => {}
            }
            due.changes.push(change);
        }
        while let Some(&(at, key)) = self.exits.front() {
            if now.duration_since(at) < KEEP_ENDED {
                break;
            }
            self.exits.pop_front();
            due.forget.push(key);
        }
        let lost = self.lost.load(Ordering::Relaxed);
        due.check_all = lost != self.lost_seen;
        self.lost_seen = lost;
        due
    }

    /// The table it listens to.
    pub fn table(&self) -> &Arc<ProcessTable> {
        &self.table
    }

    /// Of the processes a subscriber `holds`, those to forget now: the
    /// ones `due` names, and when changes were lost, every one the table
    /// no longer knows.
    pub fn gone(&self, due: Due, holds: impl IntoIterator<Item = ProcKey>) -> Vec<ProcKey> {
        let mut gone = due.forget;
        if due.check_all {
            gone.extend(holds.into_iter().filter(|k| !self.table.knows(*k)));
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn exits_are_forgotten_after_keep_ended_and_losses_reported() {
        let table = Arc::new(ProcessTable::default());
        let mut sub = table.subscribe();
        let mut publisher = Publisher::default();
        let (rx, lost) = publisher.add();
        sub.rx = rx;
        sub.lost = lost;
        let key = ProcKey {
            pid: 7,
            start_ns: 9,
            exec: 0,
        };
        publisher.publish(key, ChangeKind::Exit);
        let t0 = Instant::now();
        let due = sub.poll(t0);
        assert_eq!(due.changes.len(), 1);
        assert!(due.forget.is_empty() && !due.check_all);
        assert!(sub.poll(t0 + KEEP_ENDED / 2).forget.is_empty());
        publisher.publish(ProcKey::of_pid(8), ChangeKind::Exec);
        assert!(
            sub.poll(t0).forget.is_empty(),
            "an exec's new key has nothing to forget"
        );
        assert_eq!(
            sub.poll(t0 + KEEP_ENDED + Duration::from_millis(1)).forget,
            vec![key]
        );
        for _ in 0..QUEUE + 3 {
            publisher.publish(key, ChangeKind::New);
        }
        assert_eq!(publisher.dropped, 3);
        let due = sub.poll(t0);
        assert_eq!(due.changes.len(), QUEUE);
        assert!(due.check_all, "losses make the subscriber check everything");
        assert!(!sub.poll(t0).check_all);
        drop(sub);
        publisher.publish(key, ChangeKind::New);
        assert!(
            publisher.subscribers.is_empty(),
            "a gone subscriber is dropped"
        );
    }
}
