//! Slices to encode: one with every variant and edge value, and a busy
//! one of realistic size and names; and a stack table for blocks by ids.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use crate::{
    process::container::Container,
    profile::model::state::{Hist, State, INTERRUPT_TID},
    profile::model::{
        block::{StackIds, StackSource, RUNTIMES},
        counters::{RawThread, ThreadCounters},
        HistOwner, Interrupt, KeptOff, Origin, Sample, Sleeps, Slice, Stack, ThreadInfo, Wakeup,
    },
};

/// The store's table as a test sees it: ids by content, spaced apart.
#[derive(Default)]
pub struct Ids {
    pub by_content: HashMap<Vec<String>, u32>,
    pub by_id: HashMap<u32, Stack>,
    pub calls: usize,
}

impl StackIds for Ids {
    fn id_of(&mut self, stack: &Stack) -> u32 {
        self.calls += 1;
        let next = 1000 + 7 * self.by_content.len() as u32;
        let key = stack.iter().map(|f| f.to_string()).collect();
        let id = *self.by_content.entry(key).or_insert(next);
        self.by_id.entry(id).or_insert_with(|| stack.clone());
        id
    }
}

impl StackSource for Ids {
    fn stack(&self, id: u32) -> Option<Stack> {
        self.by_id.get(&id).cloned()
    }
}

/// xorshift64*: the same rows every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

fn container(id: char, runtime: &'static str, named: bool) -> Arc<Container> {
    let some = |s: &str| named.then(|| s.to_string());
    Arc::new(Container {
        id: id.to_string().repeat(64),
        runtime,
        cgroup: format!("/kubepods.slice/{runtime}-{id}.scope"),
        pod_uid: some("0f1e2d3c-aaaa-bbbb-cccc-0123456789ab"),
        namespace: some("prod-ü"),
        pod: some("orders-7d9f"),
        container: some("api"),
    })
}

/// Every variant and the edge values of every field.
pub fn edges() -> Slice {
    let t = UNIX_EPOCH + Duration::new(1_750_000_000, 999_999_999);
    let mut s = Slice::empty(t, t + Duration::new(60, 1));
    let f = |n: &str| -> Arc<str> { Arc::from(n) };
    let (main, wait) = (f("main"), f("[k] futex_wait 等待 🚀"));
    let stack = |frames: &[&Arc<str>]| -> Stack { frames.iter().map(|f| (*f).clone()).collect() };
    let stacks = [
        stack(&[&main, &wait]),
        stack(&[&main, &f("work"), &wait]),
        stack(&[]),
        stack(&[&f("")]),
    ];
    let max = u64::MAX;
    for (i, state) in State::ALL.into_iter().enumerate() {
        let stack = stacks[i % stacks.len()].clone();
        let (pid, tid) = if i == 0 {
            (u32::MAX, u32::MAX)
        } else {
            (1, i as u32)
        };
        s.samples.push(Sample {
            pid,
            tid,
            state,
            stack,
            ns: max - i as u64,
            count: max,
        });
    }
    s.samples.push(s.samples[1].clone()); // a key twice
    for (i, interrupt) in [None, Some(Interrupt::Hard), Some(Interrupt::Soft)]
        .into_iter()
        .enumerate()
    {
        let waker = if interrupt.is_some() {
            (0, INTERRUPT_TID)
        } else {
            (2, 2)
        };
        s.wakeups.push(Wakeup {
            pid: waker.0,
            tid: waker.1,
            interrupt,
            peer_pid: [1, 7, u32::MAX][i],
            peer_tid: [0, 9, 3][i],
            stack: stacks[i].clone(),
            ns: [0, max, 12345][i],
            count: i as u64,
        });
    }
    let proc_name = f("süßer-prozess");
    s.processes.insert(1, proc_name.clone());
    s.processes.insert(2, f(""));
    s.processes.insert(u32::MAX, f("max"));
    s.threads.insert(
        1,
        ThreadInfo {
            pid: 1,
            name: Arc::from("süßer-prozess"),
        },
    );
    s.threads.insert(
        5,
        ThreadInfo {
            pid: 1,
            name: f("worker/5"),
        },
    );
    s.threads.insert(
        u32::MAX,
        ThreadInfo {
            pid: u32::MAX,
            name: f(""),
        },
    );
    let full = ThreadCounters {
        ns: [max; State::COUNT],
        switches_voluntary: max,
        switches_involuntary: 0,
        wakeups_sent: 1,
        wakeups_received: max - 1,
    };
    for (pid, tid, comm, counters) in [
        (1, 1, "süßer-prozess", full),
        (1, 1, "", ThreadCounters::default()),
        (u32::MAX, 0, "x", full),
    ] {
        s.thread_totals.push(RawThread {
            tid,
            pid,
            comm: comm.into(),
            counters,
        });
    }
    let hist = |k: u64| Hist {
        slots: std::array::from_fn(|i| if i % 2 == 0 { k } else { max }),
        ns: k,
    };
    for (owner, k) in [
        (HistOwner::Process(1), 0),
        (HistOwner::Cgroup(u64::MAX), 1),
        (HistOwner::Cgroup(0), 2),
        (HistOwner::ProcessThrottled(u32::MAX), 3),
        (HistOwner::CgroupThrottled(77), max),
    ] {
        s.runq_hists.push((owner, hist(k)));
    }
    let shared = container('a', "containerd", true);
    s.containers.insert(1, shared.clone());
    s.containers.insert(2, shared);
    for (i, runtime) in RUNTIMES.into_iter().enumerate() {
        let id = char::from(b'b' + i as u8);
        s.containers
            .insert(7 + i as u32, container(id, runtime, i % 2 == 0));
    }
    s.origins.insert(
        1,
        Origin {
            parent: 0,
            cgroup: Some(f("/system.slice/ü.service")),
            cgroups_v1: Some(Arc::new(crate::process::cgroups::V1Paths::in_file(
                "12:cpu,cpuacct:/docker/ü\n1:name=systemd:/x\n0::/ü.service\n",
            ))),
            identity: crate::process::identity::Identity::of(
                b"/usr/bin/python3\0/srv/\xffshop.py\0",
                true,
                Some(std::path::Path::new("/usr/bin/python3.11")),
            )
            .map(Arc::new),
        },
    );
    s.origins.insert(
        2,
        Origin {
            parent: 1,
            cgroup: None,
            cgroups_v1: Some(Arc::default()),
            identity: crate::process::identity::Identity::of(b"x", false, None).map(Arc::new),
        },
    );
    s.origins.insert(
        u32::MAX,
        Origin {
            parent: u32::MAX,
            cgroup: Some(proc_name),
            ..Origin::default()
        },
    );
    for by in [0, 2, KeptOff::UNSEEN, KeptOff::OTHERS] {
        s.kept_off.push(KeptOff {
            pid: 1,
            tid: 1,
            by,
            ns: max - u64::from(by),
        });
    }
    s.sleeps.push(Sleeps {
        pid: 1,
        tid: 1,
        slots: [u32::MAX; crate::profile::model::state::SLEEP_SLOTS],
    });
    s.sleeps.push(Sleeps {
        pid: 2,
        tid: 9,
        slots: std::array::from_fn(|i| i as u32),
    });
    s.stats
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = if i == 0 { max } else { i as u64 });
    s
}

