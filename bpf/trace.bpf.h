/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * On-demand thread timelines (`/trace`): every state change of one
 * process's threads, one ring-buffer record each, only while user space
 * has written that process's tgid into `trace_target`. With no trace
 * running each hook pays one array lookup and a compare.
 *
 * The records reuse what the engine already knows: the state a switch-out
 * classified, the stamps it accounts phases from (phase_start, in_at), the
 * waker sched_waking noted. So a trace's intervals are the engine's own,
 * and their sums are what the per-thread totals count.
 */
#ifndef WALLSCOPE_TRACE_BPF_H
#define WALLSCOPE_TRACE_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "task.bpf.h"
#include "wallscope.h"

/* [WS_TRACE_TARGET_TGID]: the traced tgid (0: none), written by user
 * space; [WS_TRACE_TARGET_LOST]: records of this recording that found the
 * ring full, reset by user space as it starts one. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, WS_TRACE_TARGET_COUNT);
	__type(key, __u32);
	__type(value, __u32);
} trace_target SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, WS_TRACE_RING_BYTES);
} trace_events SEC(".maps");

/* Whether `tgid` is being traced: the one cost when nothing is. */
static __always_inline bool ws_traced(__u32 tgid)
{
	__u32 key = WS_TRACE_TARGET_TGID, *target = bpf_map_lookup_elem(&trace_target, &key);

	return target && *target && *target == tgid;
}

/* Sends one record; `waker` is tgid << 32 | tid. A subprogram of its own:
 * the hooks that call it stay small for the verifier. */
static __noinline void ws_trace_emit(__u64 ts, __u32 tid, __u32 kind, __u32 state, __u64 waker)
{
	struct ws_trace_event *e = bpf_ringbuf_reserve(&trace_events, sizeof(*e), 0);

	if (!e) {
		__u32 key = WS_TRACE_TARGET_LOST, *lost = bpf_map_lookup_elem(&trace_target, &key);

		if (lost)
			__sync_fetch_and_add(lost, 1);
		ws_stat_inc(WS_STAT_TRACE_LOST);
		return;
	}
	e->ts = ts;
	e->tid = tid;
	e->kind = kind;
	e->state = state;
	e->cpu = bpf_get_smp_processor_id();
	e->waker_pid = waker >> 32;
	e->waker_tid = (__u32)waker;
	bpf_ringbuf_submit(e, 0);
	ws_stat_inc(WS_STAT_TRACE_EVENTS);
}

/* The stamp a phase began at, or now if the engine has none. */
static __always_inline __u64 ws_trace_stamp(__u64 stamp)
{
	return stamp ? stamp : bpf_ktime_get_ns();
}

/* After on_switch (a program of its own: on_switch is near the verifier's
 * budget): `prev` left the CPU into the state on_switch classified, `next`
 * got it. */
static __always_inline void ws_trace_switch(struct task_struct *prev, struct task_struct *next)
{
	struct ws_task *s;

	if (prev->pid && ws_traced(prev->tgid) && (s = ws_task(prev, false)) && s->phase_start)
		ws_trace_emit(s->phase_start, prev->pid, WS_TRACE_SWITCH_OUT, s->state, 0);
	if (next->pid && ws_traced(next->tgid) && (s = ws_task(next, false)))
		ws_trace_emit(ws_trace_stamp(s->in_at), next->pid, WS_TRACE_SWITCH_IN,
			      WS_STATE_CPU, 0);
}

/* A sleep of `p` ended at `now` (on_wakeup) or `p` was created
 * (on_wakeup_new): runqueue from now, woken by the waker in `s`. */
static __always_inline void ws_trace_runnable(struct task_struct *p, struct ws_task *s,
					      __u32 kind, __u64 now)
{
	if (ws_traced(p->tgid))
		ws_trace_emit(now, p->pid, kind, WS_STATE_RUNQUEUE,
			      (__u64)s->waker_pid << 32 | s->waker_tid);
}

static __always_inline void ws_trace_exit(struct task_struct *p)
{
	if (ws_traced(p->tgid))
		ws_trace_emit(bpf_ktime_get_ns(), p->pid, WS_TRACE_EXIT, WS_STATE_SLEEP, 0);
}

/* The `trace_threads` iterator, run once as a recording starts: where each
 * of the traced process's threads is, and since when, so that every
 * timeline is known from the window's start. */
static __always_inline void ws_trace_snapshot(struct task_struct *t)
{
	struct ws_task *s;
	__u32 state;
	__u64 since;

	if (!ws_traced(t->tgid))
		return;
	s = ws_task(t, false);
	if (s && s->phase_start) {
		state = s->state;
		since = s->phase_start;
	} else if (s && s->in_at && t->on_cpu) {
		state = WS_STATE_CPU;
		since = s->in_at;
	} else {
		/* Not seen by the engine since it started: what the kernel
		 * says now, from now. */
		since = bpf_ktime_get_ns();
		state = t->on_cpu ? WS_STATE_CPU
				  : ws_classify(ws_task_state(t) == TASK_RUNNING, t,
						ws_task_state(t), 0);
	}
	ws_trace_emit(since, t->pid, WS_TRACE_SNAPSHOT, state, 0);
}

#endif /* WALLSCOPE_TRACE_BPF_H */
