//! Wires the stages together on the daemon's threads.
//!
//! # Threads, channels and the two back-flows
//!
//! ```text
//! BPF counts maps -drain-> ws-collect -batches-> ws-symbolize -slices-> Shared.store
//!                              |                  |    ^    ^
//!                              | pids             |    |    +-- ProcessTable <-- ws-procs
//!                              v                  |    |              (BPF lifecycle ring)
//! BPF unwind maps <-tables- ws-unwind             |    +-- Jvms <-- ws-jvm
//!        (back-flow 1)                            |                   ^   (back-flow 2)
//!                                                 +--- sightings -----+
//! ```
//!
//! - `ws-collect`: drains the BPF maps every interval, raised above the
//!   other threads ([`raise`]). Sends each batch to `ws-symbolize` on a
//!   bounded channel of [`BATCH_QUEUE`] (when full it keeps the batch and
//!   merges the next drains into it, up to [`max_batch_bytes`])
//!   and each drain's pids to `ws-unwind` (a channel of 1; skipped while
//!   busy). Its health updates never wait for the lock (`Updates`).
//! - `ws-symbolize`: names the frames (reading the [`ProcessTable`] and
//!   [`Jvms`]), pushes the slice into [`Shared::store`] and updates
//!   [`Shared::health`].
//! - `ws-procs` (`process::spawn_reader`, when the kernel has the
//!   lifecycle ring buffer): applies fork/exec/exit events to the
//!   [`ProcessTable`], reads new images' maps and prepares new JVMs
//!   (`jvm::flags::prepare`, on the table's `JvmFound`). The table
//!   publishes its changes (`New`, `Exec`, `Exit`, `JvmFound`) on a bounded
//!   queue per subscriber, never blocking: `ws-procs` itself, `ws-unwind`,
//!   `ws-jvm`, `ws-symbolize` (JIT and Java caches) and `ws-push-build`
//!   (service names) read theirs when they next run, and forget a process
//!   by the one rule of `process::Subscription`.
//! - `ws-unwind` (with unwind tables): builds tables for the pids it is
//!   handed and writes them into the BPF unwind maps. **Back-flow 1**:
//!   user space feeds what the kernel's next stack walks read.
//! - `ws-jvm` (`jvm::agent`): takes JVM sightings from `ws-symbolize`
//!   (bounded, `try_send`: dropped and counted when full), attaches, and
//!   writes thread names and attach status into [`Jvms`], which
//!   `ws-symbolize` reads on its next batch. **Back-flow 2**: the
//!   symbolizer asks, the agent answers a batch later. Each attach runs on
//!   a short-lived `ws-jvm-attach` thread, ended by the attach time-outs.
//! - `ws-push-build`, `ws-push-sendN` and `ws-otlp-sendN` (`export::push`,
//!   `--push-url`, `--otlp-url`): started and stopped by `main`; they read
//!   [`Shared`] and hand requests over through each sink's outbox.
//! - The HTTP runtime (tokio, `main`): serves `api` from [`Shared`];
//!   queries run on its blocking pool, bounded by `api::limit`.
//!
//! [`Pipeline::stop`] sets `stop`: `ws-collect` drains twice more and
//! returns, which closes the batch and pid channels, so `ws-symbolize` and
//! `ws-unwind` end after their last item; the symbolizer's end closes the
//! sightings channel, which ends `ws-jvm`; `ws-procs` watches `stop`. All
//! five are joined.
//!
//! [`Jvms`]: crate::jvm::Jvms

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::{
    bpf::{self, LoadError, ProbeOptions},
    budget,
    collect::{Drainer, RawBatch},
    held::{self, Holder},
    jvm::{agent, agent::JvmMode, JvmFrames},
    priority::raise,
    process::{self, ProcessTable},
    profile::store::Store,
    python::registry::{PythonThreads, Pythons},
    state::{Health, Shared},
    symbolize::{JvmLink, Symbolizer},
    unwind::registry::Registry,
};

/// Why the pipeline could not start.
#[derive(Debug, Error)]
pub enum PipelineError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("starting the {name} thread: {source}")]
    Thread {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// How the pipeline runs.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    pub probes: ProbeOptions,
    /// Time between two drains.
    pub drain_interval: Duration,
    /// History kept in the store.
    pub retention: Duration,
    /// Bound of the store's estimated size; past it the oldest slices go.
    pub store_max_bytes: usize,
    /// Where to keep history on disk too (`--history-dir`), and its bound.
    pub history: Option<crate::profile::history::HistoryConfig>,
    /// Whether to attach to JVMs.
    pub jvm: JvmMode,
    /// Where Java frames come from.
    pub jvm_frames: JvmFrames,
    /// Whether to read Python interpreters' frames and thread names.
    pub python: bool,
}

/// CPU time of the calling thread so far, in µs (0 if it cannot be read).
fn thread_cpu_us() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    if !ok {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000
}

