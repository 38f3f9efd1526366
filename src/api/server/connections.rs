//! The open connections and where each one is (waiting for a request or
//! serving one, and whether its answer is being written and still moves),
//! for the idle timeout, the write deadlines and the eviction at the cap.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    sync::{atomic::Ordering, Arc, Mutex},
    time::Instant,
};

use tokio::sync::Notify;

use super::{
    stats::{bump, STATS},
    EVICTABLE_STALL, IDLE_TIMEOUT, WRITE_DEADLINE, WRITE_STALL,
};
use crate::untrusted::refusals::{self, Reason, What};

/// Whose a connection is, for the eviction at the cap: a local client's
/// uid, else (a remote client, or a failed lookup) its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Owner {
    Uid(u32),
    Address(IpAddr),
}

impl Owner {
    pub(super) fn of(client: &super::super::peer::Client) -> Owner {
        match client.uid {
            Some(uid) => Owner::Uid(uid),
            None => Owner::Address(client.addr.ip().to_canonical()),
        }
    }
}

/// Where an open connection is, for the idle and eviction rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No complete request header since this instant: just accepted, or
    /// its last response fully written.
    Waiting(Instant),
    /// Serving this many requests (handler running or response body not
    /// fully written).
    Serving(u32),
}

/// One open connection, as its task sees it.
#[derive(Debug, Default)]
pub(super) struct Connection {
    /// Wakes the connection's task to drop it (idle, evicted).
    pub(super) close: Notify,
}

/// An answer being written: since when, and when the client last took
/// some of it (hyper asked for the next chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Writing {
    since: Instant,
    progress: Instant,
}

impl Writing {
    /// Whether the answer is stuck at `now`: no progress for
    /// [`WRITE_STALL`], or written for longer than [`WRITE_DEADLINE`].
    fn stuck(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.progress) >= WRITE_STALL
            || now.saturating_duration_since(self.since) >= WRITE_DEADLINE
    }
}

/// An open connection in the table.
#[derive(Debug)]
struct Entry {
    phase: Phase,
    /// The answer being written, while its handler is done and its body
    /// not fully handed to hyper.
    writing: Option<Writing>,
    owner: Owner,
    conn: Arc<Connection>,
}

/// The open connections, and the waiting ones ordered by how long they
/// have waited, so that the longest-waiting one is found without a scan.
#[derive(Debug, Default)]
struct Table {
    entries: HashMap<u64, Entry>,
    waiting: BTreeSet<(Instant, u64)>,
    /// Open connections per owner.
    owned: HashMap<Owner, usize>,
    next_id: u64,
}

impl Table {
    /// Removes connection `id` (if still there); returns it.
    fn remove(&mut self, id: u64) -> Option<Arc<Connection>> {
        let entry = self.entries.remove(&id)?;
        if let Phase::Waiting(since) = entry.phase {
            self.waiting.remove(&(since, id));
        }
        if let Some(n) = self.owned.get_mut(&entry.owner) {
            *n -= 1;
            if *n == 0 {
                self.owned.remove(&entry.owner);
            }
        }
        Some(entry.conn)
    }

    /// The owner that holds the most connections once `newcomer` has one
    /// more; the newcomer on a tie (it makes room among its own first).
    fn heaviest(&self, newcomer: Owner) -> Owner {
        let own = self.owned.get(&newcomer).copied().unwrap_or(0) + 1;
        self.owned
            .iter()
            .filter(|&(&o, &n)| o != newcomer && n > own)
            .max_by_key(|&(_, &n)| n)
            .map_or(newcomer, |(&o, _)| o)
    }

