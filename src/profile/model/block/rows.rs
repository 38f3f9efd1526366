//! The row sections of a block: samples, wakeups, thread totals, runqueue
//! histograms, who kept threads off the CPU, sleeps and the loss counters.
//! Rows are sorted by their keys (so a key column is runs and small
//! deltas), each field a column of its own.

use super::{
    columns::{
        finish_all, put_columns, unzigzag, zigzag, Budget, Col, KeysReader, KeysWriter, Reader,
    },
    names::{text, Names, Strings},
    stacks::Table,
    CodecError, Keep, Shape,
};
use crate::{
    profile::model::state::{Hist, State},
    profile::model::{
        counters::{RawThread, ThreadCounters},
        HistOwner, Interrupt, KeptOff, Sample, Sleeps, Slice, Stack, StatDeltas, Wakeup,
    },
};

type Result<T> = std::result::Result<T, CodecError>;

/// The rows of `v`, sorted by `key` (stable: rows of equal keys keep
/// their order).
fn sorted<T, K: Ord>(v: &[T], key: impl Fn(&T) -> K) -> Vec<&T> {
    let mut rows: Vec<&T> = v.iter().collect();
    // Keys look stacks up in a table: computed once per row.
    rows.sort_by_cached_key(|r| key(r));
    rows
}

/// One column per element of an array field, then those columns written.
fn put_arrays<const N: usize>(out: &mut Vec<Col>, rows: impl Iterator<Item = [u64; N]>) {
    let mut cols: Vec<Col> = (0..N).map(|_| Col::default()).collect();
    for row in rows {
        for (c, v) in cols.iter_mut().zip(row) {
            c.u64(v);
        }
    }
    out.extend(cols);
}

/// The `n` array columns written, of which this build knows `N` or more
/// (a block from a build with fewer states or slots reads as zeros there).
fn get_arrays<'a, const N: usize>(r: &mut Reader<'a>, n: usize) -> Result<Vec<Reader<'a>>> {
    if n > N {
        return Err(CodecError::Shape);
    }
    (0..n).map(|_| Ok(r.columns::<1>()?[0])).collect()
}

fn get_array<const N: usize, T>(cols: &mut [Reader]) -> Result<[T; N]>
where
    T: TryFrom<u64> + Default + Copy,
{
    let mut out = [T::default(); N];
    for (v, c) in out.iter_mut().zip(cols) {
        *v = T::try_from(c.u64()?).map_err(|_| CodecError::Corrupt("value too large"))?;
    }
    Ok(out)
}

pub fn put_samples(s: &Slice, stacks: &Table, out: &mut Col) {
    let rows = sorted(&s.samples, |r| {
        (r.pid, r.tid, r.state, stacks.local(&r.stack))
    });
    let (mut keys, mut cols) = (KeysWriter::default(), <[Col; 4]>::default());
    for r in rows {
        keys.push(r.pid, r.tid);
        let [state, stack, ns, count] = &mut cols;
        state.u8(r.state as u8);
        stack.u64(stacks.local(&r.stack));
        ns.u64(r.ns);
        count.u64(r.count);
    }
    let [pids, tids] = keys.finish();
    let [a, b, c, d] = cols;
    put_columns(out, &[pids, tids, a, b, c, d]);
}

pub fn get_samples(
    r: &mut Reader,
    n: usize,
    stacks: &[Stack],
    (b, keep): (&mut Budget, Keep),
) -> Result<Vec<Sample>> {
    let [pids, tids, mut state, mut stack, mut ns, mut count] = r.columns()?;
    let mut keys = KeysReader::new(pids, tids);
    let mut out = b.vec(n, &state)?;
    for _ in 0..n {
        let (pid, tid) = keys.next()?;
        let (state, stack) = (state_of(state.u8()?)?, stack.index(stacks.len())?);
        let (ns, count) = (ns.u64()?, count.u64()?);
        if keep.pid(pid) {
            let stack = stacks[stack].clone();
            out.push(Sample {
                pid,
                tid,
                state,
                stack,
                ns,
                count,
            });
        }
    }
    keys.finish()?;
    finish_all(&[state, stack, ns, count])?;
    Ok(keep.shrink(out))
}

