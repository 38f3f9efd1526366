//! Tests of the mirror: sizes, offsets and constants against bpf/wallscope.h.
use std::mem::offset_of;

use super::*;

/// Offsets as laid out by `struct ws_proc_event` in bpf/wallscope.h.
#[test]
fn proc_event_offsets_match_header() {
    assert_eq!(offset_of!(ProcEvent, kind), 0);
    assert_eq!(offset_of!(ProcEvent, pid), 4);
    assert_eq!(offset_of!(ProcEvent, parent), 8);
    assert_eq!(offset_of!(ProcEvent, start_ns), 16);
    assert_eq!(offset_of!(ProcEvent, time_ns), 24);
    assert_eq!(offset_of!(ProcEvent, comm), 32);
}

/// Offsets as laid out by `struct ws_stack_key` in bpf/wallscope.h.
#[test]
fn stack_key_offsets_match_header() {
    assert_eq!(offset_of!(StackKey, pid), 0);
    assert_eq!(offset_of!(StackKey, tid), 4);
    assert_eq!(offset_of!(StackKey, user_stack_id), 8);
    assert_eq!(offset_of!(StackKey, kernel_stack_id), 12);
    assert_eq!(offset_of!(StackKey, state), 16);
    assert_eq!(offset_of!(StackKey, stack_gen), 20);
    assert_eq!(offset_of!(StackKey, peer_pid), 24);
    assert_eq!(offset_of!(StackKey, peer_tid), 28);
    assert_eq!(offset_of!(StackKey, syscall), 32);
    assert_eq!(offset_of!(StackKey, comm), 40);
    assert_eq!(offset_of!(StackValue, ns), 0);
    assert_eq!(offset_of!(StackValue, count), 8);
    assert_eq!(offset_of!(ThreadTotals, comm), 8);
    assert_eq!(offset_of!(ThreadTotals, ns), 24);
    assert_eq!(offset_of!(ThreadTotals, switches_voluntary), 72);
    assert_eq!(offset_of!(ThreadTotals, wakeups_received), 96);
    assert_eq!(offset_of!(Hist, ns), 8 * HIST_SLOTS);
    assert_eq!(offset_of!(LiveThread, since_ns), 16);
    assert_eq!(offset_of!(LiveThread, now_ns), 24);
    assert_eq!(offset_of!(LiveThread, user_stack_id), 32);
    assert_eq!(offset_of!(LiveThread, stack_gen), 40);
    assert_eq!(offset_of!(LiveThread, waker_pid), 44);
    assert_eq!(offset_of!(LiveThread, waker_tid), 48);
    assert_eq!(offset_of!(LiveThread, comm), 56);
    assert_eq!(offset_of!(HistKey, kind), 8);
    assert_eq!(offset_of!(StoredStack, len), 8);
    assert_eq!(offset_of!(StoredStack, ips), 16);
    assert_eq!(offset_of!(UnwindRow, cfa_off), 4);
    assert_eq!(offset_of!(UnwindRow, rbp_off), 8);
    assert_eq!(offset_of!(UnwindRow, cfa_reg), 10);
    assert_eq!(offset_of!(UnwindRow, rbp_rule), 11);
    assert_eq!(offset_of!(UnwindMapping, bias), 16);
    assert_eq!(offset_of!(UnwindMapping, row_count), 28);
    assert_eq!(offset_of!(UnwindMapping, page_count), 36);
    assert_eq!(offset_of!(UnwindProc, mappings), 8);
}

