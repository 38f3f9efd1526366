//! What `/healthz`, open to every local user, shows a reader of the
//! processes it names: a user other than root reads their own processes,
//! and the others only as a count ([`crate::profile::report::disclosure`]).

use std::time::SystemTime;

use crate::{
    budget::cpu,
    profile::report::disclosure::{Hidden, Sight},
    state::Health,
    untrusted::refusals,
    unwind::stats::{PartialProcess, ProcessMissing, UserTables},
};

/// Why the daemon is degraded now ([`refusals::degradations`]), naming
/// the processes `sight` may see and counting the others, as of their
/// last refusal, in one `[other users] ×N`.
pub fn degraded(sight: &Sight) -> Vec<String> {
    refusals::degradations()
        .iter()
        .map(|d| {
            let mut hidden = Hidden::default();
            let mut whose: Vec<String> = Vec::new();
            for &(pid, times, at) in &d.payers {
                if sight.sees(pid, at) {
                    whose.push(refusals::named(pid, times));
                } else {
                    hidden.note(pid);
                }
            }
            if !hidden.is_empty() {
                whose.push(hidden.label());
            }
            d.line(&whose)
        })
        .collect()
}

/// `/healthz` `user_cpu` as `sight` may read it: a user other than root
/// sees their own account, the others only as a count.
pub fn user_cpu(mut report: cpu::Report, sight: &Sight) -> cpu::Report {
    let before = report.users.len();
    report.users.retain(|u| sight.sees_user(u.uid));
    report.other_users = before - report.users.len();
    report
}

/// `health` with the processes lacking unwind tables that `sight` may not
/// see summed into one entry: `[other users] ×N` (pid 0), their files
/// counted in `more_files`, none named; the same for the processes with
/// partial stacks, and the other users' unwind figures summed into one
/// entry without a uid.
pub fn health(mut health: Health, sight: &Sight) -> Health {
    if !sight.limited() {
        return health;
    }
    let now = SystemTime::now();
    let unwind = &mut health.unwind;
    unwind.partial = partial(std::mem::take(&mut unwind.partial), sight, now);
    unwind.users = users(std::mem::take(&mut unwind.users), sight.uid());
    let mut hidden = Hidden::default();
    let mut files = 0;
    health.unwind.missing.retain(|m| {
        let shown = sight.sees(m.pid, now);
        if !shown {
            hidden.note(m.pid);
            files += m.files.len() + m.more_files;
        }
        shown
    });
    if !hidden.is_empty() {
        health.unwind.missing.push(ProcessMissing {
            pid: 0,
            name: hidden.label(),
            files: Vec::new(),
            more_files: files,
        });
    }
    health
}

/// `partial` with the processes `sight` may not see in one entry (pid 0).
fn partial(all: Vec<PartialProcess>, sight: &Sight, now: SystemTime) -> Vec<PartialProcess> {
    let mut hidden = Hidden::default();
    let mut others = PartialProcess {
        pid: 0,
        name: String::new(),
        tables_evicted: 0,
        files_evicted: 0,
        files_no_room: 0,
    };
    let mut shown: Vec<PartialProcess> = all
        .into_iter()
        .filter(|p| {
            let seen = sight.sees(p.pid, now);
            if !seen {
                hidden.note(p.pid);
                others.tables_evicted += p.tables_evicted;
                others.files_evicted += p.files_evicted;
                others.files_no_room += p.files_no_room;
            }
            seen
        })
        .collect();
    if !hidden.is_empty() {
        others.name = hidden.label();
        shown.push(others);
    }
    shown
}

