/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The BPF <-> user-space contract: map keys, values, enums and sizes.
 * Types and constants only. Its one Rust mirror is src/bpf/abi.rs; both pin
 * the sizes below, and a Rust test checks that field offsets agree.
 */
#ifndef WALLSCOPE_H
#define WALLSCOPE_H

#define WS_COMM_LEN 16
/* Frames kept per stack (the kernel's perf default). */
#define WS_MAX_STACK_DEPTH 127

/* Where a thread's time went. CPU is sampled; the rest are off-CPU intervals. */
enum ws_state {
	WS_STATE_CPU = 0,
	WS_STATE_RUNQUEUE = 1,
	WS_STATE_FUTEX = 2,
	WS_STATE_IO = 3,
	WS_STATE_SLEEP = 4,
	WS_STATE_COUNT = 5,
};

/* Stack id used when a stack could not be captured (see ws_stat). */
#define WS_NO_STACK (-1)

/* Key of the aggregation maps (counts_0 / counts_1). */
struct ws_stack_key {
	__u32 pid; /* tgid, in the initial pid namespace */
	__u32 tid;
	__s32 user_stack_id;   /* id in stacks_N, or WS_NO_STACK */
	__s32 kernel_stack_id; /* id in stacks_N, or WS_NO_STACK */
	__u32 state;           /* enum ws_state */
	__u32 _pad;
	char comm[WS_COMM_LEN]; /* thread name at the time of the event */
};

/* Value of the aggregation maps: summed time and number of events. */
struct ws_stack_value {
	__u64 ns;
	__u64 count;
};

/* Indexes of the per-CPU `stats` array: every way an event can be degraded. */
enum ws_stat {
	WS_STAT_SAMPLES = 0,           /* on-CPU samples seen */
	WS_STAT_COUNTS_FULL = 1,       /* event dropped: aggregation map full */
	WS_STAT_USTACK_COLLISION = 2,  /* user stack dropped: stack map bucket taken */
	WS_STAT_USTACK_FAILED = 3,     /* user stack walk failed (not a kernel thread) */
	WS_STAT_KSTACK_COLLISION = 4,  /* kernel stack dropped: stack map bucket taken */
	WS_STAT_KSTACK_FAILED = 5,     /* kernel stack walk failed */
	WS_STAT_COUNT = 6,
};

#ifdef __BPF__
_Static_assert(sizeof(struct ws_stack_key) == 40, "ws_stack_key size");
_Static_assert(sizeof(struct ws_stack_value) == 16, "ws_stack_value size");
#endif

#endif /* WALLSCOPE_H */
