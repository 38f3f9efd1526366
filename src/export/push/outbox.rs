//! Requests waiting to be sent: a queue bounded by intervals and bytes,
//! oldest dropped first (counted), emptied by several senders at once and,
//! on shutdown, within a grace; and the backoff between failed tries.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use crate::state::push::PushStats;

/// Intervals' worth of requests kept while the server does not take them:
/// the newest and the one before.
pub const MAX_INTERVALS: u64 = 2;
/// Bytes of requests kept while the server does not take them: half the
/// budget's `push_outbox` part (a daemon runs at most two sinks, Pyroscope
/// and OTLP).
pub fn max_bytes() -> usize {
    crate::budget::bytes(crate::budget::Part::PushOutbox) / 2
}
/// The first wait after a failed try; it doubles up to the interval.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// One call to the server: the profiles of some processes for one
/// interval.
#[derive(Debug, Clone)]
pub struct Request {
    /// The encoded request.
    pub body: Vec<u8>,
    pub profiles: u64,
    /// Which interval it belongs to (counted from 1).
    pub interval: u64,
    /// The services it is for, for log lines.
    pub service: String,
    /// Its interval's requests, to time the interval's sending.
    pub batch: Arc<Batch>,
}

impl Request {
    /// An interval's requests, one per pack of processes: `encode` gives
    /// a pack's body, how many profiles it holds, and its services
    /// ([`Request::services`]).
    pub fn batch<T>(
        packs: Vec<T>,
        interval: u64,
        mut encode: impl FnMut(T) -> (Vec<u8>, u64, String),
    ) -> Vec<Request> {
        let batch = Batch::new(packs.len());
        packs
            .into_iter()
            .map(|pack| {
                let (body, profiles, service) = encode(pack);
                Request {
                    body,
                    profiles,
                    interval,
                    service,
                    batch: batch.clone(),
                }
            })
            .collect()
    }

    /// The services of a request's processes, as log lines name them:
    /// `app`, or `app and 3 more`.
    pub fn services(services: &[&str]) -> String {
        match services {
            [one] => one.to_string(),
            [first, rest @ ..] => format!("{first} and {} more", rest.len()),
            [] => String::new(),
        }
    }
}

/// An interval's requests: when they were queued and how many are not
/// settled yet (sent, refused or dropped).
#[derive(Debug)]
pub struct Batch {
    pub queued: Instant,
    pub requests: usize,
    unsettled: AtomicUsize,
}

impl Batch {
    /// A batch of `requests` queued now.
    pub fn new(requests: usize) -> Arc<Batch> {
        Arc::new(Batch {
            queued: Instant::now(),
            requests,
            unsettled: AtomicUsize::new(requests),
        })
    }

    /// Settles one request; true for the batch's last.
    pub fn settle(&self) -> bool {
        self.unsettled.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

/// Where the outbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Shutting down: what is queued (and, once `complete`, nothing more
    /// is coming) is sent until `deadline`.
    Closing {
        deadline: Instant,
        complete: bool,
    },
    Stopped,
}

struct Queue {
    requests: VecDeque<Request>,
    bytes: usize,
    phase: Phase,
}

impl Default for Queue {
    fn default() -> Queue {
        Queue {
            requests: VecDeque::new(),
            bytes: 0,
            phase: Phase::Running,
        }
    }
}

/// The queue between the thread that builds profiles and the one that
/// sends them.
#[derive(Default)]
pub struct Outbox {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Outbox {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an interval's requests, then drops the oldest past the
    /// bounds.
    pub fn add(&self, requests: Vec<Request>, stats: &PushStats) {
        let mut q = self.lock();
        for r in requests {
            q.bytes += r.body.len();
            q.requests.push_back(r);
        }
        bound(&mut q, stats);
        self.changed.notify_all();
    }

    /// Puts a request that failed for now back in front of the others
    /// (unless it is too old to keep).
    pub fn put_back(&self, r: Request, stats: &PushStats) {
        let mut q = self.lock();
        q.bytes += r.body.len();
        q.requests.push_front(r);
        bound(&mut q, stats);
    }

