//! wallscope: where does each thread's wall-clock time go?
//!
//! Stages, each a module with one job: [`bpf`] loads the programs,
//! [`collect`] drains their maps, [`symbolize`] names the frames (with
//! [`jvm`] for Java),
//! [`profile`] stores ([`profile::model`]) and answers queries
//! ([`profile::report`]), [`api`] serves it over HTTP and [`export`] pushes
//! it; [`pipeline`] wires them together (its doc lists every thread).
//! [`state`] is what the pipeline writes and the API and the pusher read;
//! [`token`] and [`hostname`] are the small utilities both use;
//! [`priority`] sets which threads run above the others and which below.
//! Files that profiled processes control are opened only through
//! [`untrusted`].

pub mod api;
pub mod bpf;
pub mod budget;
pub mod caps;
pub mod collect;
pub mod export;
pub mod held;
pub mod hostname;
pub mod jvm;
pub mod otelctx;
pub mod perfmap;
pub mod pipeline;
pub mod priority;
pub mod process;
pub mod profile;
pub mod python;
pub mod runtime;
pub mod runtimes;
pub mod state;
pub mod symbolize;
pub mod token;
pub mod trace;
pub mod untrusted;
pub mod unwind;
