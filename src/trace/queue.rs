//! Whose turn the recorder is: one recording at a time (BPF has one
//! target), the others wait in a queue rather than being refused, so that
//! no user can keep it with back-to-back recordings.
//!
//! Each user (uid) may have one request queued or recording; among users
//! it is first come, first served, so a user asking again right after its
//! recording goes behind everyone waiting. Root (and every client that
//! reads all processes) goes first, and a user's recording running when
//! root asks is stopped early ([`Stop::preempt`]) and served as it is: root
//! waits for no one's 30 s. A wait is bounded ([`MAX_WAIT`]); a request
//! whose client hangs up leaves the queue, and its recording stops
//! ([`Stop::cancel`]).

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use thiserror::Error;
use tokio::sync::Notify;

/// Longest a request waits for its turn: one full recording ahead, and
/// the encoding of its trace.
pub const MAX_WAIT: Duration = Duration::from_secs(super::MAX_SECONDS + 10);
/// Requests queued or recording at most (one per user, many for root).
pub const MAX_QUEUED: usize = 64;

/// Who asks for a recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// Root, or a client that may read every process: goes first.
    Root,
    /// A local user other than root.
    User(u32),
}

/// Why a request gets no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum QueueError {
    #[error("uid {0} already has a recording running or waiting: one at a time per user")]
    AlreadyQueued(u32),
    #[error("{MAX_QUEUED} recordings are running or waiting already")]
    Full,
    #[error("no turn within {}s: other recordings ran", MAX_WAIT.as_secs())]
    TimedOut,
}

/// How a recording is asked to end before its time.
#[derive(Debug, Default)]
pub struct Stop(AtomicU8);

const PREEMPTED: u8 = 1;
const CANCELLED: u8 = 2;

impl Stop {
    /// Root waits: end now and serve what was recorded.
    pub fn preempt(&self) {
        let _ = self
            .0
            .compare_exchange(0, PREEMPTED, Ordering::Relaxed, Ordering::Relaxed);
    }
    /// Its client is gone: end now, serve nothing.
    pub fn cancel(&self) {
        self.0.store(CANCELLED, Ordering::Relaxed);
    }
    /// Whether the recording should end now.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed) != 0
    }
    pub fn preempted(&self) -> bool {
        self.0.load(Ordering::Relaxed) == PREEMPTED
    }
    pub fn cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed) == CANCELLED
    }
}

#[derive(Debug)]
struct Entry {
    ticket: u64,
    who: Who,
    stop: Arc<Stop>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    running: Option<Entry>,
    waiting: VecDeque<Entry>,
}

impl Inner {
    /// The waiter whose turn is next: the first root's, else the first.
    fn first(&self) -> Option<u64> {
        self.waiting
            .iter()
            .find(|e| e.who == Who::Root)
            .or_else(|| self.waiting.front())
            .map(|e| e.ticket)
    }

    /// Whether `who` has a request here (a cancelled one, about to end,
    /// does not count: its client is gone).
    fn holds(&self, who: Who) -> bool {
        self.running
            .iter()
            .chain(&self.waiting)
            .any(|e| e.who == who && !e.stop.cancelled())
    }
}

/// The recorder's queue.
#[derive(Debug, Default)]
pub struct Queue {
    inner: Mutex<Inner>,
    changed: Notify,
}

/// A place in the queue, left when dropped (a client that hung up).
#[derive(Debug)]
pub struct Ticket {
    queue: Arc<Queue>,
    ticket: u64,
    pub stop: Arc<Stop>,
}

/// The recorder's turn, handed back when dropped.
#[derive(Debug)]
pub struct Turn(Ticket);

