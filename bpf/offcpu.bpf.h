/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Off-CPU engine. Every nanosecond a thread is not running belongs to one
 * phase: from switch-out in a sleep state (futex, io, sleep) until its
 * wakeup, then runqueue until it is switched in (a preempted thread goes
 * straight to runqueue, a throttled one to throttled).
 *
 * Time is accounted as it passes: phase ends add what is left to the
 * per-thread totals, and the drain-time iterator (live.bpf.h) adds the part
 * of every ongoing phase that has passed, so a thread blocked for an hour
 * shows in every window. acct_from / row_from mark how far the totals and
 * the stack rows have got; whoever moves them (atomically) adds the time.
 *
 * Stacks are taken only where they matter: switch-out stamps the phase (no
 * stack); when a phase ends its row is drawn with probability
 * min(1, d / offcpu_sample_ns) and weight (its unrecorded time) / p, an
 * unbiased estimate whatever the switch rate, and drawn rows wait in the
 * task's storage until sched_exit_tp runs in the task itself, right after
 * the switch-in, where its stack is walked (the same registers as at
 * switch-out). Kernels without that tracepoint take stacks at switch-out.
 */
#ifndef WALLSCOPE_OFFCPU_BPF_H
#define WALLSCOPE_OFFCPU_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include "culprits.bpf.h"
#include "otelctx.bpf.h"
#include "task.bpf.h"
#include "trace.bpf.h"
#include "unseen.bpf.h"
#include "wallscope.h"

/* The kernel stack is the costly part, and for futex and sleep the
 * syscall names the path: only I/O waits and kernel threads pay for it. */
static __always_inline bool ws_wants_kernel_stack(struct task_struct *t, struct ws_task *s)
{
	return ws_is_kthread(t) || s->pending_state[0] == WS_STATE_IO ||
	       s->pending_state[1] == WS_STATE_IO || s->state == WS_STATE_IO;
}

/* Forgets the walks kept for `t` (an exec replaced its memory). */
static __always_inline void ws_forget_walks(struct task_struct *t)
{
	struct ws_task *s = ws_task(t, false);

	if (s)
		__builtin_memset(&s->memos, 0, sizeof(s->memos));
}

/* Walks the current task's stacks into `s` for its last episode, unless the
 * drain-time iterator already did (then they move to this generation). */
static __always_inline void ws_own_stacks(void *ctx, struct task_struct *t, struct ws_task *s,
					  __u64 episode, bool kernel)
{
	__u32 gen = ws_control(WS_CONTROL_GENERATION);

	/* The iterator's walk is kept unless it was made before the process's
	 * latest registration (no tables yet, or fewer): then walk here. */
	if (episode && s->stack_episode == episode && s->stack_tables &&
	    s->stack_tables == ws_unwind_epoch(t->tgid)) {
		s->user_stack_id = ws_renew_stack(s->user_stack_id, s->stack_gen, gen);
		s->kernel_stack_id = ws_renew_stack(s->kernel_stack_id, s->stack_gen, gen);
		s->stack_gen = gen;
		return;
	}
	s->stack_gen = gen;
	s->stack_episode = episode;
	s->user_stack_id = ws_is_kthread(t) ? WS_NO_STACK : ws_user_stack_memo(ctx, &s->memos, gen);
	s->stack_tables = 1;
	s->kernel_stack_id = kernel ? ws_kernel_stack(ctx, gen) : WS_NO_STACK;
	ws_stat_inc(WS_STAT_OFFCPU_WALKS);
}

static __always_inline void ws_switch_out(void *ctx, bool preempt, struct task_struct *prev,
					  __u64 now)
{
	struct ws_task *s = ws_task(prev, true);
	bool kthread = ws_is_kthread(prev);
	__u32 st;

	if (!s)
		return;
	if (!s->on_cpu_since && s->phase_start)
		ws_switch_in_unseen(prev, s, now);
	if (s->pending_ns[0] || s->pending_ns[1]) {
		/* Its switch-in hook never ran: keep the time, without a stack
		 * (under the span of the phase it ended, so before the read). */
		s->user_stack_id = WS_NO_STACK;
		s->kernel_stack_id = WS_NO_STACK;
		ws_emit_pending(prev, s);
		ws_stat_inc(WS_STAT_DEFERRED_LOST);
	}
	/* The span of the run's end and of the phase that begins. */
	ws_otel_observe(prev, s, now);
	ws_count_ns(&s->c, WS_STATE_CPU, ws_take(&s->on_cpu_since, now, 0));
	st = ws_task_state(prev);
	s->syscall = kthread ? 0 : ws_syscall(prev);
	s->state = ws_classify(preempt || st == TASK_RUNNING, prev, st, s->syscall);
	s->off_since = now;
	s->phase_start = now;
	s->acct_from = now;
	s->row_from = now;
	ws_mark_out(prev, s);

	if (s->state == WS_STATE_RUNQUEUE || s->state == WS_STATE_THROTTLED)
		__sync_fetch_and_add(&s->c.switches_involuntary, 1);
	else
		__sync_fetch_and_add(&s->c.switches_voluntary, 1);
}

