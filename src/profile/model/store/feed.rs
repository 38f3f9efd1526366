//! Sealed slices on their way to the disk history: encoded self-contained
//! (see [`crate::profile::model::block::encode_standalone`]) on a thread
//! of their own, so that neither the drain nor the store's push pays for
//! the encoding or the write. A queue of a few slices; past it a slice is
//! dropped and counted, never waited for.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        mpsc::{self, SyncSender, TrySendError},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use crate::profile::{
    history::{BlockMeta, History},
    model::{block, Slice},
};

/// Slices waiting to be encoded (each about a second of the host).
const QUEUE_SLICES: usize = 8;

/// The sending end, held by the store.
pub struct Feed {
    tx: SyncSender<Slice>,
    history: Arc<History>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    done: AtomicU64,
    dropped: AtomicU64,
}

impl Feed {
    /// Starts the encoding thread (`ws-history-enc`) feeding `history`.
    pub fn start(history: Arc<History>) -> std::io::Result<Feed> {
        let (tx, rx) = mpsc::sync_channel::<Slice>(QUEUE_SLICES);
        let counts = Arc::new(Counts::default());
        let (to, done) = (history.clone(), counts.clone());
        thread::Builder::new()
            .name("ws-history-enc".into())
            .spawn(move || {
                for slice in rx {
                    let meta = BlockMeta {
                        start: slice.start,
                        end: slice.end,
                        step_s: 1,
                    };
                    to.submit(meta, block::encode_standalone(&slice));
                    done.done.fetch_add(1, Relaxed);
                }
            })?;
        Ok(Feed {
            tx,
            history,
            counts,
        })
    }

    /// Queues `slice` for the disk; dropped (counted) when the queue is full.
    pub fn send(&self, slice: Slice) {
        match self.tx.try_send(slice) {
            Ok(()) => {
                self.counts.sent.fetch_add(1, Relaxed);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// Slices dropped because the encoder was behind.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Relaxed)
    }

    /// Waits, at most `timeout`, until every slice sent is encoded and
    /// written (see [`History::flush`]): at shutdown, so that a restart
    /// reads back the seconds before it.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let sent = self.counts.sent.load(Relaxed);
        while self.counts.done.load(Relaxed) < sent {
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(5));
        }
        self.history
            .flush(deadline.saturating_duration_since(Instant::now()))
    }

    /// The history it feeds.
    pub fn history(&self) -> &Arc<History> {
        &self.history
    }
}
