/* SPDX-License-Identifier: Apache-2.0 */
/*
 * In-kernel aggregation shared by every program.
 *
 * Sums live in two buffers (counts_N, threads_N, runq_hist_N): user space
 * flips control[WS_CONTROL_BUFFER] before draining the idle one, so events
 * that arrive during a drain land in the other buffer.
 *
 * Stacks live in WS_STACK_GENERATIONS stack maps. An off-CPU interval takes
 * its stack at switch-out and is summed when it ends, possibly seconds later,
 * so stack ids must outlive drains: they are tagged with the generation of
 * the map they are in. A row may use the current or the previous generation;
 * older ones are expired (counted). User space clears the map of generation
 * g-2 and only then moves to g+1.
 */
#ifndef WALLSCOPE_AGGREGATE_BPF_H
#define WALLSCOPE_AGGREGATE_BPF_H

#include "wallscope.h"

#ifndef EEXIST
#define EEXIST 17
#endif

/* Sizes are defaults; user space may override them before load. */
#define WS_COUNTS_ENTRIES 32768
#define WS_STACKS_ENTRIES 8192
#define WS_THREADS_ENTRIES 32768
#define WS_HIST_ENTRIES 4096

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
		struct ws_hist)

WS_BUFFER(0);
WS_BUFFER(1);

#define WS_STACKS(n)                                                           \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_STACK_TRACE);                        \
		__uint(max_entries, WS_STACKS_ENTRIES);                        \
		__uint(key_size, sizeof(__u32));                               \
		__uint(value_size, WS_MAX_STACK_DEPTH * sizeof(__u64));        \
	} stacks_##n SEC(".maps")

WS_STACKS(0);
WS_STACKS(1);
WS_STACKS(2);

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

static __always_inline void *ws_stack_map(__u32 gen)
{
	switch (gen % WS_STACK_GENERATIONS) {
	case 0:
		return &stacks_0;
	case 1:
		return &stacks_1;
	default:
		return &stacks_2;
	}
}

/* Captures one stack of the current task into generation `gen`; failures
 * are counted and become WS_NO_STACK. */
static __always_inline __s32 ws_stack_id(void *ctx, __u32 gen, __u64 flags,
					 __u32 collision_stat, __u32 failed_stat)
{
	long id = bpf_get_stackid(ctx, ws_stack_map(gen), flags);

	if (id >= 0)
		return id;
	ws_stat_inc(id == -EEXIST ? collision_stat : failed_stat);
	return WS_NO_STACK;
}

static __always_inline __s32 ws_user_stack(void *ctx, __u32 gen)
{
	return ws_stack_id(ctx, gen, BPF_F_USER_STACK, WS_STAT_USTACK_COLLISION,
			   WS_STAT_USTACK_FAILED);
}

static __always_inline __s32 ws_kernel_stack(void *ctx, __u32 gen)
{
	return ws_stack_id(ctx, gen, 0, WS_STAT_KSTACK_COLLISION,
			   WS_STAT_KSTACK_FAILED);
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

/* Adds `ns` (and one event) to `key`'s row in the active buffer. */
static __always_inline void ws_add(struct ws_stack_key *key, __u64 ns)
{
	void *counts = ws_buffer() ? (void *)&counts_1 : (void *)&counts_0;
	struct ws_stack_value *val;

	ws_check_generation(key);
	val = bpf_map_lookup_elem(counts, key);
	if (!val) {
		struct ws_stack_value zero = {};

		val = ws_insert(counts, key, &zero, WS_STAT_COUNTS_FULL);
		if (!val)
			return;
	}
	__sync_fetch_and_add(&val->ns, ns);
	__sync_fetch_and_add(&val->count, 1);
}

#endif /* WALLSCOPE_AGGREGATE_BPF_H */
