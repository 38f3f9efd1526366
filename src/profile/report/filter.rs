//! Which samples a query wants: read by the row selection ([`super::rows`])
//! and the folding on top of it ([`super::query`]).

use crate::{
    profile::model::state::State,
    profile::model::{
        kind::{Group, Kind},
        window::Window,
    },
};

/// Which samples a query wants and how to fold them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub kind: Kind,
    pub group: Group,
    /// Which slices to read.
    pub window: Window,
    /// Other processes' stacks and names stay out: a user other than root
    /// asked about their own process `pid`, and its wakeups name the
    /// processes that woke it and that it woke (`[another process]`).
    pub others_hidden: bool,
}

impl Filter {
    /// A CPU profile grouped by process.
    pub fn cpu(pid: Option<u32>, tid: Option<u32>, window: Window) -> Filter {
        Filter {
            pid,
            tid,
            kind: Kind::State(State::Cpu),
            group: Group::Process,
            window,
            others_hidden: false,
        }
    }

    /// Whether the filter selects thread `tid` of `pid`.
    pub fn matches(&self, pid: u32, tid: u32) -> bool {
        self.pid.is_none_or(|p| p == pid) && self.tid.is_none_or(|t| t == tid)
    }
}