impl Turn {
    pub fn stop(&self) -> &Stop {
        &self.0.stop
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the queue; root's arrival stops a user's recording early.
    pub fn enter(self: &Arc<Self>, who: Who) -> Result<Ticket, QueueError> {
        let mut inner = self.lock();
        if let Who::User(uid) = who {
            if inner.holds(who) {
                return Err(QueueError::AlreadyQueued(uid));
            }
        }
        if inner.waiting.len() + usize::from(inner.running.is_some()) >= MAX_QUEUED {
            return Err(QueueError::Full);
        }
        if who == Who::Root {
            if let Some(r) = inner.running.as_ref().filter(|r| r.who != Who::Root) {
                r.stop.preempt();
            }
        }
        let ticket = inner.next;
        inner.next += 1;
        let stop = Arc::new(Stop::default());
        inner.waiting.push_back(Entry {
            ticket,
            who,
            stop: stop.clone(),
        });
        Ok(Ticket {
            queue: self.clone(),
            ticket,
            stop,
        })
    }

    /// Takes the turn if it is `ticket`'s.
    fn try_start(&self, ticket: u64) -> bool {
        let mut inner = self.lock();
        if inner.running.is_some() || inner.first() != Some(ticket) {
            return false;
        }
        let Some(at) = inner.waiting.iter().position(|e| e.ticket == ticket) else {
            return false;
        };
        inner.running = inner.waiting.remove(at);
        true
    }

    /// Requests running or waiting now.
    pub fn len(&self) -> usize {
        let inner = self.lock();
        inner.waiting.len() + usize::from(inner.running.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Ticket {
    /// Waits for the recorder, at most `limit`.
    pub async fn turn(self, limit: Duration) -> Result<Turn, QueueError> {
        let deadline = tokio::time::Instant::now() + limit;
        let queue = self.queue.clone();
        loop {
            // Registered before the check, so a turn handed back in
            // between is not missed.
            let changed = queue.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.queue.try_start(self.ticket) {
                return Ok(Turn(self));
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(QueueError::TimedOut);
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self.queue.lock();
        if inner
            .running
            .as_ref()
            .is_some_and(|r| r.ticket == self.ticket)
        {
            inner.running = None;
        } else {
            inner.waiting.retain(|e| e.ticket != self.ticket);
        }
        drop(inner);
        self.queue.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOON: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn root_goes_first_and_preempts_a_users_recording() {
        let q = Arc::new(Queue::default());
        let a = q.enter(Who::User(1)).unwrap().turn(SOON).await.unwrap();
        let b = q.enter(Who::User(2)).unwrap();
        assert!(!a.stop().is_set());
        let root = q.enter(Who::Root).unwrap();
        assert!(a.stop().preempted());
        let (b_turn, root_turn) = (b.turn(Duration::from_secs(5)), root.turn(SOON * 4));
        let b_turn = tokio::spawn(b_turn);
        tokio::time::sleep(SOON).await;
        drop(a);
        let root_turn = root_turn.await.unwrap();
        assert!(!b_turn.is_finished());
        drop(root_turn);
        b_turn.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn one_request_per_user_first_come_first_served_among_users() {
        let q = Arc::new(Queue::default());
        let a = q.enter(Who::User(1)).unwrap().turn(SOON).await.unwrap();
        assert_eq!(
            q.enter(Who::User(1)).unwrap_err(),
            QueueError::AlreadyQueued(1)
        );
        let b = q.enter(Who::User(2)).unwrap();
        drop(a);
        // User 1 asks again at once: behind user 2.
        let a_again = q.enter(Who::User(1)).unwrap();
        assert_eq!(a_again.turn(SOON).await.unwrap_err(), QueueError::TimedOut);
        let b = b.turn(SOON).await.unwrap();
        // A user's recording is not stopped for another user.
        assert!(!b.stop().is_set());
        drop(b);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_ticket_dropped_while_waiting_leaves_the_queue() {
        let q = Arc::new(Queue::default());
        let a = q.enter(Who::User(1)).unwrap().turn(SOON).await.unwrap();
        let waiting = tokio::spawn(q.enter(Who::User(2)).unwrap().turn(Duration::from_secs(60)));
        tokio::time::sleep(SOON).await;
        assert_eq!(q.len(), 2);
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(q.len(), 1);
        drop(a);
        assert!(q.is_empty());
        // Root's requests need no per-user rule but are bounded.
        let roots: Vec<Ticket> = (0..MAX_QUEUED)
            .map(|_| q.enter(Who::Root).unwrap())
            .collect();
        assert_eq!(q.enter(Who::Root).unwrap_err(), QueueError::Full);
        drop(roots);
        assert!(q.is_empty());
    }
}
