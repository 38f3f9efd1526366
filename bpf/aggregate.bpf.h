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

/*
 * Not BPF_MAP_TYPE_STACK_TRACE: it keys stacks by bucket, and a stack whose
 * bucket holds another stack is refused for the whole generation, so a hot
 * stack can lose every sample (measured: 12 % of a JVM's stacks at 25 %
 * occupancy). Keyed by a 64-bit hash here, refusals need a hash collision.
 * Entries are allocated on use, so memory follows the stacks seen.
 */
#define WS_STACKS(n)                                                           \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                               \
		__uint(max_entries, WS_STACKS_ENTRIES);                        \
		__uint(map_flags, BPF_F_NO_PREALLOC);                          \
		__type(key, __u32);                                            \
		__type(value, struct ws_stack);                                \
	} stacks_##n SEC(".maps")

WS_STACKS(0);
WS_STACKS(1);
WS_STACKS(2);

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

/* Where a stack is assembled before it is hashed and stored. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_stack);
} stack_scratch SEC(".maps");

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

#include "walkcost.bpf.h"
#include "unwind.bpf.h"

/* 64-bit hash of a stack's frames (multiply-xorshift per frame). */
static __always_inline __u64 ws_stack_hash(const struct ws_stack *s)
{
	__u64 h = 0x9e3779b97f4a7c15ULL ^ s->len;

	for (__u32 i = 0; i < WS_MAX_STACK_DEPTH; i++) {
		if (i >= s->len)
			break;
		h = (h ^ s->ips[i]) * 0xff51afd7ed558ccdULL;
		h ^= h >> 32;
	}
	return h;
}

/* Stores stack `s` (frames and len set) into generation `gen`: its id, or
 * WS_NO_STACK when refused (counted). */
static __always_inline __s32 ws_store_stack(struct ws_stack *s, __u32 gen, __u32 collision_stat)
{
	void *map = ws_stack_map(gen);

	s->hash = ws_stack_hash(s);
	__u32 id = (__u32)s->hash & 0x7fffffff; /* ids are non-negative s32 */

	for (int attempt = 0; attempt < 2; attempt++) {
		struct ws_stack *old = bpf_map_lookup_elem(map, &id);

		if (old) {
			if (old->hash == s->hash)
				return id;
			ws_stat_inc(collision_stat);
			return WS_NO_STACK;
		}
		long err = bpf_map_update_elem(map, &id, s, BPF_NOEXIST);
		if (!err) {
			ws_stat_inc(WS_STAT_STACKS_STORED);
			return id;
		}
		if (err != -EEXIST) {
			ws_stat_inc(WS_STAT_STACK_STORE_FAILED);
			return WS_NO_STACK;
		}
		/* Another CPU stored this id meanwhile: compare again. */
	}
	return WS_NO_STACK;
}

/* Captures one stack of the current task into generation `gen`; failures
 * are counted and become WS_NO_STACK. */
static __always_inline __s32 ws_stack_id(void *ctx, __u32 gen, __u64 flags,
					 __u32 collision_stat, __u32 failed_stat)
{
	__u32 zero = 0;
	struct ws_stack *s = bpf_map_lookup_elem(&stack_scratch, &zero);

	if (!s)
		return WS_NO_STACK;
	__u64 start = bpf_ktime_get_ns();
	__u32 kind = WS_WALK_KERNEL, tables = 0;
	long frames = -1;

	if (flags & BPF_F_USER_STACK) {
		frames = ws_unwind_user(s, &tables);
		kind = tables ? WS_WALK_USER_TABLES : WS_WALK_USER_FP;
	}
	if (frames < 0) {
		long bytes = bpf_get_stack(ctx, s->ips, sizeof(s->ips), flags);

		frames = bytes > 0 ? bytes / sizeof(__u64) : 0;
	}
	ws_walk_cost(kind, frames, start);
	if (frames <= 0) {
		ws_stat_inc(failed_stat);
		return WS_NO_STACK;
	}
	s->len = frames;
	return ws_store_stack(s, gen, collision_stat);
}

/* A stack of generation `gen`, moved into the current generation without a
 * new walk: the id stays (it is the stack's hash). WS_NO_STACK when it has
 * already expired. */
static __always_inline __s32 ws_renew_stack(__s32 id, __u32 gen, __u32 now)
{
	struct ws_stack *s;
	__u32 key = id;

	if (id == WS_NO_STACK || gen == now)
		return id;
	if (gen + 1 != now)
		return WS_NO_STACK;
	s = bpf_map_lookup_elem(ws_stack_map(gen), &key);
	if (!s)
		return WS_NO_STACK;
	struct ws_stack *there = bpf_map_lookup_elem(ws_stack_map(now), &key);

	if (there)
		return there->hash == s->hash ? id : WS_NO_STACK;
	if (bpf_map_update_elem(ws_stack_map(now), &key, s, BPF_NOEXIST))
		return WS_NO_STACK;
	ws_stat_inc(WS_STAT_STACKS_STORED);
	return id;
}

static __always_inline __s32 ws_user_stack(void *ctx, __u32 gen)
{
	return ws_stack_id(ctx, gen, BPF_F_USER_STACK, WS_STAT_USER_STACK_COLLISION,
			   WS_STAT_USER_STACK_FAILED);
}

static __always_inline __s32 ws_kernel_stack(void *ctx, __u32 gen)
{
	return ws_stack_id(ctx, gen, 0, WS_STAT_KERNEL_STACK_COLLISION,
			   WS_STAT_KERNEL_STACK_FAILED);
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

#endif /* WALLSCOPE_AGGREGATE_BPF_H */
