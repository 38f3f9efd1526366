//! Names: a table of a block's distinct strings (thread, process and
//! container names, cgroups, command lines; frames in a standalone block), and the
//! sections keyed by pid that refer to it. Each string is written once and
//! decoded into one `Arc<str>` that every row naming it shares, the first
//! time a row that is kept names it.

use std::{cell::OnceCell, collections::HashMap, mem::size_of, sync::Arc};

use rustc_hash::FxHashMap;

use super::{
    columns::{finish_all, put_columns, Budget, Col, KeysReader, KeysWriter, Reader},
    CodecError,
};
use strum::IntoEnumIterator;

use crate::{
    process::{
        cgroups::{V1Paths, MAX_V1_HIERARCHIES},
        container::Container,
        identity::{EntryKind, Identity},
    },
    profile::model::{Origin, Slice, ThreadInfo},
};

type Result<T> = std::result::Result<T, CodecError>;

/// The runtimes a [`Container`] may name: a decoded block maps its
/// runtime's name back to one of these `&'static str` (see
/// `process::container::container_id`).
pub const RUNTIMES: [&str; 5] = ["containerd", "cri-o", "docker", "podman", "kubelet"];

/// Bytes of an `Arc` allocation's two counts.
const ARC_HEADER: usize = 2 * size_of::<usize>();

/// The distinct strings of a block being written, by first use.
#[derive(Default)]
pub struct Strings<'s> {
    index: FxHashMap<&'s str, u64>,
    list: Vec<&'s str>,
}

impl<'s> Strings<'s> {
    pub fn id(&mut self, s: &'s str) -> u64 {
        let next = self.list.len() as u64;
        *self.index.entry(s).or_insert_with(|| {
            self.list.push(s);
            next
        })
    }

    /// An optional string: 0 for none, else its id + 1.
    pub fn opt(&mut self, s: Option<&'s str>) -> u64 {
        s.map_or(0, |s| self.id(s) + 1)
    }

    /// Their count, then the lengths and the bytes as two columns.
    pub fn put(&self, out: &mut Col) {
        let (mut lens, mut bytes) = (Col::default(), Col::default());
        for s in &self.list {
            lens.u64(s.len() as u64);
            bytes.0.extend_from_slice(s.as_bytes());
        }
        out.u64(self.list.len() as u64);
        put_columns(out, &[lens, bytes]);
    }
}

/// The strings a block's rows refer to: their bounds read and checked at
/// once, each decoded (UTF-8 checked, its bytes charged to the budget) the
/// first time a kept row names it. A decode narrowed to one process (see
/// [`super::Keep`]) then makes a few of a block's thousands of thread
/// names instead of all of them.
pub struct Names<'a> {
    bytes: &'a [u8],
    /// Where each string ends in `bytes`.
    ends: Vec<usize>,
    made: Vec<OnceCell<Arc<str>>>,
}

impl Names<'_> {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// String `i` (below [`Self::len`]).
    pub fn get(&self, i: usize, budget: &mut Budget) -> Result<Arc<str>> {
        if let Some(made) = self.made[i].get() {
            return Ok(made.clone());
        }
        let start = i.checked_sub(1).map_or(0, |j| self.ends[j]);
        let s = std::str::from_utf8(&self.bytes[start..self.ends[i]])
            .map_err(|_| CodecError::Corrupt("a name is not UTF-8"))?;
        budget.charge(ARC_HEADER + s.len())?;
        Ok(self.made[i].get_or_init(|| Arc::from(s)).clone())
    }
}

/// Reads back what [`Strings::put`] wrote.
pub fn get_strings<'a>(r: &mut Reader<'a>, budget: &mut Budget) -> Result<Names<'a>> {
    let n = count(r.u64()?)?;
    let [mut lens, mut bytes] = r.columns()?;
    let mut ends: Vec<usize> = budget.vec(n, &lens)?;
    budget.charge(n.saturating_mul(size_of::<OnceCell<Arc<str>>>()))?;
    let mut end = 0usize;
    for _ in 0..n {
        let len = count(lens.u64()?)?;
        end = end.checked_add(len).ok_or(CodecError::Truncated)?;
        ends.push(end);
    }
    let all = bytes.bytes(end)?;
    finish_all(&[lens, bytes])?;
    Ok(Names {
        bytes: all,
        ends,
        made: (0..n).map(|_| OnceCell::new()).collect(),
    })
}

