//! Where tables go: which file to build next, placing a built table in
//! the row array, and which tables give way when it does not fit.

use std::{cmp::Reverse, time::Instant};

use super::{
    super::{
        batch::set_rows,
        fair::{claim, Charges, Loaded},
        files::{layout, TablePlace, TableState},
        held,
        space::{cheapest_room, Placed},
        stats::Missing,
        table::{load_bias_of, TableError, UnwindTable},
    },
    Registry, EVICTED_COOLDOWN, MAX_TABLE_SHARE, RETRY_AFTER,
};
use crate::{
    bpf::abi::UNWIND_MAX_TABLE_ROWS,
    process::files::{ExecMapping, FileKey},
    untrusted::{
        refusals::{self, Reason, What},
        OpenError,
    },
};

impl Registry {
    /// The next table to build: the newest file (a process started now
    /// does not wait behind the backlog), or the most shared one (libc
    /// before a plugin), each then by the other and by how lately its
    /// processes ran. Tables left out before come back only once room can
    /// be made for them, and none is built while no room can be made.
    pub(super) fn next_build(&mut self, now: Instant, newest: bool) -> Option<FileKey> {
        let due = |at: Option<Instant>| at.is_none_or(|t| now.duration_since(t) >= RETRY_AFTER);
        let mut candidates: Vec<(FileKey, Option<u32>)> = self
            .files
            .iter()
            .filter(|(_, f)| f.users > 0 && due(f.tried))
            .filter_map(|(k, f)| match f.state {
                TableState::Pending => Some((*k, None)),
                TableState::Out { why, len, at } => {
                    let wait = if why == Missing::Evicted {
                        EVICTED_COOLDOWN
                    } else {
                        RETRY_AFTER
                    };
                    (now.duration_since(at) >= wait).then_some((*k, Some(len)))
                }
                _ => None,
            })
            .collect();
        let files = &self.files;
        if newest {
            candidates
                .sort_by_key(|(k, _)| Reverse((files[k].since, files[k].users, files[k].used)));
        } else {
            candidates
                .sort_by_key(|(k, _)| Reverse((files[k].users, files[k].used, files[k].since)));
        }
        let loaded = self.loaded();
        for (key, out) in candidates {
            // A new file's size is unknown: without room for one row,
            // building it would be in vain (it counts as left out, though
            // it might have needed no table).
            let len = out.unwrap_or(1);
            if self.victims(key, len, now, &loaded).is_some() {
                return Some(key);
            }
            if out.is_none() {
                self.stats.tables_no_room += 1;
            }
            if let Some(f) = self.files.get_mut(&key) {
                let why = match f.state {
                    TableState::Out { why, .. } => why,
                    _ => Missing::NoRoom,
                };
                f.state = TableState::Out { why, len, at: now };
            }
        }
        None
    }

    /// Builds and loads `key`'s table, opening the file through a process
    /// that maps it, and gives it to the processes that map it.
    pub(super) fn build(&mut self, key: FileKey, now: Instant) {
        let Some(f) = self.files.get_mut(&key) else {
            return;
        };
        f.tried = Some(now);
        let was_pending = matches!(f.state, TableState::Pending);
        let through: Vec<(u32, ExecMapping)> = self
            .procs
            .iter()
            .filter_map(|(pid, p)| Some((*pid, p.mappings.iter().find(|m| m.key == key)?.clone())))
            .take(4)
            .collect();
        let mut opened = None;
        for (pid, m) in through {
            match m.open(pid) {
                Ok(file) => {
                    opened = Some(Ok((file, m)));
                    break;
                }
                // A process that exits while its mappings are read leaves
                // nothing to open: that says nothing of the file.
                Err(OpenError::Io(err)) => tracing::debug!(pid, file = %m.path, "unwind: {err}"),
                Err(refused) => {
                    tracing::debug!(pid, "unwind: {refused}");
                    opened = Some(Err(()));
                    break;
                }
            }
        }
        let Some(opened) = opened else {
            return;
        };
        let state = match opened {
            Ok((file, m)) => {
                if let Ok(bias) = load_bias_of(&file, m.start, m.offset) {
                    let delta = m.start.wrapping_sub(m.offset).wrapping_sub(bias) as i64;
                    if let Some(f) = self.files.get_mut(&key) {
                        f.deltas.retain(|(o, _)| *o != m.offset);
                        f.deltas.push((m.offset, delta));
                    }
                }
                let max_rows =
                    held::max_build_rows((self.maps.capacity / MAX_TABLE_SHARE) as usize);
                match UnwindTable::from_file_within(&file, max_rows) {
                    Err(TableError::TooManyRows(_)) => TableState::TooBig,
                    Ok(t) => {
                        tracing::debug!(file = %m.path, rows = t.rows.len(),
                            frame_pointer_share = t.frame_pointer_share, "unwind table");
                        self.load(key, &t, now)
                    }
                    Err(err) => {
                        tracing::debug!(file = %m.path, "no unwind table: {err}");
                        TableState::Failed
                    }
                }
            }
            Err(()) => TableState::Failed,
        };
        match state {
            TableState::Failed => self.stats.tables_failed += 1,
            TableState::NotNeeded => self.stats.tables_not_needed += 1,
            TableState::TooBig => self.stats.tables_too_big += 1,
            TableState::Out { .. } => self.stats.tables_no_room += 1,
            TableState::Loaded { .. } | TableState::Pending => {}
        }
        // Its users' entries change: a table to walk with, or no longer
        // pending (a file that keeps frame pointers, or none to be had).
        let rewrite = matches!(state, TableState::Loaded { .. }) || was_pending;
        if let Some(f) = self.files.get_mut(&key) {
            f.state = state;
        }
        if rewrite {
            for pid in self.users_of(key, false) {
                self.write_entry(pid);
            }
        }
    }

