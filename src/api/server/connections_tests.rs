//! Tests of the connection table (`connections.rs`).

use std::time::Duration;

use super::*;

/// The one owner of most tests' connections.
const USER: Owner = Owner::Uid(1000);

/// The phase of connection `c`, `None` once chosen to be closed.
fn phase(c: &Admitted) -> Option<Phase> {
    c.connections.table().entries.get(&c.id).map(|e| e.phase)
}

#[test]
fn full_table_evicts_the_longest_waiting_connection() {
    let t0 = Instant::now();
    let conns = Arc::new(Connections::new(3));
    let at = |s| t0 + Duration::from_secs(s);
    let a = conns.admit(at(0), USER).unwrap();
    let b = conns.admit(at(1), USER).unwrap();
    let c = conns.admit(at(2), USER).unwrap();
    // `a` is serving, so `b` has waited longest.
    let serving = a.request_started();
    let d = conns.admit(at(3), USER).unwrap();
    assert_eq!(phase(&b), None);
    assert_eq!(phase(&c), Some(Phase::Waiting(at(2))));
    assert_eq!(conns.table().entries.len(), 3);
    // Every connection busy: no room.
    let _busy = [c.request_started(), d.request_started()];
    assert!(conns.admit(at(4), USER).is_none());
    // A finished request makes its connection evictable again.
    drop(serving);
    assert!(matches!(phase(&a), Some(Phase::Waiting(_))));
    assert!(conns.admit(at(5), USER).is_some());
    assert_eq!(phase(&a), None);
    // The evicted connection's task was told to close it.
    let closing = b.conn.close.notified();
    tokio::pin!(closing);
    assert!(closing.as_mut().enable(), "a stored permit");
}

#[test]
fn only_connections_waiting_past_the_timeout_are_closed() {
    // In the past, so that a wait starting now comes after all of them.
    let t0 = Instant::now().checked_sub(Duration::from_secs(60)).unwrap();
    let conns = Arc::new(Connections::new(10));
    let old = conns.admit(t0, USER).unwrap();
    let busy = conns.admit(t0, USER).unwrap();
    let young = conns.admit(t0 + Duration::from_secs(5), USER).unwrap();
    let in_flight = busy.request_started();
    conns.close_idle(t0 + IDLE_TIMEOUT);
    assert_eq!(phase(&old), None);
    assert_eq!(phase(&busy), Some(Phase::Serving(1)));
    assert_eq!(
        phase(&young),
        Some(Phase::Waiting(t0 + Duration::from_secs(5)))
    );
    // A connection that was serving waits from the end of its response.
    drop(in_flight);
    conns.close_idle(t0 + IDLE_TIMEOUT + Duration::from_secs(5));
    assert_eq!(phase(&young), None);
    assert!(matches!(phase(&busy), Some(Phase::Waiting(_))));
    assert_eq!(conns.table().waiting.len(), 1);
    drop(young);
    drop(old);
    assert_eq!(conns.table().entries.len(), 1);
}

#[test]
fn answers_that_stop_moving_or_take_too_long_are_closed() {
    let t0 = Instant::now()
        .checked_sub(Duration::from_secs(600))
        .unwrap();
    let conns = Arc::new(Connections::new(10));
    let [reader, stopped, handler] = [0, 1, 2].map(|_| conns.admit(t0, USER).unwrap());
    let requests = [&reader, &stopped, &handler].map(|c| c.request_started());
    requests[0].writing(t0);
    requests[1].writing(t0);
    let half = WRITE_STALL / 2;
    requests[0].progress(t0 + half);
    // A reader that keeps taking bytes, and a handler still computing,
    // stay; the one that stopped reading goes.
    conns.close_stuck_writers(t0 + WRITE_STALL);
    assert_eq!(phase(&stopped), None);
    assert_eq!(phase(&reader), Some(Phase::Serving(1)));
    assert_eq!(phase(&handler), Some(Phase::Serving(1)));
    // Progress postpones the stall, never the total deadline.
    let mut at = t0 + half;
    while at + half < t0 + WRITE_DEADLINE {
        at += half;
        requests[0].progress(at);
        conns.close_stuck_writers(at);
        assert_eq!(phase(&reader), Some(Phase::Serving(1)), "{:?}", at - t0);
    }
    conns.close_stuck_writers(t0 + WRITE_DEADLINE);
    assert_eq!(phase(&reader), None);
    assert_eq!(phase(&handler), Some(Phase::Serving(1)));
    // The closed ones' tasks were told.
    for c in [&reader, &stopped] {
        let closing = c.conn.close.notified();
        tokio::pin!(closing);
        assert!(closing.as_mut().enable(), "a stored permit");
    }
}

