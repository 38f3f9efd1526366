//! The HTTP server's counters, for `/healthz` and `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// The HTTP server's counters since start, for `/healthz` and `/metrics`.
#[derive(Debug)]
pub struct Stats {
    pub(super) connections_open: AtomicU64,
    pub(super) connection_limit: AtomicU64,
    pub(super) connections_accepted: AtomicU64,
    pub(super) closed_idle_timeout: AtomicU64,
    pub(super) closed_evicted: AtomicU64,
    pub(super) closed_write_stalled: AtomicU64,
    pub(super) refused_full: AtomicU64,
    pub(super) rejected_host: AtomicU64,
    pub(super) rejected_token: AtomicU64,
}

/// The counters of the one server of this process. A static rather than
/// router state: the access middleware and the accept loop count into it
/// without being handed anything.
pub static STATS: Stats = Stats {
    connections_open: AtomicU64::new(0),
    connection_limit: AtomicU64::new(0),
    connections_accepted: AtomicU64::new(0),
    closed_idle_timeout: AtomicU64::new(0),
    closed_evicted: AtomicU64::new(0),
    closed_write_stalled: AtomicU64::new(0),
    refused_full: AtomicU64::new(0),
    rejected_host: AtomicU64::new(0),
    rejected_token: AtomicU64::new(0),
};

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Snapshot {
    /// Connections open now.
    pub connections_open: u64,
    /// The connection cap in force (0 before the server started).
    pub connection_limit: u64,
    pub connections_accepted: u64,
    /// Closed after waiting for a request longer than [`super::IDLE_TIMEOUT`].
    pub closed_idle_timeout: u64,
    /// Closed to make room for a new one: waiting for a request, or its
    /// answer stalled for [`super::EVICTABLE_STALL`].
    pub closed_evicted: u64,
    /// Closed because their answer stopped moving ([`super::WRITE_STALL`]) or took
    /// longer than [`super::WRITE_DEADLINE`].
    pub closed_write_stalled: u64,
    /// New connections closed at once: at the cap, every one busy.
    pub refused_full: u64,
    /// Requests refused for their `Host` (421).
    pub rejected_host: u64,
    /// Requests refused for a missing or wrong token (401).
    pub rejected_token: u64,
}

impl Snapshot {
    /// The event counters by name, as `/metrics` labels them.
    pub fn events(&self) -> [(&'static str, u64); 7] {
        [
            ("connections_accepted", self.connections_accepted),
            ("closed_idle_timeout", self.closed_idle_timeout),
            ("closed_evicted", self.closed_evicted),
            ("closed_write_stalled", self.closed_write_stalled),
            ("refused_full", self.refused_full),
            ("rejected_host", self.rejected_host),
            ("rejected_token", self.rejected_token),
        ]
    }
}

impl Stats {
    /// All counters now.
    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            connections_open: get(&self.connections_open),
            connection_limit: get(&self.connection_limit),
            connections_accepted: get(&self.connections_accepted),
            closed_idle_timeout: get(&self.closed_idle_timeout),
            closed_evicted: get(&self.closed_evicted),
            closed_write_stalled: get(&self.closed_write_stalled),
            refused_full: get(&self.refused_full),
            rejected_host: get(&self.rejected_host),
            rejected_token: get(&self.rejected_token),
        }
    }

    /// Counts a request refused for its `Host`.
    pub fn count_rejected_host(&self) {
        bump(&self.rejected_host);
    }

    /// Counts a request refused for its token.
    pub fn count_rejected_token(&self) {
        bump(&self.rejected_token);
    }
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
