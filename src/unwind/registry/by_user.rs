//! The registry's report by user: each user's part of the row array, the
//! evictions its tables caused and suffered, and the processes whose
//! stacks are partial for want of an evicted or unplaced table.

use std::collections::{HashMap, HashSet};

use super::{
    super::{
        accounts::{top_partial, top_users, PartialProcess, UserTables, OTHERS},
        stats::{Lacking, Missing},
    },
    Registry,
};

impl Registry {
    /// Fills `users`, `partial` and `processes_partial` of the stats from
    /// the processes `lacking` tables now.
    pub(super) fn report_users(&mut self, lacking: &[Lacking]) {
        let mut partial = Vec::new();
        let mut partial_of: HashMap<u32, u64> = HashMap::new();
        for l in lacking {
            let of = |why| l.files.iter().filter(|(_, w)| *w == why).count() as u64;
            let (evicted, no_room) = (of(Missing::Evicted), of(Missing::NoRoom));
            if evicted + no_room == 0 {
                continue;
            }
            let Some(p) = self.procs.get(&l.pid) else {
                continue;
            };
            *partial_of.entry(p.uid).or_insert(0) += 1;
            let entry = PartialProcess {
                pid: l.pid,
                name: p.name.clone(),
                tables_evicted: u64::from(p.tables_evicted),
                files_evicted: evicted,
                files_no_room: no_room,
            };
            partial.push((entry, l.seen));
        }
        self.stats.processes_partial = partial.len() as u64;
        self.stats.partial = top_partial(partial);

        let (_, charges) = self.loaded();
        let mut processes: HashMap<u32, u64> = HashMap::new();
        for p in self.procs.values() {
            *processes.entry(p.uid).or_insert(0) += 1;
        }
        let uids: HashSet<u32> = charges
            .users()
            .chain(self.accounts.users())
            .chain(processes.keys().copied())
            .collect();
        let users = uids
            .into_iter()
            .map(|uid| {
                UserTables {
                    uid: (uid != OTHERS).then_some(uid),
                    rows: charges.rows(uid),
                    share: charges.share(&[uid]),
                    processes: processes.get(&uid).copied().unwrap_or(0),
                    processes_partial: partial_of.get(&uid).copied().unwrap_or(0),
                    ..UserTables::default()
                }
                .with_counts(self.accounts.get(uid))
            })
            .collect();
        self.stats.users = top_users(users);
    }
}