fn state_of(raw: u8) -> Result<State> {
    State::from_raw(raw.into()).ok_or(CodecError::Corrupt("unknown state"))
}

fn interrupt_code(i: Option<Interrupt>) -> u8 {
    match i {
        None => 0,
        Some(Interrupt::Hard) => 1,
        Some(Interrupt::Soft) => 2,
    }
}

pub fn put_wakeups(s: &Slice, stacks: &Table, out: &mut Col) {
    let rows = sorted(&s.wakeups, |r| {
        let irq = interrupt_code(r.interrupt);
        (
            r.pid,
            r.tid,
            r.peer_pid,
            r.peer_tid,
            irq,
            stacks.local(&r.stack),
        )
    });
    let (mut keys, mut cols) = (KeysWriter::default(), <[Col; 6]>::default());
    for r in rows {
        keys.push(r.pid, r.tid);
        let [irq, peer_pid, peer_tid, stack, ns, count] = &mut cols;
        irq.u8(interrupt_code(r.interrupt));
        // Most wakeups stay within a process.
        peer_pid.delta(r.pid.into(), r.peer_pid.into());
        peer_tid.delta(r.peer_pid.into(), r.peer_tid.into());
        stack.u64(stacks.local(&r.stack));
        ns.u64(r.ns);
        count.u64(r.count);
    }
    let [pids, tids] = keys.finish();
    let [a, b, c, d, e, f] = cols;
    put_columns(out, &[pids, tids, a, b, c, d, e, f]);
}

pub fn get_wakeups(
    r: &mut Reader,
    n: usize,
    stacks: &[Stack],
    (b, keep): (&mut Budget, Keep),
) -> Result<Vec<Wakeup>> {
    let [pids, tids, mut irq, mut peer_pid, mut peer_tid, mut stack, mut ns, mut count] =
        r.columns()?;
    let mut keys = KeysReader::new(pids, tids);
    let mut out = b.vec(n, &irq)?;
    for _ in 0..n {
        let (pid, tid) = keys.next()?;
        let interrupt = match irq.u8()? {
            0 => None,
            1 => Some(Interrupt::Hard),
            2 => Some(Interrupt::Soft),
            _ => return Err(CodecError::Corrupt("unknown interrupt")),
        };
        let peer_pid = peer_pid.delta32(pid)?;
        let (peer_tid, stack) = (peer_tid.delta32(peer_pid)?, stack.index(stacks.len())?);
        let (ns, count) = (ns.u64()?, count.u64()?);
        if keep.pid(pid) || keep.pid(peer_pid) {
            let stack = stacks[stack].clone();
            out.push(Wakeup {
                pid,
                tid,
                interrupt,
                peer_pid,
                peer_tid,
                stack,
                ns,
                count,
            });
        }
    }
    keys.finish()?;
    finish_all(&[irq, peer_pid, peer_tid, stack, ns, count])?;
    Ok(keep.shrink(out))
}

