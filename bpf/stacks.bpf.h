/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Stack capture and storage.
 *
 * Stacks live in WS_STACK_GENERATIONS stack maps. An off-CPU interval takes
 * its stack at switch-out and is summed when it ends, possibly seconds later,
 * so stack ids must outlive drains: they are tagged with the generation of
 * the map they are in. A row may use the current or the previous generation;
 * older ones are expired (counted, see ws_check_generation in maps.bpf.h).
 * User space clears the map of generation g-2 and only then moves to g+1.
 */
#ifndef WALLSCOPE_STACKS_BPF_H
#define WALLSCOPE_STACKS_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "core_fixes.bpf.h"
#include "maps.bpf.h"
#include "unwind.bpf.h"
#include "walkcost.bpf.h"
#include "wallscope.h"

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

/* Where a stack is assembled before it is hashed and stored. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_stack);
} stack_scratch SEC(".maps");

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

#endif /* WALLSCOPE_STACKS_BPF_H */
