//! Profiles in the formats other tools read: pprof (`/pprof`,
//! `wallscope record -o X.pb.gz`).

pub mod pprof;