/// Names as a JVM, a Python service and the kernel show them.
fn frame_names(rng: &mut Rng) -> Vec<Arc<str>> {
    let pkgs = [
        "java.util.concurrent.",
        "org.apache.kafka.clients.producer.internals.",
        "io.netty.channel.nio.",
        "com.example.orders.service.",
        "sun.nio.ch.",
    ];
    let classes = [
        "ThreadPoolExecutor",
        "Sender",
        "NioEventLoop",
        "OrderRepository",
        "EPollSelectorImpl",
        "LinkedBlockingQueue",
        "CompletableFuture",
    ];
    let methods = [
        "runWorker",
        "run",
        "poll",
        "take",
        "select",
        "processSelectedKeys",
        "findByCustomer",
        "awaitNanos",
        "park",
    ];
    let mut names: Vec<Arc<str>> = Vec::new();
    for _ in 0..240 {
        let n = format!(
            "{}{}.{}",
            rng.pick(&pkgs),
            rng.pick(&classes),
            rng.pick(&methods)
        );
        names.push(n.into());
    }
    for k in [
        "do_syscall_64",
        "__x64_sys_futex",
        "futex_wait",
        "schedule",
        "__schedule",
        "ep_poll",
        "do_epoll_wait",
        "tcp_recvmsg",
    ] {
        names.push(format!("[k] {k}").into());
    }
    for i in 0..40 {
        names.push(format!("py::handle_request_{i} (app/server.py:{})", 100 + i).into());
        names.push(format!("libc.so.6`__futex_abstimed_wait_common{}", i % 3).into());
    }
    names
}