/// `users` with every user but `own` summed into one entry without a uid.
fn users(all: Vec<UserTables>, own: Option<u32>) -> Vec<UserTables> {
    let (mut shown, rest): (Vec<UserTables>, Vec<UserTables>) = all
        .into_iter()
        .partition(|u| u.uid.is_some() && u.uid == own);
    if !rest.is_empty() {
        let mut sum = UserTables::default();
        rest.iter().for_each(|u| sum.add(u));
        shown.push(sum);
    }
    shown
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        profile::report::disclosure::Reader,
        untrusted::refusals::{Reason, What},
        unwind::stats::{Missing, MissingFile},
    };

    #[test]
    fn other_users_processes_lacking_tables_are_a_count() {
        let mut health = Health::default();
        let lacking = |pid: u32, name: &str| ProcessMissing {
            pid,
            name: name.into(),
            files: vec![MissingFile {
                path: format!("/home/{name}/bin"),
                reason: Missing::Pending,
            }],
            more_files: 2,
        };
        health.unwind.missing = vec![lacking(10, "mine"), lacking(20, "secret"), lacking(30, "x")];
        let reader = Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(|pid| (pid == 10).then_some((1000, SystemTime::UNIX_EPOCH))),
        };
        let shown = health_of(&health, &reader);
        let text = format!("{:?}", shown.unwind.missing);
        assert!(!text.contains("secret") && !text.contains("20"), "{text}");
        assert_eq!(shown.unwind.missing.len(), 2);
        assert_eq!(shown.unwind.missing[0].pid, 10);
        let others = &shown.unwind.missing[1];
        assert_eq!((others.pid, others.name.as_str()), (0, "[other users] ×2"));
        assert_eq!((others.files.len(), others.more_files), (0, 6));
        assert_eq!(health_of(&health, &Reader::All).unwind.missing.len(), 3);
    }

    #[test]
    fn other_users_unwind_figures_and_partial_processes_are_sums() {
        let mut health = Health::default();
        let partial = |pid: u32, name: &str| PartialProcess {
            pid,
            name: name.into(),
            tables_evicted: 2,
            files_evicted: 1,
            files_no_room: 1,
        };
        health.unwind.partial = vec![partial(10, "mine"), partial(20, "secret")];
        let user = |uid: u32, rows: u64| UserTables {
            uid: Some(uid),
            rows,
            evictions_caused: rows / 10,
            ..UserTables::default()
        };
        health.unwind.users = vec![user(0, 50), user(1000, 20), user(65534, 30)];
        let reader = Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(|pid| (pid == 10).then_some((1000, SystemTime::UNIX_EPOCH))),
        };
        let shown = health_of(&health, &reader).unwind;
        let text = format!("{:?} {:?}", shown.partial, shown.users);
        assert!(
            !text.contains("secret") && !text.contains("65534"),
            "{text}"
        );
        assert_eq!(shown.partial[0].pid, 10);
        assert_eq!(shown.partial[1].name, "[other users] ×1");
        assert_eq!(shown.partial[1].tables_evicted, 2);
        assert_eq!(shown.users.len(), 2);
        assert_eq!((shown.users[0].uid, shown.users[0].rows), (Some(1000), 20));
        let others = &shown.users[1];
        assert_eq!(
            (others.uid, others.rows, others.evictions_caused),
            (None, 80, 8)
        );
        let all = health_of(&health, &Reader::All).unwind;
        assert_eq!((all.users.len(), all.partial.len()), (3, 2));
    }

    fn health_of(health: &Health, reader: &Reader) -> Health {
        self::health(health.clone(), &reader.sight())
    }

    #[test]
    fn a_user_reads_other_users_degraded_processes_as_a_count() {
        for pid in [5151, 5252, 5353, 5252] {
            refusals::count_for(What::Elf, Reason::Budget, pid);
        }
        let reader = crate::profile::report::disclosure::Reader::User {
            uid: Some(1000),
            owner_of: std::sync::Arc::new(|pid| {
                (pid == 5151).then_some((1000, std::time::SystemTime::UNIX_EPOCH))
            }),
        };
        let why = degraded(&reader.sight()).join("\n");
        assert!(
            // Other tests of this process may count `elf` `budget` too.
            why.contains("elf budget for pid 5151 (1x), [other users] ×"),
            "{why}"
        );
        assert!(!why.contains("5252") && !why.contains("5353"), "{why}");
        let root = degraded(&Sight::all()).join("\n");
        assert!(root.contains("pid 5252 (2x)"), "{root}");
    }

    #[test]
    fn a_user_reads_their_own_cpu_budget_and_the_others_as_a_count() {
        let account = |uid: u32| cpu::UserCpu {
            uid,
            name: None,
            pool: cpu::Pool::of(uid),
            share_ms_per_s: 5.0,
            balance_ms: 1.0,
            cpu_ms_last_minute: 2.0,
            units_last_minute: 3,
            refused_last_minute: 0,
            cpu_ms_total: 2.0,
            units_total: 3,
            refused_total: Default::default(),
        };
        let report = cpu::Report {
            pool_ms_per_s: 10.0,
            burst_s: 5,
            users: vec![account(0), account(1000), account(65534)],
            other_users: 0,
        };
        let reader = Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(|_| None),
        };
        let shown = user_cpu(report.clone(), &reader.sight());
        let uids: Vec<u32> = shown.users.iter().map(|u| u.uid).collect();
        assert_eq!((uids, shown.other_users), (vec![1000], 2));
        let root = user_cpu(report, &Sight::all());
        assert_eq!((root.users.len(), root.other_users), (3, 0));
    }
}
