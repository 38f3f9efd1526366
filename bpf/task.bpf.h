/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * A thread's state as the programs know it (task storage), and the small
 * steps every program takes on it: classify a phase, take a mark, flush
 * CPU time, move its counters out. The events that drive it are in
 * offcpu.bpf.h; unseen.bpf.h mends it when an event never reached them.
 */
#ifndef WALLSCOPE_TASK_BPF_H
#define WALLSCOPE_TASK_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include "arch.bpf.h"
#include "core_fixes.bpf.h"
#include "counts.bpf.h"
#include "maps.bpf.h"
#include "memo.bpf.h"
#include "stacks.bpf.h"
#include "threads.bpf.h"
#include "wallscope.h"

/* Set by user space before load. */
const volatile __u64 offcpu_min_ns = 0;
/* Sampling scale T of off-CPU and waker stacks (0: every interval). */
const volatile __u64 offcpu_sample_ns = 0;
/* sched_exit_tp is attached: stacks are walked at switch-in. */
const volatile bool stacks_at_switch_in = false;

/* What a thread is doing off-CPU, kept per thread. */
struct ws_task {
	__u64 off_since;    /* switch-out that began the current off-CPU episode; 0 while running */
	__u64 phase_start;  /* start of the current phase; 0 while running */
	__u64 acct_from;    /* the totals hold the phase's time up to here (0: nothing open) */
	__u64 row_from;     /* the stack rows hold the phase's time up to here (0: nothing open) */
	__u64 on_cpu_since; /* switch-in, or the last flush of CPU time; 0 while off-CPU */
	__u64 last_episode; /* off_since of the episode that ended at the last switch-in */
	__u64 stack_episode; /* off_since of the episode the stacks below belong to */
	__u64 in_at;	     /* the last switch-in seen (or first sight running) */
	__u64 exec_in;	     /* the kernel's CPU time of the thread at in_at */
	__u64 exec_out;	     /* the kernel's CPU time of the thread at the last switch-out */
	__u64 delay_out;     /* the kernel's runqueue wait of the thread, likewise */
	__u64 pending_ns[2]; /* drawn rows waiting for the switch-in stack: the sleep
			      * phase a wakeup ended, the phase the switch-in ended */
	__u32 pending_state[2];
	__u32 state;   /* enum ws_state of the current phase */
	__u32 syscall; /* syscall nr + 1 at switch-out, 0 if none */
	__u32 stack_gen;
	__s32 user_stack_id;
	__s32 kernel_stack_id;
	__u32 waker_pid; /* the last wakeup's waker (WS_INTERRUPT_TID: an interrupt) */
	__u32 waker_tid;
	__u32 stack_tables; /* epoch of the registration the user stack above was walked with (0: none) */
	struct ws_counts c; /* since the last export */
	struct ws_walk_memos memos; /* e.g. where it blocks and where it wakes others */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ws_task);
} tasks SEC(".maps");

/* Per CPU: the thread just switched in with drawn rows waiting for its
 * stack (0: none), for sched_exit_tp to check with one array lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} deferred_tid SEC(".maps");

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

/* Whether `t`'s cgroup has spent its CPU quota: the task's own flag where
 * throttling is per task (6.18+), or its group's throttle count, which is
 * set first (the task is preempted, then throttled on its way to user
 * mode, and in between it waits for the quota, not for a CPU). */
static __always_inline bool ws_throttled(struct task_struct *t)
{
	struct task_struct___throttle *tt = (void *)t;

	if (bpf_core_field_exists(tt->throttled) && BPF_CORE_READ(tt, throttled))
		return true;
	if (bpf_core_field_exists(t->se.cfs_rq)) {
		struct cfs_rq *cfs = BPF_CORE_READ(t, se.cfs_rq);

		return cfs && BPF_CORE_READ(cfs, throttle_count) > 0;
	}
	return false;
}

/* Id of the cgroup whose CPU quota applies to `t` (the CPU controller's,
 * in cgroup v1 or v2); its default-hierarchy cgroup where unknown. */
static __always_inline __u64 ws_cpu_cgroup(struct task_struct *t)
{
	if (bpf_core_field_exists(t->sched_task_group)) {
		struct task_group *tg = BPF_CORE_READ(t, sched_task_group);

		if (tg)
			return BPF_CORE_READ(tg, css.cgroup, kn, id);
	}
	return t->cgroups->dfl_cgrp->kn->id;
}

/* Syscall the task is in, as nr + 1; 0 when in none. */
static __always_inline __u32 ws_syscall(struct task_struct *t)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	long nr = regs->orig_ax;

	return nr >= 0 && nr < 4096 ? nr + 1 : 0;
}

static __always_inline __u32 ws_classify(bool runnable, struct task_struct *t, __u32 state,
					 __u32 syscall)
{
	if (runnable)
		return ws_throttled(t) ? WS_STATE_THROTTLED : WS_STATE_RUNQUEUE;
	if ((state & TASK_UNINTERRUPTIBLE) && !(state & TASK_NOLOAD))
		return WS_STATE_IO;
	if (syscall == WS_NR_FUTEX + 1 || syscall == WS_NR_FUTEX_WAITV + 1)
		return WS_STATE_FUTEX;
	return WS_STATE_SLEEP;
}

