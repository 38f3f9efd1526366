/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The aggregation maps shared by every program, and the helpers that add
 * to them.
 *
 * Sums live in two buffers (counts_N, threads_N, runq_hist_N, culprits_N): user space
 * flips control[WS_CONTROL_BUFFER] before draining the idle one, so events
 * that arrive during a drain land in the other buffer. Every way an event
 * can be degraded is counted in `stats` (enum ws_stat).
 */
#ifndef WALLSCOPE_MAPS_BPF_H
#define WALLSCOPE_MAPS_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "core_fixes.bpf.h"
#include "wallscope.h"

/* Sizes are defaults; user space may override them before load. */
#define WS_COUNTS_ENTRIES 32768
#define WS_THREADS_ENTRIES 32768
#define WS_HIST_ENTRIES 4096
#define WS_CULPRITS_ENTRIES 16384

#define WS_HASH(name, entries, k, v)                                           \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                               \
		__uint(max_entries, entries);                                  \
		__type(key, k);                                                \
		__type(value, v);                                              \
	} name SEC(".maps")

#define WS_BUFFER(n)                                                           \
	WS_HASH(counts_##n, WS_COUNTS_ENTRIES, struct ws_stack_key,           \
		struct ws_stack_value);                                        \
	WS_HASH(threads_##n, WS_THREADS_ENTRIES, __u32,                       \
		struct ws_thread_totals);                                      \
	WS_HASH(runq_hist_##n, WS_HIST_ENTRIES, struct ws_hist_key,           \
		struct ws_hist);                                               \
	WS_HASH(culprits_##n, WS_CULPRITS_ENTRIES, struct ws_culprit_key,     \
		__u64)

WS_BUFFER(0);
WS_BUFFER(1);

/* Rows inserted into each buffer since user space last emptied it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts_used SEC(".maps");

/* Rows a buffer takes before new threads' rows are merged per process
 * (7/8 of the buffer's size), and before merged rows also leave their
 * stacks out (15/16), so that what is left always has room: set by user
 * space before load. */
const volatile __u64 counts_merge_at = WS_COUNTS_ENTRIES - WS_COUNTS_ENTRIES / 8;
const volatile __u64 counts_strip_at = WS_COUNTS_ENTRIES - WS_COUNTS_ENTRIES / 16;

/* enum ws_control values, written by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, WS_CONTROL_COUNT);
	__type(key, __u32);
	__type(value, __u32);
} control SEC(".maps");

/* Per-CPU counters indexed by enum ws_stat; never reset, user space diffs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WS_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void ws_stat_inc(__u32 stat)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &stat);

	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

static __always_inline __u32 ws_control(__u32 index)
{
	__u32 *v = bpf_map_lookup_elem(&control, &index);

	return v ? *v : 0;
}

/* The aggregation buffer programs write to now. */
static __always_inline __u32 ws_buffer(void)
{
	return ws_control(WS_CONTROL_BUFFER) & 1;
}

/* Drops stack ids whose generation may have been cleared. */
static __always_inline void ws_check_generation(struct ws_stack_key *key)
{
	__u32 now = ws_control(WS_CONTROL_GENERATION);

	if (key->stack_gen == now || key->stack_gen + 1 == now)
		return;
	if (key->user_stack_id != WS_NO_STACK || key->kernel_stack_id != WS_NO_STACK)
		ws_stat_inc(WS_STAT_STACK_EXPIRED);
	key->user_stack_id = WS_NO_STACK;
	key->kernel_stack_id = WS_NO_STACK;
}

/* Inserts `init` under `key` unless present, then looks it up: the slow
 * path of a lookup that missed. */
static __always_inline void *ws_insert(void *map, const void *key,
				       const void *init, __u32 full_stat)
{
	long err = bpf_map_update_elem(map, key, init, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		ws_stat_inc(full_stat);
		return NULL;
	}
	return bpf_map_lookup_elem(map, key);
}

/* The row a new key goes to when its buffer is nearly full: its process's
 * merged row (see WS_MERGED_TID); past `strip`, without stacks, which
 * bounds the rows left to a few per process (wakeups raised in interrupts
 * carry whatever stack was interrupted, thousands of distinct ones). */
static __always_inline void ws_merge_key(struct ws_stack_key *key, bool strip)
{
	key->tid = WS_MERGED_TID | key->pid;
	if (key->peer_tid)
		key->peer_tid = WS_MERGED_TID | key->peer_pid;
	__builtin_memset(key->comm, 0, sizeof(key->comm));
	key->span = 0;
	if (strip) {
		key->user_stack_id = WS_NO_STACK;
		key->kernel_stack_id = WS_NO_STACK;
	}
}

/* Adds `ns` (and one event) to `key`'s row in the active buffer. A new row
 * in a nearly full buffer is merged into its process's row (counted) rather
 * than dropped; only when even that finds no room is the event lost. */
static __always_inline void ws_add(const struct ws_stack_key *key, __u64 ns)
{
	__u32 buffer = ws_buffer();
	void *counts = buffer ? (void *)&counts_1 : (void *)&counts_0;
	struct ws_stack_key k = *key;
	struct ws_stack_value *val;

	ws_check_generation(&k);
	val = bpf_map_lookup_elem(counts, &k);
	if (!val) {
		struct ws_stack_value zero = {};
		__u64 *used = bpf_map_lookup_elem(&counts_used, &buffer);

		if (used && *used >= counts_merge_at && k.tid) {
			ws_merge_key(&k, *used >= counts_strip_at);
			ws_stat_inc(WS_STAT_COUNTS_MERGED);
			val = bpf_map_lookup_elem(counts, &k);
		}
		if (!val) {
			val = ws_insert(counts, &k, &zero, WS_STAT_COUNTS_FULL);
			if (!val)
				return;
			if (used)
				__sync_fetch_and_add(used, 1);
		}
	}
	__sync_fetch_and_add(&val->ns, ns);
	__sync_fetch_and_add(&val->count, 1);
}

#endif /* WALLSCOPE_MAPS_BPF_H */
