//! Who may take whose rows of the unwind row array: per-user shares, so
//! that one user's churn of binaries evicts only that user's tables.
//!
//! A loaded table is charged to the users (euids) whose registered
//! processes map it, its rows split evenly among them (a shared libc costs
//! each of its users a part, and the users' charges sum to the rows in
//! use); a table no registered process maps any more stays charged to the
//! user whose process mapped it last until it is evicted, so a user's
//! short-lived programs weigh on that user's share after they end.
//!
//! A user's share is an even share of the array among the users with
//! charges (the asking user counted), at least 1/[`MIN_USER_SHARE`]. When a
//! table does not fit, these may make room for it:
//! - tables no live process maps (of anyone: they help no stack now);
//! - the asking users' own tables, worth less than the new one (fewer
//!   processes for which it is vital, then fewer processes, then idle
//!   longer: equals do not take turns);
//! - other users' tables, only while each of those users is over its share
//!   and the asking user stays within its own with the new table.
//!
//! A table more users map than the new one never gives way to it, and
//! among the tables that may, the cheapest run goes first ([`Cost`]):
//! other users' excess before the asker's own, then tables that are no
//! process's main executable or runtime library ([`vital_keys`]) first.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::space::Cost;
use crate::process::files::{ExecMapping, FileKey};

/// A table's processes ran within this long: it counts as in use (evicting
/// it costs more).
const IDLE_AFTER: Duration = Duration::from_secs(10);

/// The least share of the row array a user keeps however many users hold
/// tables (a fraction: 1/N).
pub(super) const MIN_USER_SHARE: u64 = 8;

/// Runtime libraries nearly every stack of the processes mapping them walks
/// through (file name prefixes): the C library and the loader, the C++
/// runtime, and the JVM's and CPython's interpreters.
const RUNTIMES: [&str; 9] = [
    "libc.so",
    "libc-",
    "ld-linux",
    "ld-musl",
    "ld-2.",
    "libpthread",
    "libstdc++.so",
    "libjvm.so",
    "libpython",
];

/// Whether the file at `path` (as `/proc/PID/maps` shows it) is a runtime
/// library ([`RUNTIMES`]).
pub(super) fn is_runtime(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    RUNTIMES.iter().any(|r| name.starts_with(r))
}

/// The files a process cannot lose without losing most of its stacks: its
/// main executable (the file mapped lowest: the kernel loads the program
/// below the libraries) and its runtime libraries. A process naming its
/// own files so gains nothing against other users: only the order in
/// which its own tables go.
pub(super) fn vital_keys(mappings: &[ExecMapping]) -> Vec<FileKey> {
    let main = mappings.iter().min_by_key(|m| m.start).map(|m| m.key);
    let mut keys: Vec<FileKey> = mappings
        .iter()
        .filter(|m| Some(m.key) == main || is_runtime(&m.path))
        .map(|m| m.key)
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// A table as the share rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holding {
    /// The users it is charged to, sorted: those whose registered
    /// processes map it, or else the one whose process mapped it last.
    pub users: Vec<u32>,
    /// Whether a registered process maps it.
    pub live: bool,
    /// Processes for which it is the main executable or a runtime library.
    pub vital: u32,
    /// Registered processes mapping it.
    pub processes: u32,
    /// Last time one of them was seen.
    pub used: Instant,
}

impl Holding {
    /// Its worth against another table of the same users: vital first.
    fn worth(&self) -> (bool, u32, Instant) {
        (self.vital > 0, self.processes, self.used)
    }

    /// What evicting this table (`len` slots) for a table that claims it
    /// so costs at `now`.
    pub fn cost(&self, len: u32, now: Instant, claim: Claim) -> Cost {
        Cost {
            own: u64::from(claim == Claim::Own),
            vital: u64::from(self.vital > 0),
            users: u64::from(self.processes),
            active: u64::from(now.duration_since(self.used) < IDLE_AFTER),
            rows: u64::from(len),
        }
    }
}

/// A loaded table: where it is in the array, and whose it is.
pub(super) struct Loaded<K> {
    pub key: K,
    pub start: u32,
    pub len: u32,
    pub holding: Holding,
}

/// Rows charged to each user, against the array's capacity.
#[derive(Debug, Default)]
pub(super) struct Charges {
    capacity: u64,
    rows: HashMap<u32, u64>,
}

