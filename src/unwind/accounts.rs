//! Evictions counted by user, charged to the user whose table caused them,
//! and by process: what `/healthz` (`pipeline.unwind.users`, `partial`)
//! shows of whose churn cost whose stacks.

use std::collections::HashMap;

use serde::Serialize;

use super::fair::Holding;

/// Users counted apart, at most; any further user is counted under
/// [`OTHERS`] (uids are the host's, so this is rarely reached).
const MAX_USERS: usize = 1024;
/// The key of the users past [`MAX_USERS`].
pub(super) const OTHERS: u32 = u32::MAX;
/// Users listed in `/healthz`, those charged the most rows first.
pub const USERS_LISTED: usize = 32;
/// Processes listed in `UnwindStats::partial`.
pub const PARTIAL_LISTED: usize = 20;

/// What happened to one user's tables and what its tables did to others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// Tables evicted to make room for this user's tables.
    pub caused: u64,
    /// Of them, other users' tables some process still mapped (taken back
    /// while those users were over their share).
    pub caused_others: u64,
    /// This user's tables evicted while some process still mapped them.
    pub lost: u64,
    /// Of them, for another user's table.
    pub lost_to_others: u64,
}

/// Counts by user (euid).
#[derive(Debug, Default)]
pub(super) struct Accounts {
    users: HashMap<u32, Counts>,
}

impl Accounts {
    fn of(&mut self, uid: u32) -> &mut Counts {
        let uid = if self.users.len() >= MAX_USERS && !self.users.contains_key(&uid) {
            OTHERS
        } else {
            uid
        };
        self.users.entry(uid).or_default()
    }

    /// `victim` was evicted for a table of `payer` (see
    /// [`super::files::FileEntry::payer`]).
    pub fn evicted(&mut self, payer: Option<u32>, victim: &Holding) {
        let others = |uid: u32| victim.users.iter().any(|u| *u != uid);
        if let Some(payer) = payer {
            let c = self.of(payer);
            c.caused += 1;
            if victim.live && others(payer) {
                c.caused_others += 1;
            }
        }
        if !victim.live {
            return;
        }
        for &uid in &victim.users {
            let c = self.of(uid);
            c.lost += 1;
            if payer.is_some_and(|p| p != uid) {
                c.lost_to_others += 1;
            }
        }
    }

    pub fn get(&self, uid: u32) -> Counts {
        self.users.get(&uid).copied().unwrap_or_default()
    }

    pub fn users(&self) -> impl Iterator<Item = u32> + '_ {
        self.users.keys().copied()
    }
}

/// One user's part of the row array and its evictions (`/healthz`
/// `pipeline.unwind.users`).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct UserTables {
    /// The user (euid); `None` for the users a reader other than root may
    /// not see, summed, or those past the users counted apart.
    pub uid: Option<u32>,
    /// Rows of the array charged to the user now (a table's rows split
    /// among the users whose processes map it; kept by the last user once
    /// none does), and its share (an even share among the users charged).
    pub rows: u64,
    pub share: u64,
    /// Its registered processes, and how many of them walk some file
    /// without its table because it was evicted or found no room.
    pub processes: u64,
    pub processes_partial: u64,
    /// Tables evicted to make room for this user's tables (its churn), and
    /// of them other users' tables in use.
    pub evictions_caused: u64,
    pub evictions_caused_others: u64,
    /// Its tables in use evicted, and of them for another user's table.
    pub tables_lost: u64,
    pub tables_lost_to_others: u64,
}

impl UserTables {
    /// Adds `o`'s figures (summing users hidden from a reader).
    pub fn add(&mut self, o: &UserTables) {
        self.rows += o.rows;
        self.share = self.share.max(o.share);
        self.processes += o.processes;
        self.processes_partial += o.processes_partial;
        self.evictions_caused += o.evictions_caused;
        self.evictions_caused_others += o.evictions_caused_others;
        self.tables_lost += o.tables_lost;
        self.tables_lost_to_others += o.tables_lost_to_others;
    }

    pub(super) fn with_counts(mut self, c: Counts) -> UserTables {
        self.evictions_caused = c.caused;
        self.evictions_caused_others = c.caused_others;
        self.tables_lost = c.lost;
        self.tables_lost_to_others = c.lost_to_others;
        self
    }
}