pub fn count(n: u64) -> Result<usize> {
    usize::try_from(n).map_err(|_| CodecError::Corrupt("count over usize"))
}

fn name(names: &Names, r: &mut Reader, budget: &mut Budget) -> Result<Arc<str>> {
    names.get(r.index(names.len())?, budget)
}

fn opt_name(names: &Names, r: &mut Reader, budget: &mut Budget) -> Result<Option<Arc<str>>> {
    match r.opt_index(names.len())? {
        Some(i) => names.get(i, budget).map(Some),
        None => Ok(None),
    }
}

/// Inserts a decoded entry; a key twice is a corrupt block.
fn insert<V>(map: &mut HashMap<u32, V>, key: u32, v: V) -> Result<()> {
    match map.insert(key, v) {
        None => Ok(()),
        Some(_) => Err(CodecError::Corrupt("a key twice")),
    }
}

/// Entries of a map keyed by pid, in pid order.
fn by_pid<V>(map: &HashMap<u32, V>) -> Vec<(u32, &V)> {
    let mut v: Vec<(u32, &V)> = map.iter().map(|(k, v)| (*k, v)).collect();
    v.sort_unstable_by_key(|(k, _)| *k);
    v
}

/// Thread names (`threads`, keyed by tid), sorted by pid and tid.
pub fn put_threads<'s>(s: &'s Slice, strings: &mut Strings<'s>, out: &mut Col) {
    let mut rows: Vec<(u32, u32, &str)> = s
        .threads
        .iter()
        .map(|(tid, t)| (t.pid, *tid, &*t.name))
        .collect();
    rows.sort_unstable();
    let (mut keys, mut names) = (KeysWriter::default(), Col::default());
    for (pid, tid, name) in rows {
        keys.push(pid, tid);
        names.u64(strings.id(name));
    }
    let [pids, tids] = keys.finish();
    put_columns(out, &[pids, tids, names]);
}

/// Thread names; those of threads `keep` (pid, tid) refuses are read
/// past, not made.
pub fn get_threads(
    r: &mut Reader,
    n: usize,
    names: &Names,
    budget: &mut Budget,
    keep: impl Fn(u32, u32) -> bool,
) -> Result<HashMap<u32, ThreadInfo>> {
    let [pids, tids, mut col] = r.columns()?;
    let mut keys = KeysReader::new(pids, tids);
    let mut out = budget.map(n, &keys.tids)?;
    for _ in 0..n {
        let (pid, tid) = keys.next()?;
        let i = col.index(names.len())?;
        if keep(pid, tid) {
            let name = names.get(i, budget)?;
            insert(&mut out, tid, ThreadInfo { pid, name })?;
        }
    }
    keys.finish()?;
    col.finish()?;
    Ok(out)
}

/// Process names and origins, sorted by pid.
pub fn put_processes<'s>(s: &'s Slice, strings: &mut Strings<'s>, out: &mut Col) {
    let (mut pids, mut names, mut prev) = (Col::default(), Col::default(), 0);
    for (pid, name) in by_pid(&s.processes) {
        pids.delta(prev, pid.into());
        names.u64(strings.id(name));
        prev = pid.into();
    }
    let (mut opids, mut parents, mut cgroups, mut prev) =
        (Col::default(), Col::default(), Col::default(), 0);
    for (pid, o) in by_pid(&s.origins) {
        opids.delta(prev, pid.into());
        parents.u64(o.parent.into());
        cgroups.u64(strings.opt(o.cgroup.as_deref()));
        prev = pid.into();
    }
    put_columns(out, &[pids, names, opids, parents, cgroups]);
}

/// What [`put_processes`] wrote: process names and origins.
pub type Processes = (HashMap<u32, Arc<str>>, HashMap<u32, Origin>);

