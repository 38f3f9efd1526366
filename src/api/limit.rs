//! Queries that walk the store run on blocking threads, a bounded number at
//! a time, so that the async workers (which answer `/healthz` and accept
//! connections) never compute a profile.
//!
//! At most [`MAX_RUNNING`] queries run at once; up to [`MAX_WAITING`] more
//! wait for a turn, each for at most [`MAX_WAIT`]. Past either bound the
//! request gets 503 with a message and `Retry-After`, counted as refused.
//! A query computes its first [`QUERY_GRACE`] of CPU at the workloads'
//! own priority, then at nice [`QUERY_NICE`]: an incident's cheap
//! questions answer at once on a loaded host, while heavy ones (on a small
//! host two of them could take every core) leave the profiled workloads,
//! the daemon's pipeline and `/healthz` first. A watcher sums the CPU of
//! the query's [`Crew`] (its thread and the workers it starts) every
//! [`WATCH_EVERY`].
//!
//! A query whose client went away still runs to its end (a blocking thread
//! cannot be interrupted) but keeps its turn while it does, so abandoned
//! queries cannot pile up beyond the bound.
//!
//! [`QUERY_NICE`]: crate::priority::crew::QUERY_NICE

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use serde::Serialize;
use tokio::sync::Semaphore;

use super::error::ApiError;
use crate::priority::crew::{Crew, QUERY_GRACE};

/// Queries computing at once (the host's cores are for the workloads).
pub const MAX_RUNNING: usize = 2;
/// Queries waiting for a turn; more are refused at once.
pub const MAX_WAITING: usize = 16;
/// Longest a query waits for a turn.
pub const MAX_WAIT: Duration = Duration::from_secs(10);
/// How often a running query's CPU is looked at.
const WATCH_EVERY: Duration = Duration::from_millis(10);

/// The bound on running queries, with its counters.
pub struct Queries {
    turns: Arc<Semaphore>,
    max_running: usize,
    max_waiting: usize,
    max_wait: Duration,
    waiting: AtomicUsize,
    completed: AtomicU64,
    refused: AtomicU64,
}

/// What `/healthz` and `/metrics` show of the query bound.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct QueryStats {
    pub running: usize,
    pub waiting: usize,
    pub max_running: usize,
    pub max_waiting: usize,
    pub completed: u64,
    /// Refused with 503: too many waiting, or waited [`MAX_WAIT`].
    pub refused: u64,
}

impl Default for Queries {
    fn default() -> Self {
        Queries::new(MAX_RUNNING, MAX_WAITING, MAX_WAIT)
    }
}