/// Drained batches waiting for the symbolizer; a drain that finds the
/// queue full keeps its batch and merges the next drains into it, rows
/// summed by key, rather than holding BPF data back or growing without
/// bound.
pub const BATCH_QUEUE: usize = 1;
/// Bytes the drained batches may hold together (by their estimate, which
/// errs high): the budget's `batches` part, shared by the batch queued for
/// the symbolizer, the one it symbolizes and the one waiting in the
/// collector, a third each.
pub fn max_batch_bytes() -> u64 {
    budget::bytes(budget::Part::Batches) as u64
}

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

/// Drains the duration percentiles are taken over (10 minutes).
pub const DRAIN_WINDOW: usize = 600;
/// Longest [`Pipeline::stop`] waits for the last drain and symbolization.
pub const STOP_TIMEOUT: Duration = Duration::from_millis(800);

/// A running pipeline. [`Pipeline::stop`] drains what is left.
pub struct Pipeline {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    /// Every thread the pipeline started, joined by [`Pipeline::stop`].
    threads: Vec<JoinHandle<()>>,
    /// Detaches the programs when dropped (at [`Pipeline::stop`]; the
    /// drainer holds the maps it reads).
    _probes: bpf::Probes,
}

/// At most this long to write what is queued for the disk history at stop.
const HISTORY_FLUSH: Duration = Duration::from_secs(2);

/// The disk history `config` names, opened, and the thread encoding for it.
fn history_feed(
    config: crate::profile::history::HistoryConfig,
) -> Result<crate::profile::store::feed::Feed, String> {
    let history = crate::profile::history::History::open(config).map_err(|e| e.to_string())?;
    crate::profile::store::feed::Feed::start(history).map_err(|e| e.to_string())
}