/// The header's enums and constants, read from the header text itself so
/// that an edit on one side only fails here.
#[test]
fn constants_match_header() {
    let header = include_str!("../../../bpf/wallscope.h");
    let value_of = |name: &str| -> i64 {
        let line = header
            .lines()
            .find(|l| {
                let t = l.trim_start();
                t.starts_with(&format!("{name} ")) || t.starts_with(&format!("#define {name} "))
            })
            .unwrap_or_else(|| panic!("{name} not in header"));
        let rhs = line
            .split(['=', ' ', '\t', ',', '(', ')'])
            .filter(|s| !s.is_empty());
        // Decimal or hex, with C's `u` suffix (`0x40000000u`).
        let number = |s: &str| {
            let s = s.trim_end_matches(['u', 'U']);
            match s.strip_prefix("0x") {
                Some(hex) => i64::from_str_radix(hex, 16).ok(),
                None => s.parse::<i64>().ok(),
            }
        };
        rhs.filter_map(number)
            .next()
            .unwrap_or_else(|| panic!("{line}"))
    };
    assert_eq!(value_of("WS_COMM_LEN"), COMM_LEN as i64);
    assert_eq!(value_of("WS_MAX_STACK_DEPTH"), MAX_STACK_DEPTH as i64);
    assert_eq!(value_of("WS_NO_STACK"), NO_STACK as i64);
    for s in State::ALL {
        let name = format!("WS_STATE_{}", s.name().to_uppercase());
        assert_eq!(value_of(&name), s as i64, "{name}");
    }
    assert_eq!(value_of("WS_STATE_COUNT"), State::ALL.len() as i64);
    assert_eq!(value_of("WS_STATE_WAKEUP"), WAKEUP_STATE as i64);
    assert_eq!(value_of("WS_STACK_GENERATIONS"), STACK_GENERATIONS as i64);
    assert_eq!(value_of("WS_HIST_SLOTS"), HIST_SLOTS as i64);
    assert_eq!(value_of("WS_WALK_KINDS"), WALK_KINDS as i64);
    assert_eq!(value_of("WS_WALK_DEPTHS"), WALK_DEPTHS as i64);
    assert_eq!(value_of("WS_WALK_TIME_SLOTS"), WALK_TIME_SLOTS as i64);
    assert_eq!(
        value_of("WS_WALK_USER_TABLES"),
        walk_kind::USER_TABLES as i64
    );
    assert_eq!(value_of("WS_WALK_USER_FP"), walk_kind::USER_FP as i64);
    assert_eq!(value_of("WS_WALK_KERNEL"), walk_kind::KERNEL as i64);
    assert_eq!(value_of("WS_WALK_LIVE"), walk_kind::LIVE as i64);
    assert_eq!(value_of("WS_CONTROL_BUFFER"), Control::Buffer as i64);
    assert_eq!(
        value_of("WS_CONTROL_GENERATION"),
        Control::Generation as i64
    );
    assert_eq!(value_of("WS_HIST_PROCESS"), HIST_PROCESS as i64);
    assert_eq!(value_of("WS_HIST_CGROUP"), HIST_CGROUP as i64);
    assert_eq!(
        value_of("WS_HIST_PROCESS_THROTTLED"),
        HIST_PROCESS_THROTTLED as i64
    );
    assert_eq!(
        value_of("WS_HIST_CGROUP_THROTTLED"),
        HIST_CGROUP_THROTTLED as i64
    );
    assert_eq!(value_of("WS_INTERRUPT_TID"), INTERRUPT_TID as i64);
    assert_eq!(value_of("WS_STAT_COUNT"), Stat::COUNT as i64);
    let stat_names = [
        "WS_STAT_SAMPLES",
        "WS_STAT_COUNTS_FULL",
        "WS_STAT_USTACK_COLLISION",
        "WS_STAT_USTACK_FAILED",
        "WS_STAT_KSTACK_COLLISION",
        "WS_STAT_KSTACK_FAILED",
        "WS_STAT_SWITCHES",
        "WS_STAT_WAKEUPS",
        "WS_STAT_STACK_EXPIRED",
        "WS_STAT_TASK_STORAGE_FAILED",
        "WS_STAT_THREADS_FULL",
        "WS_STAT_HIST_FULL",
        "WS_STAT_BELOW_THRESHOLD",
        "WS_STAT_STACKS_STORED",
        "WS_STAT_STACK_STORE_FAILED",
        "WS_STAT_UNWIND_WALKS",
        "WS_STAT_UNWIND_NO_INFO",
        "WS_STAT_UNWIND_UNSUPPORTED",
        "WS_STAT_UNWIND_READ_FAILED",
        "WS_STAT_UNWIND_TRUNCATED",
        "WS_STAT_PROC_EVENTS_LOST",
        "WS_STAT_COUNTS_MERGED",
        "WS_STAT_OFFCPU_WALKS",
        "WS_STAT_WAKER_WALKS",
        "WS_STAT_LIVE_WALKS",
        "WS_STAT_SAMPLED_OUT",
        "WS_STAT_DEFERRED_LOST",
        "WS_STAT_LIVE_WALKS_PUT_OFF",
        "WS_STAT_WALKS_REUSED",
    ];
    assert_eq!(stat_names.len(), Stat::COUNT);
    assert_eq!(
        value_of("WS_UNWIND_MAX_MAPPINGS"),
        UNWIND_MAX_MAPPINGS as i64
    );
    let enums = [
        ("WS_CFA_RSP", cfa::RSP),
        ("WS_CFA_RBP", cfa::RBP),
        ("WS_CFA_NONE", cfa::NONE),
        ("WS_CFA_END", cfa::END),
        ("WS_CFA_UNSUPPORTED", cfa::UNSUPPORTED),
        ("WS_RBP_SAME", rbp::SAME),
        ("WS_RBP_AT_CFA", rbp::AT_CFA),
        ("WS_RBP_UNSUPPORTED", rbp::UNSUPPORTED),
    ];
    for (name, v) in enums {
        assert_eq!(value_of(name), i64::from(v), "{name}");
    }
    for (stat, name) in Stat::ALL.iter().zip(stat_names) {
        assert_eq!(value_of(name), *stat as i64, "{name}");
    }
}
