//! Reading symbolized kernel stacks: the profiler's own frames to cut off,
//! and whether a wakeup ran in a hard or a soft interrupt.
//!
//! Names are matched without the `_[k]` mark and without the suffixes the
//! compiler adds to clones (`.cold`, `.isra.0`, `.constprop.0`).

use crate::profile::model::Interrupt;

/// Exact names of BPF machinery frames (the prefixes are in [`is_own`]).
const OWN_NAMES: [&str; 3] = ["trace_call_bpf", "bpf_overflow_handler", "___bpf_prog_run"];

/// Name prefixes of BPF machinery frames: the helpers that take the stack,
/// the tracepoint glue that runs the program, the interpreter and the
/// trampolines.
const OWN_PREFIXES: [&str; 11] = [
    "bpf_get_stack",
    "__bpf_get_stack",
    "___bpf_get_stack",
    "bpf_get_task_stack",
    "bpf_trace_run",
    "__bpf_trace_",
    "__traceiter_",
    "__bpf_prog_run",
    "__bpf_prog_enter",
    "__bpf_prog_exit",
    "bpf_trampoline_",
];

/// Frames that only run in softirq context (or hand it the CPU).
const SOFTIRQ_NAMES: [&str; 18] = [
    "handle_softirqs",
    "__do_softirq",
    "do_softirq",
    "do_softirq_own_stack",
    "invoke_softirq",
    "run_ksoftirqd",
    "__local_bh_enable_ip",
    "net_rx_action",
    "net_tx_action",
    "run_timer_softirq",
    "hrtimer_run_softirq",
    "tasklet_action",
    "tasklet_hi_action",
    "tasklet_action_common",
    "blk_done_softirq",
    "irq_poll_softirq",
    "rcu_core_si",
    "run_rebalance_domains",
];

/// Name prefixes of hard interrupt entry and dispatch frames.
const HARDIRQ_PREFIXES: [&str; 9] = [
    "asm_sysvec_",
    "sysvec_",
    "__sysvec_",
    "asm_common_interrupt",
    "common_interrupt",
    "__common_interrupt",
    "handle_irq_event",
    "__handle_irq_event_percpu",
    "hrtimer_interrupt",
];

/// A frame's function name: no `_[k]` mark, no clone suffix.
fn base(frame: &str) -> &str {
    let name = frame.strip_suffix("_[k]").unwrap_or(frame);
    name.split('.').next().unwrap_or(name)
}

/// `bpf_prog_<16 hex digits>` alone or followed by `_<name>`: the symbol of
/// a loaded BPF program (not `bpf_prog_run`, `bpf_prog_add`...).
fn is_bpf_program(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("bpf_prog_") else {
        return false;
    };
    let (tag, tail) = rest.split_at(rest.len().min(16));
    tag.len() == 16
        && tag.bytes().all(|b| b.is_ascii_hexdigit())
        && (tail.is_empty() || tail.starts_with('_'))
}

