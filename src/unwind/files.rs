//! What the registry knows of each file: its table's state, how many
//! processes use it, and how a table is laid out in the row array.

use std::collections::HashMap;
use std::{sync::Arc, time::Instant};

use crate::process::files::ExecMapping;

use super::{
    space::Cost,
    stats::Missing,
    table::{UnwindRow, UnwindTable},
};

/// `p_vaddr - p_offset` of the segment `m` maps in `pid`, as its file's
/// headers say, expressed as the shift from file offset to address.
pub(super) fn delta_of(pid: u32, m: &ExecMapping) -> Option<i64> {
    let file = m.open(pid).ok()?;
    let bias = super::table::load_bias_of(&file, m.start, m.offset).ok()?;
    Some(m.start.wrapping_sub(m.offset).wrapping_sub(bias) as i64)
}

/// A table's processes ran within this long: it counts as in use (evicting
/// it costs more).
pub(super) const IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Where a loaded table is, as BPF needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TablePlace {
    pub index_start: u32,
    pub row_count: u32,
    pub page_base: u32,
    pub page_count: u32,
}

/// The state of a file's table.
#[derive(Debug, Clone, Copy)]
pub(super) enum TableState {
    /// Not built yet.
    Pending,
    /// In the row array: `len` slots from `start` (the page index, then
    /// the rows).
    Loaded {
        start: u32,
        len: u32,
        place: TablePlace,
    },
    /// Keeps frame pointers: walked without a table.
    NotNeeded,
    Failed,
    TooBig,
    /// Built but not in the array (evicted, or no room): `len` slots
    /// needed, last tried at `at`.
    Out {
        why: Missing,
        len: u32,
        at: Instant,
    },
}

/// A file some process maps.
pub(super) struct FileEntry {
    pub path: Arc<str>,
    pub state: TableState,
    /// Registered processes mapping it.
    pub users: u32,
    /// The same by user (euid): how many of each user's processes.
    pub owners: HashMap<u32, u32>,
    /// Last time one of them was seen.
    pub used: Instant,
    /// When it was first seen.
    pub since: Instant,
    /// Last time building its table was tried (none could open it...).
    pub tried: Option<Instant>,
    /// `p_vaddr - p_offset` of the segment mapped at each file offset.
    pub deltas: Vec<(u64, i64)>,
}

impl FileEntry {
    pub fn new(path: Arc<str>, now: Instant) -> FileEntry {
        FileEntry {
            path,
            state: TableState::Pending,
            users: 0,
            owners: HashMap::new(),
            used: now,
            since: now,
            tried: None,
            deltas: Vec::new(),
        }
    }

    /// Why a process mapping this file walks it without a table, if it does.
    pub fn missing(&self) -> Option<Missing> {
        match self.state {
            TableState::Pending => Some(Missing::Pending),
            TableState::Loaded { .. } | TableState::NotNeeded => None,
            TableState::Failed => Some(Missing::Failed),
            TableState::TooBig => Some(Missing::TooBig),
            TableState::Out { why, .. } => Some(why),
        }
    }

    pub fn delta(&self, offset: u64) -> Option<i64> {
        self.deltas
            .iter()
            .find(|(o, _)| *o == offset)
            .map(|(_, d)| *d)
    }

    /// One more process of `uid` maps it.
    pub fn attach(&mut self, uid: u32) {
        self.users += 1;
        *self.owners.entry(uid).or_insert(0) += 1;
    }

    /// One process of `uid` no longer maps it.
    pub fn detach(&mut self, uid: u32) {
        self.users = self.users.saturating_sub(1);
        if let Some(n) = self.owners.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.owners.remove(&uid);
            }
        }
    }

    /// The one user whose processes map it, if only one's do.
    pub fn owner(&self) -> Option<u32> {
        let mut owners = self.owners.keys();
        match (owners.next(), owners.next()) {
            (Some(&uid), None) => Some(uid),
            _ => None,
        }
    }

    /// Whether this loaded table may be evicted for `other`'s: only for
    /// one that more users' processes map, or as many users' and more
    /// processes, or as many of which one ran more lately (seen in a later
    /// update). So a library every user's processes map never leaves for
    /// tables of files one user brings, however many processes that user
    /// runs; among tables of programs, those of programs that stopped
    /// running go first. A table only one user's processes map gives way
    /// to another user's only while its user is over its share of the
    /// array (`over_share`), so one user cannot push out the others.
    pub fn yields_to(&self, other: &FileEntry, over_share: impl Fn(u32) -> bool) -> bool {
        let (mine, theirs) = (self.owners.len(), other.owners.len());
        if mine != theirs {
            return mine < theirs;
        }
        if let (Some(a), Some(b)) = (self.owner(), other.owner()) {
            if a != b && !over_share(a) {
                return false;
            }
        }
        self.users < other.users || (self.users == other.users && self.used < other.used)
    }

    /// What evicting this table costs at `now`.
    pub fn cost(&self, len: u32, now: Instant) -> Cost {
        Cost {
            users: u64::from(self.users),
            active: u64::from(now.duration_since(self.used) < IDLE_AFTER),
            rows: u64::from(len),
        }
    }
}

