//! Profiles: the OS-free [`model`] (stacks, slices, the store) and the
//! [`report`]s computed from it, one per answer.

pub mod history;
pub mod model;
pub mod report;

// The paths from before the split, which the rest of the crate, the tests
// and the benches use.
pub use model::{kind, live, size, store, window, *};
pub use report::{
    blocked, cgroup_list, culprits, disclosure, fair, gil, groups, hist, host, processes, query,
    render, rows, runqueue, sleeps, strip, stuck, threads, timeline, truncate,
};