/* A runqueue wait goes to the thread's own histogram (exported at drains);
 * throttled intervals, rare, straight to the maps. */
static __always_inline void ws_waited(struct task_struct *t, struct ws_task *s, __u32 state,
				      __u64 ns)
{
	if (state == WS_STATE_RUNQUEUE) {
		ws_count_runq_wait(&s->c, ns);
		return;
	}
	ws_hist_add(t->tgid, WS_HIST_PROCESS_THROTTLED, ns);
	ws_hist_add(ws_cpu_cgroup(t), WS_HIST_CGROUP_THROTTLED, ns);
}

static __always_inline void ws_switch_in(struct task_struct *next, __u64 now,
					 struct ws_cpu_runs *runs)
{
	struct ws_task *s = ws_task(next, true);

	if (!s)
		return;
	if (!s->phase_start && s->on_cpu_since)
		ws_switch_out_unseen(next, s, ws_classify(true, next, TASK_RUNNING, 0), now);
	if (s->phase_start) {
		__u32 state = s->state;
		__u64 d = now - s->phase_start, w;

		ws_count_ns(&s->c, state, ws_take(&s->acct_from, now, 0));
		if (state == WS_STATE_RUNQUEUE || state == WS_STATE_THROTTLED)
			ws_waited(next, s, state, d);
		if (state == WS_STATE_RUNQUEUE)
			ws_blame(runs, &s->c.culprits, s->phase_start, now,
				 (__u64)next->tgid << 32 | next->pid);
		w = ws_draw(d, ws_take(&s->row_from, now, 0), s->c.span.id);
		if (w) {
			s->pending_ns[1] = w;
			s->pending_state[1] = state;
		}
		s->phase_start = 0;
		s->last_episode = s->off_since;
		if (s->pending_ns[0] || s->pending_ns[1]) {
			__u32 zero = 0, *slot;

			if (!stacks_at_switch_in)
				ws_emit_pending(next, s);
			else if ((slot = bpf_map_lookup_elem(&deferred_tid, &zero)))
				*slot = next->pid;
		}
	}
	s->off_since = 0;
	ws_mark_in(next, s, now);
	s->on_cpu_since = now;
}

static __always_inline void ws_on_switch(void *ctx, bool preempt, struct task_struct *prev,
					 struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	struct ws_cpu_runs *runs;

	ws_stat_inc(WS_STAT_SWITCHES);
	runs = ws_note_run(prev, now);
	if (prev->pid)
		ws_switch_out(ctx, preempt, prev, now);
	if (next->pid)
		ws_switch_in(next, now, runs);
}

/* Kernels without sched_exit_tp: the thread just switched out walks its
 * stacks for the phase that starts (a program of its own on sched_switch,
 * attached after on_switch only then: with the walk, on_switch would not
 * fit the verifier's budget). */
static __always_inline void ws_on_switched_out(void *ctx, struct task_struct *prev)
{
	struct ws_task *s;

	if (!prev->pid || !(s = ws_task(prev, false)) || !s->phase_start)
		return;
	ws_own_stacks(ctx, prev, s, s->off_since, s->state == WS_STATE_IO || ws_is_kthread(prev));
}

/* sched_exit_tp, in the task that just got the CPU: walks its stack for
 * the rows its switch-in drew. Relies on `current` and the task's storage
 * only: the tracepoint also fires without a switch, and its arguments are
 * not a stable interface. */
static __always_inline void ws_on_switched_in(void *ctx)
{
	__u32 zero = 0, *slot = bpf_map_lookup_elem(&deferred_tid, &zero);
	struct task_struct *cur;
	struct ws_task *s;
	__u32 tid;

	if (!slot || !*slot)
		return;
	tid = *slot;
	*slot = 0;
	cur = bpf_get_current_task_btf();
	if (cur->pid != tid || !(s = ws_task(cur, false)))
		return;
	ws_own_stacks(ctx, cur, s, s->last_episode, ws_wants_kernel_stack(cur, s));
	ws_emit_pending(cur, s);
}

