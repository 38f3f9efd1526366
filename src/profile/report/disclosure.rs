//! What an answer may say of processes its reader does not own. Root (or
//! a token holder) reads every process by name; a local user other than
//! root reads their own processes by name and everyone else's only as a
//! count, `[other users] ×N`: culprits, wakers, `/healthz` and
//! `/processes` tell them that others ran, never who (pid, name, path).
//!
//! Folded stacks (`/folded`, `/flamegraph`, `/pprof`) of such a user
//! already name no process but the one asked about ([`OTHER_PROCESS`],
//! `Filter::others_hidden`).
//!
//! A pid is the reader's only if its process is theirs now *and* had
//! started by the time in question: a pid the reader's process took after
//! another user's process ended does not bring that process's name or
//! time along.

use std::{
    cell::RefCell,
    collections::{HashMap, HashSet},
    sync::Arc,
    time::SystemTime,
};

use crate::untrusted::refusals::{count, Reason, What};

/// What stands for the processes a reader may not see; [`Hidden::label`]
/// adds how many.
pub const OTHER_USERS: &str = "[other users]";

/// What stands, in the folded stacks of a user other than root (wakers
/// and wakees, see [`super::rows`]), for any process but the one asked
/// about: a stack's weight is time, not processes, so no count; and the
/// reader's own other processes are left out too, as the query is about
/// one process.
pub const OTHER_PROCESS: &str = "[another process]";

/// Processes one answer remembers the owner of, and counts hidden: a
/// fork storm's pids are looked up again, or counted as "more", past it
/// (about 2 MiB); either is counted (`client`/`too_many_entries`).
pub const MAX_REMEMBERED: usize = 1 << 16;

/// A process's owner (its one uid) and when it started, never earlier
/// than it did; `None` when it is gone or its uids differ.
pub type OwnerOf = dyn Fn(u32) -> Option<(u32, SystemTime)> + Send + Sync;

/// Who reads an answer.
#[derive(Clone)]
pub enum Reader {
    /// Root, a token holder, or local checks turned off: every process.
    All,
    /// A local user other than root (`None`: one whose uid could not be
    /// found, who sees no process): their own processes only.
    User {
        uid: Option<u32>,
        owner_of: Arc<OwnerOf>,
    },
}

impl Reader {
    /// The view of one answer (it remembers the owners it looked up).
    pub fn sight(&self) -> Sight {
        Sight {
            reader: self.clone(),
            owners: RefCell::new(HashMap::new()),
        }
    }
}

/// One answer's view of the processes: which it may name.
pub struct Sight {
    reader: Reader,
    owners: RefCell<HashMap<u32, Option<(u32, SystemTime)>>>,
}

impl Sight {
    /// Sees every process (root's answers, exporters).
    pub fn all() -> Sight {
        Reader::All.sight()
    }

    /// Whether some processes stay hidden from this reader.
    pub fn limited(&self) -> bool {
        matches!(self.reader, Reader::User { .. })
    }

    /// Whether the reader may see what concerns user `uid` as a whole
    /// (their CPU budget): root, or `uid` themselves.
    pub fn sees_user(&self, uid: u32) -> bool {
        match &self.reader {
            Reader::All => true,
            Reader::User { uid: reader, .. } => *reader == Some(uid),
        }
    }

    /// The reader's uid when it is a local user other than root (whose own
    /// figures it may read), `None` otherwise.
    pub fn uid(&self) -> Option<u32> {
        match &self.reader {
            Reader::User { uid, .. } => *uid,
            Reader::All => None,
        }
    }

