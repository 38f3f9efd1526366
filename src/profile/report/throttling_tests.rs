use std::time::{Duration, SystemTime};

use super::*;
use crate::profile::model::{
    counters::{RawThread, ThreadCounters},
    state::{Hist, HIST_SLOTS},
    store::Store,
    Slice,
};
use crate::profile::report::{
    disclosure::Reader,
    host_facts::{Hybrid, BATCH, GONE},
};

const MS: u64 = 1_000_000;
fn hist(ns: u64, count: u64) -> Hist {
    let mut slots = [0; HIST_SLOTS];
    slots[17] = count;
    Hist { slots, ns }
}

fn thread(pid: u32, cpu_ms: u64, throttled_ms: u64, runqueue_ms: u64) -> RawThread {
    let mut ns = [0; State::COUNT];
    ns[State::Cpu as usize] = cpu_ms * MS;
    ns[State::Throttled as usize] = throttled_ms * MS;
    ns[State::Runqueue as usize] = runqueue_ms * MS;
    RawThread {
        tid: pid,
        pid,
        comm: "t".into(),
        counters: ThreadCounters {
            ns,
            ..Default::default()
        },
    }
}

/// Ten 1 s slices: pid 41 runs 200 ms and is throttled 800 ms of each;
/// pid 50, its noisy neighbour, runs the whole second.
fn quota_bound() -> (Store, SystemTime) {
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
    let mut store = Store::new(Duration::from_secs(600));
    for i in (0..10).rev() {
        let at = end - Duration::from_secs(i);
        let mut slice = Slice::empty(at - Duration::from_secs(1), at);
        slice.thread_totals = vec![thread(41, 200, 800, 0), thread(50, 1000, 0, 0)];
        slice.runq_hists = vec![
            (HistOwner::CgroupThrottled(BATCH), hist(800 * MS, 8)),
            (HistOwner::ProcessThrottled(41), hist(800 * MS, 8)),
            (HistOwner::CgroupThrottled(GONE), hist(MS, 1)),
        ];
        store.push(slice);
    }
    (store, end)
}

/// A local user who sees no process.
fn nobody() -> Sight {
    Reader::User {
        uid: None,
        owner_of: std::sync::Arc::new(|_| None),
    }
    .sight()
}

#[test]
fn a_quota_bound_process_is_named_with_its_cgroup_quota_and_members() {
    let (store, end) = quota_bound();
    let window = Window::last(30, end);
    let t = of_pid(&store.snapshot(), &Hybrid, window, 41, &Sight::all()).unwrap();
    assert_eq!(
        t,
        Throttling {
            path: "/batch".into(),
            hierarchy: "v1:cpu".into(),
            quota_us: Some(20_000),
            period_us: 100_000,
            cpus: Some(0.2),
            members: vec![41, 42],
            member_count: 2,
            cpu_us: 2_000_000,
            cpus_used: 0.2,
            throttled_us: 8_000_000,
            throttled_intervals: 80,
            share_of_wall_throttled: 0.8,
            nr_periods: 100,
            nr_throttled: 80,
            share_of_periods_throttled: 0.8,
            kernel_throttled_us: 8_100_000,
        }
    );
    assert_eq!(
        describe(&t, &window.describe()),
        "throttled by its cgroup's CPU quota: /batch (v1:cpu) quota 20.0 ms / 100.0 ms (0.2 CPU), \
         using 0.20 CPU; throttled 80 % of periods (cpu.stat), 8.0 s in the last 30 s \
         (80 % of its members' wall time); members 41, 42"
    );
    // Its idle fellow member gets the same answer.
    let fellow = of_pid(&store.snapshot(), &Hybrid, window, 42, &Sight::all());
    assert_eq!(fellow.map(|t| t.path), Some("/batch".into()));
    // The neighbour's cgroup has no quota and was not throttled: nothing.
    assert_eq!(
        of_pid(&store.snapshot(), &Hybrid, window, 50, &Sight::all()),
        None
    );
    assert_eq!(
        of_pid(&store.snapshot(), &Hybrid, window, 77, &Sight::all()),
        None
    );
}

#[test]
fn the_host_lists_throttled_cgroups_by_path_not_unified_id() {
    let (store, end) = quota_bound();
    let all = host_wide(
        &store.snapshot(),
        &Hybrid,
        Window::last(30, end),
        &Sight::all(),
    );
    // The gone cgroup's id resolves to nothing and is left out.
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].path.as_str(), all[0].throttled_us),
        ("/batch", 8_000_000)
    );
    let json = serde_json::to_value(&all[0]).unwrap();
    assert_eq!(json["hierarchy"], "v1:cpu");
    assert_eq!(json["quota_us"], 20_000);
    // Nothing in a later window.
    let later = Window::last(30, end + Duration::from_secs(60));
    assert!(host_wide(&store.snapshot(), &Hybrid, later, &Sight::all()).is_empty());
}

#[test]
fn a_user_sees_no_other_users_members() {
    let (store, end) = quota_bound();
    let nobody = nobody();
    let t = of_pid(
        &store.snapshot(),
        &Hybrid,
        Window::last(30, end),
        41,
        &nobody,
    )
    .unwrap();
    assert!(t.members.is_empty(), "{t:?}");
    assert_eq!((t.member_count, t.cpu_us), (2, 0));
    assert!(!describe(&t, "last 30 s").contains("; members"));
}

#[test]
fn the_host_names_throttled_cgroups_only_to_those_who_see_a_member() {
    let (store, end) = quota_bound();
    let window = Window::last(30, end);
    let report = |sight: &Sight| {
        super::super::host::report(&store.snapshot(), &Hybrid, window, 2, 10, 10, sight)
    };
    let root = report(&Sight::all());
    assert_eq!(root.throttled_cgroups, 1);
    assert_eq!(root.throttled[0].path, "/batch");
    let text = super::super::host::render_text(&root);
    assert!(
        text.contains(
            "throttled: /batch (v1:cpu) quota 20.0 ms / 100.0 ms (0.2 CPU), using 0.20 CPU"
        ),
        "{text}"
    );
    let nobody = nobody();
    let user = report(&nobody);
    assert_eq!((user.throttled_cgroups, user.throttled.len()), (1, 0));
}