#[test]
fn at_the_cap_a_stalled_answer_makes_room() {
    let t0 = Instant::now().checked_sub(Duration::from_secs(60)).unwrap();
    let conns = Arc::new(Connections::new(2));
    let stalled = conns.admit(t0, USER).unwrap();
    let moving = conns.admit(t0, USER).unwrap();
    let (a, b) = (stalled.request_started(), moving.request_started());
    a.writing(t0);
    b.writing(t0);
    let almost = t0 + EVICTABLE_STALL * 9 / 10;
    b.progress(almost);
    // Nobody has stalled long enough yet: no room.
    assert!(conns.admit(almost, USER).is_none());
    let first = conns.admit(t0 + EVICTABLE_STALL, USER).unwrap();
    assert_eq!(phase(&stalled), None);
    assert_eq!(phase(&moving), Some(Phase::Serving(1)));
    // A handler still computing is not evicted: only answers stall.
    let _computing = first.request_started();
    b.progress(t0 + EVICTABLE_STALL);
    assert!(conns.admit(t0 + EVICTABLE_STALL * 3 / 2, USER).is_none());
    assert!(conns.admit(t0 + EVICTABLE_STALL * 2, USER).is_some());
    assert_eq!(phase(&moving), None);
}

#[test]
fn a_finished_answer_leaves_the_write_rules() {
    let t0 = Instant::now()
        .checked_sub(Duration::from_secs(600))
        .unwrap();
    let conns = Arc::new(Connections::new(4));
    let c = conns.admit(t0, USER).unwrap();
    let r = c.request_started();
    r.writing(t0);
    drop(r);
    // Waiting now: the idle rule applies, not the write stall.
    conns.close_stuck_writers(t0 + WRITE_DEADLINE);
    assert!(matches!(phase(&c), Some(Phase::Waiting(_))));
    let next = c.request_started();
    conns.close_stuck_writers(t0 + WRITE_DEADLINE * 2);
    assert_eq!(
        phase(&c),
        Some(Phase::Serving(1)),
        "its next request computes"
    );
    drop(next);
}

#[test]
fn at_the_cap_room_is_made_among_the_connections_of_whoever_holds_the_most() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let conns = Arc::new(Connections::new(4));
    let (root, flooder) = (Owner::Uid(0), Owner::Uid(65534));
    // Root's probe, just accepted and not yet read, is the oldest waiting.
    let probe = conns.admit(at(0), root).unwrap();
    let flood: Vec<Admitted> = (1..4)
        .map(|i| conns.admit(at(i), flooder).unwrap())
        .collect();
    let _serving: Vec<InFlight> = flood[1..].iter().map(|c| c.request_started()).collect();
    // The flooder's next connection closes its own waiting one, not root's.
    let next = conns.admit(at(10), flooder).unwrap();
    assert_eq!(phase(&flood[0]), None);
    assert_eq!(phase(&probe), Some(Phase::Waiting(at(0))));
    // All of the flooder's own busy and none stalled: it is refused.
    let _busy = next.request_started();
    assert!(conns.admit(at(20), flooder).is_none());
    assert_eq!(phase(&probe), Some(Phase::Waiting(at(0))));
    // Another user gets in: the heaviest holder's oldest goes, busy or not.
    let other = conns.admit(at(30), Owner::Uid(1000)).unwrap();
    assert_eq!(phase(&flood[1]), None);
    assert!(phase(&other).is_some() && phase(&probe).is_some());
    assert_eq!(conns.table().owned.get(&flooder), Some(&2));
}
