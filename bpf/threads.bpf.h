/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Per-thread totals and runqueue histograms, in the active buffer. */
#ifndef WALLSCOPE_THREADS_BPF_H
#define WALLSCOPE_THREADS_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "walkcost.bpf.h"
#include "wallscope.h"

/* The totals row of `task`, created on first use. `task` is a BTF pointer
 * (tp_btf argument or bpf_get_current_task_btf): plain loads, no helpers. */
static __always_inline struct ws_thread_totals *ws_thread(struct task_struct *task)
{
	void *map = ws_buffer() ? (void *)&threads_1 : (void *)&threads_0;
	__u32 tid = task->pid;
	struct ws_thread_totals *t = bpf_map_lookup_elem(map, &tid);

	if (t)
		return t;
	struct ws_thread_totals init = { .pid = task->tgid };

	__builtin_memcpy(init.comm, task->comm, sizeof(init.comm));
	return ws_insert(map, &tid, &init, WS_STAT_THREADS_FULL);
}

/* Histogram slot of an interval of `ns`: 0 under 1 us, else log2 us + 1. */
static __always_inline __u32 ws_hist_slot(__u64 ns)
{
	__u64 us = ns / 1000;
	__u32 slot = us ? ws_log2(us) + 1 : 0;

	if (slot >= WS_HIST_SLOTS)
		slot = WS_HIST_SLOTS - 1;
	/* clang may check a copy and index with the original register; the
	 * barrier keeps the mask, which bounds the register indexed with. */
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