    /// Puts a built table in the array, making room if it is worth it.
    fn load(&mut self, key: FileKey, table: &UnwindTable, now: Instant) -> TableState {
        if table.uses_frame_pointers() || table.rows.is_empty() {
            return TableState::NotNeeded;
        }
        let (slots, page_base, page_count) = layout(table);
        let len = match u32::try_from(slots.len()) {
            // BPF's binary search reaches UNWIND_MAX_TABLE_ROWS rows.
            Ok(len)
                if len <= self.maps.capacity / MAX_TABLE_SHARE
                    && table.rows.len() <= UNWIND_MAX_TABLE_ROWS as usize =>
            {
                len
            }
            _ => return TableState::TooBig,
        };
        let start = match self.space.allocate(len) {
            Some(start) => start,
            None => {
                let loaded = self.loaded();
                let Some(victims) = self.victims(key, len, now, &loaded) else {
                    return TableState::Out {
                        why: Missing::NoRoom,
                        len,
                        at: now,
                    };
                };
                let payer = self.files.get(&key).and_then(|f| f.payer());
                for victim in victims {
                    self.evict(victim, payer, now);
                }
                let Some(start) = self.space.allocate(len) else {
                    // Not expected: the victims made a contiguous room.
                    return TableState::Out {
                        why: Missing::NoRoom,
                        len,
                        at: now,
                    };
                };
                start
            }
        };
        if let Err(err) = set_rows(&mut self.maps.rows, start, &slots) {
            tracing::warn!("writing unwind rows: {err}");
            self.space.release(start, len);
            return TableState::Failed;
        }
        self.stats.tables_loaded += 1;
        self.stats.rows_in_use += u64::from(len);
        TableState::Loaded {
            start,
            len,
            place: TablePlace {
                index_start: start,
                row_count: table.rows.len() as u32,
                page_base,
                page_count,
            },
        }
    }

    /// The loaded tables, and the rows charged to each user for them
    /// ([`super::super::fair`]).
    pub(super) fn loaded(&self) -> (Vec<Loaded<FileKey>>, Charges) {
        let loaded: Vec<Loaded<FileKey>> = self
            .files
            .iter()
            .filter_map(|(k, f)| match f.state {
                TableState::Loaded { start, len, .. } => Some(Loaded {
                    key: *k,
                    start,
                    len,
                    holding: f.holding(),
                }),
                _ => None,
            })
            .collect();
        let charges = Charges::new(self.maps.capacity, &loaded);
        (loaded, charges)
    }

    /// The tables of `loaded` to evict so that `key`'s table (`want`
    /// slots) fits, among those it may claim ([`claim`]); `None` if that
    /// cannot make room.
    fn victims(
        &self,
        key: FileKey,
        want: u32,
        now: Instant,
        (loaded, charges): &(Vec<Loaded<FileKey>>, Charges),
    ) -> Option<Vec<FileKey>> {
        let asking = self.files.get(&key)?.holding();
        let tables: Vec<Placed<FileKey>> = loaded
            .iter()
            .filter(|t| t.key != key)
            .map(|t| Placed {
                start: t.start,
                len: t.len,
                key: t.key,
                cost: claim(&t.holding, &asking, want, charges)
                    .map(|why| t.holding.cost(t.len, now, why)),
            })
            .collect();
        cheapest_room(&self.space.free, &tables, want)
    }

    /// Frees a table's rows, for a table of `payer` (counted against that
    /// user, and against the processes that lose it); the processes using
    /// it are re-written without it first, since their entries would point
    /// at rows that will hold another table.
    fn evict(&mut self, key: FileKey, payer: Option<u32>, now: Instant) {
        let Some(f) = self.files.get_mut(&key) else {
            return;
        };
        let TableState::Loaded { start, len, .. } = f.state else {
            return;
        };
        f.state = TableState::Out {
            why: Missing::Evicted,
            len,
            at: now,
        };
        let victim = f.holding();
        self.accounts.evicted(payer, &victim);
        let losers = self.users_of(key, true);
        for pid in &losers {
            if let Some(p) = self.procs.get_mut(pid) {
                p.tables_evicted = p.tables_evicted.saturating_add(1);
            }
            self.write_entry(*pid);
        }
        if victim.live && victim.users.iter().any(|u| Some(*u) != payer) {
            // Taken back from users over their share: name one of the
            // processes that lost it, degraded by its user's own excess.
            self.stats.tables_taken_back += 1;
            let pid = losers.first().copied().unwrap_or(0);
            refusals::count_for(What::Elf, Reason::Budget, pid);
        }
        self.space.release(start, len);
        self.stats.rows_in_use -= u64::from(len);
        self.stats.tables_evicted += 1;
    }
}
