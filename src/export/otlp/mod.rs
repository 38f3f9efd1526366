//! OpenTelemetry profiles over OTLP/HTTP (`--otlp-url`): the profiles
//! pushed to Pyroscope, of the same processes and windows, as the
//! `v1development` profiles signal of opentelemetry-proto **v1.11.0**
//! (wire-identical to v1.10.0 for profiles): per interval an
//! `ExportProfilesServiceRequest` (or a few, for many processes), binary
//! protobuf, `POST URL/v1development/profiles`,
//! `Content-Type: application/x-protobuf`.
//!
//! A request holds one shared `ProfilesDictionary` and one
//! `ResourceProfiles` per process (`service.name`, `process.pid`,
//! `host.name`, `container.id` and `k8s.*` in a container), with one
//! `ScopeProfiles` (`wallscope`, its version) of two profiles, one sample
//! type each: `cpu`/`nanoseconds` and `off_cpu`/`nanoseconds`. Samples
//! carry `thread.id`, `thread.name`, `wallscope.pool`, and off CPU
//! `wallscope.state`; locations carry `profile.frame.type`. The profiles
//! are built as `/pprof` builds them ([`crate::export::pprof`]), fitted
//! to the same limits as Pyroscope's, so their totals are `/pprof`'s over
//! the same window.

mod dictionary;
mod encode;
pub mod proto;

pub use dictionary::{Dictionary, Frame};
pub use encode::{frame, Otlp, MAX_REQUEST_BYTES};

use super::push::send::Protocol;

/// The OTLP/HTTP path of the profiles signal, below the receiver's URL.
pub const PATH: &str = "v1development/profiles";

/// OTLP/HTTP with binary protobuf bodies.
pub const PROTOCOL: Protocol = Protocol {
    server: "the OTLP receiver",
    path: PATH,
    headers: &[("Content-Type", "application/x-protobuf")],
};

/// The instrumentation scope's name.
pub const SCOPE: &str = "wallscope";

/// Semantic conventions' attribute names (resource, sample, location),
/// and wallscope's own.
pub const SERVICE_NAME: &str = "service.name";
pub const PROCESS_PID: &str = "process.pid";
pub const HOST_NAME: &str = "host.name";
pub const CONTAINER_ID: &str = "container.id";
pub const THREAD_ID: &str = "thread.id";
pub const THREAD_NAME: &str = "thread.name";
pub const FRAME_TYPE: &str = "profile.frame.type";
/// The off-CPU state of a sample: `runqueue`, `throttled`, `futex`, `io`
/// or `sleep` (no convention names one).
pub const STATE: &str = "wallscope.state";
/// The thread's pool: its name with the numbers that tell the pool's
/// threads apart masked (`worker-*`).
pub const POOL: &str = "wallscope.pool";

/// The sample types: `(type, unit)` of the CPU and off-CPU profiles
/// (`off_cpu` as the proto's own comment names it).
pub const CPU_TYPE: (&str, &str) = ("cpu", "nanoseconds");
pub const OFFCPU_TYPE: (&str, &str) = ("off_cpu", "nanoseconds");

#[cfg(test)]
mod tests;