/// Whether `frame` belongs to the BPF machinery that took the stack.
fn is_own(frame: &str) -> bool {
    let name = base(frame);
    is_bpf_program(name)
        || name.starts_with("perf_trace_")
        || OWN_NAMES.contains(&name)
        || OWN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// How many frames, counted from the leaf, belong to the BPF program that
/// took the stack: every frame up to and including the outermost machinery
/// frame. What lies above it (e.g. `__schedule`) is the real kernel path.
pub fn own_frames<F: AsRef<str>>(leaf_first: &[F]) -> usize {
    leaf_first
        .iter()
        .rposition(|f| is_own(f.as_ref()))
        .map_or(0, |at| at + 1)
}

/// The context a wakeup raised in an interrupt ran in, from its symbolized
/// stack (root first). The frame nearest the leaf that names a context
/// decides: a hard interrupt that arrived while softirqs were running is a
/// hard interrupt. A stack naming neither is taken as a hard interrupt.
pub fn interrupt<F: AsRef<str>>(root_first: &[F]) -> Interrupt {
    entered_interrupt(root_first).unwrap_or(Interrupt::Hard)
}

/// The interrupt context a stack (root first) runs in, if it passes
/// through an interrupt's entry or a softirq.
pub fn entered_interrupt<F: AsRef<str>>(root_first: &[F]) -> Option<Interrupt> {
    root_first.iter().rev().find_map(|f| context_of(f.as_ref()))
}

/// Where the outermost interrupt entry is in a stack (root first): the
/// frames before it are the interrupted context's, not the interrupt's.
pub fn interrupt_entry<F: AsRef<str>>(root_first: &[F]) -> Option<usize> {
    root_first
        .iter()
        .position(|f| context_of(f.as_ref()).is_some())
}

/// The interrupt context `frame` runs in, if it names one.
fn context_of(frame: &str) -> Option<Interrupt> {
    let name = base(frame);
    if SOFTIRQ_NAMES.contains(&name) {
        Some(Interrupt::Soft)
    } else if HARDIRQ_PREFIXES.iter().any(|p| name.starts_with(p)) {
        Some(Interrupt::Hard)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| format!("{n}_[k]")).collect()
    }

    #[test]
    fn tracepoint_machinery_is_cut_from_the_leaf() {
        // A sched_switch stack as bpf_get_stack takes it, leaf first.
        let stack = k(&[
            "bpf_get_stack_raw_tp",
            "bpf_prog_6deef7357e7b4530_on_switch",
            "bpf_trace_run4",
            "__bpf_trace_sched_switch",
            "__traceiter_sched_switch",
            "__schedule",
            "schedule",
            "futex_wait_queue",
        ]);
        assert_eq!(own_frames(&stack), 5);
        assert_eq!(stack[own_frames(&stack)], "__schedule_[k]");
        // Classic tracepoint programs, trampolines and the interpreter.
        let stack = k(&[
            "bpf_get_stackid_tp",
            "___bpf_prog_run",
            "__bpf_prog_run32",
            "trace_call_bpf",
            "perf_trace_run_bpf_submit",
            "perf_trace_sched_wakeup_template",
            "try_to_wake_up",
            "wake_up_q",
        ]);
        assert_eq!(own_frames(&stack), 6);
        let stack = k(&[
            "bpf_prog_0123456789abcdef",
            "bpf_trampoline_6442513950",
            "__bpf_prog_enter_recur.isra.0",
            "do_nanosleep",
        ]);
        assert_eq!(own_frames(&stack), 3);
    }

    #[test]
    fn stacks_without_machinery_are_kept_whole() {
        let stack = k(&["__schedule", "schedule", "bpf_prog_load", "__sys_bpf"]);
        assert_eq!(own_frames(&stack), 0, "bpf(2) itself is real work");
        assert_eq!(own_frames::<&str>(&[]), 0);
        for name in [
            "bpf_prog_run",
            "bpf_prog_add",
            "bpf_prog_0123_x",
            "perf_event_open",
        ] {
            assert!(!is_own(name), "{name}");
        }
        assert!(is_own("bpf_prog_0123456789abcdef_x_[k]"));
    }

    #[test]
    fn interrupts_are_told_apart_by_the_frame_nearest_the_leaf() {
        let root_first = |leaf_first: &[&str]| {
            let mut v = k(leaf_first);
            v.reverse();
            v
        };
        let hrtimer = root_first(&[
            "try_to_wake_up",
            "hrtimer_wakeup",
            "__hrtimer_run_queues",
            "hrtimer_interrupt",
            "__sysvec_apic_timer_interrupt",
            "sysvec_apic_timer_interrupt",
            "asm_sysvec_apic_timer_interrupt",
            "pv_native_safe_halt",
        ]);
        assert_eq!(interrupt(&hrtimer), Interrupt::Hard);
        let net = root_first(&[
            "try_to_wake_up",
            "sock_def_readable",
            "tcp_data_queue",
            "__netif_receive_skb",
            "net_rx_action",
            "handle_softirqs",
            "irq_exit_rcu",
            "common_interrupt",
        ]);
        assert_eq!(interrupt(&net), Interrupt::Soft);
        let timer = root_first(&[
            "try_to_wake_up",
            "call_timer_fn",
            "__run_timers",
            "run_timer_softirq.cold",
        ]);
        assert_eq!(interrupt(&timer), Interrupt::Soft);
        // A hard interrupt taken while softirqs ran.
        let nested = root_first(&["try_to_wake_up", "hrtimer_interrupt", "handle_softirqs"]);
        assert_eq!(interrupt(&nested), Interrupt::Hard);
        assert_eq!(interrupt(&root_first(&["try_to_wake_up"])), Interrupt::Hard);
    }

    #[test]
    fn an_interrupts_entry_is_found_under_what_it_interrupted() {
        // A timer that fired while a user thread was in write(2): the
        // frames under the entry are the thread's, not the interrupt's.
        let mut in_syscall = k(&[
            "try_to_wake_up",
            "hrtimer_wakeup",
            "__hrtimer_run_queues",
            "hrtimer_interrupt",
            "__sysvec_apic_timer_interrupt",
            "asm_sysvec_apic_timer_interrupt",
            "copy_page_from_iter",
            "pipe_write",
            "do_syscall_64",
        ]);
        in_syscall.reverse();
        assert_eq!(entered_interrupt(&in_syscall), Some(Interrupt::Hard));
        let at = interrupt_entry(&in_syscall).unwrap();
        assert!(in_syscall[at].starts_with("asm_sysvec_apic_timer_interrupt"));
        let mut woke = k(&["try_to_wake_up", "futex_wake", "do_futex", "do_syscall_64"]);
        woke.reverse();
        assert_eq!(
            (entered_interrupt(&woke), interrupt_entry(&woke)),
            (None, None)
        );
    }
}