    /// Whether the reader may name process `pid` as it was at `at`: theirs
    /// now, and started by then (so not an earlier process of that pid).
    pub fn sees(&self, pid: u32, at: SystemTime) -> bool {
        let (uid, owner_of) = match &self.reader {
            Reader::All => return true,
            Reader::User { uid: None, .. } => return false,
            Reader::User {
                uid: Some(uid),
                owner_of,
            } => (*uid, owner_of),
        };
        let known = self.owners.borrow().get(&pid).copied();
        let owner = match known {
            Some(owner) => owner,
            None => {
                let owner = owner_of(pid);
                let mut owners = self.owners.borrow_mut();
                if owners.len() < MAX_REMEMBERED {
                    owners.insert(pid, owner);
                    if owners.len() == MAX_REMEMBERED {
                        count(What::Client, Reason::TooManyEntries);
                    }
                }
                owner
            }
        };
        owner.is_some_and(|(owner, started)| owner == uid && started <= at)
    }
}

/// The distinct processes an answer left unnamed, for its count entry.
#[derive(Debug, Default, Clone)]
pub struct Hidden {
    pids: HashSet<u32>,
    /// More were met than [`MAX_REMEMBERED`].
    more: bool,
}

impl Hidden {
    /// Notes `pid` as one left unnamed.
    pub fn note(&mut self, pid: u32) {
        if self.pids.len() < MAX_REMEMBERED {
            self.pids.insert(pid);
        } else if !self.more && !self.pids.contains(&pid) {
            self.more = true;
            count(What::Client, Reason::TooManyEntries);
        }
    }

    /// How many processes were left unnamed (at least: past
    /// [`MAX_REMEMBERED`], more are not counted).
    pub fn count(&self) -> usize {
        self.pids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pids.is_empty()
    }

    /// `[other users] ×N` (`×N+` past what was counted).
    pub fn label(&self) -> String {
        label(self.count(), self.more)
    }
}

/// `[other users] ×N`, `+` when there were more than `n`.
pub fn label(n: usize, more: bool) -> String {
    let plus = if more { "+" } else { "" };
    format!("{OTHER_USERS} ×{n}{plus}")
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;

    pub(crate) fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// User 1000 reading: pid 10 is theirs since t=100, pid 20 another
    /// user's, pid 30 gone.
    pub(crate) fn user_1000() -> Reader {
        Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(|pid| match pid {
                10 => Some((1000, at(100))),
                20 => Some((1, at(50))),
                _ => None,
            }),
        }
    }

    #[test]
    fn a_user_sees_their_own_processes_since_they_started() {
        let sight = user_1000().sight();
        assert!(sight.limited());
        assert!(sight.sees(10, at(100)) && sight.sees(10, at(500)));
        // Before it started, pid 10 was someone else's process.
        assert!(!sight.sees(10, at(99)));
        assert!(!sight.sees(20, at(500)), "another user's");
        assert!(!sight.sees(30, at(500)), "gone: whose it was is unknown");
        let all = Sight::all();
        assert!(!all.limited() && all.sees(20, at(0)) && all.sees(30, at(0)));
        let unknown = Reader::User {
            uid: None,
            owner_of: Arc::new(|_| Some((0, at(0)))),
        };
        assert!(!unknown.sight().sees(10, at(500)));
    }

    #[test]
    fn owners_are_looked_up_once_per_answer() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let reader = Reader::User {
            uid: Some(7),
            owner_of: Arc::new(move |_| {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Some((7, at(0)))
            }),
        };
        let sight = reader.sight();
        for _ in 0..5 {
            assert!(sight.sees(3, at(1)));
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn hidden_processes_are_counted_once_each() {
        let mut hidden = Hidden::default();
        assert!(hidden.is_empty());
        for pid in [5, 6, 5, 7, 6] {
            hidden.note(pid);
        }
        assert_eq!(hidden.label(), "[other users] ×3");
        assert_eq!(label(2, true), "[other users] ×2+");
        let before = crate::untrusted::refusals::get(What::Client, Reason::TooManyEntries);
        let mut crowd = Hidden::default();
        for pid in 0..MAX_REMEMBERED as u32 + 2 {
            crowd.note(pid);
        }
        assert_eq!(crowd.label(), format!("[other users] ×{MAX_REMEMBERED}+"));
        let after = crate::untrusted::refusals::get(What::Client, Reason::TooManyEntries);
        assert!(after > before, "the count past its bound is counted");
    }
}