impl Pipeline {
    /// Loads and attaches the programs and starts draining.
    pub fn start(opts: &PipelineOptions) -> Result<Pipeline, PipelineError> {
        // `--jvm=off` reads no JVM memory either: perf maps only.
        let jvm_frames = match opts.jvm {
            JvmMode::Off => JvmFrames::PerfMap,
            JvmMode::Auto => opts.jvm_frames,
        };
        let (probes, mut maps) = bpf::load(&opts.probes)?;
        let store = Store::new(opts.retention).with_max_bytes(opts.store_max_bytes);
        let store = match opts.history.clone().map(history_feed).transpose() {
            Ok(Some(feed)) => store.with_history(feed),
            Ok(None) => store,
            Err(reason) => {
                tracing::warn!("no disk history ({reason}): history is kept in memory only");
                store.without_history(reason)
            }
        };
        let shared = Shared::new(store, probes.attached.clone());
        let table = shared.processes.clone();
        // Python interpreters, found by the registry, named by the symbolizer.
        let pythons = Pythons::default();
        let registry = maps
            .unwind
            .take()
            .filter(|_| opts.probes.unwind_tables)
            .map(|mut unwind| {
                let py_threads = unwind.py_threads.take();
                let mut r = Registry::new(unwind, table.clone());
                if jvm_frames == JvmFrames::Full {
                    r.java = Some(Box::new(crate::jvm::walk_code::code_for_walks));
                }
                if let Some(map) = py_threads.filter(|_| opts.python) {
                    r = r.with_python(Box::new(PythonThreads::new(
                        map,
                        pythons.clone(),
                        table.clone(),
                    )));
                }
                r
            });
        if jvm_frames == JvmFrames::Full {
            // The one write into other processes; see `jvm::flags`.
            shared.jvms.allow_flag_writes();
        }
        shared.health().engine = Some(probes.engine.clone());
        if let Some(trace) = maps.trace.take() {
            let _ = shared
                .trace
                .set(Arc::new(crate::trace::Recorder::new(trace)));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::sync_channel::<RawBatch>(BATCH_QUEUE);
        let mut threads = Vec::new();
        if let Some(ring) = maps.proc_events.take() {
            let jvms = shared.jvms.clone();
            let procs = process::spawn_reader(ring, table.clone(), stop.clone(), move |pid| {
                crate::jvm::flags::prepare(pid, &jvms);
            })
            .map_err(|source| PipelineError::Thread {
                name: "process table",
                source,
            })?;
            threads.push(procs);
        }
        let unwind = match registry {
            Some(registry) => {
                let (pids, thread) = spawn_unwind(registry, shared.clone()).map_err(|source| {
                    PipelineError::Thread {
                        name: "unwind",
                        source,
                    }
                })?;
                threads.push(thread);
                Some(pids)
            }
            None => None,
        };

        let collector = {
            let (stop, shared, interval) = (stop.clone(), shared.clone(), opts.drain_interval);
            let mut drainer = Drainer::new(maps, probes.recording_since);
            thread::Builder::new()
                .name("ws-collect".into())
                .spawn(move || collect_loop(&mut drainer, unwind, &tx, &stop, &shared, interval))
                .map_err(|source| PipelineError::Thread {
                    name: "collector",
                    source,
                })?
        };
        threads.push(collector);
        let (sightings, agent) =
            agent::spawn(shared.jvms.clone(), opts.jvm, &table).map_err(|source| {
                PipelineError::Thread {
                    name: "JVM agent",
                    source,
                }
            })?;
        threads.push(agent);
        let link = JvmLink {
            jvms: shared.jvms.clone(),
            sightings,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        let symbolizer = {
            let shared = shared.clone();
            thread::Builder::new()
                .name("ws-symbolize".into())
                .spawn(move || symbolize_loop(&rx, &shared, table, link, jvm_frames, pythons))
                .map_err(|source| PipelineError::Thread {
                    name: "symbolizer",
                    source,
                })?
        };
        threads.push(symbolizer);
        Ok(Pipeline {
            shared,
            stop,
            threads,
            _probes: probes,
        })
    }

    /// The state the API serves from.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Stops sampling after a last drain of both buffers and waits until
    /// everything is in the store, for at most [`STOP_TIMEOUT`].
    pub fn stop(self) -> bool {
        self.stop_within(STOP_TIMEOUT)
    }

    /// Like [`Pipeline::stop`], waiting at most `timeout` for the threads;
    /// the programs are detached either way. False when a thread was still
    /// busy (its last batch is then lost; the threads end with the process).
    pub fn stop_within(self, timeout: Duration) -> bool {
        let started = Instant::now();
        self.stop.store(true, Ordering::SeqCst);
        // Detached meanwhile, not after: on a busy host closing the links
        // took up to a second (the kernel waits for RCU grace periods), and
        // the last drains read maps the drainer holds, not the programs.
        let probes = self._probes;
        let detach = thread::Builder::new()
            .name("ws-detach".into())
            .spawn(move || drop(probes));
        let deadline = started + timeout;
        let done = |threads: &[JoinHandle<()>]| threads.iter().all(|t| t.is_finished());
        while !done(&self.threads) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        let finished = done(&self.threads);
        if finished {
            for t in self.threads {
                let _ = t.join();
            }
        } else {
            tracing::warn!("pipeline threads still busy after {timeout:?}: not waiting for them");
        }
        let drained = started.elapsed();
        // The last seconds reach the disk history: a restart reads them.
        let store = self.shared.store.read().unwrap_or_else(|e| e.into_inner());
        if !store.flush_history(HISTORY_FLUSH) {
            tracing::warn!("the disk history was not written within {HISTORY_FLUSH:?}: its newest seconds may be lost");
        }
        drop(store);
        // A failed spawn dropped the probes in place.
        if let Ok(detach) = detach {
            let _ = detach.join();
        }
        tracing::debug!(?drained, took = ?started.elapsed(), "pipeline stopped, programs detached");
        finished
    }
}

/// Runs unwind registration on a thread of its own: building a table for
/// a new library takes tens of milliseconds, which neither the drain nor
/// the symbolizer should wait for. It is handed the pids of each drain;
/// while it is busy, newer drains' pids are skipped (they come again).
fn spawn_unwind(
    mut registry: Registry,
    shared: Arc<Shared>,
) -> std::io::Result<(mpsc::SyncSender<Vec<u32>>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::sync_channel::<Vec<u32>>(1);
    let thread = thread::Builder::new()
        .name("ws-unwind".into())
        .spawn(move || {
            for pids in rx {
                registry.update(pids);
                shared.health().unwind = registry.stats();
            }
        })?;
    Ok((tx, thread))
}

fn collect_loop(
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

fn symbolize_loop(
    rx: &mpsc::Receiver<RawBatch>,
    shared: &Shared,
    table: Arc<ProcessTable>,
    link: JvmLink,
    jvm_frames: JvmFrames,
    pythons: Pythons,
) {
    raise::worker(raise::SYMBOLIZE_NICE);
    let dropped = link.dropped.clone();
    let mut symbolizer =
        Symbolizer::with_jvms(table.clone(), link, jvm_frames).with_pythons(pythons);
    for batch in rx {
        let bytes = batch.estimated_bytes();
        let started = Instant::now();
        let cpu_started = thread_cpu_us();
        let named = symbolizer.symbolize(batch);
        held::change(Holder::Batches, bytes, false);
        let mut store = shared.store.write().unwrap_or_else(|e| e.into_inner());
        store.set_live(named.live);
        store.push(named.slice);
        drop(store);
        let (name_bytes, elf_files) = symbolizer.held();
        // Read before the health lock: the table's own lock may be held a
        // while (10,000 new threads), and `/healthz` waits for this one.
        let processes = table.stats();
        let mut h = shared.health();
        h.last_symbolize_us = started.elapsed().as_micros() as u64;
        h.symbolize_us_total += h.last_symbolize_us;
        h.symbolized_batches += 1;
        h.last_symbolize_cpu_us = thread_cpu_us().saturating_sub(cpu_started);
        h.symbolize_cpu_us_total += h.last_symbolize_cpu_us;
        h.jvm_sightings_dropped = dropped.load(Ordering::Relaxed);
        h.frame_name_bytes = name_bytes as u64;
        h.elf_files_open = elf_files as u64;
        h.frame_cache = symbolizer.cache_stats();
        h.processes = processes;
        drop(h);
    }
}
