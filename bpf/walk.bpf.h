/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * One user stack walk's state (registers, progress, its process's tables)
 * and how it reads the walked task's memory: the stack in windows, other
 * memory (a JVM's code cache, java.bpf.h) into scratch of its own.
 */
#ifndef WALLSCOPE_WALK_BPF_H
#define WALLSCOPE_WALK_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "wallscope.h"

/* Bytes of stack a walk copies at once. Each read of
 * user memory costs far more than the bytes it copies (measured here: 430
 * ns for the first 8 bytes of a walk, 135 ns for the next), and the frames
 * of a walk are close together: a walk copies windows of the stack and
 * reads its frames from the copy. */
#define WS_STACK_WINDOW 1024
/* Bytes of a JVM's segment map read at once: most blobs' first segment is
 * within one read back from any of theirs (a hop goes back at most 254). */
#define WS_SEGMAP_WINDOW 1024
/* A rule's cfa_reg for "not in a table: take a frame-pointer step". */
#define WS_UNWIND_FP_STEP 0xff

/* One walk, per CPU: registers, progress, a copy of the process's
 * mappings so that a step reads them without a hash lookup, and the window
 * of stack memory last copied. */
struct ws_unwind_walk {
	__u64 pc;
	__u64 sp;
	__u64 bp;
	__u32 len;
	__u32 stop; /* 0 while walking, else the ws_stat of an early end, or ~0 */
	__u32 pid;
	__u32 win_len; /* bytes of win holding the stack from win_start */
	__u64 win_start;
	struct ws_unwind_proc proc;
	__u8 win[WS_STACK_WINDOW];
	/* A segment-map walk (java.bpf.h), here rather than on the program's
	 * stack: the verifier tracks stack values across a loop's rounds and
	 * would follow every hop apart. */
	__u64 seg_map;	 /* the segment map */
	__u64 seg_first; /* segment index of segmap[0] */
	__u64 seg_at;	 /* segment walked to */
	__u32 seg_len;	 /* bytes of segmap read */
	__u32 seg_reads;
	__u32 seg_found; /* 1: seg_at starts a block; 2: refused */
	__u32 _seg_pad;
	__u8 segmap[WS_SEGMAP_WINDOW]; /* a JVM code heap's segment map, up to a pc's segment */
	__u8 blob[WS_JAVA_BLOB_HEADER]; /* the code blob's header */
	/* The thread's Python frames (python.bpf.h), walked before the
	 * native ones, which may then take max_len frames. */
	struct ws_py_thread_key py_key; /* the thread, in python_threads */
	__u64 py_frame; /* the frame read next */
	__u32 py_len;
	__u32 max_len;
	__u64 py[WS_PY_MAX_FRAMES];
	__u8 py_buf[WS_PY_FRAME_READ]; /* the frame read last */
	/* The search for the innermost frame's return address while tables
	 * are pending (pending.bpf.h), here to keep it off the stack. */
	__u64 scan_after; /* a direct call's target must be above this */
	__u64 scan_end;	  /* words at or above it are the caller's frame */
	__u32 scan_reads;
	__u32 scan_slot;     /* the return address's word + 1, 0: none */
	__u32 scan_indirect; /* it returns from an indirect call */
	__u32 _scan_pad;
	__u64 scan_word; /* the word read last */
	__u64 scan_t1;	 /* what rbp's frame's return says (ws_call_target) */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_unwind_walk);
} unwind_walk SEC(".maps");

/* Reads user memory of the current task, or, from the sleepable drain-time
 * iterator, of `task` (a constant NULL folds the other branch away, so
 * non-sleepable programs never reference the sleepable helper). */
static __always_inline long ws_read_user(void *dst, __u32 size, __u64 addr,
					 struct task_struct *task)
{
	if (task)
		return bpf_copy_from_user_task(dst, size, (void *)addr, task, 0);
	return bpf_probe_read_user(dst, size, (void *)addr);
}

/* Bytes a window reaches below the word asked for: a frame's saved rbp
 * (CFA-16) is read after its return address (CFA-8), an interpreted Java
 * frame's Method* below its frame pointer. */
#define WS_WINDOW_BELOW 64

/* Copies a window of stack memory holding the word at `addr`: from
 * WS_WINDOW_BELOW under it, WS_STACK_WINDOW bytes; else from `addr` to the
 * end of its page (the top of a stack, with nothing mapped above). */
static __always_inline long ws_walk_window(struct ws_unwind_walk *w, __u64 addr,
					   struct task_struct *task)
{
	__u64 start = addr - WS_WINDOW_BELOW;
	__u32 len = WS_STACK_WINDOW;

	w->win_len = 0;
	if (ws_read_user(w->win, WS_STACK_WINDOW, start, task)) {
		start = addr;
		len = 4096 - (addr & 4095);
		if (len > WS_STACK_WINDOW)
			len = WS_STACK_WINDOW;
		asm volatile("" : "+r"(len));
		if (len < 8 || len > WS_STACK_WINDOW || ws_read_user(w->win, len, addr, task))
			return -1;
	}
	w->win_start = start;
	w->win_len = len;
	return 0;
}

/* Reads the word of the walked stack at `addr`, from the window copied
 * last or from a new one. */
static __always_inline long ws_walk_read(struct ws_unwind_walk *w, __u64 addr, __u64 *out,
					 struct task_struct *task)
{
	__u64 off = addr - w->win_start;

	if (addr < w->win_start || off + 8 > w->win_len) {
		if (ws_walk_window(w, addr, task))
			return -1;
		off = addr - w->win_start;
	}
	asm volatile("" : "+r"(off));
	if (off > WS_STACK_WINDOW - 8)
		return -1;
	*out = *(__u64 *)(w->win + off);
	return 0;
}

#endif /* WALLSCOPE_WALK_BPF_H */
