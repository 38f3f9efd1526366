//! Profiles in the formats other tools read: pprof (`/pprof`,
//! `wallscope record -o X.pb.gz`), pushed to Grafana Pyroscope
//! (`--push-url`), as OpenTelemetry profiles over OTLP (`--otlp-url`), and
//! as the file `wallscope record` writes.

pub mod otlp;
pub mod pprof;
pub mod push;
pub mod record;
