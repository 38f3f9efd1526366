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
/* Stack maps rotate through this many generations (see aggregate.bpf.h). */
#define WS_STACK_GENERATIONS 3
/* log2 microsecond buckets of the runqueue histograms (1 us .. ~36 min). */
#define WS_HIST_SLOTS 32

/* Where a thread's time went. CPU is sampled; the rest are off-CPU intervals. */
enum ws_state {
	WS_STATE_CPU = 0,
	WS_STATE_RUNQUEUE = 1,
	WS_STATE_FUTEX = 2,
	WS_STATE_IO = 3,
	WS_STATE_SLEEP = 4,
	/* Runnable, but its cgroup's CPU quota is spent (CFS bandwidth). */
	WS_STATE_THROTTLED = 5,
	WS_STATE_COUNT = 6,
	/* Not a state of the thread: a wakeup it sent (peer = the wakee). */
	WS_STATE_WAKEUP = 6,
};

/*
 * Waker of a wakeup raised in interrupt context (hard or soft: the kernel
 * stack tells them apart): pid 0 and this tid, never the interrupted thread.
 */
#define WS_INTERRUPT_TID 0x40000000u

/* Stack id used when a stack could not be captured (see ws_stat). */
#define WS_NO_STACK (-1)

/* Indexes of the `control` array, written by user space. */
enum ws_control {
	WS_CONTROL_BUFFER = 0,    /* aggregation buffer programs write to (0/1) */
	WS_CONTROL_GENERATION = 1, /* current stack-map generation */
	WS_CONTROL_COUNT = 2,
};

/* Key of the aggregation maps (counts_0 / counts_1). */
struct ws_stack_key {
	__u32 pid; /* tgid, in the initial pid namespace */
	__u32 tid;
	__s32 user_stack_id;   /* id in stacks_{stack_gen % 3}, or WS_NO_STACK */
	__s32 kernel_stack_id; /* id in stacks_{stack_gen % 3}, or WS_NO_STACK */
	__u32 state;           /* enum ws_state */
	__u32 stack_gen;       /* generation the stack ids belong to */
	__u32 peer_pid;        /* WS_STATE_WAKEUP: the woken process, else 0 */
	__u32 peer_tid;        /* WS_STATE_WAKEUP: the woken thread, else 0 */
	__u32 syscall;         /* off-CPU: syscall nr at switch-out + 1, 0 if none */
	__u32 _pad;
	char comm[WS_COMM_LEN]; /* thread name at the time of the event */
};

/*
 * When an aggregation buffer is nearly full, new rows of a thread go to its
 * process's merged row instead of being dropped: tid (and a wakee's
 * peer_tid) become WS_MERGED_TID | pid, and comm is cleared. Pids are below
 * 2^22, so merged tids never collide with real ones.
 */
#define WS_MERGED_TID 0x80000000u

/* Value of the aggregation maps: summed time and number of events. */
struct ws_stack_value {
	__u64 ns;
	__u64 count;
};

/* Per-thread totals (threads_0 / threads_1), keyed by tid. Nothing here is
 * subject to the off-CPU threshold: every nanosecond is counted. */
struct ws_thread_totals {
	__u32 pid;
	__u32 _pad;
	char comm[WS_COMM_LEN];
	__u64 ns[WS_STATE_COUNT];     /* by enum ws_state; CPU measured exactly */
	__u64 switches_voluntary;
	__u64 switches_involuntary;
	__u64 wakeups_sent;
	__u64 wakeups_received;
};

/* Key of the runqueue histograms (runq_hist_0 / runq_hist_1): runqueue
 * latency, and apart from it the time spent throttled. */
struct ws_hist_key {
	__u64 id;   /* pid or cgroup id */
	__u32 kind; /* enum ws_hist_kind */
	__u32 _pad;
};

