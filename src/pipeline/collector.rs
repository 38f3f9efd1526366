//! The collector thread (`ws-collect`): drains BPF every interval at a
//! raised priority, hands batches to the symbolizer (merging drains while
//! it is busy) and pids to the unwind registry, and keeps the drain
//! figures of `/healthz` without ever waiting for its lock.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    collect::{Drainer, RawBatch},
    held::{self, Holder},
    priority::raise,
    state::{Health, Shared},
};

use super::{max_batch_bytes, DRAIN_WINDOW};

/// Keeps `batch` within `max` bytes ([`RawBatch::fit_within`]), counting
/// what that cost. False if dropped.
fn fit(batch: &mut RawBatch, max: u64, updates: &mut Updates) -> bool {
    let fit = batch.fit_within(max);
    if fit.stripped {
        updates.push(move |h| {
            h.batches_stripped += 1;
            h.batch_processes_folded += fit.folded;
            h.rows_dropped += fit.rows_dropped;
            h.batches_dropped += u64::from(fit.dropped);
        });
    }
    if fit.dropped {
        tracing::warn!("drained batch past its bound even with only its totals: dropped");
    }
    !fit.dropped
}

pub(super) fn collect_loop(
    drainer: &mut Drainer,
    unwind: Option<mpsc::SyncSender<Vec<u32>>>,
    tx: &mpsc::SyncSender<RawBatch>,
    stop: &AtomicBool,
    shared: &Shared,
    interval: Duration,
) {
    let mut applied = raise::collector();
    tracing::info!("drain priority: {}", applied.label());
    let mut updates = Updates::default();
    let label = applied.label();
    updates.push(move |h| h.drain_priority = label);
    let max_bytes = max_batch_bytes();
    held::set(Holder::Batches, 0, Some(max_bytes));
    let mut next = Instant::now() + interval;
    // A drained batch the symbolizer had no room for yet.
    let mut waiting: Option<RawBatch> = None;
    let mut window = DrainWindow::default();
    loop {
        while Instant::now() < next && !stop.load(Ordering::SeqCst) {
            thread::sleep((next - Instant::now()).min(Duration::from_millis(20)));
        }
        // After a stall (a slow drain, tables built for a new binary), the
        // rhythm restarts from now: draining back to back to make up for
        // missed ticks would only overflow the symbolizer's queue and drop
        // the batches that hold the data.
        next = (next + interval).max(Instant::now() + interval / 2);
        let stopping = stop.load(Ordering::SeqCst);
        // On stop, drain twice: the second pass empties the buffer that was
        // active during the first.
        for _ in 0..if stopping { 2 } else { 1 } {
            let started = Instant::now();
            match drainer.drain() {
                Ok(batch) => {
                    window.record(&mut updates, &batch, started);
                    let costs = drainer.walk_costs();
                    let (rows, by_kind) = (costs.rows(), costs.by_kind());
                    updates.push(move |h| {
                        h.walk_cost = rows;
                        h.walk_cost_by_kind = by_kind;
                    });
                    raise::keep(&mut applied, window.drains);
                    let label = applied.label();
                    updates.push(move |h| h.drain_priority = label);
                    let mut pids: Vec<u32> = batch.records.iter().map(|r| r.pid).collect();
                    pids.sort_unstable();
                    pids.dedup();
                    let mut batch = match waiting.take() {
                        Some(mut earlier) => {
                            held::change(Holder::Batches, earlier.estimated_bytes(), false);
                            earlier.absorb(batch);
                            earlier
                        }
                        None => batch,
                    };
                    // A third each for the batch queued, the one being
                    // symbolized and this one: the bound holds by
                    // construction, and a symbolizer stuck on a large
                    // batch never leaves this one no room at all (what
                    // the others left was 0 at a load of thousands, and
                    // every batch was dropped).
                    let room = max_bytes / 3;
                    let sent = if fit(&mut batch, room, &mut updates) {
                        let bytes = batch.estimated_bytes();
                        tx.try_send(batch).map(|()| bytes)
                    } else {
                        Ok(0)
                    };
                    match sent {
                        Ok(bytes) => held::change(Holder::Batches, bytes, true),
                        // The symbolizer is behind: keep the data, merged
                        // with the next drain's, within the bound.
                        Err(mpsc::TrySendError::Full(batch)) => {
                            updates.push(|h| h.batches_merged += 1);
                            held::change(Holder::Batches, batch.estimated_bytes(), true);
                            waiting = Some(batch);
                        }
                        Err(mpsc::TrySendError::Disconnected(_)) => return,
                    }
                    // Not when stopping: tables for new processes would never
                    // be used.
                    if let Some(unwind) = unwind.as_ref().filter(|_| !stopping) {
                        if let Err(mpsc::TrySendError::Full(_)) = unwind.try_send(pids) {
                            updates.push(|h| h.unwind_updates_skipped += 1);
                        }
                    }
                }
                Err(err) => {
                    tracing::error!("drain failed: {err}");
                    updates.push(|h| h.drain_errors += 1);
                }
            }
        }
        updates.publish(shared, stopping);
        if stopping {
            if let Some(batch) = waiting.take() {
                let _ = tx.send(batch);
            }
            return;
        }
    }
}

