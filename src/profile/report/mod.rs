//! Reports over the [`super::model`]: one module per answer the API, the
//! exporters and the command line give.

pub mod answer;
pub mod blocked;
pub mod budget;
pub mod cgroup_list;
pub mod culprit_groups;
pub mod culprits;
pub mod disclosure;
pub mod durations;
pub mod elide;
pub mod explain;
pub mod fair;
pub mod filter;
pub mod fold;
pub mod gil;
pub mod groups;
pub mod hist;
pub mod host;
pub mod host_facts;
pub mod identity;
pub mod processes;
pub mod processes_text;
pub mod query;
pub mod render;
pub mod rows;
pub mod runqueue;
pub mod sleeps;
pub mod spans;
pub mod strip;
pub mod stuck;
pub mod thread_fold;
pub mod threads;
pub mod throttling;
pub mod timeline;
pub mod truncate;