static __always_inline bool ws_sleeping(__u32 state)
{
	return state == WS_STATE_FUTEX || state == WS_STATE_IO || state == WS_STATE_SLEEP;
}

static __always_inline struct ws_task *ws_task(struct task_struct *t, bool create)
{
	struct ws_task *s = bpf_task_storage_get(&tasks, t, 0,
						 create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);

	if (!s && create)
		ws_stat_inc(WS_STAT_TASK_STORAGE_FAILED);
	return s;
}

/* Weight of the row of an interval of length `d` whose unrecorded part is
 * `rem`: drawn with probability p = min(1, d / T), it weighs rem / p; not
 * drawn, 0. The expected weight is `rem`. */
static __always_inline __u64 ws_sample_weight(__u64 d, __u64 rem)
{
	__u64 t = offcpu_sample_ns;

	if (d < offcpu_min_ns || !rem)
		return 0;
	if (!t || d >= t)
		return rem;
	/* u uniform in [0, T): drawn when u < d. T is at most ~4 s (u32). */
	if ((((__u64)bpf_get_prandom_u32() * t) >> 32) >= d)
		return 0;
	return rem * t / d;
}

/* As ws_sample_weight, counting what gets no row. An interval under an
 * OpenTelemetry span (`whole`) is always drawn: a span is its own unit,
 * and one row at most per interval of it (never one weighed up for
 * others) is what shows where that request waited. */
static __always_inline __u64 ws_draw(__u64 d, __u64 rem, bool whole)
{
	__u64 w = whole && d >= offcpu_min_ns ? rem : ws_sample_weight(d, rem);

	if (!w && rem)
		ws_stat_inc(d < offcpu_min_ns ? WS_STAT_BELOW_THRESHOLD : WS_STAT_SAMPLED_OUT);
	return w;
}

/* Moves `*from` to `to` and returns the time from the old mark to `now`. */
static __always_inline __u64 ws_take(__u64 *from, __u64 now, __u64 to)
{
	__u64 old = __sync_lock_test_and_set(from, to);

	return old && now > old ? now - old : 0;
}

/* The stack row of `t` in `state`, with the stacks kept in `s`. */
static __always_inline void ws_phase_key(struct ws_stack_key *key, struct task_struct *t,
					 struct ws_task *s, __u32 state)
{
	key->pid = t->tgid;
	key->tid = t->pid;
	key->state = state;
	key->stack_gen = s->stack_gen;
	key->user_stack_id = s->user_stack_id;
	key->kernel_stack_id = s->kernel_stack_id;
	key->syscall = s->syscall;
	/* Read at the switch-out that began the phase: it cannot change
	 * while the thread is off the CPU. */
	key->span = s->c.span.id;
	__builtin_memcpy(key->comm, t->comm, sizeof(key->comm));
}

/* Adds the drawn rows waiting in `s` (with the stacks in `s`). */
static __always_inline void ws_emit_pending(struct task_struct *t, struct ws_task *s)
{
	struct ws_stack_key key = {};

	for (int i = 0; i < 2; i++) {
		__u64 ns = s->pending_ns[i];

		if (!ns)
			continue;
		s->pending_ns[i] = 0;
		ws_phase_key(&key, t, s, s->pending_state[i]);
		ws_add(&key, ns);
	}
}

/* Adds the CPU time of the running task since switch-in (or the last
 * flush) to its counters; a compare-and-swap, as the drain-time iterator and
 * the sampler may flush it at once. Nothing while it is off-CPU (0): a
 * thread first seen running is adopted by the iterator (ws_adopt). */
static __always_inline void ws_flush_cpu(struct ws_task *s, __u64 now)
{
	__u64 since = s->on_cpu_since;

	if (since && now > since &&
	    __sync_val_compare_and_swap(&s->on_cpu_since, since, now) == since)
		ws_count_ns(&s->c, WS_STATE_CPU, now - since);
}

/* The kernel's own account of `t`: its CPU time (what schedstat's first
 * field shows) and its time waiting in a runqueue (the second; 0 without
 * CONFIG_SCHED_INFO). Both only grow. */
static __always_inline __u64 ws_kernel_cpu_ns(struct task_struct *t)
{
	return t->se.sum_exec_runtime;
}

static __always_inline __u64 ws_kernel_wait_ns(struct task_struct *t)
{
	if (bpf_core_field_exists(t->sched_info.run_delay))
		return t->sched_info.run_delay;
	return 0;
}

/* Notes the kernel's account at a switch-in (or first sight running)... */
static __always_inline void ws_mark_in(struct task_struct *t, struct ws_task *s, __u64 now)
{
	s->in_at = now;
	s->exec_in = ws_kernel_cpu_ns(t);
}

/* ...and at a switch-out (or first sight off-CPU), for unseen.bpf.h. */
static __always_inline void ws_mark_out(struct task_struct *t, struct ws_task *s)
{
	s->exec_out = ws_kernel_cpu_ns(t);
	s->delay_out = ws_kernel_wait_ns(t);
}

/* Moves `t`'s counters into the active buffer (drain-time iterator). */
static __always_inline void ws_export(struct task_struct *t, struct ws_task *s)
{
	ws_export_counts(t, &s->c, t->cgroups->dfl_cgrp->kn->id);
}

#endif /* WALLSCOPE_TASK_BPF_H */
