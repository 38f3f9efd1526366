/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The BPF <-> user-space contract: map keys, values, enums, sizes and the
 * capacities user space relies on. Types and constants only. build.rs reads
 * it with bindgen into Rust (src/bpf/abi/generated.rs, with layout
 * assertions) and turns WS_STATS into the Rust `Stat`; the sizes below are
 * pinned here, so a change that moves a field fails the build.
 */
#ifndef WALLSCOPE_H
#define WALLSCOPE_H

#ifdef __bpf__
#include "vmlinux.h"
#else
/* User space (bindgen): the kernel's fixed-width types, which BPF programs
 * have from vmlinux.h. */
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef long long __s64;
#endif

#define WS_COMM_LEN 16
/* Frames kept per stack (the kernel's perf default). */
#define WS_MAX_STACK_DEPTH 127
/* Stack maps rotate through this many generations (see stacks.bpf.h). */
#define WS_STACK_GENERATIONS 3
/* Entries of each stack map; user space moves to the next generation once
 * half of them are used (src/collect/stacks.rs). */
#define WS_STACKS_ENTRIES 16384
/* log2 microsecond buckets of the runqueue histograms (1 us .. ~36 min). */
#define WS_HIST_SLOTS 32
/* log2 microsecond slots of a thread's blocked intervals (switch-out to
 * wakeup): under 1 us, then [2^(k-1), 2^k) us, the last from ~4.2 s on. */
#define WS_SLEEP_SLOTS 24

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
	__u8 comm[WS_COMM_LEN]; /* thread name at the time of the event */
	/* The OpenTelemetry span active on the thread (its 8 bytes as the
	 * record holds them), 0 for none: see ws_otel_proc. */
	__u64 span;
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
	__u8 comm[WS_COMM_LEN];
	__u64 ns[WS_STATE_COUNT];     /* by enum ws_state; CPU measured exactly */
	__u64 switches_voluntary;
	__u64 switches_involuntary;
	__u64 wakeups_sent;
	__u64 wakeups_received;
	__u32 sleep_slots[WS_SLEEP_SLOTS]; /* blocked intervals a wakeup ended, by length */
};

/* Key of the runqueue histograms (runq_hist_0 / runq_hist_1): runqueue
 * latency, and apart from it the time spent throttled. */
struct ws_hist_key {
	__u64 id;   /* pid or cgroup id */
	__u32 kind; /* enum ws_hist_kind */
	__u32 _pad;
};

/*
 * Who kept a thread off the CPU while it waited in a runqueue: the time
 * each process ran on the CPU that thread was switched in on, within its
 * wait (culprits_0 / culprits_1, values in ns). `culprit` is a tgid, 0 the
 * idle task, WS_CULPRIT_UNSEEN the part of the wait the CPU's recent runs
 * do not cover (the thread waited on another CPU's queue, or more than
 * WS_CPU_RUNS runs went by), WS_CULPRIT_OTHERS the processes past a
 * thread's first WS_CULPRIT_SLOTS in a drain. Kept per thread in its task
 * storage as waits end and moved to the map at each drain (counts.bpf.h),
 * so a switch updates no map.
 */
struct ws_culprit_key {
	__u32 pid;     /* the waiting thread's process */
	__u32 tid;     /* the waiting thread */
	__u32 culprit; /* the process that ran meanwhile */
	__u32 _pad;
};

#define WS_CULPRIT_UNSEEN 0xffffffffu
/* The processes past each thread's first WS_CULPRIT_SLOTS in one drain. */
#define WS_CULPRIT_OTHERS 0xfffffffeu
#define WS_CULPRIT_SLOTS 8
/* Runs of each CPU kept for the attribution: a power of two. A wait
 * longer than this many runs of others is attributed in part only (the
 * rest is WS_CULPRIT_UNSEEN): 16 left a fifth of a starved thread's wait
 * unattributed beside a forking script on a saturated host. */
#define WS_CPU_RUNS 64

