/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* The cost of every stack walk, as a per-CPU histogram (see wallscope.h):
 * two clock reads a walk, so that walk cost is measured where it is paid,
 * on the host's own stacks, not guessed from a microbenchmark alone. */
#ifndef WALLSCOPE_WALKCOST_BPF_H
#define WALLSCOPE_WALKCOST_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "wallscope.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_walk_cost);
} walk_cost SEC(".maps");

/* Floor of log2(v) for v > 0, without loops. */
static __always_inline __u32 ws_log2(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xFFFFFFFF) << 5; v >>= shift; r |= shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

/* Counts one walk of `kind` that found `frames` frames, begun at `start`. */
static __always_inline void ws_walk_cost(__u32 kind, long frames, __u64 start)
{
	__u64 ns = bpf_ktime_get_ns() - start;
	__u32 e, slot, depth;

	if (!ns)
		ns = 1;
	e = ws_log2(ns);
	slot = 4 * e + (e >= 2 ? (__u32)(ns >> (e - 2)) & 3 : 0);
	if (slot >= WS_WALK_TIME_SLOTS)
		slot = WS_WALK_TIME_SLOTS - 1;
	depth = frames > 0 ? (__u32)frames / 8 : 0;
	if (depth >= WS_WALK_DEPTHS)
		depth = WS_WALK_DEPTHS - 1;
	__u32 i = (kind * WS_WALK_DEPTHS + depth) * WS_WALK_TIME_SLOTS + slot, zero = 0;
	struct ws_walk_cost *c = bpf_map_lookup_elem(&walk_cost, &zero);

	asm volatile("" : "+r"(i));
	if (c && i < WS_WALK_COST_ENTRIES)
		c->n[i] += 1; /* per-CPU: no atomics */
}

#endif /* WALLSCOPE_WALKCOST_BPF_H */
