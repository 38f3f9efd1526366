//! The thread that keeps the process table current: it reads lifecycle
//! events from the BPF ring buffer as they come, reads the maps of newly
//! exec'd processes once they have settled, and expires ended images. It
//! is the only place events flow into the table, so the drain and the
//! symbolizer never wait for it.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
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

/// Starts the reader thread; it ends soon after `stop` is set.
/// `on_new_jvm` is called with each process as soon as it maps libjvm.
pub fn spawn_reader(
    mut ring: RingBuf<MapData>,
    table: Arc<ProcessTable>,
    stop: Arc<AtomicBool>,
    on_new_jvm: impl Fn(u32) + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    thread::Builder::new()
        .name("ws-procs".into())
        .spawn(move || {
            // The reader is a subscriber too: JVMs are prepared by the
            // callback as soon as the table finds them.
            let mut changes = table.subscribe();
            let mut last_expire = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                let wait = table
                    .next_due()
                    .map_or(TICK, |at| at.saturating_duration_since(now).min(TICK));
                wait_readable(&ring, wait);
                for _ in 0..EVENTS_PER_ROUND {
                    let Some(item) = ring.next() else { break };
                    if let Some(event) = ProcEvent::from_bytes(&item) {
                        table.apply(&event, Instant::now());
                    }
                }
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
fn wait_readable(ring: &RingBuf<MapData>, timeout: Duration) {
    let mut fd = libc::pollfd {
        fd: ring.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack; the fd outlives the call.
    unsafe { libc::poll(&mut fd, 1, timeout.as_millis().max(1) as i32) };
}
