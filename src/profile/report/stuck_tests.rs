use super::*;

fn blocked(pid: u32, tid: u32, name: &str, secs: f64, stack: &[&str]) -> BlockedThread {
    BlockedThread {
        pid,
        process: "app".into(),
        tid,
        name: name.into(),
        state: "futex",
        in_state_s: secs,
        since: String::new(),
        syscall: Some("futex"),
        syscall_nr: Some(202),
        stack: stack.iter().map(|f| f.to_string()).collect(),
        woken_by: None,
        waits_for_tid: None,
    }
}

/// A pricing worker waiting on a future inside its own task.
const QUOTE: [&str; 9] = [
    "[syscall futex]",
    "Unsafe.park_[j]",
    "LockSupport.park_[j]",
    "FutureTask.awaitDone_[j]",
    "FutureTask.get_[j]",
    "Pricing.quote_[j]",
    "FutureTask.run_[j]",
    "ThreadPoolExecutor.runWorker_[j]",
    "Thread.run_[j]",
];

/// An idle worker waiting for a task.
const IDLE: [&str; 7] = [
    "[syscall futex]",
    "Unsafe.park_[j]",
    "LockSupport.park_[j]",
    "AbstractQueuedSynchronizer$ConditionObject.await_[j]",
    "LinkedBlockingQueue.take_[j]",
    "ThreadPoolExecutor.getTask_[j]",
    "ThreadPoolExecutor.runWorker_[j]",
];

fn sizes(pools: &[(&str, usize)]) -> WaitFacts {
    WaitFacts {
        pool_sizes: pools
            .iter()
            .map(|(p, n)| ((7, p.to_string()), *n))
            .collect(),
        owners: HashMap::new(),
    }
}

#[test]
fn a_pool_waiting_on_itself_is_named_with_its_place() {
    let threads = [
        blocked(7, 1, "pricing-1", 45.2, &QUOTE),
        blocked(7, 2, "pricing-2", 44.9, &QUOTE),
        blocked(7, 3, "idle-1", 50.0, &IDLE),
        blocked(7, 4, "idle-2", 50.0, &IDLE),
    ];
    let (pools, findings) = summarize(&threads, &sizes(&[("pricing-*", 2), ("idle-*", 2)]));
    let pricing = pools.iter().find(|p| p.pool == "pricing-*").unwrap();
    assert_eq!(
        pricing.summary,
        "pool pricing-* (pid 7, app): 2 of 2 threads blocked 45 s in FutureTask.get (inside Pricing.quote)"
    );
    // The idle pool waits for work: summarised, never flagged.
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(
        (
            findings[0].kind,
            findings[0].certainty,
            findings[0].tids.clone()
        ),
        ("own_pool_wait", "inferred", vec![1, 2])
    );
}

#[test]
fn a_pool_blocked_a_quarter_second_says_so_in_ms() {
    let threads = [
        blocked(7, 1, "pricing-1", 0.25, &QUOTE),
        blocked(7, 2, "pricing-2", 0.25, &QUOTE),
    ];
    let (pools, findings) = summarize(&threads, &sizes(&[("pricing-*", 2)]));
    assert!(
        pools[0]
            .summary
            .contains("2 of 2 threads blocked 250 ms in"),
        "{}",
        pools[0].summary
    );
    assert!(
        findings[0].summary.contains("at least 250 ms"),
        "{}",
        findings[0].summary
    );
}

#[test]
fn a_pool_with_a_thread_left_is_not_flagged() {
    let threads = [blocked(7, 1, "pricing-1", 45.0, &QUOTE)];
    let (pools, findings) = summarize(&threads, &sizes(&[("pricing-*", 2)]));
    assert_eq!((pools[0].blocked, pools[0].threads), (1, 2));
    assert!(findings.is_empty(), "{findings:?}");
}

#[test]
fn mutex_owners_in_a_cycle_are_a_certain_deadlock() {
    let lock = [
        "[syscall futex]",
        "__lll_lock_wait",
        "pthread_mutex_lock",
        "take_in_order",
        "alpha",
    ];
    let threads = [
        blocked(7, 11, "alpha-1", 12.0, &lock),
        blocked(7, 12, "beta-1", 12.0, &lock),
        blocked(7, 13, "gamma-1", 12.0, &lock),
    ];
    let mut facts = sizes(&[("alpha-*", 1), ("beta-*", 1), ("gamma-*", 3)]);
    // alpha and beta wait for each other; gamma for alpha (not in the cycle).
    facts.owners = HashMap::from([(11, 12), (12, 11), (13, 11)]);
    let (_, findings) = summarize(&threads, &facts);
    let cycles: Vec<&Finding> = findings.iter().filter(|f| f.kind == "lock_cycle").collect();
    assert_eq!(cycles.len(), 1, "{findings:?}");
    assert_eq!(cycles[0].certainty, "certain");
    assert_eq!(cycles[0].pools, ["alpha-*", "beta-*"]);
    let mut tids = cycles[0].tids.clone();
    tids.sort_unstable();
    assert_eq!(tids, [11, 12]);
    assert!(
        cycles[0]
            .summary
            .contains("in pthread_mutex_lock in take_in_order"),
        "{}",
        cycles[0].summary
    );
    // Each pool of one blocked thread on a mutex is flagged too.
    assert!(findings
        .iter()
        .any(|f| f.kind == "pool_blocked" && f.pools == ["alpha-*"]));
    assert!(!findings
        .iter()
        .any(|f| f.kind == "pool_blocked" && f.pools == ["gamma-*"]));
}
