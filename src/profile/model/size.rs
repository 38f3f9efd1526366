//! Estimates of what the store's data costs in memory, computed once per
//! slice or stack when it enters the store (never by walking the store).
//!
//! The figures count the heap blocks the store owns: vectors and hash
//! tables by capacity, strings by capacity, `Arc` headers. Frame and thread
//! names are interned by the symbolizer: a stack costs its array of
//! pointers, and each distinct name the store holds is counted once, by
//! [`NameBytes`], for as long as a stack or slice of the store holds it
//! (so evicting history makes room for names too). Allocator overhead is
//! not counted: the estimate is a lower bound of the resident memory,
//! within a few tens of percent.

use std::{collections::HashMap, mem::size_of};

use rustc_hash::FxHashMap;

use super::{
    counters::RawThread,
    live::{LiveThread, LiveView},
    Frame, HistOwner, Sample, Slice, Stack, ThreadInfo, Wakeup,
};
use crate::{process::container::Container, profile::model::state::Hist};

/// Two reference counts ahead of every `Arc` allocation.
pub const ARC_HEADER: usize = 2 * size_of::<usize>();

/// A hash table of `capacity` entries of `T` (hashbrown: one control byte
/// per bucket, ~8/7 buckets per entry).
fn table<T>(capacity: usize) -> usize {
    capacity * (size_of::<T>() + 1) * 8 / 7
}

fn map<K, V>(m: &HashMap<K, V>) -> usize {
    table::<(K, V)>(m.capacity())
}

/// Bytes of one slice apart from the stacks it shares with the table.
pub fn slice_bytes(s: &Slice) -> usize {
    ARC_HEADER
        + size_of::<Slice>()
        + s.samples.capacity() * size_of::<Sample>()
        + s.wakeups.capacity() * size_of::<Wakeup>()
        + map(&s.threads)
        + s.thread_totals.capacity() * size_of::<RawThread>()
        + s.thread_totals
            .iter()
            .map(|t| t.comm.capacity())
            .sum::<usize>()
        + s.runq_hists.capacity() * size_of::<(HistOwner, Hist)>()
        + map(&s.processes)
        + map(&s.containers)
        + s.containers
            .values()
            .map(|c| ARC_HEADER + container_bytes(c))
            .sum::<usize>()
        + s.kept_off.capacity() * size_of::<crate::profile::model::KeptOff>()
        + s.sleeps.capacity() * size_of::<crate::profile::model::Sleeps>()
        + map(&s.origins)
        + s.origins.values().map(origin_bytes).sum::<usize>()
}

/// Heap bytes of an origin's cgroups and identity (shared with the
/// process table and the other slices while the process lives: counted
/// here all the same, as containers are).
fn origin_bytes(o: &crate::profile::model::Origin) -> usize {
    o.cgroup.as_ref().map_or(0, |c| ARC_HEADER + c.len())
        + o.cgroups_v1.as_ref().map_or(0, |v| ARC_HEADER + v.bytes())
        + o.identity.as_ref().map_or(0, |i| ARC_HEADER + i.bytes())
}

/// Heap bytes of a container's names (the `Arc` is shared with the
/// process table while the process lives: counted here all the same).
fn container_bytes(c: &Container) -> usize {
    size_of::<Container>()
        + c.id.capacity()
        + c.cgroup.capacity()
        + [&c.pod_uid, &c.namespace, &c.pod, &c.container]
            .iter()
            .map(|s| s.as_ref().map_or(0, String::capacity))
            .sum::<usize>()
}

/// Bytes of one distinct stack held in the store's stack table: its array
/// of frame pointers and its slot in the table.
pub fn stack_bytes(stack: &Stack) -> usize {
    ARC_HEADER + stack.len() * size_of::<Frame>() + table::<Stack>(1)
}

/// Bytes of a live view: its threads, its process names and each distinct
/// stack array once (threads of a pool waiting in one place share one).
/// Stacks it shares with the store's table are counted twice: the
/// estimate errs high.
pub fn live_bytes(view: &LiveView) -> usize {
    let mut stacks: rustc_hash::FxHashSet<*const Frame> = rustc_hash::FxHashSet::default();
    let stack_bytes: usize = view
        .threads
        .iter()
        .filter(|t| stacks.insert(t.stack.as_ptr()))
        .map(|t| ARC_HEADER + t.stack.len() * size_of::<Frame>())
        .sum();
    ARC_HEADER
        + size_of::<LiveView>()
        + view.threads.capacity() * size_of::<LiveThread>()
        + map(&view.processes)
        + stack_bytes
}

