/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Per-thread counters, kept in the thread's task storage so that no switch
 * or wakeup looks a map up for them, and exported as deltas into the
 * active buffer's threads_N and runq_hist_N rows by the drain-time iterator
 * (every thread, every drain) and when a thread exits. Writers add
 * atomically; the export takes each counter with an atomic exchange, so an
 * event is exported once, in the drain it happened before.
 */
#ifndef WALLSCOPE_COUNTS_BPF_H
#define WALLSCOPE_COUNTS_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "culprits.bpf.h"
#include "spantimes.bpf.h"
#include "threads.bpf.h"
#include "wallscope.h"

struct ws_counts {
	__u64 ns[WS_STATE_COUNT]; /* by enum ws_state */
	__u64 switches_voluntary;
	__u64 switches_involuntary;
	__u64 wakeups_sent;
	__u64 wakeups_received;
	__u64 runq_waits; /* runqueue waits ended since the export; 0: slots untouched */
	__u64 runq_ns;
	__u64 runq_slots[WS_HIST_SLOTS]; /* as struct ws_hist */
	__u32 sleeps; /* blocked intervals ended since the export; 0: slots untouched */
	__u32 sleep_slots[WS_SLEEP_SLOTS];
	struct ws_culprit_slots culprits; /* who kept it off the CPU meanwhile */
	struct ws_span_acc span; /* its OpenTelemetry span's share of ns[] */
};

static __always_inline void ws_count_ns(struct ws_counts *c, __u32 state, __u64 ns)
{
	if (ns && state < WS_STATE_COUNT) {
		__sync_fetch_and_add(&c->ns[state], ns);
		ws_span_count(&c->span, state, ns);
	}
}

static __always_inline void ws_count_runq_wait(struct ws_counts *c, __u64 ns)
{
	__u32 slot = ws_hist_slot(ns);

	__sync_fetch_and_add(&c->runq_slots[slot], 1);
	__sync_fetch_and_add(&c->runq_ns, ns);
	__sync_fetch_and_add(&c->runq_waits, 1);
}

/* A blocked interval of `ns` that a wakeup ended. */
static __always_inline void ws_count_sleep(struct ws_counts *c, __u64 ns)
{
	__sync_fetch_and_add(&c->sleep_slots[ws_sleep_slot(ns)], 1);
	__sync_fetch_and_add(&c->sleeps, 1);
}

/* Moves `c`'s blocked intervals into `row`, creating it if needed. Out of
 * line: the iterator's combined stack is near the verifier's bound. */
static __noinline void ws_export_sleeps(struct task_struct *t, struct ws_counts *c,
					struct ws_thread_totals *row)
{
	__u32 v;

	if (!t || !c || !c->sleeps || !__sync_lock_test_and_set(&c->sleeps, 0))
		return;
	if (!row && !(row = ws_thread(t)))
		return;
	for (int i = 0; i < WS_SLEEP_SLOTS; i++) {
		if (c->sleep_slots[i] && (v = __sync_lock_test_and_set(&c->sleep_slots[i], 0)))
			__sync_fetch_and_add(&row->sleep_slots[i], v);
	}
}

/* Moves `c`'s culprits into the active buffer's culprits_N rows. A slot is
 * freed once its time is taken: a switch-in on another CPU adding to it in
 * between has its time go to the slot's next process (rare: the export
 * runs once a drain). */
static __always_inline void ws_export_culprits(struct task_struct *t, struct ws_counts *c)
{
	__u64 v;

	struct ws_culprit_slots *k = &c->culprits;

	for (int i = 0; i < WS_CULPRIT_SLOTS; i++) {
		__u32 slot = k->slot[i];

		if (!slot)
			continue;
		v = __sync_lock_test_and_set(&k->ns[i], 0);
		k->comm_hash[i] = 0;
		k->slot[i] = 0;
		if (v)
			ws_culprit_add(t->tgid, t->pid, slot - 1, v);
	}
	if (k->others_ns && (v = __sync_lock_test_and_set(&k->others_ns, 0)))
		ws_culprit_add(t->tgid, t->pid, WS_CULPRIT_OTHERS, v);
	if (k->unseen_ns && (v = __sync_lock_test_and_set(&k->unseen_ns, 0)))
		ws_culprit_add(t->tgid, t->pid, WS_CULPRIT_UNSEEN, v);
}

/* Moves `c` into `t`'s totals row and its process's and cgroup's runqueue
 * histograms in the active buffer. */
static __always_inline void ws_export_counts(struct task_struct *t, struct ws_counts *c,
					     __u64 cgroup)
{
	struct ws_thread_totals *row = NULL;
	__u64 v;

	if (c->span.id)
		ws_span_flush(t, &c->span, bpf_ktime_get_ns());
	for (int i = 0; i < WS_STATE_COUNT; i++) {
		if (!c->ns[i] || !(v = __sync_lock_test_and_set(&c->ns[i], 0)))
			continue;
		if (!row && !(row = ws_thread(t)))
			return;
		__sync_fetch_and_add(&row->ns[i], v);
	}
#define WS_EXPORT(field)                                                           \
	if (c->field && (v = __sync_lock_test_and_set(&c->field, 0))) {            \
		if (!row && !(row = ws_thread(t)))                                 \
			return;                                                    \
		__sync_fetch_and_add(&row->field, v);                              \
	}
	WS_EXPORT(switches_voluntary)
	WS_EXPORT(switches_involuntary)
	WS_EXPORT(wakeups_sent)
	WS_EXPORT(wakeups_received)
#undef WS_EXPORT
	ws_export_sleeps(t, c, row);
	ws_export_culprits(t, c);
	if (!c->runq_waits)
		return;
	__u64 waits = __sync_lock_test_and_set(&c->runq_waits, 0);
	__u64 ns = __sync_lock_test_and_set(&c->runq_ns, 0);
	struct ws_hist *proc = ws_hist_row(t->tgid, WS_HIST_PROCESS);
	struct ws_hist *group = ws_hist_row(cgroup, WS_HIST_CGROUP);

	if (!waits)
		return;
	if (proc)
		__sync_fetch_and_add(&proc->ns, ns);
	if (group)
		__sync_fetch_and_add(&group->ns, ns);
	for (int i = 0; i < WS_HIST_SLOTS; i++) {
		if (!c->runq_slots[i] || !(v = __sync_lock_test_and_set(&c->runq_slots[i], 0)))
			continue;
		if (proc)
			__sync_fetch_and_add(&proc->slots[i], v);
		if (group)
			__sync_fetch_and_add(&group->slots[i], v);
	}
}

#endif /* WALLSCOPE_COUNTS_BPF_H */