/// Counts a waiting query until dropped (also when the request is dropped
/// while it waits).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Queries {
    /// A bound of `max_running` queries at once, `max_waiting` more waiting
    /// at most `max_wait` each.
    pub fn new(max_running: usize, max_waiting: usize, max_wait: Duration) -> Self {
        Queries {
            turns: Arc::new(Semaphore::new(max_running)),
            max_running,
            max_waiting,
            max_wait,
            waiting: AtomicUsize::new(0),
            completed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Runs `query` on a blocking thread once it has a turn.
    pub async fn run<T, F>(&self, query: F) -> Result<T, ApiError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let turn = match self.turns.clone().try_acquire_owned() {
            Ok(turn) => turn,
            Err(_) => self.wait_for_turn().await?,
        };
        let crew = Crew::default();
        let watched = crew.clone();
        let watcher = tokio::spawn(async move {
            let mut tick = tokio::time::interval(WATCH_EVERY);
            while watched.cpu() < QUERY_GRACE {
                tick.tick().await;
            }
            watched.demote();
        });
        let result = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let _member = crew.join();
            query()
        })
        .await;
        watcher.abort();
        self.completed.fetch_add(1, Ordering::Relaxed);
        result.map_err(|e| ApiError::Failed(format!("query failed: {e}")))
    }

    async fn wait_for_turn(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let waiting = self.waiting.fetch_add(1, Ordering::Relaxed) + 1;
        let _waiting = Waiting(&self.waiting);
        if waiting > self.max_waiting {
            return Err(self.refuse(format!(
                "{} queries are running and {} waiting: retry later",
                self.max_running, self.max_waiting
            )));
        }
        match tokio::time::timeout(self.max_wait, self.turns.clone().acquire_owned()).await {
            Ok(Ok(turn)) => Ok(turn),
            // Ok(Err(_)) cannot happen: the semaphore is never closed.
            Ok(Err(_)) | Err(_) => Err(self.refuse(format!(
                "no turn within {} s: {} queries were running: retry later",
                self.max_wait.as_secs_f64(),
                self.max_running
            ))),
        }
    }

    fn refuse(&self, message: String) -> ApiError {
        self.refused.fetch_add(1, Ordering::Relaxed);
        ApiError::Busy(message)
    }

    /// Counters and gauges now.
    pub fn stats(&self) -> QueryStats {
        let running = self.max_running - self.turns.available_permits();
        QueryStats {
            running,
            waiting: self.waiting.load(Ordering::Relaxed),
            max_running: self.max_running,
            max_waiting: self.max_waiting,
            completed: self.completed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::priority::crew::QUERY_NICE;

    /// Starts a query that holds its turn until the sender is used.
    async fn hold(queries: &Arc<Queries>) -> (mpsc::Sender<()>, tokio::task::JoinHandle<bool>) {
        let (release, held) = mpsc::channel::<()>();
        let queries2 = queries.clone();
        let task =
            tokio::spawn(async move { queries2.run(move || held.recv().is_ok()).await.unwrap() });
        while queries.stats().running == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (release, task)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_the_waiting_bound_queries_are_refused_at_once() {
        let queries = Arc::new(Queries::new(1, 1, Duration::from_secs(600)));
        let (release, first) = hold(&queries).await;
        let waiter = {
            let queries = queries.clone();
            tokio::spawn(async move { queries.run(|| 7).await })
        };
        while queries.stats().waiting == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let refused = queries.run(|| ()).await;
        assert!(
            matches!(refused, Err(ApiError::Busy(ref m)) if m.contains("1 waiting")),
            "{refused:?}"
        );
        release.send(()).unwrap();
        assert!(first.await.unwrap());
        assert_eq!(waiter.await.unwrap().unwrap(), 7, "the waiter ran after");
        let stats = queries.stats();
        assert_eq!(
            (stats.refused, stats.completed, stats.running, stats.waiting),
            (1, 2, 0, 0)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_query_waits_at_most_max_wait() {
        let queries = Arc::new(Queries::new(1, 4, Duration::from_millis(50)));
        let (release, first) = hold(&queries).await;
        let late = queries.run(|| ()).await;
        assert!(
            matches!(late, Err(ApiError::Busy(ref m)) if m.contains("no turn")),
            "{late:?}"
        );
        release.send(()).unwrap();
        assert!(first.await.unwrap());
        assert_eq!(queries.run(|| 1).await.unwrap(), 1, "turns are given back");
    }

    fn own_nice() -> libc::c_int {
        // SAFETY: getpriority has no preconditions.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    fn own_cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is written.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cheap_query_runs_at_the_workloads_nice_a_heavy_one_yields() {
        let queries = Queries::default();
        let cheap = queries.run(own_nice).await.unwrap();
        assert!(cheap < QUERY_NICE, "a cheap query is not niced: {cheap}");
        // A query spinning (and a worker it starts) until demoted, or for
        // 20 times the grace.
        let (nice, spent, worker) = queries
            .run(|| {
                let crew = Crew::current().expect("a query computes in a crew");
                while own_nice() < QUERY_NICE && own_cpu() < QUERY_GRACE * 20 {
                    std::hint::black_box((0..1000u64).sum::<u64>());
                }
                let worker = std::thread::spawn(move || {
                    let _member = crew.join();
                    own_nice()
                });
                (own_nice(), own_cpu(), worker.join().unwrap())
            })
            .await
            .unwrap();
        assert!(nice >= QUERY_NICE, "demoted: nice {nice} after {spent:?}");
        assert!(spent >= QUERY_GRACE, "not before its grace: {spent:?}");
        assert!(worker >= QUERY_NICE, "a worker joins demoted: {worker}");
        // The pool's thread got its nice back.
        let after = queries.run(own_nice).await.unwrap();
        assert!(after < QUERY_NICE, "the next query starts afresh: {after}");
    }
}
