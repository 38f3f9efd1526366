//! Profiles: the OS-free [`model`] (stacks, slices, the store) and the
//! [`report`]s computed from it, one per answer.

pub mod history;
pub mod model;
pub mod report;