/// Health updates of the collector, applied when the health lock is
/// free: the collector never waits for it, since a thread of lower
/// priority (the symbolizer, a `/healthz` request) may hold it while the
/// host keeps it off the CPU for seconds (priority inversion). Updates
/// are applied in order, so counters and latest values come out right.
#[derive(Default)]
struct Updates {
    queue: Vec<Update>,
}

/// One queued change to [`Health`].
type Update = Box<dyn FnOnce(&mut Health)>;

/// Updates past which the collector waits for the lock after all (each
/// drain queues a few; an hour's worth is far more than any stall).
const MAX_PENDING_UPDATES: usize = 4096;

impl Updates {
    fn push(&mut self, f: impl FnOnce(&mut Health) + 'static) {
        self.queue.push(Box::new(f));
    }

    /// Applies the queued updates if the lock is free (or `wait`, or too
    /// many are queued).
    fn publish(&mut self, shared: &Shared, wait: bool) {
        let mut health = match shared.health.try_lock() {
            Ok(h) => h,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                if !wait && self.queue.len() < MAX_PENDING_UPDATES {
                    return;
                }
                shared.health()
            }
        };
        for f in self.queue.drain(..) {
            f(&mut health);
        }
    }
}

/// The last [`DRAIN_WINDOW`] drains' durations and the gaps between them.
#[derive(Default)]
struct DrainWindow {
    drains: u64,
    durations: VecDeque<u64>,
    gaps: VecDeque<u64>,
    last_start: Option<Instant>,
}

/// The `q` quantile (0..=1) of `values`, nearest rank.
fn quantile(values: &VecDeque<u64>, q: f64) -> u64 {
    let mut sorted: Vec<u64> = values.iter().copied().collect();
    sorted.sort_unstable();
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or(0)
}

impl DrainWindow {
    fn record(&mut self, updates: &mut Updates, batch: &RawBatch, started: Instant) {
        let push = |q: &mut VecDeque<u64>, v: u64| {
            if q.len() == DRAIN_WINDOW {
                q.pop_front();
            }
            q.push_back(v);
        };
        self.drains += 1;
        let us = batch.drain_time.as_micros() as u64;
        push(&mut self.durations, us);
        let gap = self.last_start.map(|l| (started - l).as_micros() as u64);
        self.last_start = Some(started);
        if let Some(gap) = gap {
            push(&mut self.gaps, gap);
        }
        let (p50, p99) = (
            quantile(&self.durations, 0.5),
            quantile(&self.durations, 0.99),
        );
        let gap_p99 = quantile(&self.gaps, 0.99);
        let missing = batch.missing_stacks;
        updates.push(move |h| {
            h.drains += 1;
            h.last_drain_us = us;
            h.max_drain_us = h.max_drain_us.max(us);
            h.drain_us_p50 = p50;
            h.drain_us_p99 = p99;
            h.drain_gap_us_p99 = gap_p99;
            h.max_drain_gap_us = h.max_drain_gap_us.max(gap.unwrap_or(0));
            h.missing_stacks += missing;
        });
    }
}