enum ws_hist_kind {
	WS_HIST_PROCESS = 0,
	WS_HIST_CGROUP = 1,
	WS_HIST_PROCESS_THROTTLED = 2,
	WS_HIST_CGROUP_THROTTLED = 3,
};

/*
 * One stack in stacks_N, keyed by its id: the low 31 bits of `hash`, a
 * 64-bit hash of the frames. Two stacks share an id only if their hashes
 * collide in those bits; the full hash tells them apart.
 */
struct ws_stack {
	__u64 hash;
	__u32 len; /* frames in ips, innermost first */
	__u32 _pad;
	__u64 ips[WS_MAX_STACK_DEPTH];
};

/*
 * Unwind tables (issue 5): for code without frame pointers, compact rows
 * derived from .eh_frame by user space, in one array (`unwind_rows`); per
 * process, the executable mappings that have a table (`unwind_procs`).
 * A row applies from `pc` (an ELF virtual address of its module) to the
 * next row's pc. Elsewhere the walk follows the frame-pointer chain.
 */
#define WS_UNWIND_MAX_MAPPINGS 16

enum ws_cfa_reg {
	WS_CFA_RSP = 0,
	WS_CFA_RBP = 1,
	WS_CFA_NONE = 2,        /* no unwind info for this range */
	WS_CFA_END = 3,         /* outermost frame: the walk ends normally */
	WS_CFA_UNSUPPORTED = 4, /* expression or other register, signal frame */
};

enum ws_rbp_rule {
	WS_RBP_SAME = 0,   /* rbp unchanged */
	WS_RBP_AT_CFA = 1, /* rbp saved at CFA + rbp_off */
	WS_RBP_UNSUPPORTED = 2,
};

struct ws_unwind_row {
	__u32 pc;      /* first address covered, module virtual address */
	__s32 cfa_off; /* CFA = (cfa_reg == RSP ? rsp : rbp) + cfa_off */
	__s16 rbp_off;
	__u8 cfa_reg;  /* enum ws_cfa_reg */
	__u8 rbp_rule; /* enum ws_rbp_rule */
};

/*
 * A table in unwind_rows starts with a page index, then its rows. Index
 * entry k (its `pc` field) is the number, counted from the first row, of
 * the last row with pc <= (page_base + k) * 4096, for k in 0..=page_count:
 * a lookup narrows to one page's rows before the binary search.
 */
struct ws_unwind_mapping {
	__u64 start; /* runtime address range of the executable mapping */
	__u64 end;
	__u64 bias;  /* runtime address - module virtual address */
	__u32 index_start; /* unwind_rows[index_start ..= +page_count]: page index */
	__u32 row_count;   /* rows follow the index */
	__u32 page_base;   /* first page (module vaddr / 4096) */
	__u32 page_count;
};

struct ws_unwind_proc {
	__u32 count; /* mappings used */
	__u32 epoch; /* changes at every registration: cached lookups expire */
	struct ws_unwind_mapping mappings[WS_UNWIND_MAX_MAPPINGS];
	/* A HotSpot JVM's interpreter code, [start, end), or 0, 0: a frame
	 * there is recorded as WS_JAVA_METHOD_TAG | its Method*. */
	__u64 interp_start;
	__u64 interp_end;
};

/* A user stack entry that is an interpreted Java frame's Method* (read at
 * frame pointer - 24, where HotSpot's x86-64 interpreter keeps it), not a
 * pc: user addresses stay below 2^47, kernel ones start at 0xffff8... */
#define WS_JAVA_METHOD_TAG (1ULL << 62)
#define WS_JAVA_METHOD_SLOT 24

struct ws_hist {
	__u64 slots[WS_HIST_SLOTS];
	__u64 ns; /* total time of the intervals counted */
};