/// A process whose stacks are partial because a table it needs was
/// evicted or found no room (`/healthz` `pipeline.unwind.partial`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartialProcess {
    pub pid: u32,
    /// Its `comm` (for a reader other than root, other users' processes
    /// are one entry, pid 0, named `[other users] ×N`).
    pub name: String,
    /// Tables it was using that were evicted since it was registered.
    pub tables_evicted: u64,
    /// Its files walked without a table now: evicted, or no room.
    pub files_evicted: u64,
    pub files_no_room: u64,
}

/// The [`PARTIAL_LISTED`] processes to list: those that lost the most
/// tables to evictions, then the ones seen last (`seen` rank: higher is
/// later), then the newest.
pub(super) fn top_partial(
    mut all: Vec<(PartialProcess, std::time::Instant)>,
) -> Vec<PartialProcess> {
    all.sort_by_key(|(p, seen)| std::cmp::Reverse((p.tables_evicted, *seen, p.pid)));
    all.into_iter()
        .take(PARTIAL_LISTED)
        .map(|(p, _)| p)
        .collect()
}

/// The users to list: the most rows first, then the most evictions
/// caused, at most [`USERS_LISTED`]; the rest summed into one entry
/// without a uid.
pub(super) fn top_users(mut all: Vec<UserTables>) -> Vec<UserTables> {
    all.sort_by_key(|u| {
        std::cmp::Reverse((u.rows, u.evictions_caused + u.tables_lost, u.processes))
    });
    if all.len() > USERS_LISTED {
        let rest = all.split_off(USERS_LISTED - 1);
        let mut sum = UserTables::default();
        for u in &rest {
            sum.add(u);
        }
        all.push(sum);
    }
    all
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    const NOBODY: u32 = 65534;

    fn holding(users: &[u32], live: bool) -> Holding {
        Holding {
            users: users.to_vec(),
            live,
            vital: 0,
            processes: u32::from(live),
            used: Instant::now(),
        }
    }

    #[test]
    fn evictions_are_charged_to_the_user_whose_table_caused_them() {
        let mut a = Accounts::default();
        // Nobody's churn evicts its own ended binary, then its running
        // one, then root's excess.
        a.evicted(Some(NOBODY), &holding(&[NOBODY], false));
        a.evicted(Some(NOBODY), &holding(&[NOBODY], true));
        a.evicted(Some(NOBODY), &holding(&[0], true));
        let n = a.get(NOBODY);
        assert_eq!(
            (n.caused, n.caused_others, n.lost, n.lost_to_others),
            (3, 1, 1, 0)
        );
        let r = a.get(0);
        assert_eq!((r.caused, r.lost, r.lost_to_others), (0, 1, 1));
        // A shared table lost counts for each of its users.
        a.evicted(Some(1), &holding(&[1, NOBODY], true));
        assert_eq!(a.get(1).lost_to_others, 0);
        assert_eq!(a.get(NOBODY).lost_to_others, 1);
        assert_eq!(a.get(1).caused_others, 1);
    }

    #[test]
    fn users_are_counted_apart_up_to_a_bound() {
        let mut a = Accounts::default();
        for uid in 0..MAX_USERS as u32 + 5 {
            a.evicted(Some(uid), &holding(&[uid], false));
        }
        assert_eq!(a.users().count(), MAX_USERS + 1);
        assert_eq!(a.get(OTHERS).caused, 5);
        let listed = top_users(
            (0..40)
                .map(|uid| UserTables {
                    uid: Some(uid),
                    rows: u64::from(uid),
                    ..UserTables::default()
                })
                .collect(),
        );
        assert_eq!(listed.len(), USERS_LISTED);
        assert_eq!(listed[0].uid, Some(39));
        let rest = listed.last().unwrap();
        assert_eq!(rest.uid, None);
        assert_eq!(rest.rows, (0..9).sum::<u64>());
    }

    #[test]
    fn processes_that_lost_tables_are_listed_first() {
        let t = Instant::now();
        let p = |pid, tables_evicted| {
            (
                PartialProcess {
                    pid,
                    name: String::new(),
                    tables_evicted,
                    files_evicted: 1,
                    files_no_room: 0,
                },
                t,
            )
        };
        let mut all: Vec<_> = (100..130).map(|pid| p(pid, 0)).collect();
        all.push(p(7, 2));
        let top = top_partial(all);
        assert_eq!(top.len(), PARTIAL_LISTED);
        assert_eq!(top[0].pid, 7);
        assert_eq!(top[1].pid, 129, "then the newest");
    }
}
