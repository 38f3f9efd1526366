/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Off-CPU engine. Every nanosecond a thread is not running belongs to one
 * phase: from switch-out in a sleep state (futex, io, sleep) until its
 * wakeup, then runqueue until it is switched in (a preempted thread goes
 * straight to runqueue). Phases are summed when they end, with the stack
 * taken at switch-out; per-thread totals get every phase, the stack rows
 * only those at least offcpu_min_ns long.
 */
#ifndef WALLSCOPE_OFFCPU_BPF_H
#define WALLSCOPE_OFFCPU_BPF_H

#include "threads.bpf.h"

#define PF_KTHREAD 0x00200000
#define TASK_RUNNING 0x0
#define TASK_INTERRUPTIBLE 0x1
#define TASK_UNINTERRUPTIBLE 0x2
#define TASK_NOLOAD 0x400
#define WS_NR_FUTEX 202       /* x86-64 */
#define WS_NR_FUTEX_WAITV 449 /* x86-64 */

/* Set by user space before load. */
const volatile __u64 offcpu_min_ns = 0;

/* What a thread is doing off-CPU, kept per thread. */
struct ws_task {
	__u64 phase_start;  /* start of the current off-CPU phase; 0 while running */
	__u64 on_cpu_since; /* switch-in, or the last on-CPU sample; 0 if unknown */
	__u32 state;        /* enum ws_state of the current phase */
	__u32 stack_gen;
	__s32 user_stack_id;
	__s32 kernel_stack_id;
	__u32 syscall; /* syscall nr + 1 at switch-out, 0 if none */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ws_task);
} tasks SEC(".maps");

/* Task state field: `__state` since 5.14, `state` before. */
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

/* Tasks here are BTF pointers (tp_btf arguments, bpf_get_current_task_btf):
 * fields are read with plain loads, which cost far less than probe-read
 * helpers; CO-RE still relocates the offsets. */
static __always_inline __u32 ws_task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return BPF_CORE_READ((struct task_struct___pre514 *)t, state);
}

static __always_inline bool ws_is_kthread(struct task_struct *t)
{
	return t->flags & PF_KTHREAD;
}

/* Syscall the task is in, as nr + 1; 0 when in none. */
static __always_inline __u32 ws_syscall(struct task_struct *t)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	long nr = regs->orig_ax;

	return nr >= 0 && nr < 4096 ? nr + 1 : 0;
}

static __always_inline __u32 ws_classify(bool preempt, struct task_struct *prev, __u32 syscall)
{
	__u32 st = ws_task_state(prev);

	if (preempt || st == TASK_RUNNING)
		return WS_STATE_RUNQUEUE;
	if ((st & TASK_UNINTERRUPTIBLE) && !(st & TASK_NOLOAD))
		return WS_STATE_IO;
	if (syscall == WS_NR_FUTEX + 1 || syscall == WS_NR_FUTEX_WAITV + 1)
		return WS_STATE_FUTEX;
	return WS_STATE_SLEEP;
}

static __always_inline struct ws_task *ws_task(struct task_struct *t, bool create)
{
	struct ws_task *s = bpf_task_storage_get(&tasks, t, 0,
						 create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);

	if (!s && create)
		ws_stat_inc(WS_STAT_TASK_STORAGE_FAILED);
	return s;
}

/* Ends the current off-CPU phase of `t` at `now`. */
static __always_inline void ws_end_phase(struct task_struct *t, struct ws_task *s, __u64 now)
{
	__u64 ns = now - s->phase_start;
	struct ws_stack_key key = {};

	ws_thread_time(t, s->state, ns);
	if (ns < offcpu_min_ns) {
		ws_stat_inc(WS_STAT_BELOW_THRESHOLD);
		return;
	}
	key.pid = t->tgid;
	key.tid = t->pid;
	key.state = s->state;
	key.stack_gen = s->stack_gen;
	key.user_stack_id = s->user_stack_id;
	key.kernel_stack_id = s->kernel_stack_id;
	key.syscall = s->syscall;
	__builtin_memcpy(key.comm, t->comm, sizeof(key.comm));
	ws_add(&key, ns);
}

/* Adds the CPU time since switch-in (or the last flush) to `totals`. */
static __always_inline void ws_flush_cpu(struct ws_thread_totals *totals, struct ws_task *s,
					 __u64 now)
{
	if (totals && s->on_cpu_since && now > s->on_cpu_since)
		__sync_fetch_and_add(&totals->ns[WS_STATE_CPU], now - s->on_cpu_since);
	s->on_cpu_since = now;
}