/// A slice's span in nanoseconds: about the wall time of a thread alive
/// through it.
pub fn span_ns(s: &Slice) -> u64 {
    s.end
        .duration_since(s.start)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A thread's time by state, its largest state's replaced by the span less
/// the thread's wall (near 0 for a thread alive through the slice: one
/// byte for a sleeping thread's second instead of five). Wrapping sums
/// keep any values exact. Returns which state that is.
fn split_wall(ns: &[u64; State::COUNT], span: u64) -> (u8, [u64; State::COUNT]) {
    let k = (0..ns.len()).rev().max_by_key(|&i| ns[i]).unwrap_or(0);
    let wall = ns.iter().fold(0u64, |a, &v| a.wrapping_add(v));
    let mut out = *ns;
    out[k] = zigzag(span.wrapping_sub(wall) as i64);
    (k as u8, out)
}

/// Undoes [`split_wall`].
fn join_wall(
    k: u8,
    mut ns: [u64; State::COUNT],
    span: u64,
    states: usize,
) -> Result<[u64; State::COUNT]> {
    let k = usize::from(k);
    if k >= states {
        return Err(CodecError::Corrupt("state out of range"));
    }
    let deficit = unzigzag(ns[k]) as u64;
    ns[k] = 0;
    let others = ns.iter().fold(0u64, |a, &v| a.wrapping_add(v));
    ns[k] = span.wrapping_sub(deficit).wrapping_sub(others);
    Ok(ns)
}

pub fn put_totals<'s>(s: &'s Slice, strings: &mut Strings<'s>, out: &mut Col) {
    let rows = sorted(&s.thread_totals, |r| (r.pid, r.tid));
    let span = span_ns(s);
    let (mut keys, mut comm, mut most) = (KeysWriter::default(), Col::default(), Col::default());
    let mut split = Vec::with_capacity(rows.len());
    for r in &rows {
        keys.push(r.pid, r.tid);
        comm.u64(strings.id(&r.comm));
        let (k, ns) = split_wall(&r.counters.ns, span);
        most.u8(k);
        split.push(ns);
    }
    let [pids, tids] = keys.finish();
    let mut cols = vec![pids, tids, comm, most];
    put_arrays(&mut cols, split.into_iter());
    put_arrays(
        &mut cols,
        rows.iter().map(|r| {
            let c = &r.counters;
            let (vol, invol) = (c.switches_voluntary, c.switches_involuntary);
            [vol, invol, c.wakeups_sent, c.wakeups_received]
        }),
    );
    put_columns(out, &cols);
}

pub fn get_totals(
    r: &mut Reader,
    (n, shape, span): (usize, &Shape, u64),
    names: &Names,
    (b, keep): (&mut Budget, Keep),
) -> Result<Vec<RawThread>> {
    let [pids, tids, mut comm, mut most] = r.columns()?;
    let mut ns = get_arrays::<{ State::COUNT }>(r, shape.states)?;
    let mut counts = get_arrays::<4>(r, 4)?;
    let mut keys = KeysReader::new(pids, tids);
    let mut out = b.vec(n, &comm)?;
    for _ in 0..n {
        let (pid, tid) = keys.next()?;
        let [vol, invol, sent, received] = get_array(&mut counts)?;
        let counters = ThreadCounters {
            ns: join_wall(most.u8()?, get_array(&mut ns)?, span, shape.states)?,
            switches_voluntary: vol,
            switches_involuntary: invol,
            wakeups_sent: sent,
            wakeups_received: received,
        };
        if !keep.pid(pid) {
            comm.index(names.len())?;
            continue;
        }
        let comm = text(names, &mut comm, b)?;
        out.push(RawThread {
            tid,
            pid,
            comm,
            counters,
        });
    }
    keys.finish()?;
    finish_all(&[comm, most])?;
    finish_all(&ns)?;
    finish_all(&counts)?;
    Ok(keep.shrink(out))
}

fn owner_parts(o: &HistOwner) -> (u8, u64) {
    match *o {
        HistOwner::Process(pid) => (0, pid.into()),
        HistOwner::Cgroup(id) => (1, id),
        HistOwner::ProcessThrottled(pid) => (2, pid.into()),
        HistOwner::CgroupThrottled(id) => (3, id),
    }
}

fn owner_of(kind: u8, v: u64) -> Result<HistOwner> {
    let pid = || u32::try_from(v).map_err(|_| CodecError::Corrupt("pid over u32"));
    Ok(match kind {
        0 => HistOwner::Process(pid()?),
        1 => HistOwner::Cgroup(v),
        2 => HistOwner::ProcessThrottled(pid()?),
        3 => HistOwner::CgroupThrottled(v),
        _ => return Err(CodecError::Corrupt("unknown histogram owner")),
    })
}

pub fn put_hists(s: &Slice, out: &mut Col) {
    let rows = sorted(&s.runq_hists, |(o, _)| *o);
    let (mut kinds, mut values, mut nss, mut prev) =
        (Col::default(), Col::default(), Col::default(), 0);
    for (o, h) in &rows {
        let (kind, v) = owner_parts(o);
        kinds.u8(kind);
        values.delta(prev, v);
        nss.u64(h.ns);
        prev = v;
    }
    let mut cols = vec![kinds, values, nss];
    put_arrays(&mut cols, rows.iter().map(|(_, h)| h.slots));
    put_columns(out, &cols);
}