impl Charges {
    /// The charges of the `tables` loaded in an array of `capacity` slots.
    pub fn new<K>(capacity: u32, tables: &[Loaded<K>]) -> Charges {
        let mut rows: HashMap<u32, u64> = HashMap::new();
        for t in tables {
            let (users, len) = (&t.holding.users, t.len);
            let n = users.len() as u64;
            if n == 0 {
                continue;
            }
            for (i, uid) in users.iter().enumerate() {
                // Split evenly; the remainder to the first users.
                let part = u64::from(len) / n + u64::from((i as u64) < u64::from(len) % n);
                *rows.entry(*uid).or_insert(0) += part;
            }
        }
        Charges {
            capacity: u64::from(capacity),
            rows,
        }
    }

    /// Rows charged to `uid`.
    pub fn rows(&self, uid: u32) -> u64 {
        self.rows.get(&uid).copied().unwrap_or(0)
    }

    /// The users with charges.
    pub fn users(&self) -> impl Iterator<Item = u32> + '_ {
        self.rows.keys().copied()
    }

    /// A user's share while `asking` (the users of a table placed) count
    /// among the users: even among them all, at least the floor.
    pub fn share(&self, asking: &[u32]) -> u64 {
        let new = asking.iter().filter(|u| !self.rows.contains_key(u)).count();
        let users = (self.rows.len() + new).max(1) as u64;
        (self.capacity / users)
            .max(self.capacity / MIN_USER_SHARE)
            .min(self.capacity)
    }

    /// Whether one of `asking` stays within its share with its part of a
    /// table of `len` rows.
    fn within(&self, asking: &[u32], len: u32) -> bool {
        let share = self.share(asking);
        let part = u64::from(len) / asking.len().max(1) as u64;
        asking.iter().any(|u| self.rows(*u) + part <= share)
    }

    /// Whether `uid` holds more than its share while `asking` count.
    fn over(&self, uid: u32, asking: &[u32]) -> bool {
        self.rows(uid) > self.share(asking)
    }
}

/// Why a loaded table may give way to a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Claim {
    /// No registered process maps it.
    Unused,
    /// Its users are all over their share (or ask).
    Excess,
    /// It is the asking users' own, worth less than the new table.
    Own,
}

