//! The language runtimes wallscope reads, in the order they are asked
//! (see [`crate::runtime`]): HotSpot first (its anonymous code is its
//! own, named from its structures, else from its perf map the Java way),
//! CPython, then any perf map (JIT code of every other runtime), and the
//! OpenTelemetry thread contexts when asked for (they name no frame:
//! they need the walk's registrations). A new
//! runtime is one module implementing [`Runtime`](crate::runtime::Runtime)
//! and one line here.

use std::sync::Arc;

use crate::{
    jvm::{runtime::Java, runtime::JvmLink, JvmFrames, Jvms},
    otelctx::OtelContexts,
    perfmap::PerfMaps,
    process::ProcessTable,
    python::{
        registry::{PythonThreads, Pythons},
        runtime::Python,
    },
    runtime::{Runtime, Runtimes},
};

/// How the runtimes are read.
#[derive(Default)]
pub struct RuntimeOptions {
    /// Where Java frames come from (`--jvm-frames`, `--jvm off`).
    pub jvm_frames: JvmFrames,
    /// What is known of the JVMs (shared with the JVM agent).
    pub jvms: Arc<Jvms>,
    /// The JVM agent, to which JVMs seen are reported.
    pub jvm_link: Option<JvmLink>,
    /// The Python interpreters found, shared by the two halves.
    pub pythons: Pythons,
    /// Python's walk half (registers interpreters and threads for BPF).
    pub python_walk: Option<PythonThreads>,
    /// The OpenTelemetry thread contexts to discover (with the sink that
    /// writes them for BPF), if spans are captured.
    pub otel: Option<Arc<OtelContexts>>,
}

/// Every runtime, for the processes of `table`.
pub fn build(table: &Arc<ProcessTable>, opts: RuntimeOptions) -> Runtimes {
    let perf_maps = PerfMaps::new(table.clone());
    let java = Java::new(
        table.clone(),
        opts.jvms,
        opts.jvm_frames,
        perf_maps.clone(),
        opts.jvm_link,
    );
    let python = Python::new(opts.pythons, opts.python_walk);
    let mut all: Vec<Arc<dyn Runtime>> =
        vec![Arc::new(java), Arc::new(python), Arc::new(perf_maps)];
    if let Some(otel) = opts.otel {
        all.push(otel);
    }
    Runtimes::new(all)
}

/// The runtimes with no agent and no walk half (tests, benchmarks).
pub fn standard(table: &Arc<ProcessTable>) -> Runtimes {
    build(table, RuntimeOptions::default())
}