pub fn get_processes(
    r: &mut Reader,
    (n, n_origins): (usize, usize),
    names: &Names,
    budget: &mut Budget,
) -> Result<Processes> {
    let [mut pids, mut col, mut opids, mut parents, mut cgroups] = r.columns()?;
    let (mut processes, mut prev) = (budget.map(n, &pids)?, 0);
    for _ in 0..n {
        prev = pids.delta32(prev)?;
        insert(&mut processes, prev, name(names, &mut col, budget)?)?;
    }
    let (mut origins, mut prev) = (budget.map(n_origins, &opids)?, 0);
    for _ in 0..n_origins {
        prev = opids.delta32(prev)?;
        let parent = parents.u32()?;
        let cgroup = opt_name(names, &mut cgroups, budget)?;
        let origin = Origin {
            parent,
            cgroup,
            ..Origin::default()
        };
        insert(&mut origins, prev, origin)?;
    }
    finish_all(&[pids, col, opids, parents, cgroups])?;
    Ok((processes, origins))
}

/// Containers: each distinct one (by allocation) once, then the pids that
/// run in it, so that a decoded block's processes share it again.
pub fn put_containers<'s>(s: &'s Slice, strings: &mut Strings<'s>, out: &mut Col) {
    let mut table: FxHashMap<*const Container, u64> = FxHashMap::default();
    let mut fields: [Col; 7] = Default::default();
    let (mut pids, mut refs, mut prev) = (Col::default(), Col::default(), 0);
    for (pid, c) in by_pid(&s.containers) {
        let next = table.len() as u64;
        let i = *table.entry(Arc::as_ptr(c)).or_insert_with(|| {
            let [id, runtime, cgroup, uid, ns, pod, name] = &mut fields;
            id.u64(strings.id(&c.id));
            runtime.u64(strings.id(c.runtime));
            cgroup.u64(strings.id(&c.cgroup));
            uid.u64(strings.opt(c.pod_uid.as_deref()));
            ns.u64(strings.opt(c.namespace.as_deref()));
            pod.u64(strings.opt(c.pod.as_deref()));
            name.u64(strings.opt(c.container.as_deref()));
            next
        });
        pids.delta(prev, pid.into());
        refs.u64(i);
        prev = pid.into();
    }
    out.u64(table.len() as u64);
    put_columns(out, &fields);
    put_columns(out, &[pids, refs]);
}

pub fn get_containers(
    r: &mut Reader,
    n: usize,
    names: &Names,
    budget: &mut Budget,
) -> Result<HashMap<u32, Arc<Container>>> {
    let distinct = count(r.u64()?)?;
    let [mut id, mut runtime, mut cgroup, mut uid, mut ns, mut pod, mut cname] = r.columns()?;
    let mut table: Vec<Arc<Container>> = budget.vec(distinct, &id)?;
    for _ in 0..distinct {
        budget.charge(size_of::<Container>() + ARC_HEADER)?;
        let c = Container {
            id: text(names, &mut id, budget)?,
            runtime: runtime_of(&name(names, &mut runtime, budget)?)?,
            cgroup: text(names, &mut cgroup, budget)?,
            pod_uid: opt_text(names, &mut uid, budget)?,
            namespace: opt_text(names, &mut ns, budget)?,
            pod: opt_text(names, &mut pod, budget)?,
            container: opt_text(names, &mut cname, budget)?,
        };
        table.push(Arc::new(c));
    }
    finish_all(&[id, runtime, cgroup, uid, ns, pod, cname])?;
    let [mut pids, mut refs] = r.columns()?;
    let (mut out, mut prev) = (budget.map(n, &pids)?, 0);
    for _ in 0..n {
        prev = pids.delta32(prev)?;
        insert(&mut out, prev, table[refs.index(table.len())?].clone())?;
    }
    finish_all(&[pids, refs])?;
    Ok(out)
}

/// A name as an owned `String` (a thread's comm, a container's fields),
/// charged before it is copied.
pub fn text(names: &Names, r: &mut Reader, budget: &mut Budget) -> Result<String> {
    let s = name(names, r, budget)?;
    budget.charge(s.len())?;
    Ok(s.to_string())
}

fn opt_text(names: &Names, r: &mut Reader, budget: &mut Budget) -> Result<Option<String>> {
    let Some(s) = opt_name(names, r, budget)? else {
        return Ok(None);
    };
    budget.charge(s.len())?;
    Ok(Some(s.to_string()))
}

/// The known runtime of that name; another is an error, not a guess.
fn runtime_of(name: &str) -> Result<&'static str> {
    RUNTIMES
        .iter()
        .find(|r| **r == name)
        .copied()
        .ok_or_else(|| CodecError::Runtime(name.to_string()))
}

