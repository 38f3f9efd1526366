//! The threads attach jobs run on: at most [`IN_FLIGHT`], started as jobs
//! first need them and kept for the agent's life, fed through a bounded
//! queue. The agent gives out turns ([`super::turns::Turns`]) so that no
//! more jobs run (or wait here) than there are workers; each job keeps
//! its own time-outs ([`super::jobs`]).
//!
//! A job's CPU time is charged to its JVM's user
//! ([`crate::budget::cpu`]).

use std::{
    sync::{mpsc, Arc, Mutex},
    thread,
};

use super::{
    attach::Target,
    jobs::{run_job, Done, Finished, Job},
    turns::IN_FLIGHT,
    Jvms,
};
use crate::budget::cpu;

/// One job for a worker.
pub struct Work {
    pub jvms: Arc<Jvms>,
    pub target: Target,
    pub uid: u32,
    pub job: Job,
}

/// Why a job was not handed to a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    #[error("no attach worker could be started: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("every attach worker is busy and the queue is full")]
    Full,
}

/// The workers and their queue. Dropping it ends them once the jobs
/// queued are done.
pub struct Workers {
    tx: mpsc::SyncSender<Work>,
    rx: Arc<Mutex<mpsc::Receiver<Work>>>,
    done: mpsc::Sender<Finished>,
    started: usize,
}

impl Workers {
    /// Workers that send each job's end to `done`.
    pub fn new(done: mpsc::Sender<Finished>) -> Workers {
        let (tx, rx) = mpsc::sync_channel(IN_FLIGHT);
        Workers {
            tx,
            rx: Arc::new(Mutex::new(rx)),
            done,
            started: 0,
        }
    }

    /// Worker threads started so far (they live as long as `self`).
    pub fn started(&self) -> usize {
        self.started
    }

    /// Queues `work`, `running` jobs being out now (this one included):
    /// a worker is started if fewer than that exist.
    pub fn submit(&mut self, work: Work, running: usize) -> Result<(), WorkError> {
        if self.started < running.min(IN_FLIGHT) {
            let (rx, done) = (self.rx.clone(), self.done.clone());
            let spawned = thread::Builder::new()
                .name("ws-jvm-attach".into())
                .spawn(move || work_on(&rx, &done));
            match spawned {
                Ok(_) => self.started += 1,
                // The ones there take it in turn.
                Err(err) if self.started == 0 => return Err(err.into()),
                Err(err) => tracing::warn!("cannot start another attach worker: {err}"),
            }
        }
        self.tx.try_send(work).map_err(|_| WorkError::Full)
    }
}

/// A worker: runs jobs until the queue's sender is gone.
fn work_on(rx: &Mutex<mpsc::Receiver<Work>>, done: &mpsc::Sender<Finished>) {
    loop {
        // The lock is held only while waiting for the next job.
        let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(w) = next else {
            return;
        };
        let unit = cpu::measure(w.uid);
        let run = || run_job(&w.jvms, w.target, w.uid, &w.job);
        // A job that panicked gives its turn back and the worker stays:
        // that JVM is not tried again.
        let finished =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
                tracing::warn!(pid = w.target.pid, "an attach job panicked");
                Finished {
                    pid: w.target.pid,
                    done: Done::Refused,
                    timed_out: false,
                    map: None,
                }
            });
        drop(unit);
        if done.send(finished).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn work(pid: u32) -> Work {
        Work {
            jvms: Arc::new(Jvms::default()),
            target: Target { pid, ns_pid: pid },
            uid: 0,
            job: Job {
                attach: Some(0),
                ..Job::default()
            },
        }
    }

    #[test]
    fn jobs_one_after_another_reuse_one_thread() {
        let (done_tx, done_rx) = mpsc::channel();
        let mut workers = Workers::new(done_tx);
        let me = std::process::id();
        let mut threads = Vec::new();
        for _ in 0..5 {
            workers.submit(work(me), 1).unwrap();
            // Not a JVM: refused at once, on the worker.
            let f = done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(f.pid, me);
            threads.push(workers.started());
        }
        assert_eq!(threads, [1; 5]);
    }

    #[test]
    fn at_most_in_flight_workers_however_many_jobs() {
        let (done_tx, done_rx) = mpsc::channel();
        let mut workers = Workers::new(done_tx);
        let me = std::process::id();
        for round in 0..3 {
            for running in 1..=IN_FLIGHT {
                workers.submit(work(me), running).unwrap();
            }
            for _ in 0..IN_FLIGHT {
                done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
            }
            assert_eq!(workers.started(), IN_FLIGHT, "round {round}");
        }
        // The queue holds no more than the workers can take.
        let (done_tx, _done_rx) = mpsc::channel();
        let mut idle = Workers::new(done_tx);
        idle.started = IN_FLIGHT; // none started: nothing takes the queue
        for _ in 0..IN_FLIGHT {
            idle.submit(work(me), IN_FLIGHT).unwrap();
        }
        assert!(matches!(
            idle.submit(work(me), IN_FLIGHT),
            Err(WorkError::Full)
        ));
    }

    #[test]
    fn dropping_the_workers_ends_their_threads() {
        let (done_tx, done_rx) = mpsc::channel();
        let mut workers = Workers::new(done_tx);
        workers.submit(work(std::process::id()), 1).unwrap();
        done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        drop(workers);
        // Every worker's sender of `done` goes with its thread.
        assert!(matches!(
            done_rx.recv_timeout(Duration::from_secs(30)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        ));
    }
}