pub fn get_hists(
    r: &mut Reader,
    (n, shape): (usize, &Shape),
    (b, keep): (&mut Budget, Keep),
) -> Result<Vec<(HistOwner, Hist)>> {
    let [mut kinds, mut values, mut nss] = r.columns()?;
    let mut slots =
        get_arrays::<{ crate::profile::model::state::HIST_SLOTS }>(r, shape.hist_slots)?;
    let (mut out, mut prev) = (b.vec(n, &kinds)?, 0);
    for _ in 0..n {
        prev = values.delta(prev)?;
        let owner = owner_of(kinds.u8()?, prev)?;
        let hist = Hist {
            slots: get_array(&mut slots)?,
            ns: nss.u64()?,
        };
        let kept = match owner {
            HistOwner::Process(pid) | HistOwner::ProcessThrottled(pid) => keep.pid(pid),
            HistOwner::Cgroup(_) | HistOwner::CgroupThrottled(_) => keep == Keep::All,
        };
        if kept {
            out.push((owner, hist));
        }
    }
    finish_all(&[kinds, values, nss])?;
    finish_all(&slots)?;
    Ok(keep.shrink(out))
}

pub fn put_kept_off(s: &Slice, out: &mut Col) {
    let rows = sorted(&s.kept_off, |r| (r.pid, r.tid, r.by));
    let (mut keys, mut by, mut ns) = (KeysWriter::default(), Col::default(), Col::default());
    for r in rows {
        keys.push(r.pid, r.tid);
        by.u64(r.by.into());
        ns.u64(r.ns);
    }
    let [pids, tids] = keys.finish();
    put_columns(out, &[pids, tids, by, ns]);
}

pub fn get_kept_off(
    r: &mut Reader,
    n: usize,
    (b, keep): (&mut Budget, Keep),
) -> Result<Vec<KeptOff>> {
    let [pids, tids, mut by, mut ns] = r.columns()?;
    let mut keys = KeysReader::new(pids, tids);
    let mut out = b.vec(n, &by)?;
    for _ in 0..n {
        let (pid, tid) = keys.next()?;
        let (by, ns) = (by.u32()?, ns.u64()?);
        if keep.pid(pid) {
            out.push(KeptOff { pid, tid, by, ns });
        }
    }
    keys.finish()?;
    finish_all(&[by, ns])?;
    Ok(keep.shrink(out))
}

pub fn put_sleeps(s: &Slice, out: &mut Col) {
    let rows = sorted(&s.sleeps, |r| (r.pid, r.tid));
    let mut keys = KeysWriter::default();
    rows.iter().for_each(|r| keys.push(r.pid, r.tid));
    let mut cols = Vec::from(keys.finish());
    put_arrays(&mut cols, rows.iter().map(|r| r.slots.map(u64::from)));
    put_columns(out, &cols);
}

pub fn get_sleeps(
    r: &mut Reader,
    (n, shape): (usize, &Shape),
    (b, keep): (&mut Budget, Keep),
) -> Result<Vec<Sleeps>> {
    let [pids, tids] = r.columns()?;
    let mut slots =
        get_arrays::<{ crate::profile::model::state::SLEEP_SLOTS }>(r, shape.sleep_slots)?;
    let mut keys = KeysReader::new(pids, tids);
    let mut out = b.vec(n, &keys.tids)?;
    for _ in 0..n {
        let (pid, tid) = keys.next()?;
        let slots = get_array(&mut slots)?;
        if keep.pid(pid) {
            out.push(Sleeps { pid, tid, slots });
        }
    }
    keys.finish()?;
    finish_all(&slots)?;
    Ok(keep.shrink(out))
}

pub fn put_stats(s: &Slice, out: &mut Col) {
    s.stats.iter().for_each(|&v| out.u64(v));
}

pub fn get_stats(r: &mut Reader, shape: &Shape) -> Result<StatDeltas> {
    let mut stats: StatDeltas = [0; crate::profile::model::state::STAT_COUNTERS];
    if shape.stats > stats.len() {
        return Err(CodecError::Shape);
    }
    for v in stats.iter_mut().take(shape.stats) {
        *v = r.u64()?;
    }
    Ok(stats)
}
