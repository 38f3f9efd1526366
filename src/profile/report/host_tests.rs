use std::{sync::Arc, time::Duration};

use super::*;
use crate::profile::model::live::LiveThread;

fn thread(pid: u32, state: State, s: u64, stack: &[&str]) -> LiveThread {
    LiveThread {
        pid,
        tid: pid * 10,
        name: Arc::from("t"),
        state,
        in_state: Duration::from_secs(s),
        syscall: None,
        // Outermost frame first, as the store keeps them.
        stack: stack.iter().map(|f| Arc::<str>::from(*f)).collect(),
        waker: None,
    }
}

#[test]
fn held_up_threads_are_io_locks_and_joins_of_user_processes() {
    let lock = [
        "main",
        "waiter_wants_lock",
        "pthread_mutex_lock",
        "__lll_lock_wait",
        "[syscall futex]",
    ];
    let idle = ["main", "worker", "pthread_cond_wait", "[syscall futex]"];
    let mut live = LiveView {
        threads: vec![
            thread(1, State::Futex, 30, &lock),
            thread(1, State::Futex, 30, &idle),
            thread(2, State::Io, 15, &["main", "read", "folio_wait_bit_[k]"]),
            // A kernel thread in D, a short wait, an idle poll, a hidden one.
            thread(3, State::Io, 20, &["worker_thread_[k]"]),
            thread(4, State::Futex, 5, &lock),
            thread(5, State::Sleep, 100, &["main", "epoll_wait"]),
            thread(6, State::Futex, 40, &lock),
            // glibc's internal name, which reads as wait machinery.
            thread(
                7,
                State::Futex,
                12,
                &["main", "take", "___pthread_mutex_lock", "[syscall futex]"],
            ),
        ],
        ..LiveView::default()
    };
    live.processes.insert(1, Arc::from("hung"));
    let mut asked = Vec::new();
    let stuck = stuck_now(
        &live,
        |pid| pid != 6,
        |pid| {
            asked.push(pid);
            pid == 3
        },
    );
    assert_eq!(stuck.min_s, 10);
    assert_eq!(stuck.threads, 3);
    let listed: Vec<(u32, &str, usize, f64)> = stuck
        .processes
        .iter()
        .map(|p| (p.pid, p.comm.as_str(), p.threads, p.longest_s))
        .collect();
    assert_eq!(
        listed,
        [(1, "hung", 1, 30.0), (2, "", 1, 15.0), (7, "", 1, 12.0)]
    );
    // Only threads in I/O need the kernel's word.
    assert_eq!(asked, [2, 3]);
}