/* A task's kernel stack size on x86-64 (THREAD_SIZE: 16 KiB, 32 KiB with
 * KASAN; a KASAN kernel's deepest frames would be taken for interrupts). */
#define WS_THREAD_SIZE (16 * 1024)

/* Whether a wakeup runs in an interrupt, hard or soft, whatever `cur` was
 * doing when it arrived. (The preempt count would say it always, but it is
 * a per-CPU variable BPF reaches only through kallsyms data symbols, which
 * this kernel lacks.) Two signs, one for each case:
 * - It arrived in the kernel (a syscall, a kernel thread, the idle loop):
 *   x86-64 then runs it, and the softirqs at its exit, on the CPU's own
 *   IRQ stack. A tp_btf program's context is the argument array in its
 *   caller's frame, so where it lies tells which stack runs.
 * - It arrived in user mode: it runs on the task's stack, but the register
 *   frame the task entered the kernel with is the interrupt's, whose
 *   orig_ax is negative (no syscall; vectors push -1).
 * Softirqs run by ksoftirqd or at local_bh_enable stay the task's doing. */
static __always_inline bool ws_in_interrupt(struct task_struct *cur, void *ctx)
{
	__u64 sp = (__u64)ctx, base = (__u64)cur->stack;
	struct pt_regs *regs;

	if (sp - base >= WS_THREAD_SIZE)
		return true;
	if (ws_is_kthread(cur))
		return false;
	regs = (struct pt_regs *)bpf_task_pt_regs(cur);
	return (long)regs->orig_ax < 0;
}

/* Kernel stack walks for interrupts' wakeups, per CPU and 100 ms window:
 * a walk costs 10-40 us here, and a process of 10,000 threads napping
 * 250 ms raises 40,000 timer wakeups a second (200 walks a second per CPU
 * cost at most 1 % of it). Past the budget a row has no kernel stack. */
#define WS_IRQ_WALKS_PER_WINDOW 20
#define WS_IRQ_WALK_WINDOW_NS 100000000ULL

struct ws_irq_walks {
	__u64 window;
	__u64 used;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_irq_walks);
} irq_walks SEC(".maps");

static __always_inline bool ws_irq_walk_allowed(void)
{
	__u32 zero = 0;
	struct ws_irq_walks *b = bpf_map_lookup_elem(&irq_walks, &zero);
	__u64 window = bpf_ktime_get_ns() / WS_IRQ_WALK_WINDOW_NS;

	if (!b)
		return false;
	if (b->window != window) {
		b->window = window;
		b->used = 0;
	}
	if (b->used >= WS_IRQ_WALKS_PER_WINDOW) {
		ws_stat_inc(WS_STAT_IRQ_WALKS_PUT_OFF);
		return false;
	}
	b->used++;
	return true;
}

/* sched_waking runs in the waker's context (sched_wakeup may run on the
 * wakee's CPU, in an IPI): who woke `p`, and the waker's stack, drawn by
 * the wakee's sleep like off-CPU rows. */
static __always_inline void ws_on_waking(void *ctx, struct task_struct *p)
{
	struct task_struct *waker = bpf_get_current_task_btf();
	struct ws_task *s = ws_task(p, false), *ws = NULL;
	/* The idle task wakes nobody itself: what runs in its context is an
	 * interrupt (a timer firing on an idle CPU, above all). */
	bool irq = !waker->pid || ws_in_interrupt(waker, ctx);
	struct ws_stack_key key = {};
	__u64 slept, w;

	if (!irq && (ws = ws_task(waker, false)))
		__sync_fetch_and_add(&ws->c.wakeups_sent, 1);
	if (!s)
		return;
	s->waker_pid = irq ? 0 : waker->tgid;
	s->waker_tid = irq ? WS_INTERRUPT_TID : waker->pid;
	if (!s->phase_start || !ws_sleeping(s->state))
		return;
	slept = bpf_ktime_get_ns() - s->phase_start;
	w = ws_sample_weight(slept, slept);
	if (!w)
		return;
	key.state = WS_STATE_WAKEUP;
	key.peer_pid = p->tgid;
	key.peer_tid = p->pid;
	key.stack_gen = ws_control(WS_CONTROL_GENERATION);
	if (irq) {
		key.tid = WS_INTERRUPT_TID;
		key.user_stack_id = WS_NO_STACK;
		key.kernel_stack_id = ws_irq_walk_allowed() ? ws_kernel_stack(ctx, key.stack_gen)
							     : WS_NO_STACK;
	} else {
		key.pid = waker->tgid;
		key.tid = waker->pid;
		key.kernel_stack_id = WS_NO_STACK;
		if (ws_is_kthread(waker))
			key.user_stack_id = WS_NO_STACK;
		else if (ws)
			key.user_stack_id = ws_user_stack_memo(ctx, &ws->memos, key.stack_gen);
		else
			key.user_stack_id = ws_user_stack(ctx, key.stack_gen);
		key.syscall = ws_is_kthread(waker) ? 0 : ws_syscall(waker);
		bpf_get_current_comm(key.comm, sizeof(key.comm));
	}
	ws_stat_inc(WS_STAT_WAKER_WALKS);
	ws_add(&key, w);
}