/* One run of a task on a CPU, and the ring of each CPU's latest. */
struct ws_cpu_run {
	__u64 start;
	__u64 end;
	__u32 tgid;
	__u32 comm_hash; /* of the process's name: a script's children share it */
};

struct ws_cpu_runs {
	__u64 last_switch; /* when the task running now was switched in */
	__u32 head;        /* runs[head % WS_CPU_RUNS] is written next */
	__u32 _pad;
	struct ws_cpu_run runs[WS_CPU_RUNS];
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
 * Unwind tables: for code without frame pointers, compact rows
 * derived from .eh_frame by user space, in one array (`unwind_rows`); per
 * process, the executable mappings that have a table (`unwind_procs`).
 * A row applies from `pc` (an ELF virtual address of its module) to the
 * next row's pc. Elsewhere the walk follows the frame-pointer chain.
 */
#define WS_UNWIND_MAX_MAPPINGS 16
/* Processes with unwind tables (entries of `unwind_procs`): user space
 * registers no more. */
#define WS_UNWIND_PROCS 8192
/* Default rows of `unwind_rows`; user space sizes it from --unwind-table-mb. */
#define WS_UNWIND_ROWS 1024
/* Halvings of the binary search in a table (unwind.bpf.h), and so the most
 * rows a table may have: user space loads no larger table. */
#define WS_UNWIND_SEARCH_STEPS 24
#define WS_UNWIND_MAX_TABLE_ROWS (1 << 24)

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

/*
 * A HotSpot JVM's code, as the walk steps through it without frame
 * pointers (java.bpf.h): user space reads it from the JVM's vmStructs when
 * it registers the process. A pc in a code heap belongs to the code blob
 * whose block the heap's segment map leads back to (a byte per segment:
 * 0 starts a block, 0xff is free, else how many segments back to go);
 * the blob's frame size says where its caller's frame starts.
 */
#define WS_JAVA_MAX_HEAPS 4
/* Bytes of a code blob's header the walk reads: every field below lies
 * within them (user space registers no layout where one does not). JDK 21
 * keeps _frame_size at 88, 17 at 40, 25 at 36. */
#define WS_JAVA_BLOB_HEADER 128

struct ws_java_heap {
	__u64 low; /* [low, high): the heap's reserved code */
	__u64 high;
	__u64 segmap; /* its segment map */
	__u32 log2_segment;
	__u32 _pad;
};

struct ws_java_code {
	/* The interpreter's code, [start, end), or 0, 0: a frame there is
	 * recorded as WS_JAVA_METHOD_TAG | its Method*. */
	__u64 interp_start;
	__u64 interp_end;
	struct ws_java_heap heaps[WS_JAVA_MAX_HEAPS];
	__u32 heap_count;     /* 0: compiled frames are not stepped through */
	__u16 block_header;   /* sizeof(HeapBlock): a blob starts this far into its block */
	__u16 frame_size;     /* offsetof(CodeBlob, _frame_size): an int, in words */
	__u16 frame_complete; /* offsetof(CodeBlob, _frame_complete_offset) */
	__u16 code;	      /* offsetof(CodeBlob, _code_begin or _code_offset) */
	__u8 frame_complete_width; /* 2 or 4 bytes */
	__u8 code_is_offset;	   /* code is an int from the blob (JDK 23+), else a pointer */
	__u16 _pad;
};

/*
 * A CPython interpreter's frames, as the walk reads them (python.bpf.h).
 * User space reads the interpreter's layout when it registers the process
 * (3.13+: its own _Py_DebugOffsets; before: a table per minor version,
 * checked against the binary), and each thread's PyThreadState into
 * `python_threads`. The walk appends the thread's Python frames after its
 * native ones, innermost first: WS_PY_FRAME_TAG | the frame's code object,
 * and WS_PY_EVAL_END after the last frame of each eval-loop call, so that
 * user space puts each call's frames in place of its native
 * _PyEval_EvalFrameDefault frame.
 */
#define WS_PY_FRAME_TAG (1ULL << 61)
#define WS_PY_EVAL_END (WS_PY_FRAME_TAG | 0) /* the frames of one eval-loop call end here */
#define WS_PY_GIL (WS_PY_FRAME_TAG | 1)      /* first: the thread waits for the GIL */
#define WS_PY_CUT (WS_PY_FRAME_TAG | 2)      /* last: the chain went on (too deep, or unreadable) */
/* Python frames (and markers) a stack keeps at most: the rest is cut. */
#define WS_PY_MAX_FRAMES 64
/* Bytes of a frame read at once: every field the walk reads lies within. */
#define WS_PY_FRAME_READ 96
/* A field the layout does not have. */
#define WS_PY_NO_FIELD 0xffff

enum ws_py_entry {
	WS_PY_ENTRY_EVERY = 0, /* 3.10: every frame is one eval-loop call */
	WS_PY_ENTRY_FLAG = 1,  /* 3.11: a byte, non-zero on each call's first frame (is_entry) */
	WS_PY_ENTRY_SHIM = 2,  /* 3.12+: a frame owned by the C stack sits under each call's frames */
};

struct ws_python_code {
	__u64 gil_start; /* [gil_start, gil_end): the GIL; a futex wait there is WS_PY_GIL */
	__u64 gil_end;
	__u16 tstate_frame; /* offset in PyThreadState of the current frame, or of its _PyCFrame */
	__u16 cframe_frame; /* offset in _PyCFrame of current_frame; WS_PY_NO_FIELD: none */
	__u16 frame_back;   /* offset in a frame of its caller's frame */
	__u16 frame_code;   /* offset in a frame of its code object */
	__u16 frame_entry;  /* offset of the is_entry or owner byte (not for ENTRY_EVERY) */
	__u8 entry;         /* enum ws_py_entry */
	__u8 shim_owner;    /* ENTRY_SHIM: the owner value of a shim frame (FRAME_OWNED_BY_CSTACK) */
	__u8 minor;         /* Python 3.minor; 0: no interpreter registered */
	__u8 _pad[3];
	__u32 _pad2[2];
};

/* Key of `python_threads`: a thread by its process and its TLS base
 * (pthread_self(), which CPython keeps in PyThreadState.thread_id, and
 * the kernel in thread.fsbase); the value is its PyThreadState. */
struct ws_py_thread_key {
	__u32 pid;
	__u32 _pad;
	__u64 thread_id;
};
/* Entries of `python_threads`: user space registers no more. */
#define WS_PY_THREADS 65536

struct ws_unwind_proc {
	__u32 count; /* mappings used */
	__u32 epoch; /* changes at every registration: cached lookups expire */
	/* Nonzero while some of its files' tables are not loaded yet (not
	 * built, or the process not registered since its exec): code outside
	 * `mappings` may lack frame pointers, so the walk checks what it
	 * cannot vouch for and marks it with WS_UNWIND_PENDING_FRAME (unwind.bpf.h). */
	__u32 pending;
	__u32 _pad;
	struct ws_unwind_mapping mappings[WS_UNWIND_MAX_MAPPINGS];
	struct ws_java_code java;
	struct ws_python_code python;
};

/* A user stack entry that is an interpreted Java frame's Method* (read at
 * frame pointer - 24, where HotSpot's x86-64 interpreter keeps it), not a
 * pc: user addresses stay below 2^47, kernel ones start at 0xffff8... */
#define WS_JAVA_METHOD_TAG (1ULL << 62)
/* Where a user stack's walk met code whose table was still pending (see
 * ws_unwind_proc.pending): its last native entry when the walk ended there
 * (the callers are unknown, not absent), or its second when the innermost
 * frame could not be vouched for (a frame may be missing there; the frame
 * pointers above were walked). */
#define WS_UNWIND_PENDING_FRAME (1ULL << 60)
#define WS_JAVA_METHOD_SLOT 24

struct ws_hist {
	__u64 slots[WS_HIST_SLOTS];
	__u64 ns; /* total time of the intervals counted */
};

/*
 * The per-CPU `stats` counters, every way an event can be degraded and the
 * events seen: X(NAME, metric name, EVENT or LOSS) with what it counts.
 * The one list: enum ws_stat below and the Rust `Stat` (its names and
 * whether it counts a loss, by build.rs) are made from it.
 */
#define WS_STATS(X) \
	X(SAMPLES, "samples", EVENT)                                /* on-CPU samples seen */ \
	X(COUNTS_FULL, "counts_map_full", LOSS)                     /* event dropped: aggregation map full */ \
	X(USER_STACK_COLLISION, "user_stack_collision", LOSS)       /* user stack dropped: its id (hash) is another stack's */ \
	X(USER_STACK_FAILED, "user_stack_failed", LOSS)             /* user stack walk failed (not a kernel thread) */ \
	X(KERNEL_STACK_COLLISION, "kernel_stack_collision", LOSS)   /* kernel stack dropped: its id (hash) is another stack's */ \
	X(KERNEL_STACK_FAILED, "kernel_stack_failed", LOSS)         /* kernel stack walk failed */ \
	X(SWITCHES, "switches", EVENT)                              /* sched_switch events seen */ \
	X(WAKEUPS, "wakeups", EVENT)                                /* wakeups seen */ \
	X(STACK_EXPIRED, "stack_expired", LOSS)                     /* interval outlived its stack generation */ \
	X(TASK_STORAGE_FAILED, "task_storage_failed", LOSS)         /* no per-thread storage: interval lost */ \
	X(THREADS_FULL, "threads_map_full", LOSS)                   /* per-thread totals map full */ \
	X(HIST_FULL, "histogram_map_full", LOSS)                    /* histogram map full */ \
	X(BELOW_THRESHOLD, "intervals_below_threshold", EVENT)      /* intervals under --offcpu-min-us (totals only) */ \
	X(STACKS_STORED, "stacks_stored", EVENT)                    /* new stacks stored in the current generation */ \
	X(STACK_STORE_FAILED, "stack_store_failed", LOSS)           /* stack dropped: map full or no memory */ \
	X(UNWIND_WALKS, "unwind_walks", EVENT)                      /* user stacks walked with unwind tables */ \
	X(UNWIND_NO_INFO, "unwind_no_info", LOSS)                   /* walk ended early: no unwind row for the pc */ \
	X(UNWIND_UNSUPPORTED, "unwind_unsupported_rule", LOSS)      /* walk ended early: expression CFA, signal frame... */ \
	X(UNWIND_READ_FAILED, "unwind_read_failed", LOSS)           /* walk ended early: stack memory unreadable */ \
	X(UNWIND_TRUNCATED, "unwind_truncated", LOSS)               /* walk ended early: WS_MAX_STACK_DEPTH frames */ \
	X(PROC_EVENTS_LOST, "proc_events_lost", LOSS)               /* process event dropped: ring buffer full */ \
	X(COUNTS_MERGED, "counts_merged", EVENT)                    /* event added to its process's merged row (map nearly full) */ \
	X(OFFCPU_WALKS, "offcpu_stack_walks", EVENT)                /* off-CPU stack walks at switch-in */ \
	X(WAKER_WALKS, "waker_stack_walks", EVENT)                  /* waker stack walks */ \
	X(LIVE_WALKS, "blocked_stack_walks", EVENT)                 /* stack walks of blocked threads at drain time */ \
	X(SAMPLED_OUT, "intervals_sampled_out", EVENT)              /* intervals over the threshold not drawn: no stack row */ \
	X(DEFERRED_LOST, "deferred_stack_lost", LOSS)               /* drawn interval whose switch-in hook did not run: row without stack */ \
	X(LIVE_WALKS_PUT_OFF, "blocked_stack_walks_put_off", EVENT) /* drain-time walk put off: memory map locked or walk budget spent */ \
	X(WALKS_REUSED, "stack_walks_reused", EVENT)                /* user stack not walked: same registers and stack top as a walk kept */ \
	X(SWITCH_IN_UNSEEN, "switches_in_unseen", LOSS)             /* a thread ran without its switch-in seen: time split by the kernel's account */ \
	X(SWITCH_OUT_UNSEEN, "switches_out_unseen", LOSS)           /* a thread went off-CPU without its switch-out seen: likewise */ \
	X(JAVA_FRAMES, "java_frames_stepped", EVENT)                /* compiled Java frames stepped through by their code blob's frame size */ \
	X(JAVA_REFUSED, "java_frames_refused", LOSS)                /* walk ended in a JVM's code: free or implausible segment map, blob or frame */ \
	X(CULPRITS_FULL, "culprits_map_full", LOSS)                 /* runqueue wait not attributed to who ran meanwhile: map full */ \
	X(IRQ_WALKS_PUT_OFF, "interrupt_stack_walks_put_off", EVENT) /* interrupt's wakeup row without its kernel stack: the CPU's walk budget spent */ \
	X(PY_WALKS, "python_stack_walks", EVENT)                    /* Python frame chains walked (a thread with a known thread state) */ \
	X(PY_THREAD_UNKNOWN, "python_threads_unknown", LOSS)        /* stack of a Python process's thread with no known thread state yet: native frames only */ \
	X(PY_CUT, "python_frames_cut", LOSS)                        /* Python frame chain cut: deeper than WS_PY_MAX_FRAMES, unreadable or implausible */ \
	X(TRACE_EVENTS, "trace_events", EVENT)                      /* state changes sent to a running /trace recording */ \
	X(TRACE_LOST, "trace_events_lost", LOSS)                    /* state change of a traced thread dropped: trace ring buffer full */ \
	X(UNWIND_PENDING_WALKS, "unwind_pending_walks", EVENT)      /* user stacks walked while their process's tables were pending (innermost frame checked) */ \
	X(UNWIND_PENDING, "unwind_tables_pending", LOSS)            /* walk met code whose table was pending: [tables pending] frame */ \
	X(OTEL_READS, "otel_context_reads", EVENT)                  /* OpenTelemetry thread contexts read (a sample or switch-out in a registered process) */ \
	X(OTEL_READ_FAILED, "otel_context_read_failed", LOSS)       /* thread context unreadable (TLS, pointer or record): no span */ \
	X(SPAN_TIMES_FULL, "span_times_map_full", LOSS)             /* a thread's time under a span dropped: span times map full */ \
	X(SPAN_RECORDS_FULL, "span_records_map_full", LOSS)         /* a span's record (trace id, attributes) dropped: map full */ \
	X(SPAN_QUOTA_SPENT, "span_process_quota_spent", LOSS)       /* a span's record or time dropped: its process added a quarter of the map this second */ \
	X(SPAN_ATTRS_CUT, "span_attributes_cut", LOSS)              /* a span record's attributes cut at WS_SPAN_ATTR_BYTES, or unreadable */

/* Indexes of the per-CPU `stats` array. */
enum ws_stat {
#define WS_STAT_ENUM(name, metric, kind) WS_STAT_##name,
	WS_STATS(WS_STAT_ENUM)
#undef WS_STAT_ENUM
	WS_STAT_COUNT,
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
	__u8 comm[WS_COMM_LEN];
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
	__u8 comm[WS_COMM_LEN];
};

/*
 * On-demand thread timelines (`/trace`, trace.bpf.h): while user space
 * writes a tgid into `trace_target` (0: none), every state change of its
 * threads goes, one record each, through the `trace_events` ring buffer.
 * `ts` is when the new state began, on the clock of bpf_ktime_get_ns
 * (CLOCK_MONOTONIC), the very stamp the engine accounts the phase from.
 */
enum ws_trace_kind {
	WS_TRACE_SWITCH_OUT = 0, /* off the CPU, into `state` (runqueue, throttled, futex, io, sleep) */
	WS_TRACE_SWITCH_IN = 1,  /* onto the CPU */
	WS_TRACE_WAKEUP = 2,     /* a sleep ended: runqueue; waker_* say who woke it */
	WS_TRACE_NEW = 3,        /* a new thread, runnable; waker_* is its creator */
	WS_TRACE_EXIT = 4,       /* the thread exits: its timeline ends */
	WS_TRACE_SNAPSHOT = 5,   /* by the `trace_threads` iterator: in `state` since `ts` */
};

/* Indexes of the `trace_target` array. */
enum ws_trace_target {
	WS_TRACE_TARGET_TGID = 0, /* the traced tgid, 0: none (user space writes it) */
	WS_TRACE_TARGET_LOST = 1, /* this recording's records that found the ring full */
	WS_TRACE_TARGET_COUNT = 2,
};

/* Bytes of the `trace_events` ring buffer: ~130,000 records between two
 * reads; a record that finds no room is counted (WS_STAT_TRACE_LOST). */
#define WS_TRACE_RING_BYTES (4 * 1024 * 1024)

struct ws_trace_event {
	__u64 ts;
	__u32 tid;
	__u32 kind;  /* enum ws_trace_kind */
	__u32 state; /* enum ws_state the thread is in from ts */
	__u32 cpu;   /* where the event ran */
	__u32 waker_pid; /* WAKEUP, NEW: the waker's tgid (0 with WS_INTERRUPT_TID: an interrupt) */
	__u32 waker_tid;
};

/*
 * OpenTelemetry thread context (OTEP 4947). A process that publishes it
 * has a TLS variable `otel_thread_ctx_v1` pointing to its threads' active
 * record: trace id (16 B), span id (8 B), valid (1 B, 1: valid), trace
 * flags (1 B), attrs-data size (u16), then attributes (key index u8,
 * length u8, value). User space finds the variable and how the thread
 * pointer leads to it, and writes it per process into `otel_procs`
 * (keyed by tgid); the programs read the record of the thread they run
 * for, only while it is stopped (a sample, its switch-out).
 */
enum ws_otel_tls {
	WS_OTEL_TLS_NONE = 0,
	/* At thread pointer + tp_offset: initial- or local-exec, or a TLSDESC
	 * resolved to static TLS. */
	WS_OTEL_TLS_STATIC = 1,
	/* At the thread's dtv[module].pointer + offset (glibc: dtv at thread
	 * pointer + 8, 16 bytes an entry): a TLSDESC resolved to dynamic TLS,
	 * or general dynamic. An unallocated entry (0 or -1): no context. */
	WS_OTEL_TLS_DTV = 2,
};
struct ws_otel_proc {
	__u32 kind; /* enum ws_otel_tls */
	__u32 _pad;
	__s64 tp_offset; /* STATIC */
	__u64 module;    /* DTV: the TLS module id */
	__u64 offset;    /* DTV: the variable's offset in the module's block */
};
/* Entries of `otel_procs`: user space registers no more. */
#define WS_OTEL_PROCS 8192
/* The record's fixed header: trace id, span id, valid, flags, attrs size. */
#define WS_OTEL_HEADER 28
/* Attribute bytes kept of a span's record; the rest is cut (counted). */
#define WS_SPAN_ATTR_BYTES 256
/*
 * A thread's exact time under one span (`span_times_0` / `span_times_1`,
 * by the control buffer like the thread totals): every nanosecond of the
 * thread's states while the span was its active one, the on-CPU part
 * split at the span's change as sampling bounds it.
 */
struct ws_span_key {
	__u32 pid;
	__u32 tid;
	__u64 span; /* never 0 */
};
struct ws_span_times {
	__u64 ns[WS_STATE_COUNT]; /* by enum ws_state */
	__u64 first_ns; /* when the thread's time under the span began (ktime) */
	__u64 last_ns;  /* when it last ended, so far */
};
/* A span as its record says, written by the first thread seen in it
 * (`span_records`, keyed by pid and span; user space takes them at each
 * drain). */
struct ws_span_record_key {
	__u32 pid;
	__u32 _pad;
	__u64 span;
};
struct ws_span_record {
	__u8 trace_id[16];
	__u8 flags;
	__u8 _pad;
	__u16 attrs_size; /* as the record says */
	__u16 attrs_len;  /* bytes kept in attrs (at most WS_SPAN_ATTR_BYTES) */
	__u16 _pad2;
	__u32 tid;        /* the thread it was read from */
	__u32 _pad3;
	__u64 seen_ns;    /* when (ktime) */
	__u8 attrs[WS_SPAN_ATTR_BYTES];
};
/* Entries of the span maps; a span that finds one full is counted. */
#define WS_SPAN_TIMES 16384
#define WS_SPAN_RECORDS 4096

/* Checked by both clang for BPF and bindgen (host), so the two agree. */
_Static_assert(sizeof(struct ws_stack_key) == 64, "ws_stack_key size");
_Static_assert(sizeof(struct ws_otel_proc) == 32, "ws_otel_proc size");
_Static_assert(sizeof(struct ws_span_key) == 16, "ws_span_key size");
_Static_assert(sizeof(struct ws_span_times) == 8 * WS_STATE_COUNT + 16, "ws_span_times size");
_Static_assert(sizeof(struct ws_span_record) == 40 + WS_SPAN_ATTR_BYTES, "ws_span_record size");
_Static_assert(sizeof(struct ws_stack_value) == 16, "ws_stack_value size");
_Static_assert(sizeof(struct ws_stack) == 16 + 8 * WS_MAX_STACK_DEPTH, "ws_stack size");
_Static_assert(sizeof(struct ws_unwind_row) == 12, "ws_unwind_row size");
_Static_assert(sizeof(struct ws_unwind_mapping) == 40, "ws_unwind_mapping size");
_Static_assert(sizeof(struct ws_java_code) == 160, "ws_java_code size");
_Static_assert(sizeof(struct ws_python_code) == 40, "ws_python_code size");
_Static_assert(sizeof(struct ws_py_thread_key) == 16, "ws_py_thread_key size");
_Static_assert(sizeof(struct ws_unwind_proc) == 16 + 40 * WS_UNWIND_MAX_MAPPINGS + 160 + 40,
	       "ws_unwind_proc size");
_Static_assert(sizeof(struct ws_thread_totals) == 104 + 4 * WS_SLEEP_SLOTS, "ws_thread_totals size");
_Static_assert(sizeof(struct ws_hist_key) == 16, "ws_hist_key size");
_Static_assert(sizeof(struct ws_culprit_key) == 16, "ws_culprit_key size");
_Static_assert(sizeof(struct ws_cpu_runs) == 16 + 24 * WS_CPU_RUNS, "ws_cpu_runs size");
_Static_assert((WS_CPU_RUNS & (WS_CPU_RUNS - 1)) == 0, "WS_CPU_RUNS is a power of two");
_Static_assert(sizeof(struct ws_hist) == 8 * WS_HIST_SLOTS + 8, "ws_hist size");
_Static_assert(sizeof(struct ws_live_thread) == 72, "ws_live_thread size");
_Static_assert(sizeof(struct ws_proc_event) == 48, "ws_proc_event size");
_Static_assert(sizeof(struct ws_trace_event) == 32, "ws_trace_event size");
_Static_assert(sizeof(struct ws_walk_cost) == 4 * WS_WALK_COST_ENTRIES, "ws_walk_cost size");
_Static_assert((1ULL << WS_UNWIND_SEARCH_STEPS) >= WS_UNWIND_MAX_TABLE_ROWS,
	       "the unwind search must reach every row of the largest table");

#endif /* WALLSCOPE_H */
