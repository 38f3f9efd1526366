//! Profiles in the formats other tools read: pprof (`/pprof`,
//! `wallscope record -o X.pb.gz`), pushed to Grafana Pyroscope
//! (`--push-url`) and as OpenTelemetry profiles over OTLP (`--otlp-url`).

pub mod otlp;
pub mod pprof;
pub mod push;