    /// The oldest request, waiting for one; `None` once stopped, and
    /// while closing once the queue is empty and complete, or the grace
    /// is over.
    pub fn take(&self, stats: &PushStats) -> Option<Request> {
        let mut q = self.lock();
        loop {
            let wait = match q.phase {
                Phase::Stopped => return None,
                Phase::Closing { deadline, .. } if Instant::now() >= deadline => return None,
                Phase::Closing { deadline, .. } => {
                    Some(deadline.saturating_duration_since(Instant::now()))
                }
                Phase::Running => None,
            };
            if let Some(r) = q.requests.pop_front() {
                q.bytes -= r.body.len();
                publish(&q, stats);
                return Some(r);
            }
            if let Phase::Closing { complete: true, .. } = q.phase {
                return None;
            }
            q = match wait {
                Some(left) => {
                    self.changed
                        .wait_timeout(q, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.changed.wait(q).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    /// Waits `d`, or less if no longer running; false once not running
    /// (closing or stopped).
    pub fn pause(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut q = self.lock();
        while q.phase == Phase::Running {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            q = self
                .changed
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        false
    }

    /// Starts shutting down: pauses end, senders send what is queued and
    /// what is added until [`Outbox::complete`], until `deadline`.
    pub fn close(&self, deadline: Instant) {
        let mut q = self.lock();
        if q.phase == Phase::Running {
            q.phase = Phase::Closing {
                deadline,
                complete: false,
            };
        }
        self.changed.notify_all();
    }

    /// While closing: nothing more will be added.
    pub fn complete(&self) {
        let mut q = self.lock();
        if let Phase::Closing { deadline, .. } = q.phase {
            q.phase = Phase::Closing {
                deadline,
                complete: true,
            };
        }
        self.changed.notify_all();
    }

    /// Whether the outbox is shutting down with time left to send.
    pub fn closing(&self) -> bool {
        matches!(self.lock().phase, Phase::Closing { deadline, .. } if Instant::now() < deadline)
    }

    /// Wakes and ends [`Outbox::take`] and [`Outbox::pause`] for good; the
    /// profiles still queued are counted as dropped.
    pub fn stop(&self, stats: &PushStats) {
        let mut q = self.lock();
        q.phase = Phase::Stopped;
        let left: u64 = q.requests.drain(..).map(|r| r.profiles).sum();
        q.bytes = 0;
        if left > 0 {
            stats.lock().dropped_profiles += left;
        }
        publish(&q, stats);
        self.changed.notify_all();
    }

    /// Whether [`Outbox::stop`] was called.
    pub fn stopped(&self) -> bool {
        self.lock().phase == Phase::Stopped
    }
}

/// Drops the oldest requests while more than [`MAX_INTERVALS`] intervals
/// or [`max_bytes`] are queued.
fn bound(q: &mut Queue, stats: &PushStats) {
    let newest = q.requests.iter().map(|r| r.interval).max().unwrap_or(0);
    let mut dropped = 0;
    while let Some(old) = q.requests.front() {
        let too_old = old.interval + MAX_INTERVALS <= newest;
        if !too_old && q.bytes <= max_bytes() {
            break;
        }
        q.bytes -= old.body.len();
        dropped += old.profiles;
        if let Some(r) = q.requests.pop_front() {
            r.batch.settle();
        }
    }
    if dropped > 0 {
        stats.lock().dropped_profiles += dropped;
    }
    publish(q, stats);
}

fn publish(q: &Queue, stats: &PushStats) {
    let mut r = stats.lock();
    r.queued_requests = q.requests.len() as u64;
    r.queued_bytes = q.bytes as u64;
    r.max_queued_requests = r.max_queued_requests.max(r.queued_requests);
}

/// Waits between failed tries: [`FIRST_BACKOFF`], doubling up to `max`.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Backoff up to `max` (at least [`FIRST_BACKOFF`]).
    pub fn new(max: Duration) -> Backoff {
        Backoff {
            next: FIRST_BACKOFF,
            max: max.max(FIRST_BACKOFF),
        }
    }

    /// How long to wait after a failure; the next wait is twice as long.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// After a success: the next failure waits [`FIRST_BACKOFF`] again.
    pub fn reset(&mut self) {
        self.next = FIRST_BACKOFF;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(interval: u64, bytes: usize) -> Request {
        Request {
            body: vec![0; bytes],
            profiles: 2,
            interval,
            service: "s".into(),
            batch: Batch::new(1),
        }
    }

    #[test]
    fn the_oldest_intervals_go_first() {
        let (outbox, stats) = (Outbox::default(), PushStats::default());
        for interval in 1..=4 {
            outbox.add(vec![request(interval, 10), request(interval, 10)], &stats);
        }
        let r = stats.report();
        assert_eq!(
            (r.queued_requests, r.queued_bytes, r.dropped_profiles),
            (4, 40, 8)
        );
        let first = outbox.take(&stats).unwrap();
        assert_eq!(first.interval, 3);
        // A failed try goes back in front, unless its interval is too old.
        outbox.put_back(first, &stats);
        outbox.add(vec![request(5, 10)], &stats);
        assert_eq!(outbox.take(&stats).unwrap().interval, 4);
        assert_eq!(stats.report().dropped_profiles, 8 + 4);
    }

    #[test]
    fn bytes_are_bounded() {
        let (outbox, stats) = (Outbox::default(), PushStats::default());
        outbox.add(vec![request(1, max_bytes() / 2 + 1); 3], &stats);
        let r = stats.report();
        assert_eq!((r.queued_requests, r.dropped_profiles), (1, 4));
        assert!(r.queued_bytes <= max_bytes() as u64);
    }

    #[test]
    fn stop_ends_waits() {
        let (outbox, stats) = (Outbox::default(), PushStats::default());
        std::thread::scope(|s| {
            let taker = s.spawn(|| outbox.take(&stats));
            let pauser = s.spawn(|| outbox.pause(Duration::from_secs(3600)));
            std::thread::sleep(Duration::from_millis(50));
            outbox.stop(&stats);
            assert!(taker.join().unwrap().is_none());
            assert!(!pauser.join().unwrap());
        });
        assert!(outbox.stopped());
    }

    #[test]
    fn closing_sends_what_is_queued_and_added_then_ends() {
        let (outbox, stats) = (Outbox::default(), PushStats::default());
        outbox.add(vec![request(1, 10)], &stats);
        outbox.close(Instant::now() + Duration::from_secs(60));
        assert!(outbox.closing() && !outbox.pause(Duration::from_secs(60)));
        std::thread::scope(|s| {
            let taker = s.spawn(|| {
                let mut got = Vec::new();
                while let Some(r) = outbox.take(&stats) {
                    got.push(r.interval);
                }
                got
            });
            // The interval in progress, added after closing began.
            std::thread::sleep(Duration::from_millis(50));
            outbox.add(vec![request(2, 10)], &stats);
            outbox.complete();
            assert_eq!(taker.join().unwrap(), [1, 2]);
        });
        // The grace ends the wait for more even if nothing completes it,
        // and stopping counts what is left as dropped.
        let (outbox, stats) = (Outbox::default(), PushStats::default());
        outbox.close(Instant::now() + Duration::from_millis(50));
        assert!(outbox.take(&stats).is_none());
        outbox.add(vec![request(1, 10)], &stats);
        outbox.stop(&stats);
        assert_eq!(stats.report().dropped_profiles, 2);
    }

    #[test]
    fn backoff_doubles_up_to_the_interval() {
        let mut b = Backoff::new(Duration::from_secs(5));
        let waits: Vec<u64> = (0..5).map(|_| b.failed().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
        b.reset();
        assert_eq!(b.failed(), FIRST_BACKOFF);
    }
}