/// The origins' cgroup v1 paths and identities (a section of its own,
/// since version 2), in the origins' pid order: per origin its command
/// line (0: no identity), executable, program kind (0: none) and name,
/// and its count of v1 hierarchies plus one (0: not known), then every
/// hierarchy's controllers and path.
pub fn put_identities<'s>(s: &'s Slice, strings: &mut Strings<'s>, out: &mut Col) {
    let mut cols: [Col; 7] = Default::default();
    for (_, o) in by_pid(&s.origins) {
        let [cmdline, exe, kind, entry, v1_count, controllers, paths] = &mut cols;
        let identity = o.identity.as_deref();
        cmdline.u64(strings.opt(identity.map(|i| &*i.cmdline)));
        exe.u64(strings.opt(identity.and_then(|i| i.executable.as_deref())));
        let program = identity.and_then(|i| i.entry.as_ref());
        kind.u64(program.map_or(0, |(k, _)| entry_kind_code(*k)));
        entry.u64(strings.opt(program.map(|(_, n)| &**n)));
        match &o.cgroups_v1 {
            None => v1_count.u64(0),
            Some(v1) => {
                v1_count.u64(v1.iter().count() as u64 + 1);
                for (c, p) in v1.iter() {
                    controllers.u64(strings.id(c));
                    paths.u64(strings.id(p));
                }
            }
        }
    }
    put_columns(out, &cols);
}

/// A program kind's code in a block (its place among the kinds, plus one).
fn entry_kind_code(kind: EntryKind) -> u64 {
    EntryKind::iter()
        .position(|k| k == kind)
        .map_or(0, |i| i as u64 + 1)
}

/// Reads what [`put_identities`] wrote into `origins`.
pub fn get_identities(
    r: &mut Reader,
    origins: &mut HashMap<u32, Origin>,
    names: &Names,
    budget: &mut Budget,
) -> Result<()> {
    let [mut cmdline, mut exe, mut kind, mut entry, mut v1_count, mut controllers, mut paths] =
        r.columns()?;
    let mut pids: Vec<u32> = origins.keys().copied().collect();
    pids.sort_unstable();
    let boxed = |s: Option<Arc<str>>, budget: &mut Budget| -> Result<Option<Box<str>>> {
        let Some(s) = s else { return Ok(None) };
        budget.charge(s.len())?;
        Ok(Some(Box::from(&*s)))
    };
    for pid in pids {
        let line = boxed(opt_name(names, &mut cmdline, budget)?, budget)?;
        let executable = boxed(opt_name(names, &mut exe, budget)?, budget)?;
        let code = count(kind.u64()?)?;
        let program = boxed(opt_name(names, &mut entry, budget)?, budget)?;
        let program = match (code, program) {
            (0, None) => None,
            (code, Some(name)) if code > 0 => {
                let kind = EntryKind::iter()
                    .nth(code - 1)
                    .ok_or(CodecError::Corrupt("program kind"))?;
                Some((kind, name))
            }
            _ => return Err(CodecError::Corrupt("program kind without name")),
        };
        let identity = match line {
            Some(cmdline) => {
                budget.charge(size_of::<Identity>() + ARC_HEADER)?;
                Some(Arc::new(Identity {
                    cmdline,
                    executable,
                    entry: program,
                }))
            }
            None if executable.is_none() && program.is_none() => None,
            None => return Err(CodecError::Corrupt("identity without command line")),
        };
        let v1 = match count(v1_count.u64()?)? {
            0 => None,
            n if n - 1 > MAX_V1_HIERARCHIES => return Err(CodecError::Corrupt("v1 hierarchies")),
            n => {
                let mut pairs = Vec::with_capacity(n - 1);
                for _ in 1..n {
                    let c = name(names, &mut controllers, budget)?;
                    let p = name(names, &mut paths, budget)?;
                    budget.charge(c.len() + p.len() + 2 * size_of::<Box<str>>())?;
                    pairs.push((Box::from(&*c), Box::from(&*p)));
                }
                budget.charge(size_of::<V1Paths>() + ARC_HEADER)?;
                Some(Arc::new(V1Paths::of_pairs(pairs)))
            }
        };
        if let Some(o) = origins.get_mut(&pid) {
            o.identity = identity;
            o.cgroups_v1 = v1;
        }
    }
    finish_all(&[cmdline, exe, kind, entry, v1_count, controllers, paths])
}
