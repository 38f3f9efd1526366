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
//! - `ws-symbolize`: names the frames (reading the [`ProcessTable`], and
//!   through the runtimes' naming halves, `crate::runtime`, the JVMs'
//!   memory, [`Jvms`] and Python's interpreters), pushes the slice into
//!   [`Shared::store`] and updates [`Shared::health`]. The runtimes are
//!   one set shared with `ws-unwind`, which calls their walk halves; each
//!   half's state is locked by its own thread only.
//! - `ws-procs` (`process::spawn_reader`, when the kernel has the
//!   lifecycle ring buffer): applies fork/exec/exit events to the
//!   [`ProcessTable`], reads new images' maps and prepares new JVMs
//!   (`jvm::flags::prepare`, on the table's `JvmFound`). The table
//!   publishes its changes (`New`, `Exec`, `Exit`, `JvmFound`) on a bounded
//!   queue per subscriber, never blocking: `ws-procs` itself, `ws-unwind`,
//!   `ws-jvm`, `ws-symbolize` (the runtimes' caches) and `ws-push-build`
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
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Mutex,
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
    otelctx::{OtelContexts, OtelProcsSink},
    priority::raise,
    process::{self, ProcessTable},
    profile::model::store::Store,
    python::registry::{PythonThreads, Pythons},
    runtime::Runtimes,
    runtimes::RuntimeOptions,
    state::Shared,
    symbolize::Symbolizer,
    unwind::registry::Registry,
};

mod collector;
use collector::collect_loop;

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
) -> Result<crate::profile::model::store::feed::Feed, String> {
    let history = crate::profile::history::History::open(config).map_err(|e| e.to_string())?;
    crate::profile::model::store::feed::Feed::start(history).map_err(|e| e.to_string())
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
        let store = Store::new(opts.retention)
            .with_max_bytes(opts.store_max_bytes)
            .with_span_bytes(budget::bytes(budget::Part::Spans));
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
        let mut threads = Vec::new();
        let (sightings, agent) =
            agent::spawn(shared.jvms.clone(), opts.jvm, &table).map_err(|source| {
                PipelineError::Thread {
                    name: "JVM agent",
                    source,
                }
            })?;
        threads.push(agent);
        let sightings_dropped = Arc::new(AtomicU64::new(0));
        let mut unwind = maps.unwind.take().filter(|_| opts.probes.unwind_tables);
        // Python interpreters, found by the walk half, named by the naming
        // half of the Python runtime.
        let pythons = Pythons::default();
        let python_walk = unwind
            .as_mut()
            .and_then(|u| u.py_threads.take())
            .filter(|_| opts.python)
            .map(|map| PythonThreads::new(map, pythons.clone(), table.clone()));
        // OpenTelemetry thread contexts: found by discovery (a runtime),
        // read by the programs of the processes it registers.
        let otel = maps
            .otel_procs
            .take()
            .filter(|_| unwind.is_some())
            .map(|procs| OtelContexts::new(Arc::new(BpfOtelProcs(Mutex::new(procs)))));
        let runtimes = crate::runtimes::build(
            &table,
            RuntimeOptions {
                jvm_frames,
                jvms: shared.jvms.clone(),
                jvm_link: Some(crate::jvm::runtime::JvmLink {
                    sightings,
                    dropped: sightings_dropped.clone(),
                }),
                pythons,
                python_walk,
                otel: otel.clone(),
            },
        );
        let registry =
            unwind.map(|u| Registry::new(u, table.clone()).with_runtimes(runtimes.clone()));
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
        let proc_events = maps
            .proc_events
            .take()
            .map(|ring| process::ProcEvents::new(ring, table.clone()));
        if let Some(events) = proc_events.clone() {
            let jvms = shared.jvms.clone();
            let procs = process::spawn_reader(events, stop.clone(), move |pid| {
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
        let symbolizer = {
            let shared = shared.clone();
            thread::Builder::new()
                .name("ws-symbolize".into())
                .spawn(move || {
                    let sources = Sources {
                        table,
                        proc_events,
                        runtimes,
                        otel,
                    };
                    symbolize_loop(&rx, &shared, sources, sightings_dropped)
                })
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
/// What the symbolizer names a batch's records from.
struct Sources {
    table: Arc<ProcessTable>,
    /// Caught up on before each batch: its processes' forks are applied.
    proc_events: Option<process::ProcEvents>,
    runtimes: Runtimes,
    /// The processes' OpenTelemetry contexts: their records' key names.
    otel: Option<Arc<OtelContexts>>,
}

fn symbolize_loop(
    rx: &mpsc::Receiver<RawBatch>,
    shared: &Shared,
    sources: Sources,
    dropped: Arc<AtomicU64>,
) {
    raise::worker(raise::SYMBOLIZE_NICE);
    let Sources {
        table,
        proc_events,
        runtimes,
        otel,
    } = sources;
    let mut symbolizer = Symbolizer::with_runtimes(table.clone(), runtimes);
    if let Some(otel) = &otel {
        symbolizer.set_span_key_names(otel.clone());
    }
    for batch in rx {
        if let Some(events) = &proc_events {
            events.catch_up_all();
        }
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
        if let Some(otel) = &otel {
            h.otel = otel.stats();
        }
        drop(h);
    }
}

/// The BPF map of the processes whose thread context is read, as the
/// discovery's sink. A write that fails (the map full) leaves the process
/// without spans; discovery counts what it registered.
struct BpfOtelProcs(Mutex<bpf::otel::OtelProcs>);

impl OtelProcsSink for BpfOtelProcs {
    fn set(&self, pid: u32, access: bpf::otel::OtelTls) {
        let mut procs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = procs.set(pid, access) {
            tracing::debug!(pid, "otel_procs: {e}");
        }
    }

    fn remove(&self, pid: u32) {
        let mut procs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        procs.remove(pid);
    }
}