/* Indexes of the per-CPU `stats` array: every way an event can be degraded. */
enum ws_stat {
	WS_STAT_SAMPLES = 0,           /* on-CPU samples seen */
	WS_STAT_COUNTS_FULL = 1,       /* event dropped: aggregation map full */
	WS_STAT_USTACK_COLLISION = 2,  /* user stack dropped: its id (hash) is another stack's */
	WS_STAT_USTACK_FAILED = 3,     /* user stack walk failed (not a kernel thread) */
	WS_STAT_KSTACK_COLLISION = 4,  /* kernel stack dropped: its id (hash) is another stack's */
	WS_STAT_KSTACK_FAILED = 5,     /* kernel stack walk failed */
	WS_STAT_SWITCHES = 6,          /* sched_switch events seen */
	WS_STAT_WAKEUPS = 7,           /* wakeups seen */
	WS_STAT_STACK_EXPIRED = 8,     /* interval outlived its stack generation */
	WS_STAT_TASK_STORAGE_FAILED = 9, /* no per-thread storage: interval lost */
	WS_STAT_THREADS_FULL = 10,     /* per-thread totals map full */
	WS_STAT_HIST_FULL = 11,        /* histogram map full */
	WS_STAT_BELOW_THRESHOLD = 12,  /* intervals under --offcpu-min-us (totals only) */
	WS_STAT_STACKS_STORED = 13,    /* new stacks stored in the current generation */
	WS_STAT_STACK_STORE_FAILED = 14, /* stack dropped: map full or no memory */
	WS_STAT_UNWIND_WALKS = 15,     /* user stacks walked with unwind tables */
	WS_STAT_UNWIND_NO_INFO = 16,   /* walk ended early: no unwind row for the pc */
	WS_STAT_UNWIND_UNSUPPORTED = 17, /* walk ended early: expression CFA, signal frame... */
	WS_STAT_UNWIND_READ_FAILED = 18, /* walk ended early: stack memory unreadable */
	WS_STAT_UNWIND_TRUNCATED = 19, /* walk ended early: WS_MAX_STACK_DEPTH frames */
	WS_STAT_PROC_EVENTS_LOST = 20, /* process event dropped: ring buffer full */
	WS_STAT_COUNTS_MERGED = 21,    /* event added to its process's merged row (map nearly full) */
	WS_STAT_OFFCPU_WALKS = 22,     /* off-CPU stack walks at switch-in */
	WS_STAT_WAKER_WALKS = 23,      /* waker stack walks */
	WS_STAT_LIVE_WALKS = 24,       /* stack walks of blocked threads at drain time */
	WS_STAT_SAMPLED_OUT = 25,      /* intervals over the threshold not drawn: no stack row */
	WS_STAT_DEFERRED_LOST = 26,    /* drawn interval whose switch-in hook did not run: row without stack */
	WS_STAT_LIVE_WALKS_PUT_OFF = 27, /* drain-time walk put off: memory map locked or walk budget spent */
	WS_STAT_WALKS_REUSED = 28,     /* user stack not walked: same registers and stack top as a walk kept */
	WS_STAT_COUNT = 29,
};

/*
 * What each stack walk cost: a per-CPU histogram (`walk_cost`) of the time
 * a walk took, by what was walked, how many frames it found and how long
 * it took. Entry (kind * WS_WALK_DEPTHS + frames / 8) * WS_WALK_TIME_SLOTS
 * + slot, slot = 4 * log2(ns) + the two bits below the top one (4 slots a
 * power of two, so a percentile is known within 19 %).
 */
enum ws_walk_kind {
	WS_WALK_USER_TABLES = 0, /* a thread's own user stack, its process has unwind tables */
	WS_WALK_USER_FP = 1,     /* a thread's own user stack, the kernel's frame-pointer walk */
	WS_WALK_KERNEL = 2,      /* a kernel stack */
	WS_WALK_LIVE = 3,        /* a blocked thread's user stack, by the drain-time iterator */
	WS_WALK_KINDS = 4,
};
#define WS_WALK_DEPTHS 16      /* frames / 8; the last also holds deeper stacks */
#define WS_WALK_TIME_SLOTS 80  /* up to 2^20 ns; longer walks go to the last */
#define WS_WALK_COST_ENTRIES (WS_WALK_KINDS * WS_WALK_DEPTHS * WS_WALK_TIME_SLOTS)

