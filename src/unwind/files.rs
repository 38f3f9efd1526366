//! What the registry knows of each file: its table's state, how many
//! processes use it, and how a table is laid out in the row array.

use std::collections::HashMap;
use std::{sync::Arc, time::Instant};

use crate::{bpf::abi::UnwindRow, process::files::ExecMapping};

use super::{fair::Holding, stats::Missing, table::UnwindTable};

/// `p_vaddr - p_offset` of the segment `m` maps in `pid`, as its file's
/// headers say, expressed as the shift from file offset to address.
pub(super) fn delta_of(pid: u32, m: &ExecMapping) -> Option<i64> {
    let file = m.open(pid).ok()?;
    let bias = super::table::load_bias_of(&file, m.start, m.offset).ok()?;
    Some(m.start.wrapping_sub(m.offset).wrapping_sub(bias) as i64)
}

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
    /// The same by user (euid): how many of each user's processes. Once
    /// none maps it, the user whose process detached last stays, with 0:
    /// the table is charged to that user until evicted.
    pub owners: HashMap<u32, u32>,
    /// Of them, those for which it is the main executable or a runtime
    /// library ([`super::fair::vital_keys`]).
    pub vital: u32,
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
            vital: 0,
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

    /// One more process of `uid` maps it (`vital`: as its main
    /// executable or a runtime library).
    pub fn attach(&mut self, uid: u32, vital: bool) {
        if self.users == 0 {
            self.owners.clear();
        }
        self.users += 1;
        self.vital += u32::from(vital);
        *self.owners.entry(uid).or_insert(0) += 1;
    }

    /// One process of `uid` no longer maps it.
    pub fn detach(&mut self, uid: u32, vital: bool) {
        self.users = self.users.saturating_sub(1);
        self.vital = self.vital.saturating_sub(u32::from(vital));
        if let Some(n) = self.owners.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 && self.users > 0 {
                self.owners.remove(&uid);
            }
        }
        if self.users == 0 {
            self.owners.retain(|u, _| *u == uid);
        }
    }

    /// The table as the share rule sees it ([`super::fair`]).
    pub fn holding(&self) -> Holding {
        let mut users: Vec<u32> = self.owners.keys().copied().collect();
        users.sort_unstable();
        Holding {
            users,
            live: self.users > 0,
            vital: self.vital,
            processes: self.users,
            used: self.used,
        }
    }

    /// The user charged for evictions this table causes: the one with the
    /// most processes mapping it (the lowest uid among equals).
    pub fn payer(&self) -> Option<u32> {
        self.owners
            .iter()
            .max_by_key(|(uid, n)| (**n, std::cmp::Reverse(**uid)))
            .map(|(uid, _)| *uid)
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
    fn a_table_is_charged_to_its_last_user_once_unused() {
        let now = Instant::now();
        let mut f = FileEntry::new("f".into(), now);
        f.attach(0, true);
        f.attach(65534, false);
        f.attach(65534, false);
        let h = f.holding();
        assert_eq!(
            (h.users, h.live, h.vital, h.processes),
            (vec![0, 65534], true, 1, 3)
        );
        assert_eq!(f.payer(), Some(65534), "most processes");
        f.detach(0, true);
        f.detach(65534, false);
        f.detach(65534, false);
        let h = f.holding();
        assert_eq!((h.users, h.live, h.vital), (vec![65534], false, 0));
        assert_eq!(f.payer(), Some(65534));
    }
}
