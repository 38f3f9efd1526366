//! The live view of a batch: its off-CPU threads with their stacks (named
//! together with the records', see [`super::stacks`]) and the names of
//! their threads, processes, syscalls and wakers.

use std::{collections::HashMap, time::SystemTime};

use super::{syscalls, Symbolizer};
use crate::{
    collect::{RawLive, Waker},
    profile::model::{
        live::{LeftOut, LiveThread, LiveView, LiveWaker, Syscall},
        Frame, Stack, ThreadInfo,
    },
};

/// The batch's thread and process names.
pub(super) struct Names<'a> {
    pub threads: &'a HashMap<u32, ThreadInfo>,
    pub processes: &'a HashMap<u32, Frame>,
}

impl Symbolizer {
    /// The view of `live` (already cut to the longest waits, each with its
    /// named stack) as the drain saw it at `as_of`.
    pub(super) fn live_view(
        &mut self,
        live: impl Iterator<Item = (RawLive, Stack)>,
        left_out: LeftOut,
        names: Names,
        as_of: SystemTime,
    ) -> LiveView {
        let mut processes = HashMap::new();
        let mut threads = Vec::with_capacity(live.size_hint().0);
        for (l, stack) in live {
            if let Some(name) = names.processes.get(&l.pid) {
                processes.entry(l.pid).or_insert_with(|| name.clone());
            }
            let name = match self.thread_name(&names, l.pid, l.tid, &l.comm) {
                Some(name) => name,
                None => self.interner.get_for(l.pid, &l.comm),
            };
            let waker = l.waker.map(|w| match w {
                Waker::Thread { pid, tid } => LiveWaker::Thread {
                    pid,
                    tid,
                    name: self.thread_name(&names, pid, tid, ""),
                },
                Waker::Interrupt => LiveWaker::Interrupt,
            });
            threads.push(LiveThread {
                pid: l.pid,
                tid: l.tid,
                name,
                state: l.state,
                in_state: l.in_state,
                syscall: l.syscall.map(|nr| Syscall {
                    nr,
                    name: syscalls::name(nr),
                }),
                stack,
                waker,
            });
        }
        LiveView {
            as_of: Some(as_of),
            threads,
            processes,
            left_out: left_out.count,
            left_out_longest: left_out.longest,
        }
    }

    /// A thread's name as the batch knew it, else its runtime's name (a
    /// waker need not have run in the batch; `comm` is its name, if known).
    fn thread_name(&mut self, names: &Names, pid: u32, tid: u32, comm: &str) -> Option<Frame> {
        let seen = names.threads.get(&tid).filter(|t| t.pid == pid);
        if let Some(t) = seen {
            return Some(t.name.clone());
        }
        let proc = self.named_proc(pid, comm);
        let interner = &mut self.interner;
        self.runtimes.first(|r| r.thread_name(&proc, tid, interner))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, SystemTime},
    };

    use super::super::Symbolizer;
    use crate::{
        collect::{RawBatch, RawLive, RawRecord, RawStack, RecordKind, Waker},
        profile::model::live::{LiveWaker, MAX_LIVE_THREADS},
        profile::model::state::{State, STAT_COUNTERS},
    };

    /// A pid that cannot exist (above the kernel's pid_max limit): its
    /// frames stay unnamed, and no ELF file is opened (tests beside this
    /// one count the process's file descriptors).
    const PID: u32 = 4_194_400;

    fn live(tid: u32, ms: u64, stack: &RawStack, waker: Option<Waker>) -> RawLive {
        RawLive {
            pid: PID,
            tid,
            comm: format!("worker-{tid}"),
            state: State::Futex,
            in_state: Duration::from_millis(ms),
            syscall: Some(202),
            user_stack: Some(stack.clone()),
            kernel_stack: None,
            waker,
        }
    }

    #[test]
    fn live_threads_are_named_like_records_and_cut_to_the_longest() {
        let pid = PID;
        let stack: RawStack = Arc::from([0x40_1000]);
        let end = SystemTime::now();
        // Two more than fit: the shortest two waits (0 and 1 ms) go.
        let mut waits: Vec<RawLive> = (0..MAX_LIVE_THREADS as u32 - 1)
            .map(|i| live(1_000_000 + i, u64::from(i), &stack, None))
            .collect();
        let main = Waker::Thread { pid, tid: pid };
        waits.push(live(10, 3_600_000, &stack, Some(main)));
        waits.push(live(11, 3_500_000, &stack, Some(Waker::Interrupt)));
        let stranger = Waker::Thread { pid, tid: 12 };
        waits.push(live(13, 3_400_000, &stack, Some(stranger)));
        let batch = RawBatch {
            end,
            interval: Duration::from_secs(1),
            records: vec![RawRecord {
                pid,
                tid: pid,
                kind: RecordKind::Time(State::Futex),
                comm: "main".into(),
                syscall: Some(202),
                user_stack: Some(stack.clone()),
                kernel_stack: None,
                ns: 1_000,
                count: 1,
                span: None,
            }],
            threads: Vec::new(),
            runq_hists: Vec::new(),
            kept_off: Vec::new(),
            sleeps: Vec::new(),
            live: waits,
            span_times: Vec::new(),
            span_records: Vec::new(),
            stats: [0; STAT_COUNTERS],
            missing_stacks: 0,
            drain_time: Duration::ZERO,
        };
        let named = Symbolizer::new().symbolize(batch);
        let view = named.live;
        assert_eq!(view.as_of, Some(end));
        assert_eq!(view.threads.len(), MAX_LIVE_THREADS);
        assert_eq!(
            (view.left_out, view.left_out_longest),
            (2, Duration::from_millis(1))
        );
        let tids: Vec<u32> = view.threads[..4].iter().map(|t| t.tid).collect();
        assert_eq!(tids, [10, 11, 13, 1_000_000 + MAX_LIVE_THREADS as u32 - 2]);

        let first = &view.threads[0];
        let sample = &named.slice.samples[0];
        assert!(Arc::ptr_eq(&first.stack, &sample.stack), "named once");
        let frames: Vec<&str> = first.stack.iter().map(|f| &**f).collect();
        assert_eq!(frames, ["[unknown]", "[syscall futex]"]);
        assert_eq!(
            first.syscall.map(|s| (s.nr, s.name)),
            Some((202, Some("futex")))
        );
        assert_eq!(&*first.name, "worker-10");
        assert_eq!(
            first.waker,
            Some(LiveWaker::Thread {
                pid,
                tid: pid,
                name: Some(Arc::from("main"))
            })
        );
        assert_eq!(view.threads[1].waker, Some(LiveWaker::Interrupt));
        assert_eq!(
            view.threads[2].waker,
            Some(LiveWaker::Thread {
                pid,
                tid: 12,
                name: None
            }),
            "not seen in the batch"
        );
        assert_eq!(view.processes.len(), 1);
        assert_eq!(&*view.processes[&pid], "main", "its first thread's name");
        assert_eq!(named.slice.processes[&pid], view.processes[&pid]);
        assert!(
            named.slice.threads.contains_key(&10),
            "live names are the batch's"
        );
    }
}
