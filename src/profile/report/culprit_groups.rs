//! The culprits past those a "kept off the CPU by" list names, grouped
//! before they are summed into its `[rest]`: by cgroup (a service, a
//! container, a build: many processes of many names), and, outside a
//! known cgroup, by name with its numbers as `*` (`kworker/*:*`, the
//! `[pid *]` of processes whose name was not recorded). A busy host's
//! thousand small culprits then read as the few things that took the CPU,
//! and the `[rest]` that remains is small.

use std::collections::HashMap;

use super::culprits::{share, Culprit, LISTED_PIDS};

/// Names a grouped row lists before `+N`.
const LISTED_NAMES: usize = 3;

/// What culprits are grouped by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Cgroup(String),
    Family(String),
    /// A row that is no process of its own (`[idle]`, `[other CPU]`,
    /// `[others]`, another user's processes): never grouped.
    Alone(String),
}

/// `all` (culprits with their nanoseconds, most first, more than
/// `listed`) with the culprits alike grouped, of `total` nanoseconds in
/// all: those of every kind that two or more past the first `listed` are
/// of. One of the first `listed` joins its kind's group when it took less
/// than the group (it would leave the list to it), else it keeps its row:
/// a hog stays named beside the small ones of its cgroup.
pub fn group(all: Vec<(u64, Culprit)>, listed: usize, total: u64) -> Vec<(u64, Culprit)> {
    let keys: Vec<Key> = all.iter().map(|(_, c)| key(c)).collect();
    let mut past: HashMap<&Key, (usize, u64)> = HashMap::new();
    for (k, (ns, _)) in keys.iter().zip(&all).skip(listed) {
        let p = past.entry(k).or_default();
        (p.0, p.1) = (p.0 + 1, p.1 + ns);
    }
    let joins = |i: usize, key: &Key, ns: u64| match past.get(key) {
        Some(&(n, sum)) if n >= 2 => i >= listed || ns < sum,
        _ => false,
    };
    let mut groups: HashMap<Key, Vec<(u64, Culprit)>> = HashMap::new();
    let mut order = Vec::new();
    let mut out = Vec::new();
    for (i, (key, culprit)) in keys.iter().zip(all).enumerate() {
        if !joins(i, key, culprit.0) {
            out.push(culprit);
            continue;
        }
        let members = groups.entry(key.clone()).or_default();
        if members.is_empty() {
            order.push(key.clone());
        }
        members.push(culprit);
    }
    for key in order {
        let Some(members) = groups.remove(&key) else {
            continue;
        };
        out.push(match key {
            Key::Cgroup(cgroup) => merged(names(&members), Some(cgroup), &members, total),
            Key::Family(name) | Key::Alone(name) => merged(name, None, &members, total),
        });
    }
    out
}

fn key(c: &Culprit) -> Key {
    match &c.cgroup {
        Some(cgroup) => Key::Cgroup(cgroup.clone()),
        None if is_no_process(c) => Key::Alone(c.name.clone()),
        None => Key::Family(family(&c.name)),
    }
}

/// Whether `c` stands for no process of its own.
fn is_no_process(c: &Culprit) -> bool {
    c.name.starts_with('[') && !c.name.starts_with("[pid ")
}

/// `name` with every run of digits as one `*`.
fn family(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for ch in name.chars() {
        match ch.is_ascii_digit() {
            true if out.ends_with('*') => {}
            true => out.push('*'),
            false => out.push(ch),
        }
    }
    out
}

/// The members' names, most time first: `cc1, sh, as +4`.
fn names(members: &[(u64, Culprit)]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for (_, c) in members {
        if !names.contains(&c.name.as_str()) {
            names.push(&c.name);
        }
    }
    let more = names.len().saturating_sub(LISTED_NAMES);
    let mut out = names[..names.len().min(LISTED_NAMES)].join(", ");
    if more > 0 {
        out.push_str(&format!(" +{more}"));
    }
    out
}

fn merged(
    name: String,
    cgroup: Option<String>,
    members: &[(u64, Culprit)],
    total: u64,
) -> (u64, Culprit) {
    let ns: u64 = members.iter().map(|m| m.0).sum();
    let pids = members.iter().flat_map(|m| m.1.pids.iter().copied());
    let culprit = Culprit {
        name,
        cgroup,
        processes: members.iter().map(|m| m.1.processes).sum(),
        pids: pids.take(LISTED_PIDS).collect(),
        us: members.iter().map(|m| m.1.us).sum(),
        share: share(ns, total),
    };
    (ns, culprit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn culprit(name: &str, cgroup: Option<&str>, pid: u32, ms: u64) -> (u64, Culprit) {
        let c = Culprit {
            name: name.into(),
            cgroup: cgroup.map(str::to_string),
            processes: 1,
            pids: vec![pid],
            us: ms * 1000,
            share: 0.0,
        };
        (ms * 1_000_000, c)
    }

    #[test]
    fn alike_culprits_are_grouped_by_cgroup_then_by_name() {
        let build = Some("/system.slice/build.service");
        let mut tail = vec![
            culprit("cc1", build, 10, 30),
            culprit("kworker/0:1", None, 3, 5),
            culprit("as", build, 11, 20),
            culprit("kworker/1:2", None, 4, 5),
            culprit("sh", build, 12, 10),
            culprit("ld", build, 13, 5),
            culprit("[idle]", None, 0, 4),
            culprit("lonely", Some("/user.slice"), 14, 3),
        ];
        tail[6].1.pids.clear();
        let total = 100_000_000;
        let grouped = group(tail, 0, total);
        let by_name = |n: &str| grouped.iter().find(|g| g.1.name == n).unwrap();
        let b = &by_name("cc1, as, sh +1").1;
        assert_eq!((b.processes, b.us, b.share), (4, 65_000, 0.65));
        assert_eq!(b.cgroup, build.map(str::to_string));
        assert_eq!(b.pids, [10, 11, 12, 13]);
        let k = &by_name("kworker/*:*").1;
        assert_eq!(
            (k.processes, k.us, k.pids.as_slice()),
            (2, 10_000, &[3, 4][..])
        );
        assert_eq!(by_name("[idle]").1.us, 4_000);
        assert_eq!(by_name("lonely").1.cgroup.as_deref(), Some("/user.slice"));
        assert_eq!(grouped.len(), 4);
        // Nothing is lost.
        assert_eq!(grouped.iter().map(|g| g.0).sum::<u64>(), 82_000_000);
    }

    #[test]
    fn a_hog_keeps_its_row_beside_the_small_ones_of_its_cgroup() {
        let app = Some("/app");
        let all = vec![
            culprit("hog", app, 1, 50),
            culprit("small", app, 2, 8),
            culprit("a", app, 3, 5),
            culprit("b", app, 4, 5),
        ];
        let grouped = group(all.clone(), 2, 68_000_000);
        let names: Vec<&str> = grouped.iter().map(|g| g.1.name.as_str()).collect();
        assert_eq!(names, ["hog", "small, a, b"]);
        // Smaller than the rest of its kind, it joins them.
        let mut all = all;
        all[0].0 = 5_000_000;
        let grouped = group(all, 2, 23_000_000);
        let names: Vec<&str> = grouped.iter().map(|g| g.1.name.as_str()).collect();
        assert_eq!(names, ["hog, small, a +1"]);
    }

    #[test]
    fn families_star_every_number() {
        assert_eq!(family("kworker/u8:3H"), "kworker/u*:*H");
        assert_eq!(family("[pid 1234]"), "[pid *]");
        assert_eq!(family("nginx"), "nginx");
    }
}