/// Bytes of one slice's rows by the process they belong to (samples and
/// wakeups by the thread that slept or woke, thread totals and names):
/// what dropping that process's rows from the slice would free. The store
/// adds the stacks and names each process's rows brought in.
pub fn bytes_by_pid(s: &Slice) -> FxHashMap<u32, usize> {
    let mut by_pid: FxHashMap<u32, usize> = FxHashMap::default();
    for sample in &s.samples {
        *by_pid.entry(sample.pid).or_default() += size_of::<Sample>();
    }
    for w in &s.wakeups {
        *by_pid.entry(w.charged_to()).or_default() += size_of::<Wakeup>();
    }
    for t in &s.thread_totals {
        *by_pid.entry(t.pid).or_default() += size_of::<RawThread>() + t.comm.capacity();
    }
    for t in &s.sleeps {
        *by_pid.entry(t.pid).or_default() += size_of::<crate::profile::model::Sleeps>();
    }
    for t in s.threads.values() {
        *by_pid.entry(t.pid).or_default() += table::<(u32, ThreadInfo)>(1);
    }
    by_pid
}

/// The distinct names (frames, thread and process names) the store holds,
/// each counted once while anything in the store holds it. Keyed by
/// address: the interner makes equal names one allocation.
#[derive(Default)]
pub struct NameBytes {
    held: FxHashMap<usize, (u32, usize)>,
    bytes: usize,
}

impl NameBytes {
    /// One more holder of `name`; returns the bytes it added (none when
    /// the name was held already).
    pub fn add(&mut self, name: &Frame) -> usize {
        let (refs, len) = self
            .held
            .entry(name.as_ptr() as usize)
            .or_insert((0, name.len()));
        *refs += 1;
        if *refs == 1 {
            self.bytes += ARC_HEADER + *len;
            return ARC_HEADER + *len;
        }
        0
    }

    /// One holder of `name` fewer; its bytes go with the last.
    pub fn remove(&mut self, name: &Frame) {
        let key = name.as_ptr() as usize;
        if let Some((refs, len)) = self.held.get_mut(&key) {
            *refs -= 1;
            if *refs == 0 {
                self.bytes -= ARC_HEADER + *len;
                self.held.remove(&key);
            }
        }
    }

    /// The names a slice holds of its own (its stacks are counted with the
    /// stack table).
    pub fn slice_names(s: &Slice) -> impl Iterator<Item = (u32, &Frame)> {
        s.threads
            .values()
            .map(|t| (t.pid, &t.name))
            .chain(s.processes.iter().map(|(pid, name)| (*pid, name)))
    }

    /// Bytes of the names held, with the table that counts them.
    pub fn bytes(&self) -> usize {
        self.bytes + table::<(usize, (u32, usize))>(self.held.capacity())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn deeper_stacks_cost_more() {
        let frames = |n: usize| -> Stack { (0..n).map(|i| Frame::from(i.to_string())).collect() };
        assert!(stack_bytes(&frames(10)) > stack_bytes(&frames(2)));
        assert_eq!(
            stack_bytes(&frames(3)) - stack_bytes(&frames(2)),
            size_of::<Arc<str>>()
        );
    }

    #[test]
    fn a_live_view_counts_each_shared_stack_once() {
        use crate::{profile::model::live::LiveThread, profile::model::state::State};
        let stack: Stack = ["main", "park"].map(Frame::from).into_iter().collect();
        let thread = |tid| LiveThread {
            pid: 1,
            tid,
            name: Arc::from("pool"),
            state: State::Futex,
            in_state: std::time::Duration::from_secs(1),
            syscall: None,
            stack: stack.clone(),
            waker: None,
        };
        let view = |n: u32| LiveView {
            threads: (0..n).map(thread).collect(),
            ..LiveView::default()
        };
        let (one, two) = (live_bytes(&view(1)), live_bytes(&view(2)));
        assert_eq!(two - one, size_of::<LiveThread>(), "the stack once");
        assert!(one > live_bytes(&LiveView::default()) + 2 * size_of::<Frame>());
    }
}