/* The one entry of the per-CPU `walk_cost` array: counters that wrap. */
struct ws_walk_cost {
	__u32 n[WS_WALK_COST_ENTRIES];
};

/*
 * Process lifecycle, sent one event at a time through the `proc_events`
 * ring buffer (few: one per fork, exec, exit or rename of a process, not of
 * its threads). They feed the daemon's one process table.
 */
enum ws_proc_event_kind {
	WS_PROC_FORK = 0,   /* a new process: pid, its parent in `parent` */
	WS_PROC_EXEC = 1,   /* pid runs a new program, named `comm` */
	WS_PROC_EXIT = 2,   /* the last thread of pid exits; its mm is still there */
	WS_PROC_RENAME = 3, /* pid's main thread renamed itself (prctl) to `comm` */
};

struct ws_proc_event {
	__u32 kind;   /* enum ws_proc_event_kind */
	__u32 pid;    /* tgid, in the initial pid namespace */
	__u32 parent; /* WS_PROC_FORK: the parent's tgid, else 0 */
	__u32 _pad;
	__u64 start_ns; /* the process's start, ns since boot (start_boottime) */
	__u64 time_ns;  /* when it happened, ns since boot */
	char comm[WS_COMM_LEN];
};

/*
 * What the drain-time task iterator (`live_threads`) writes for each thread
 * that is off-CPU, as records on the iterator's file. The phase's time up to
 * `now_ns` is already in the aggregation buffer being drained.
 */
struct ws_live_thread {
	__u32 pid;
	__u32 tid;
	__u32 state;   /* enum ws_state of the current phase */
	__u32 syscall; /* syscall nr + 1 at switch-out, 0 if none */
	__u64 since_ns; /* phase start (bpf_ktime_get_ns: CLOCK_MONOTONIC) */
	__u64 now_ns;   /* when the iterator looked */
	__s32 user_stack_id;   /* in stacks_{stack_gen % 3}, or WS_NO_STACK */
	__s32 kernel_stack_id;
	__u32 stack_gen;
	__u32 waker_pid; /* who woke it last (0: none seen; WS_INTERRUPT_TID: an interrupt) */
	__u32 waker_tid;
	__u32 _pad;
	char comm[WS_COMM_LEN];
};

#ifdef __BPF__
_Static_assert(sizeof(struct ws_stack_key) == 56, "ws_stack_key size");
_Static_assert(sizeof(struct ws_stack_value) == 16, "ws_stack_value size");
_Static_assert(sizeof(struct ws_stack) == 16 + 8 * WS_MAX_STACK_DEPTH, "ws_stack size");
_Static_assert(sizeof(struct ws_unwind_row) == 12, "ws_unwind_row size");
_Static_assert(sizeof(struct ws_unwind_mapping) == 40, "ws_unwind_mapping size");
_Static_assert(sizeof(struct ws_unwind_proc) == 24 + 40 * WS_UNWIND_MAX_MAPPINGS, "ws_unwind_proc size");
_Static_assert(sizeof(struct ws_thread_totals) == 104, "ws_thread_totals size");
_Static_assert(sizeof(struct ws_hist_key) == 16, "ws_hist_key size");
_Static_assert(sizeof(struct ws_hist) == 8 * WS_HIST_SLOTS + 8, "ws_hist size");
_Static_assert(sizeof(struct ws_live_thread) == 72, "ws_live_thread size");
_Static_assert(sizeof(struct ws_proc_event) == 48, "ws_proc_event size");
_Static_assert(sizeof(struct ws_walk_cost) == 4 * WS_WALK_COST_ENTRIES, "ws_walk_cost size");
#endif

#endif /* WALLSCOPE_H */