    /// Closes one of `owner`'s connections to make room: the one that has
    /// waited longest for a request, else the one whose answer has not
    /// moved since `stalled_since` or earlier (the longest), else, when
    /// `any` (another owner holds more than the newcomer), its oldest
    /// connection, in service or not. Whether one was closed.
    fn close_one_of(&mut self, owner: Owner, stalled_since: Option<Instant>, any: bool) -> bool {
        let waiting = self
            .waiting
            .iter()
            .find(|(_, id)| self.entries.get(id).is_some_and(|e| e.owner == owner))
            .map(|&(_, id)| id);
        let stalled = || {
            let limit = if any { None } else { Some(stalled_since?) };
            self.most_stalled_writer(owner, limit)
        };
        let oldest = || {
            any.then(|| {
                self.entries
                    .iter()
                    .filter(|(_, e)| e.owner == owner)
                    .map(|(&id, _)| id)
                    .min()
            })
            .flatten()
        };
        match waiting.or_else(stalled).or_else(oldest) {
            Some(id) => {
                self.close(id);
                true
            }
            None => false,
        }
    }

    /// Closes the connection that has waited longest, if it has waited
    /// since `limit` or earlier (any if `None`); whether one was.
    fn close_oldest_waiting(&mut self, limit: Option<Instant>) -> bool {
        let Some(&(since, id)) = self.waiting.first() else {
            return false;
        };
        if limit.is_some_and(|limit| since > limit) {
            return false;
        }
        self.close(id);
        true
    }

    /// Removes connection `id` and tells its task to drop it.
    fn close(&mut self, id: u64) {
        if let Some(conn) = self.remove(id) {
            conn.close.notify_one();
        }
    }

    /// `owner`'s connection whose answer has made no progress the longest,
    /// if that was at `limit` or earlier (any without a limit). A scan:
    /// writers are at most the connection cap, and this runs only at the
    /// cap.
    fn most_stalled_writer(&self, owner: Owner, limit: Option<Instant>) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| e.owner == owner)
            .filter_map(|(&id, e)| Some((e.writing?.progress, id)))
            .filter(|&(progress, _)| limit.is_none_or(|limit| progress <= limit))
            .min()
            .map(|(_, id)| id)
    }
}

/// The open connections of a server. One lock guards every phase change,
/// so a connection chosen to be closed cannot start a request at the same
/// moment.
#[derive(Debug)]
pub(super) struct Connections {
    table: Mutex<Table>,
    cap: usize,
}

/// A connection's place in [`Connections`], given up when dropped (when
/// its task ends, however it ends).
#[derive(Debug)]
pub(super) struct Admitted {
    id: u64,
    pub(super) conn: Arc<Connection>,
    connections: Arc<Connections>,
}

impl Admitted {
    /// A request header arrived: the connection is busy until the returned
    /// guard is dropped.
    pub(super) fn request_started(&self) -> InFlight {
        let mut table = self.connections.table();
        let id = self.id;
        let waited = match table.entries.get_mut(&id) {
            Some(entry) => match entry.phase {
                Phase::Waiting(since) => {
                    entry.phase = Phase::Serving(1);
                    entry.writing = None;
                    Some(since)
                }
                Phase::Serving(n) => {
                    entry.phase = Phase::Serving(n + 1);
                    None
                }
            },
            // Chosen to be closed a moment ago: its task is dropping it.
            None => None,
        };
        if let Some(since) = waited {
            table.waiting.remove(&(since, id));
        }
        InFlight {
            id,
            connections: self.connections.clone(),
        }
    }

