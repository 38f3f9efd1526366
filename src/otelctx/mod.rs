//! OpenTelemetry's thread context, as a process publishes it for outside
//! readers: the process context (OTEP 4719, an `OTEL_CTX` mapping with a
//! protobuf payload naming the records' attribute keys) and the TLS
//! variable `otel_thread_ctx_v1` (OTEP 4947) pointing to each thread's
//! active span record. This module finds both, per process; BPF reads
//! the records (see `bpf/wallscope.h`, `ws_otel_proc`).
//!
//! [`process_ctx`] reads the context, [`elf_tls`] what a file says of the
//! variable, [`resolve`] how a thread pointer leads to it, [`registry`]
//! keeps each process's findings in step with its lifecycle (a
//! [`Runtime`](crate::runtime::Runtime): registered with the walk).

pub mod elf_tls;
mod files;
pub mod process_ctx;
pub mod registry;
pub mod resolve;

pub use registry::{OtelContexts, OtelProcsSink, OtelStats};
