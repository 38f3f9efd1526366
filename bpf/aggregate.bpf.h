/* SPDX-License-Identifier: Apache-2.0 */
/*
 * In-kernel aggregation shared by every program: per-stack sums in two
 * buffers. User space flips `buffer_index` before draining the idle buffer,
 * so events that arrive during a drain land in the other one.
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

#define WS_DEFINE_BUFFER(n)                                                    \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                               \
		__uint(max_entries, WS_COUNTS_ENTRIES);                        \
		__type(key, struct ws_stack_key);                              \
		__type(value, struct ws_stack_value);                          \
	} counts_##n SEC(".maps");                                             \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_STACK_TRACE);                        \
		__uint(max_entries, WS_STACKS_ENTRIES);                        \
		__uint(key_size, sizeof(__u32));                               \
		__uint(value_size, WS_MAX_STACK_DEPTH * sizeof(__u64));        \
	} stacks_##n SEC(".maps")

WS_DEFINE_BUFFER(0);
WS_DEFINE_BUFFER(1);

/* One u32: which buffer (0 or 1) programs write to. Written by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} buffer_index SEC(".maps");

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

/* Captures one stack; failures are counted and become WS_NO_STACK. */
static __always_inline __s32 ws_stack_id(void *ctx, void *stack_map, __u64 flags,
					 __u32 collision_stat, __u32 failed_stat)
{
	long id = bpf_get_stackid(ctx, stack_map, flags);

	if (id >= 0)
		return id;
	if (id == -EEXIST)
		ws_stat_inc(collision_stat);
	else
		ws_stat_inc(failed_stat);
	return WS_NO_STACK;
}

static __always_inline void ws_add(void *ctx, void *counts, void *stack_map,
				   struct ws_stack_key *key, __u64 ns,
				   bool want_user_stack, bool want_kernel_stack)
{
	struct ws_stack_value *val, zero = {};

	key->user_stack_id = want_user_stack
		? ws_stack_id(ctx, stack_map, BPF_F_USER_STACK,
			      WS_STAT_USTACK_COLLISION, WS_STAT_USTACK_FAILED)
		: WS_NO_STACK;
	key->kernel_stack_id = want_kernel_stack
		? ws_stack_id(ctx, stack_map, 0, WS_STAT_KSTACK_COLLISION,
			      WS_STAT_KSTACK_FAILED)
		: WS_NO_STACK;

	val = bpf_map_lookup_elem(counts, key);
	if (!val) {
		long err = bpf_map_update_elem(counts, key, &zero, BPF_NOEXIST);

		if (err && err != -EEXIST) {
			ws_stat_inc(WS_STAT_COUNTS_FULL);
			return;
		}
		val = bpf_map_lookup_elem(counts, key);
		if (!val)
			return;
	}
	__sync_fetch_and_add(&val->ns, ns);
	__sync_fetch_and_add(&val->count, 1);
}

/* Adds `ns` of `key->state` for the current task into the active buffer. */
static __always_inline void ws_record(void *ctx, struct ws_stack_key *key, __u64 ns,
				      bool want_user_stack, bool want_kernel_stack)
{
	__u32 zero = 0;
	__u32 *index = bpf_map_lookup_elem(&buffer_index, &zero);

	if (index && *index)
		ws_add(ctx, &counts_1, &stacks_1, key, ns, want_user_stack,
		       want_kernel_stack);
	else
		ws_add(ctx, &counts_0, &stacks_0, key, ns, want_user_stack,
		       want_kernel_stack);
}

#endif /* WALLSCOPE_AGGREGATE_BPF_H */
