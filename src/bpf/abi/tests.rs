//! Tests of what is kept by hand: layouts are bindgen's (compile-time
//! assertions in `generated`), the numbers all come from the header.
use std::collections::HashSet;

use super::*;

/// Metric names are what `/healthz` and `/metrics` publish: unique and
/// snake_case, whatever is added to WS_STATS.
#[test]
fn stat_names_are_unique_snake_case() {
    let mut seen = HashSet::new();
    for stat in Stat::ALL {
        let name = stat.name();
        assert!(seen.insert(name), "{name} twice");
        assert!(
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{name}"
        );
    }
    assert_eq!(Stat::ALL.len(), Stat::COUNT);
    for (i, stat) in Stat::ALL.iter().enumerate() {
        assert_eq!(*stat as usize, i, "{stat:?}");
    }
}

/// Losses and events as the header declares them (two of each kind).
#[test]
fn stat_kinds_follow_the_header() {
    assert!(!Stat::Samples.is_loss());
    assert!(!Stat::WalksReused.is_loss());
    assert!(Stat::CountsFull.is_loss());
    assert!(Stat::UserStackCollision.is_loss());
    assert_eq!(Stat::LiveWalks.name(), "blocked_stack_walks");
}

#[test]
fn states_decode_from_raw() {
    for s in State::ALL {
        assert_eq!(State::from_raw(s as u32), Some(s));
    }
    assert_eq!(State::from_raw(WAKEUP_STATE), None);
}

#[test]
fn records_read_from_short_and_unaligned_bytes() {
    let mut bytes = vec![0u8; size_of::<ProcEvent>() + 1];
    bytes[1] = proc_event::EXIT as u8;
    bytes[5] = 42;
    let e = ProcEvent::from_bytes(&bytes[1..]).unwrap();
    assert_eq!((e.kind, e.pid), (proc_event::EXIT, 42));
    assert!(ProcEvent::from_bytes(&bytes[..size_of::<ProcEvent>() - 1]).is_none());
    assert!(LiveThread::from_bytes(&[0; 8]).is_none());
}
