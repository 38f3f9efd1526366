//! The thread that keeps the process table current: it reads lifecycle
//! events from the BPF ring buffer as they come, reads the maps of newly
//! exec'd processes once they have settled, and expires ended images.
//!
//! Events flow into the table only through [`ProcEvents`]: this thread
//! reads it as events come, and the symbolizer catches up on it before
//! each batch. The kernel writes a fork's event before the child first
//! runs, so once the ring is read after a drain, every process with
//! records in that drain is in the table with its parent and cgroups,
//! even one that lived and was reaped between two reads of this thread.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, RawFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};

use super::{ChangeKind, ProcessTable};
use crate::bpf::abi::ProcEvent;

/// Longest the thread sleeps: it checks `stop` and expires images this often.
const TICK: Duration = Duration::from_millis(100);
/// Events handled between two looks at the scheduled reads, so that a
/// storm of forks does not hold back the reads of exec'd processes.
const EVENTS_PER_ROUND: usize = 1024;

/// The lifecycle event ring and the table its events go into.
#[derive(Clone)]
pub struct ProcEvents {
    ring: Arc<Mutex<RingBuf<MapData>>>,
    fd: RawFd,
    table: Arc<ProcessTable>,
}

impl ProcEvents {
    pub fn new(ring: RingBuf<MapData>, table: Arc<ProcessTable>) -> Self {
        let fd = ring.as_fd().as_raw_fd();
        ProcEvents {
            ring: Arc::new(Mutex::new(ring)),
            fd,
            table,
        }
    }

    /// Applies up to [`EVENTS_PER_ROUND`] waiting events; how many.
    pub fn catch_up(&self) -> usize {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut applied = 0;
        while applied < EVENTS_PER_ROUND {
            let Some(item) = ring.next() else { break };
            if let Some(event) = ProcEvent::from_bytes(&item) {
                self.table.apply(&event, Instant::now());
            }
            applied += 1;
        }
        applied
    }

    /// Applies every event written so far (a bounded number of rounds:
    /// a fork storm cannot hold the caller for long).
    pub fn catch_up_all(&self) {
        for _ in 0..8 {
            if self.catch_up() < EVENTS_PER_ROUND {
                break;
            }
        }
    }
}

/// Starts the reader thread; it ends soon after `stop` is set.
/// `on_new_jvm` is called with each process as soon as it maps libjvm.
pub fn spawn_reader(
    events: ProcEvents,
    stop: Arc<AtomicBool>,
    on_new_jvm: impl Fn(u32) + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    thread::Builder::new()
        .name("ws-procs".into())
        .spawn(move || {
            // The reader is a subscriber too: JVMs are prepared by the
            // callback as soon as the table finds them.
            let table = events.table.clone();
            let mut changes = table.subscribe();
            let mut last_expire = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                let wait = table
                    .next_due()
                    .map_or(TICK, |at| at.saturating_duration_since(now).min(TICK));
                wait_readable(events.fd, wait);
                events.catch_up();
                for (pid, start) in table.due_reads(Instant::now()) {
                    table.read_maps(pid, start);
                }
                let due = changes.poll(Instant::now());
                for change in due.changes {
                    if change.kind == ChangeKind::JvmFound {
                        on_new_jvm(change.key.pid);
                    }
                }
                if last_expire.elapsed() >= Duration::from_secs(1) {
                    last_expire = Instant::now();
                    table.expire(last_expire);
                }
            }
        })
}

/// Waits until the ring buffer has data or `timeout` passes.
fn wait_readable(fd: RawFd, timeout: Duration) {
    let mut fd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack; the fd is the ring's, which
    // `ProcEvents` keeps open as long as the reader runs.
    unsafe { libc::poll(&mut fd, 1, timeout.as_millis().max(1) as i32) };
}
