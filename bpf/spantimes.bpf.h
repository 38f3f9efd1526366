/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * A thread's exact time per OpenTelemetry span. Every nanosecond counted
 * into a thread's totals (ws_count_ns) also goes to its span accumulator
 * while it has a span, and the accumulator is flushed into the active
 * buffer's span_times_N row of (pid, tid, span) when the span changes
 * (otelctx.bpf.h), at every drain and at the thread's exit (with the
 * thread's counters): a drain's span times cover the drain as the thread
 * totals do, and a long span shows before it ends.
 */
#ifndef WALLSCOPE_SPANTIMES_BPF_H
#define WALLSCOPE_SPANTIMES_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "spanquota.bpf.h"
#include "wallscope.h"

WS_HASH(span_times_0, WS_SPAN_TIMES, struct ws_span_key, struct ws_span_times);
WS_HASH(span_times_1, WS_SPAN_TIMES, struct ws_span_key, struct ws_span_times);

/* The span a thread's time goes to now, in its task storage. */
struct ws_span_acc {
	__u64 id;      /* the span's 8 bytes as a u64; 0: none */
	__u64 seen_ns; /* when the thread was last seen on the CPU under it */
	__u64 from_ns; /* when the time in ns[] began */
	__u64 ns[WS_STATE_COUNT]; /* since from_ns, by enum ws_state */
};

/* What a new span_times row starts from (read-only, in .rodata: a row
 * built on the stack would grow the iterator's frame). */
const volatile struct ws_span_times ws_span_times_zero = {};

static __always_inline void ws_span_count(struct ws_span_acc *a, __u32 state, __u64 ns)
{
	if (a->id && state < WS_STATE_COUNT)
		__sync_fetch_and_add(&a->ns[state], ns);
}

/* Moves `a`'s time, up to `to`, into (t's pid, tid, a's span)'s row in the
 * active buffer; the accumulator goes on from `to`. Out of line: the
 * iterator's combined stack is near the verifier's bound. */
static __noinline void ws_span_flush(struct task_struct *t, struct ws_span_acc *a, __u64 to)
{
	struct ws_span_key key = {};
	struct ws_span_times *row = NULL;
	void *map = ws_buffer() ? (void *)&span_times_1 : (void *)&span_times_0;
	__u64 v;

	if (!t || !a || !a->id)
		return;
	key.pid = t->tgid;
	key.tid = t->pid;
	key.span = a->id;
	for (int i = 0; i < WS_STATE_COUNT; i++) {
		if (!a->ns[i] || !(v = __sync_lock_test_and_set(&a->ns[i], 0)))
			continue;
		if (!row) {
			row = bpf_map_lookup_elem(map, &key);
			if (!row && !ws_span_quota_take(key.pid, WS_SPAN_MAP_TIMES, to))
				break;
			if (!row)
				row = ws_insert(map, &key, (const void *)&ws_span_times_zero,
						WS_STAT_SPAN_TIMES_FULL);
			if (!row)
				break;
			if (!row->first_ns)
				row->first_ns = a->from_ns ? a->from_ns : to;
		}
		__sync_fetch_and_add(&row->ns[i], v);
	}
	if (row && to > row->last_ns)
		row->last_ns = to;
	a->from_ns = to;
}

#endif /* WALLSCOPE_SPANTIMES_BPF_H */
