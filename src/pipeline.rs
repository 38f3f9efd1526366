//! Wires the stages together: BPF maps -> collector thread -> symbolizer
//! thread -> store. Data only moves forward, through a channel.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex, RwLock,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use serde::Serialize;
use thiserror::Error;

use crate::{
    bpf::{self, LoadError, ProbeOptions},
    collect::{Drainer, RawBatch},
    jvm::{agent, agent::JvmMode, Jvms},
    profile::store::Store,
    symbolize::{JvmLink, Symbolizer},
    unwind::registry::{Registry, UnwindStats},
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
    /// Whether to attach to JVMs.
    pub jvm: JvmMode,
}

/// Health of the daemon's own machinery.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Health {
    pub drains: u64,
    pub drain_errors: u64,
    pub last_drain_us: u64,
    pub max_drain_us: u64,
    pub last_symbolize_us: u64,
    /// Rows whose stack was gone from the stack map when read.
    pub missing_stacks: u64,
    /// Unwind tables: loaded, evicted, processes using them.
    pub unwind: UnwindStats,
}

/// State that the API reads.
pub struct Shared {
    pub store: RwLock<Store>,
    pub health: Mutex<Health>,
    pub started: Instant,
    /// Attached programs with their number of links.
    pub attached: Vec<(String, usize)>,
    /// The JVMs seen, their thread names and attach status.
    pub jvms: Arc<Jvms>,
}

impl Shared {
    /// Shared state around an existing store (also used by tests).
    pub fn new(store: Store, attached: Vec<(String, usize)>) -> Arc<Self> {
        Arc::new(Shared {
            store: RwLock::new(store),
            health: Mutex::new(Health::default()),
            started: Instant::now(),
            attached,
            jvms: Arc::new(Jvms::default()),
        })
    }
}

/// A running pipeline. [`Pipeline::stop`] drains what is left.
pub struct Pipeline {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    collector: JoinHandle<()>,
    symbolizer: JoinHandle<()>,
    /// Dropped last: detaches the programs.
    _probes: bpf::Probes,
}

impl Pipeline {
    /// Loads and attaches the programs and starts draining.
    pub fn start(opts: &PipelineOptions) -> Result<Pipeline, PipelineError> {
        let (probes, mut maps) = bpf::load(&opts.probes)?;
        let registry = maps
            .unwind
            .take()
            .filter(|_| opts.probes.unwind_tables)
            .map(Registry::new);
        let shared = Shared::new(Store::new(opts.retention), probes.attached.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<RawBatch>();

        let collector = {
            let (stop, shared, interval) = (stop.clone(), shared.clone(), opts.drain_interval);
            let mut drainer = Drainer::new(maps);
            let mut registry = registry;
            thread::Builder::new()
                .name("ws-collect".into())
                .spawn(move || {
                    collect_loop(
                        &mut drainer,
                        registry.as_mut(),
                        &tx,
                        &stop,
                        &shared,
                        interval,
                    )
                })
                .map_err(|source| PipelineError::Thread {
                    name: "collector",
                    source,
                })?
        };
        let link = JvmLink {
            jvms: shared.jvms.clone(),
            sightings: agent::spawn(shared.jvms.clone(), opts.jvm).map_err(|source| {
                PipelineError::Thread {
                    name: "JVM agent",
                    source,
                }
            })?,
        };
        let symbolizer = {
            let shared = shared.clone();
            thread::Builder::new()
                .name("ws-symbolize".into())
                .spawn(move || symbolize_loop(&rx, &shared, link))
                .map_err(|source| PipelineError::Thread {
                    name: "symbolizer",
                    source,
                })?
        };
        Ok(Pipeline {
            shared,
            stop,
            collector,
            symbolizer,
            _probes: probes,
        })
    }

    /// The state the API serves from.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Stops sampling after a last drain of both buffers and waits until
    /// everything is in the store.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.collector.join();
        let _ = self.symbolizer.join();
    }
}

fn collect_loop(
    drainer: &mut Drainer,
    mut registry: Option<&mut Registry>,
    tx: &mpsc::Sender<RawBatch>,
    stop: &AtomicBool,
    shared: &Shared,
    interval: Duration,
) {
    let mut next = Instant::now() + interval;
    loop {
        while Instant::now() < next && !stop.load(Ordering::SeqCst) {
            thread::sleep((next - Instant::now()).min(Duration::from_millis(20)));
        }
        next += interval;
        let stopping = stop.load(Ordering::SeqCst);
        // On stop, drain twice: the second pass empties the buffer that was
        // active during the first.
        for _ in 0..if stopping { 2 } else { 1 } {
            match drainer.drain() {
                Ok(batch) => {
                    record_drain(shared, &batch);
                    let pids: Vec<u32> = batch.records.iter().map(|r| r.pid).collect();
                    if tx.send(batch).is_err() {
                        return;
                    }
                    // After the send: building a table for a new library
                    // takes tens of milliseconds, the symbolizer need not wait.
                    // Not when stopping: tables for new processes would never
                    // be used, and building them delayed exit by seconds.
                    if let Some(registry) = registry.as_deref_mut().filter(|_| !stopping) {
                        registry.update(pids);
                        shared
                            .health
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .unwind = registry.stats();
                    }
                }
                Err(err) => {
                    tracing::error!("drain failed: {err}");
                    shared
                        .health
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .drain_errors += 1;
                }
            }
        }
        if stopping {
            return;
        }
    }
}

fn record_drain(shared: &Shared, batch: &RawBatch) {
    let mut h = shared.health.lock().unwrap_or_else(|e| e.into_inner());
    h.drains += 1;
    h.last_drain_us = batch.drain_time.as_micros() as u64;
    h.max_drain_us = h.max_drain_us.max(h.last_drain_us);
    h.missing_stacks += batch.missing_stacks;
}

fn symbolize_loop(rx: &mpsc::Receiver<RawBatch>, shared: &Shared, link: JvmLink) {
    let mut symbolizer = Symbolizer::with_jvms(link);
    for batch in rx {
        let started = Instant::now();
        let slice = symbolizer.symbolize(batch);
        shared
            .store
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(slice);
        shared
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_symbolize_us = started.elapsed().as_micros() as u64;
    }
}