    /// Closes this connection if it is waiting for a request; whether it was.
    pub(super) fn close_if_waiting(&self) -> bool {
        let mut table = self.connections.table();
        match table.entries.get(&self.id).map(|e| e.phase) {
            Some(Phase::Waiting(_)) => {
                table.remove(self.id);
                true
            }
            _ => false,
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.table().remove(self.id);
        STATS.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request in progress on a connection; when dropped, the connection
/// waits for its next request (if this was its last one in progress).
#[derive(Debug)]
pub(super) struct InFlight {
    id: u64,
    connections: Arc<Connections>,
}

impl InFlight {
    /// The handler is done: its answer is being written from `now` on,
    /// under the write deadlines.
    pub(super) fn writing(&self, now: Instant) {
        self.update(|w| {
            *w = Some(Writing {
                since: now,
                progress: now,
            })
        });
    }

    /// The client took more of the answer at `now`.
    pub(super) fn progress(&self, now: Instant) {
        self.update(|w| {
            if let Some(w) = w {
                w.progress = now;
            }
        });
    }

    fn update(&self, change: impl FnOnce(&mut Option<Writing>)) {
        if let Some(entry) = self.connections.table().entries.get_mut(&self.id) {
            change(&mut entry.writing);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut table = self.connections.table();
        let Some(entry) = table.entries.get_mut(&self.id) else {
            return;
        };
        match entry.phase {
            Phase::Serving(n) if n > 1 => entry.phase = Phase::Serving(n - 1),
            Phase::Serving(_) => {
                entry.phase = Phase::Waiting(now);
                entry.writing = None;
                table.waiting.insert((now, self.id));
            }
            Phase::Waiting(_) => {}
        }
    }
}

impl Connections {
    pub(super) fn new(cap: usize) -> Connections {
        Connections {
            table: Mutex::new(Table::default()),
            cap,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new connection of `owner`. At the cap, room is made
    /// among the connections of whoever holds the most (one user's flood
    /// never closes another user's connections, root's probe among them):
    /// another owner's connection that waited longest for a request, else
    /// its most stalled answer, else its oldest; among the newcomer's own,
    /// the longest waiting, else the one whose answer has not moved for
    /// [`EVICTABLE_STALL`] or more (a client that stopped reading must not
    /// keep others out until its deadline). `None` if all of the
    /// newcomer's own are busy (the new one must then be closed).
    pub(super) fn admit(self: &Arc<Self>, now: Instant, owner: Owner) -> Option<Admitted> {
        let mut table = self.table();
        let stalled_since = now.checked_sub(EVICTABLE_STALL);
        while table.entries.len() >= self.cap {
            let victim = table.heaviest(owner);
            if !table.close_one_of(victim, stalled_since, victim != owner) {
                return None;
            }
            bump(&STATS.closed_evicted);
        }
        let id = table.next_id;
        table.next_id += 1;
        let conn = Arc::new(Connection::default());
        let entry = Entry {
            phase: Phase::Waiting(now),
            writing: None,
            owner,
            conn: conn.clone(),
        };
        table.entries.insert(id, entry);
        *table.owned.entry(owner).or_default() += 1;
        table.waiting.insert((now, id));
        bump(&STATS.connections_accepted);
        bump(&STATS.connections_open);
        Some(Admitted {
            id,
            conn,
            connections: self.clone(),
        })
    }

    /// Closes every connection that has been waiting for a request for
    /// [`IDLE_TIMEOUT`] or longer at `now`.
    pub(super) fn close_idle(&self, now: Instant) {
        let Some(limit) = now.checked_sub(IDLE_TIMEOUT) else {
            return;
        };
        let mut table = self.table();
        while table.close_oldest_waiting(Some(limit)) {
            bump(&STATS.closed_idle_timeout);
        }
    }

    /// Closes every connection whose answer is stuck at `now` (see
    /// [`WRITE_STALL`], [`WRITE_DEADLINE`]): its client stopped reading, and
    /// the answer's bytes must not be held for it.
    pub(super) fn close_stuck_writers(&self, now: Instant) {
        let mut table = self.table();
        let stuck: Vec<u64> = table
            .entries
            .iter()
            .filter(|(_, e)| e.writing.is_some_and(|w| w.stuck(now)))
            .map(|(&id, _)| id)
            .collect();
        for id in stuck {
            table.close(id);
            bump(&STATS.closed_write_stalled);
            refusals::count(What::Answers, Reason::Timeout);
        }
    }
}

#[cfg(test)]
#[path = "connections_tests.rs"]
mod tests;