/// A busy 1-s slice: 50 processes of 6 threads, 2,000 sample rows, 1,000
/// wakeups, stacks up to 60 frames deep.
pub fn busy(seed: u64) -> Slice {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let names = frame_names(&mut rng);
    let root: Vec<Arc<str>> = [
        "_start",
        "__libc_start_main",
        "main",
        "JavaMain",
        "java.lang.Thread.run",
    ]
    .map(Arc::from)
    .to_vec();
    let stacks: Vec<Stack> = (0..400)
        .map(|_| {
            let depth = 20 + rng.below(41) as usize;
            let mut frames = root.clone();
            while frames.len() < depth {
                frames.push(rng.pick(&names).clone());
            }
            frames.into()
        })
        .collect();
    let start = UNIX_EPOCH
        + Duration::new(
            1_764_000_000 + rng.below(1000),
            rng.below(1_000_000_000) as u32,
        );
    let mut s = Slice::empty(start, start + Duration::new(1, 1234));
    let comms = [
        "java", "python3", "postgres", "nginx", "kafka", "envoy", "node",
    ];
    let thread_names = [
        "worker-1",
        "kafka-producer-network-thread",
        "GC Thread#0",
        "C2 CompilerThread0",
        "epoll-loop",
        "pool-3-thread-7",
    ];
    let mut threads = Vec::new();
    for p in 0..50u32 {
        let pid = 1000 + 37 * p + rng.below(20) as u32;
        let comm: Arc<str> = Arc::from(*rng.pick(&comms));
        s.processes.insert(pid, comm.clone());
        s.origins.insert(
            pid,
            Origin {
                parent: 1,
                cgroup: (p % 2 == 0)
                    .then(|| Arc::from(format!("/system.slice/svc{}.service", p % 9))),
                ..Origin::default()
            },
        );
        for t in 0..6 {
            let tid = pid + t * (1 + rng.below(3) as u32);
            let name: Arc<str> = if t == 0 {
                comm.clone()
            } else {
                Arc::from(*rng.pick(&thread_names))
            };
            s.threads.insert(
                tid,
                ThreadInfo {
                    pid,
                    name: name.clone(),
                },
            );
            let mut ns = [0; State::COUNT];
            let cpu = rng.below(50_000_000);
            ns[State::Cpu as usize] = cpu;
            ns[State::Runqueue as usize] = rng.below(2_000_000);
            ns[State::Futex as usize] = 1_000_001_234 - cpu - ns[State::Runqueue as usize];
            s.thread_totals.push(RawThread {
                tid,
                pid,
                comm: name.to_string(),
                counters: ThreadCounters {
                    ns,
                    switches_voluntary: rng.below(500),
                    switches_involuntary: rng.below(20),
                    wakeups_sent: rng.below(300),
                    wakeups_received: rng.below(300),
                },
            });
            s.sleeps.push(Sleeps {
                pid,
                tid,
                slots: std::array::from_fn(|_| rng.below(4) as u32),
            });
            threads.push((pid, tid));
        }
        s.runq_hists.push((
            HistOwner::Process(pid),
            Hist {
                slots: std::array::from_fn(|_| rng.below(50)),
                ns: rng.below(1 << 30),
            },
        ));
        if p < 20 {
            s.containers.insert(
                pid,
                container(
                    char::from(b'a' + (p % 4) as u8),
                    RUNTIMES[p as usize % 5],
                    true,
                ),
            );
        }
    }
    for _ in 0..2000 {
        let (pid, tid) = *rng.pick(&threads);
        let state = *rng.pick(&State::ALL[..5]);
        let stack = rng.pick(&stacks).clone();
        s.samples.push(Sample {
            pid,
            tid,
            state,
            stack,
            ns: 10_000 + rng.below(1_000_000_000),
            count: 1 + rng.below(99),
        });
    }
    for _ in 0..1000 {
        let (pid, tid) = *rng.pick(&threads);
        let (peer_pid, peer_tid) = if rng.below(10) < 7 {
            let t = rng.below(6) as u32;
            (pid, tid + t)
        } else {
            *rng.pick(&threads)
        };
        let stack = rng.pick(&stacks).clone();
        let (pid, tid, interrupt) = if rng.below(20) == 0 {
            (0, INTERRUPT_TID, Some(Interrupt::Soft))
        } else {
            (pid, tid, None)
        };
        s.wakeups.push(Wakeup {
            pid,
            tid,
            interrupt,
            peer_pid,
            peer_tid,
            stack,
            ns: rng.below(100_000_000),
            count: 1 + rng.below(50),
        });
    }
    for _ in 0..200 {
        let (pid, tid) = *rng.pick(&threads);
        let by = *rng.pick(&[0, KeptOff::UNSEEN, threads[0].0, threads[7].0]);
        s.kept_off.push(KeptOff {
            pid,
            tid,
            by,
            ns: rng.below(5_000_000),
        });
    }
    for i in 0..10 {
        s.runq_hists.push((
            HistOwner::Cgroup(5000 + i * 3),
            Hist {
                slots: std::array::from_fn(|_| rng.below(50)),
                ns: rng.below(1 << 30),
            },
        ));
    }
    s.stats.iter_mut().for_each(|v| *v = rng.below(3));
    s
}