/* A wakeup ends the sleep phase of `p` (its row drawn, waiting for the
 * switch-in stack) and starts its runqueue phase. */
static __always_inline void ws_on_wakeup(struct task_struct *p)
{
	__u64 now = bpf_ktime_get_ns();
	struct ws_task *s = ws_task(p, false);

	ws_stat_inc(WS_STAT_WAKEUPS);
	if (!s)
		return;
	__sync_fetch_and_add(&s->c.wakeups_received, 1);
	if (!s->phase_start && s->on_cpu_since && !p->on_cpu)
		ws_switch_out_unseen(p, s,
				     ws_classify(false, p, TASK_INTERRUPTIBLE,
						 ws_is_kthread(p) ? 0 : ws_syscall(p)),
				     now);
	if (!s->phase_start || !ws_sleeping(s->state))
		return;
	__u32 state = s->state;
	__u64 d = now - s->phase_start;
	__u64 w;

	ws_count_sleep(&s->c, d);
	ws_count_ns(&s->c, state, ws_take(&s->acct_from, now, now));
	w = ws_draw(d, ws_take(&s->row_from, now, now), s->c.span.id);
	if (w) {
		s->pending_ns[0] = w;
		s->pending_state[0] = state;
	}
	s->state = WS_STATE_RUNQUEUE;
	s->phase_start = now;
	ws_trace_runnable(p, s, WS_TRACE_WAKEUP, now);
}

/* A new thread starts in the runqueue; its creator is recorded as its
 * waker (every creation, with its stack: forks are few). */
static __always_inline void ws_on_wakeup_new(void *ctx, struct task_struct *p)
{
	__u64 now = bpf_ktime_get_ns();
	struct ws_task *s = ws_task(p, true), *ws;
	struct task_struct *waker = bpf_get_current_task_btf();
	struct ws_stack_key key = {};

	ws_stat_inc(WS_STAT_WAKEUPS);
	if (s && !s->phase_start) {
		s->state = WS_STATE_RUNQUEUE;
		s->off_since = now;
		s->phase_start = now;
		s->acct_from = now;
		s->row_from = now;
		s->syscall = 0;
		s->waker_pid = waker->tgid;
		s->waker_tid = waker->pid;
		ws_trace_runnable(p, s, WS_TRACE_NEW, now);
	}
	if (s)
		__sync_fetch_and_add(&s->c.wakeups_received, 1);
	if (!waker->pid)
		return;
	if ((ws = ws_task(waker, false)))
		__sync_fetch_and_add(&ws->c.wakeups_sent, 1);
	key.pid = waker->tgid;
	key.tid = waker->pid;
	key.state = WS_STATE_WAKEUP;
	key.peer_pid = p->tgid;
	key.peer_tid = p->pid;
	key.stack_gen = ws_control(WS_CONTROL_GENERATION);
	key.user_stack_id = ws_is_kthread(waker) ? WS_NO_STACK : ws_user_stack(ctx, key.stack_gen);
	key.kernel_stack_id = WS_NO_STACK;
	key.syscall = ws_is_kthread(waker) ? 0 : ws_syscall(waker);
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	ws_add(&key, 0);
}

/* A thread exits: its CPU time so far and its counters go out now, as the
 * iterator will not see it again. */
static __always_inline void ws_thread_exit(struct task_struct *t)
{
	struct ws_task *s = ws_task(t, false);

	if (!s)
		return;
	ws_flush_cpu(s, bpf_ktime_get_ns());
	ws_export(t, s);
}

#endif /* WALLSCOPE_OFFCPU_BPF_H */