static __always_inline void ws_switch_out(void *ctx, bool preempt, struct task_struct *prev,
					  __u64 now)
{
	struct ws_task *s = ws_task(prev, true);
	struct ws_thread_totals *totals = ws_thread(prev);
	bool kthread = ws_is_kthread(prev);

	if (!s)
		return;
	ws_flush_cpu(totals, s, now);
	s->on_cpu_since = 0;
	s->syscall = kthread ? 0 : ws_syscall(prev);
	s->state = ws_classify(preempt, prev, s->syscall);
	s->phase_start = now;
	s->stack_gen = ws_control(WS_CONTROL_GENERATION);
	/* The user stack names the caller; the kernel stack is the costly
	 * part and for futex/sleep the syscall names the path, so only
	 * I/O waits pay for it. */
	s->user_stack_id = kthread ? WS_NO_STACK : ws_user_stack(ctx, s->stack_gen);
	s->kernel_stack_id = s->state == WS_STATE_IO || kthread
		? ws_kernel_stack(ctx, s->stack_gen) : WS_NO_STACK;

	if (totals) {
		if (s->state == WS_STATE_RUNQUEUE)
			__sync_fetch_and_add(&totals->switches_involuntary, 1);
		else
			__sync_fetch_and_add(&totals->switches_voluntary, 1);
	}
}

static __always_inline void ws_switch_in(struct task_struct *next, __u64 now)
{
	struct ws_task *s = ws_task(next, true);

	if (!s)
		return;
	if (s->phase_start) {
		if (s->state == WS_STATE_RUNQUEUE) {
			__u64 ns = now - s->phase_start;

			ws_hist_add(next->tgid, WS_HIST_PROCESS, ns);
			ws_hist_add(next->cgroups->dfl_cgrp->kn->id, WS_HIST_CGROUP, ns);
		}
		ws_end_phase(next, s, now);
	}
	s->phase_start = 0;
	s->on_cpu_since = now;
}

static __always_inline void ws_on_switch(void *ctx, bool preempt, struct task_struct *prev,
					 struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	ws_stat_inc(WS_STAT_SWITCHES);
	if (prev->pid)
		ws_switch_out(ctx, preempt, prev, now);
	if (next->pid)
		ws_switch_in(next, now);
}

/* A wakeup ends the sleep phase of `p` and starts its runqueue phase; the
 * waker (the current task) is recorded with its stack. */
static __always_inline void ws_on_wakeup(void *ctx, struct task_struct *p, bool new_task)
{
	__u64 now = bpf_ktime_get_ns(), slept = 0;
	struct ws_task *s = ws_task(p, new_task);
	struct task_struct *waker = bpf_get_current_task_btf();
	struct ws_thread_totals *totals;
	struct ws_stack_key key = {};

	ws_stat_inc(WS_STAT_WAKEUPS);
	if (s && s->phase_start && s->state != WS_STATE_RUNQUEUE) {
		slept = now - s->phase_start;
		ws_end_phase(p, s, now);
		s->state = WS_STATE_RUNQUEUE;
		s->phase_start = now;
	} else if (s && new_task && !s->phase_start) {
		s->state = WS_STATE_RUNQUEUE;
		s->phase_start = now;
		s->user_stack_id = WS_NO_STACK;
		s->kernel_stack_id = WS_NO_STACK;
		s->syscall = 0;
	}

	totals = ws_thread(p);
	if (totals)
		__sync_fetch_and_add(&totals->wakeups_received, 1);
	key.tid = waker->pid;
	if (!key.tid)
		return; /* woken from the idle task: an interrupt, no waker thread */
	totals = ws_thread(waker);
	if (totals)
		__sync_fetch_and_add(&totals->wakeups_sent, 1);
	/* Like off-CPU rows, a waker row (and its stack, the costly part)
	 * only for wakeups that end a sleep of at least the threshold. */
	if (slept < offcpu_min_ns && !new_task)
		return;
	key.pid = waker->tgid;
	key.state = WS_STATE_WAKEUP;
	key.peer_pid = p->tgid;
	key.peer_tid = p->pid;
	key.stack_gen = ws_control(WS_CONTROL_GENERATION);
	key.user_stack_id = ws_is_kthread(waker) ? WS_NO_STACK : ws_user_stack(ctx, key.stack_gen);
	key.kernel_stack_id = WS_NO_STACK;
	key.syscall = ws_is_kthread(waker) ? 0 : ws_syscall(waker);
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	ws_add(&key, slept);
}

#endif /* WALLSCOPE_OFFCPU_BPF_H */
