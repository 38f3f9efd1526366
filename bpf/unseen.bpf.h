/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Switches the programs never saw. A tracepoint can fire without running
 * its BPF programs: on the Firecracker guests wallscope is tested on, no
 * program runs in the context of the guest init's threads, so neither
 * their own switches out nor a switch from one of them to another thread,
 * nor a wakeup done in an interrupt that arrived while one ran, reaches
 * the programs. A thread's marks then say "off-CPU" while it runs, or
 * "running" while it is off, and the next event seen would drop the time
 * in between.
 *
 * Instead, that time is split with the kernel's own account of the thread
 * (its CPU time and runqueue wait, task.bpf.h) and the rest goes to the
 * state the thread was last known in, or is found in: wall time is kept
 * whole, the split is the kernel's where it can be and the last known
 * state's where not, and each case is counted (switches_in_unseen,
 * switches_out_unseen). Then the event seen goes on as usual.
 */
#ifndef WALLSCOPE_UNSEEN_BPF_H
#define WALLSCOPE_UNSEEN_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "task.bpf.h"
#include "wallscope.h"

/* How long the iterator lets marks say "running" for a thread no CPU runs
 * before it takes the switch-out as unseen: far longer than the moment
 * between a switch-in's program and the kernel's task->on_cpu. */
#define WS_UNSEEN_AFTER_NS 1000000ULL

static __always_inline __u64 ws_min(__u64 a, __u64 b)
{
	return a < b ? a : b;
}

/* `t` runs (it is being switched out, or is found running) while its
 * marks hold it off-CPU since acct_from: its switch-in went unseen, and
 * maybe its wakeup. Of the time since, the CPU time the kernel counted
 * since its last switch-out was the end of it; the runqueue wait the kernel
 * counted came just before (when the phase was still a sleep: the wakeup
 * went unseen too); the rest is the phase's. Leaves `t` running since its
 * CPU time began and returns the weight of the phase's row (0: none), for
 * the caller to add with the stacks left in `s`. */
static __always_inline __u64 ws_unseen_in_split(struct task_struct *t, struct ws_task *s,
						__u64 now)
{
	__u32 state = s->state;
	__u64 from = __sync_lock_test_and_set(&s->acct_from, 0);
	__u64 span = from && now > from ? now - from : 0;
	__u64 cpu = ws_min(span, ws_kernel_cpu_ns(t) - s->exec_out);
	__u64 wait = 0, ran_from = now - cpu, w;

	ws_stat_inc(WS_STAT_SWITCH_IN_UNSEEN);
	if (ws_sleeping(state))
		wait = ws_min(span - cpu, ws_kernel_wait_ns(t) - s->delay_out);
	ws_count_ns(&s->c, state, span - cpu - wait);
	ws_count_ns(&s->c, WS_STATE_RUNQUEUE, wait);
	/* The phase's row, whole, with the stacks the iterator walked for this
	 * episode if it did; none otherwise (its switch-in walk never ran). */
	w = ran_from > s->phase_start ? ws_draw(ran_from - s->phase_start,
						ws_take(&s->row_from, ran_from, 0), s->c.span.id)
				      : 0;
	if (w && s->stack_episode != s->off_since) {
		s->user_stack_id = WS_NO_STACK;
		s->kernel_stack_id = WS_NO_STACK;
	}
	s->row_from = 0;
	s->phase_start = 0;
	s->off_since = 0;
	s->in_at = ran_from;
	s->exec_in = ws_kernel_cpu_ns(t) - cpu;
	s->on_cpu_since = ran_from;
	return w;
}

/* ws_unseen_in_split, with the phase's row added. */
static __always_inline void ws_switch_in_unseen(struct task_struct *t, struct ws_task *s,
						__u64 now)
{
	__u32 state = s->state;
	__u64 w = ws_unseen_in_split(t, s, now);
	struct ws_stack_key key = {};

	if (w) {
		ws_phase_key(&key, t, s, state);
		ws_add(&key, w);
	}
}

/* `t` is off-CPU (woken, switched in, or found so by the iterator) while
 * its marks hold it running: its switch-out went unseen. Of the time since
 * the CPU mark, the CPU time the kernel counted since the switch-in, less
 * what was counted already, ran first; the rest starts a phase in `state`
 * (the caller's reading of the thread now), which the caller's event then
 * goes on with. */
static __always_inline void ws_switch_out_unseen(struct task_struct *t, struct ws_task *s,
						 __u32 state, __u64 now)
{
	__u64 since = s->on_cpu_since, ran, cpu, off_at;

	if (!since || now <= since ||
	    __sync_val_compare_and_swap(&s->on_cpu_since, since, 0) != since)
		return;
	ws_stat_inc(WS_STAT_SWITCH_OUT_UNSEEN);
	ran = ws_kernel_cpu_ns(t) - s->exec_in;
	cpu = ran > since - s->in_at ? ws_min(ran - (since - s->in_at), now - since) : 0;
	ws_count_ns(&s->c, WS_STATE_CPU, cpu);
	off_at = since + cpu;
	s->syscall = ws_is_kthread(t) ? 0 : ws_syscall(t);
	s->state = state;
	s->off_since = off_at;
	s->acct_from = off_at;
	s->row_from = off_at;
	ws_mark_out(t, s);
	s->phase_start = off_at;
}

#endif /* WALLSCOPE_UNSEEN_BPF_H */
