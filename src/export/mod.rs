//! Profiles in the formats other tools read: pprof (`/pprof`,
//! `wallscope record -o X.pb.gz`), and pushed to Grafana Pyroscope
//! (`--push-url`).

pub mod pprof;
pub mod push;
