//! pprof profiles from the store.

pub mod proto;