/// A table as written to the array: its page index, then its rows.
pub(super) fn layout(table: &UnwindTable) -> (Vec<UnwindRow>, u32, u32) {
    let (page_base, index) = page_index(&table.rows);
    let page_count = (index.len() as u32).saturating_sub(1);
    let slots = index
        .iter()
        .map(|&n| UnwindRow {
            pc: n,
            ..UnwindRow::default()
        })
        .chain(table.rows.iter().copied())
        .collect();
    (slots, page_base, page_count)
}

/// The page index of `rows` (sorted by pc): entry k is the number of the
/// last row with pc <= (base + k) * 4096 (0 if none), k in 0..=count.
fn page_index(rows: &[UnwindRow]) -> (u32, Vec<u32>) {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return (0, Vec::new());
    };
    let base = first.pc >> 12;
    let count = (last.pc >> 12) - base + 1;
    let index = (0..=count)
        .map(|k| {
            let page_start = u64::from(base + k) << 12;
            let after = rows.partition_point(|r| u64::from(r.pc) <= page_start);
            after.saturating_sub(1) as u32
        })
        .collect();
    (base, index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn page_index_brackets_each_page_rows() {
        let row = |pc| UnwindRow {
            pc,
            ..UnwindRow::default()
        };
        let rows = [row(0x1010), row(0x1800), row(0x3004), row(0x3100)];
        let (base, index) = page_index(&rows);
        assert_eq!(base, 1);
        // Pages 1, 2, 3 and the end of page 3.
        assert_eq!(index, vec![0, 1, 1, 3]);
        // Every address's row lies in [index[k], index[k + 1]].
        for addr in [0x1010u32, 0x1fff, 0x2500, 0x3004, 0x3050, 0x3fff] {
            let k = ((addr >> 12) - base) as usize;
            let want = rows.partition_point(|r| r.pc <= addr) - 1;
            assert!(
                index[k] as usize <= want && want <= index[k + 1] as usize,
                "{addr:#x}"
            );
        }
    }

    #[test]
    fn shared_tables_never_yield_to_less_shared_ones() {
        let now = Instant::now() + Duration::from_secs(100);
        let file = |users, idle: u64| {
            let mut f = FileEntry {
                used: now - Duration::from_secs(idle),
                ..FileEntry::new("f".into(), now)
            };
            for _ in 0..users {
                f.attach(1000);
            }
            f
        };
        let fair = |_| false;
        let libc = file(300, 50);
        let binary = file(1, 0);
        assert!(!libc.yields_to(&binary, fair), "idle or not, libc stays");
        assert!(binary.yields_to(&libc, fair));
        // Equal worth: the table whose processes ran less lately gives way,
        // and not back.
        let (idle, busy) = (file(1, 30), file(1, 0));
        assert!(idle.yields_to(&busy, fair));
        assert!(!busy.yields_to(&idle, fair));
        assert!(
            !file(1, 0).yields_to(&busy, fair),
            "seen in the same update: no turns"
        );
    }

    #[test]
    fn one_users_many_processes_push_out_neither_shared_nor_other_users_tables() {
        let now = Instant::now();
        let of = |uids: &[(u32, u32)]| {
            let mut f = FileEntry::new("f".into(), now);
            for &(uid, n) in uids {
                (0..n).for_each(|_| f.attach(uid));
            }
            f
        };
        // libc, mapped by two users' 30 processes; the attacker's file by
        // 1,000 of nobody's.
        let libc = of(&[(0, 20), (1, 10)]);
        let forged = of(&[(65534, 1000)]);
        let within = |_| false;
        assert!(!libc.yields_to(&forged, within));
        // Another user's program: only while that user is over its share.
        let program = of(&[(1, 1)]);
        assert!(!program.yields_to(&forged, within));
        assert!(program.yields_to(&forged, |uid| uid == 1));
        // Among one user's own tables, the old rule.
        let old = of(&[(65534, 1)]);
        assert!(old.yields_to(&forged, within));
        let mut gone = of(&[(1, 1)]);
        gone.detach(1);
        assert_eq!((gone.users, gone.owner()), (0, None));
        assert!(gone.yields_to(&program, within));
    }
}
