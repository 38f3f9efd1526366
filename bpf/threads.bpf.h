/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Per-thread totals and runqueue histograms, in the active buffer. */
#ifndef WALLSCOPE_THREADS_BPF_H
#define WALLSCOPE_THREADS_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "walkcost.bpf.h"
#include "wallscope.h"

/* What a new totals row starts from (read-only, in .rodata). */
const volatile struct ws_thread_totals ws_totals_zero = {};

/* The totals row of `task`, created on first use. `task` is a BTF pointer
 * (tp_btf argument or bpf_get_current_task_btf): plain loads, no helpers. */
static __always_inline struct ws_thread_totals *ws_thread(struct task_struct *task)
{
	void *map = ws_buffer() ? (void *)&threads_1 : (void *)&threads_0;
	__u32 tid = task->pid;
	struct ws_thread_totals *t = bpf_map_lookup_elem(map, &tid);

	if (t)
		return t;
	/* Inserted from a zero row in .rodata, then named: a row built on the
	 * stack would grow the iterator's frame past the verifier's bound. */
	t = ws_insert(map, &tid, (const void *)&ws_totals_zero, WS_STAT_THREADS_FULL);
	if (t && !t->pid) {
		t->pid = task->tgid;
		__builtin_memcpy(t->comm, task->comm, sizeof(t->comm));
	}
	return t;
}

/* Log2 slot of an interval of `ns`: 0 under 1 us, else log2 us + 1, at
 * most `last`. */
static __always_inline __u32 ws_us_slot(__u64 ns, __u32 last)
{
	__u64 us = ns / 1000;
	__u32 slot = us ? ws_log2(us) + 1 : 0;

	return slot > last ? last : slot;
}

/* Slot of a blocked interval of `ns` (see WS_SLEEP_SLOTS). */
static __always_inline __u32 ws_sleep_slot(__u64 ns)
{
	__u32 slot = ws_us_slot(ns, WS_SLEEP_SLOTS - 1);

	/* clang may check a copy and index with the original register; the
	 * barrier keeps the check on the register indexed with. */
	asm volatile("" : "+r"(slot));
	return slot < WS_SLEEP_SLOTS ? slot : 0;
}

/* Histogram slot of an interval of `ns` (see WS_HIST_SLOTS). */
static __always_inline __u32 ws_hist_slot(__u64 ns)
{
	__u32 slot = ws_us_slot(ns, WS_HIST_SLOTS - 1);

	asm volatile("" : "+r"(slot));
	return slot & (WS_HIST_SLOTS - 1);
}

/* The histogram row of (`id`, `kind`) in the active buffer, created on
 * first use. */
static __always_inline struct ws_hist *ws_hist_row(__u64 id, __u32 kind)
{
	void *map = ws_buffer() ? (void *)&runq_hist_1 : (void *)&runq_hist_0;
	struct ws_hist_key key = { .id = id, .kind = kind };
	struct ws_hist *h = bpf_map_lookup_elem(map, &key);

	if (!h) {
		struct ws_hist init = {};

		h = ws_insert(map, &key, &init, WS_STAT_HIST_FULL);
	}
	return h;
}

static __always_inline void ws_hist_add(__u64 id, __u32 kind, __u64 ns)
{
	struct ws_hist *h = ws_hist_row(id, kind);

	if (!h)
		return;
	__sync_fetch_and_add(&h->slots[ws_hist_slot(ns)], 1);
	__sync_fetch_and_add(&h->ns, ns);
}

#endif /* WALLSCOPE_THREADS_BPF_H */