/// Whether `victim` may be evicted for `asking`'s table of `len` rows,
/// and why (see the module's rules); `None`: it stays.
pub(super) fn claim(
    victim: &Holding,
    asking: &Holding,
    len: u32,
    charges: &Charges,
) -> Option<Claim> {
    if !victim.live {
        return Some(Claim::Unused);
    }
    if victim.users.len() > asking.users.len() {
        return None;
    }
    let others: Vec<u32> = victim
        .users
        .iter()
        .copied()
        .filter(|u| !asking.users.contains(u))
        .collect();
    if others.is_empty() {
        return (victim.worth() < asking.worth()).then_some(Claim::Own);
    }
    let taken_back = charges.within(&asking.users, len)
        && others.iter().all(|u| charges.over(*u, &asking.users));
    taken_back.then_some(Claim::Excess)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const NOBODY: u32 = 65534;

    fn holding(users: &[u32], live: bool, vital: u32, idle: u64) -> Holding {
        let now = Instant::now() + Duration::from_secs(1000);
        Holding {
            users: users.to_vec(),
            live,
            vital,
            processes: u32::from(live),
            used: now - Duration::from_secs(idle),
        }
    }

    /// The charges in an array of 1000 slots of tables (users, rows).
    fn charges(tables: &[(&[u32], u32)]) -> Charges {
        let loaded: Vec<Loaded<()>> = tables
            .iter()
            .map(|(users, len)| Loaded {
                key: (),
                start: 0,
                len: *len,
                holding: holding(users, true, 0, 0),
            })
            .collect();
        Charges::new(1000, &loaded)
    }

    #[test]
    fn a_shared_table_is_split_among_its_users() {
        let c = charges(&[(&[0], 100), (&[0, NOBODY], 31)]);
        assert_eq!(c.rows(0), 116);
        assert_eq!(c.rows(NOBODY), 15);
        assert_eq!(c.rows(7), 0);
        // Two users: half each; a third asking: a third.
        assert_eq!(c.share(&[0]), 500);
        assert_eq!(c.share(&[7]), 333);
        // The floor among many users.
        let users: Vec<[u32; 1]> = (0..20).map(|u| [u]).collect();
        let many: Vec<(&[u32], u32)> = users.iter().map(|u| (&u[..], 10)).collect();
        let c = charges(&many);
        assert_eq!(c.share(&[99]), 125);
    }

    #[test]
    fn one_users_churn_takes_only_its_own_and_unused_tables() {
        // Root's program (vital, running) holds 300 rows; nobody's ended
        // binaries still weigh on nobody's share: 700 rows of 1000.
        let program = holding(&[0], true, 1, 0);
        let mut tables: Vec<(&[u32], u32)> = vec![(&[0], 300)];
        tables.extend((0..7).map(|_| (&[NOBODY][..], 100)));
        let c = charges(&tables);
        let new_binary = holding(&[NOBODY], true, 1, 0);
        assert_eq!(claim(&program, &new_binary, 100, &c), None);
        // Nobody's ended binaries go, and its idler running ones.
        let ended = holding(&[NOBODY], false, 0, 5);
        assert_eq!(claim(&ended, &new_binary, 100, &c), Some(Claim::Unused));
        let idler = holding(&[NOBODY], true, 1, 30);
        assert_eq!(claim(&idler, &new_binary, 100, &c), Some(Claim::Own));
        // Equals do not take turns; a plugin never evicts a main binary.
        let same = holding(&[NOBODY], true, 1, 0);
        assert_eq!(claim(&same, &new_binary, 100, &c), None);
        let plugin = holding(&[NOBODY], true, 0, 0);
        assert_eq!(claim(&idler, &plugin, 100, &c), None);
        // Root, within its share, takes nobody's excess back.
        let roots_new = holding(&[0], true, 1, 0);
        assert_eq!(claim(&same, &roots_new, 100, &c), Some(Claim::Excess));
        // ... but not past its own share.
        assert_eq!(claim(&same, &roots_new, 300, &c), None);
    }

    #[test]
    fn a_user_over_its_share_gives_way_even_with_vital_tables() {
        let c = charges(&[(&[0], 800), (&[NOBODY], 100)]);
        let root_main = holding(&[0], true, 1, 0);
        let nobodys = holding(&[NOBODY], true, 1, 0);
        assert_eq!(claim(&root_main, &nobodys, 100, &c), Some(Claim::Excess));
        // A table more users map never gives way to one fewer map.
        let libc = holding(&[0, 1], true, 2, 0);
        assert_eq!(claim(&libc, &nobodys, 100, &c), None);
        // Shared by root and nobody, asked for by nobody: root is over.
        let shared = holding(&[0, NOBODY], true, 0, 0);
        let nobody_and_1 = holding(&[1, NOBODY], true, 1, 0);
        assert_eq!(claim(&shared, &nobody_and_1, 100, &c), Some(Claim::Excess));
    }

    fn mapping(start: u64, inode: u64, path: &str) -> ExecMapping {
        ExecMapping {
            start,
            end: start + 0x1000,
            offset: 0,
            key: FileKey { dev: 1, inode },
            path: path.into(),
        }
    }

    #[test]
    fn the_main_executable_and_runtime_libraries_are_vital() {
        let maps = [
            mapping(0x7f00_0000_0000, 3, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            mapping(0x7f00_1000_0000, 4, "/usr/lib/x86_64-linux-gnu/libz.so.1"),
            mapping(0x5555_0000_0000, 1, "/usr/bin/prog"),
            mapping(0x5555_0001_0000, 1, "/usr/bin/prog"),
            mapping(0x7f00_2000_0000, 5, "/opt/jdk/lib/server/libjvm.so"),
            mapping(0x7f00_3000_0000, 6, "/lib64/ld-linux-x86-64.so.2"),
            mapping(0x7f00_4000_0000, 7, "/usr/lib/libpython3.11.so.1.0"),
        ];
        let inodes: Vec<u64> = vital_keys(&maps).iter().map(|k| k.inode).collect();
        assert_eq!(inodes, [1, 3, 5, 6, 7]);
        assert!(!is_runtime("/usr/lib/libcrypto.so.3"));
        assert!(is_runtime("libc-2.31.so"));
        assert!(vital_keys(&[]).is_empty());
    }
}
