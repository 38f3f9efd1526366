/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The drain-time task iterator: user space reads it once per drain, just
 * before flipping the buffers. For every thread it
 *  - adds the time of its ongoing phase (or of its running) that has passed
 *    since the last account, so each window holds every thread's time even
 *    if the thread never woke in it;
 *  - for a phase long enough to be listed (live_min_ns, and at least
 *    offcpu_min_ns and offcpu_sample_ns, so that its end would get a stack
 *    for certain), adds that time to the phase's stack row, walking the
 *    blocked thread's stacks once per episode (later drains renew the
 *    stack ids without a walk);
 *  - writes a ws_live_thread record for each thread off-CPU for at least
 *    live_min_ns (the daemon's /blocked view).
 * Sleepable, to read a blocked thread's user memory
 * (bpf_copy_from_user_task) from its saved registers.
 */
#ifndef WALLSCOPE_LIVE_BPF_H
#define WALLSCOPE_LIVE_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include "core_fixes.bpf.h"
#include "maps.bpf.h"
#include "task.bpf.h"
#include "unseen.bpf.h"
#include "stacks.bpf.h"
#include "unwind.bpf.h"
#include "wallscope.h"

/* Set by user space before load. */
const volatile __u64 live_min_ns = 100000000;

/* Scratch of the iterator's walks. Not per-CPU maps: a sleepable program
 * may sleep mid-walk while other programs on its CPU use those; one
 * iterator runs at a time (the drainer). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_stack);
} live_stack SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_unwind_walk);
} live_walk SEC(".maps");

/* The record being written (off the program's stack, which the walk's
 * calls use up). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_live_thread);
} live_record SEC(".maps");

struct ws_task_walk {
	struct task_struct *task;
};

/* One frame of another task's walk (bpf_loop callback, so the verifier
 * checks one step rather than every walk length). */
static long ws_task_walk_step(__u32 index, void *data)
{
	struct ws_task_walk *ctx = data;
	__u32 zero = 0;
	struct ws_unwind_walk *w = bpf_map_lookup_elem(&live_walk, &zero);
	struct ws_stack *s = bpf_map_lookup_elem(&live_stack, &zero);
	struct task_struct *task = ctx->task;

	if (!w || !s || !task)
		return 1;
	/* No rule cache: this walk may sleep mid-way, and programs on its
	 * CPU would rewrite an entry under it. */
	return ws_unwind_step_in(w, s, task, NULL);
}

/* pending.bpf.h's search, in the walk of the task `data` points to. */
static long ws_pending_scan_step_task(__u32 index, void *data)
{
	struct task_struct **task = data;
	__u32 zero = 0;

	if (!task)
		return 1;
	return ws_pending_scan_in(index, bpf_map_lookup_elem(&live_walk, &zero), *task);
}

/* Appends the walk's Python frames to the live stack (the lookup here
 * keeps its key off the iterator's stack). */
static __noinline void ws_live_python_append(struct ws_unwind_walk *w)
{
	__u32 zero = 0;
	struct ws_stack *s = bpf_map_lookup_elem(&live_stack, &zero);

	if (w && s)
		ws_python_append(w, s);
}

/* Walks `task`'s user stack from the registers it saved on entering the
 * kernel: with unwind tables where registered, frame pointers elsewhere. */
static __always_inline long ws_task_user_stack(struct task_struct *task,
					       struct ws_unwind_walk *w, __u32 *tables)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	struct ws_task_walk ctx = { .task = task };

	*tables = ws_unwind_start(w, task->tgid, regs);
	ws_python_walk(w, task, regs, task);
	bpf_loop(WS_MAX_STACK_DEPTH + 1, ws_task_walk_step, &ctx, 0);
	ws_live_python_append(w);
	return ws_unwind_end(w);
}

/* Walks one iterator run may make. The drain waits for the iterator, and a
 * walk of another process's memory takes that process's memory-map lock
 * and may fault its pages in: one process holding its lock (a large mmap or
 * munmap, a core dump, a hostile loop) would hold up every drain. A walk
 * put off is tried again at the next drain; the thread's time is counted
 * either way, and its stack row waits for the walk or its switch-in. */
#define WS_LIVE_WALKS_PER_RUN 256
/* rw_semaphore count bits (kernel/locking/rwsem.c): a writer holds it, or
 * someone waits (a reader would queue behind them). */
#define WS_RWSEM_WRITER_LOCKED 1UL
#define WS_RWSEM_FLAG_WAITERS 2UL

/* The run the budget below belongs to: the active buffer, which flips
 * between two drains' runs. */
__u32 live_walk_run = 0xffffffff;
__u32 live_walks_left = 0;

/* Whether `task` may be walked now (counted when not). Reads the lock word
 * without taking it: a race only makes a walk wait as before. */
static __always_inline bool ws_live_walk_allowed(struct task_struct *task)
{
	__u32 run = ws_control(WS_CONTROL_BUFFER);
	struct mm_struct *mm = BPF_CORE_READ(task, mm);
	long lock;

	if (run != live_walk_run) {
		live_walk_run = run;
		live_walks_left = WS_LIVE_WALKS_PER_RUN;
	}
	if (live_walks_left == 0)
		goto put_off;
	if (mm) {
		lock = BPF_CORE_READ(mm, mmap_lock.count.counter);
		if (lock & (WS_RWSEM_WRITER_LOCKED | WS_RWSEM_FLAG_WAITERS))
			goto put_off;
	}
	live_walks_left--;
	return true;
put_off:
	ws_stat_inc(WS_STAT_LIVE_WALKS_PUT_OFF);
	return false;
}

/* The stacks of `task`'s current episode in `s`: walked once, renewed into
 * the current generation on later drains. Not inlined, like ws_live_row:
 * the verifier bounds the stack of a call chain, and these two need theirs
 * one after the other, not together. */
static __noinline bool ws_task_stacks(struct task_struct *task, struct ws_task *s)
{
	__u32 zero = 0, gen = ws_control(WS_CONTROL_GENERATION);
	struct ws_stack *st = bpf_map_lookup_elem(&live_stack, &zero);
	struct ws_unwind_walk *w = bpf_map_lookup_elem(&live_walk, &zero);
	long n;

	__u32 pid = task->tgid;

	/* Walked once per episode; again if the process was registered
	 * since (it blocked before the daemon registered it, or before the
	 * tables of its libraries were loaded: a new registration has a new
	 * epoch). */
	__u32 epoch = ws_unwind_epoch(pid);

	if (s->stack_episode == s->off_since && (!epoch || s->stack_tables == epoch)) {
		s->user_stack_id = ws_renew_stack(s->user_stack_id, s->stack_gen, gen);
		s->kernel_stack_id = ws_renew_stack(s->kernel_stack_id, s->stack_gen, gen);
		s->stack_gen = gen;
		return true;
	}
	if (!st || !w || !ws_live_walk_allowed(task))
		return false;
	s->stack_gen = gen;
	s->stack_episode = s->off_since;
	s->user_stack_id = WS_NO_STACK;
	s->kernel_stack_id = WS_NO_STACK;
	ws_stat_inc(WS_STAT_LIVE_WALKS);
	if (!ws_is_kthread(task)) {
		__u64 start = bpf_ktime_get_ns();

		n = ws_task_user_stack(task, w, &s->stack_tables);
		ws_walk_cost(WS_WALK_LIVE, n, start);
		if (n > 0 && n <= WS_MAX_STACK_DEPTH) {
			st->len = n;
			s->user_stack_id = ws_store_stack(st, gen, WS_STAT_USER_STACK_COLLISION);
		} else {
			ws_stat_inc(WS_STAT_USER_STACK_FAILED);
		}
	}
	if (ws_is_kthread(task) || s->state == WS_STATE_IO) {
		__u64 start = bpf_ktime_get_ns();

		n = bpf_get_task_stack(task, st->ips, sizeof(st->ips), 0);
		ws_walk_cost(WS_WALK_KERNEL, n > 0 ? n / sizeof(__u64) : 0, start);
		if (n > 0) {
			st->len = n / sizeof(__u64);
			s->kernel_stack_id = ws_store_stack(st, gen, WS_STAT_KERNEL_STACK_COLLISION);
		} else {
			ws_stat_inc(WS_STAT_KERNEL_STACK_FAILED);
		}
	}
	return true;
}

/* A thread first seen by the iterator (it has not switched since the
 * programs were attached): its phase starts now, classified from its
 * state; running ones start their CPU time now. */
static __always_inline void ws_adopt(struct task_struct *task, struct ws_task *s, __u64 now)
{
	__u32 st = ws_task_state(task);

	if (task->on_cpu) {
		ws_mark_in(task, s, now);
		__sync_val_compare_and_swap(&s->on_cpu_since, 0, now);
		return;
	}
	ws_mark_out(task, s);
	s->syscall = ws_is_kthread(task) ? 0 : ws_syscall(task);
	s->state = ws_classify(st == TASK_RUNNING, task, st, s->syscall);
	s->off_since = now;
	s->row_from = now;
	s->acct_from = now;
	s->phase_start = now;
}

static __always_inline void ws_live_record(struct seq_file *seq, struct task_struct *task,
					   struct ws_task *s, __u64 now)
{
	__u32 zero = 0;
	struct ws_live_thread *r = bpf_map_lookup_elem(&live_record, &zero);

	if (!r)
		return;
	r->pid = task->tgid;
	r->tid = task->pid;
	r->state = s->state;
	r->syscall = s->syscall;
	r->since_ns = s->phase_start;
	r->now_ns = now;
	r->stack_gen = s->stack_gen;
	r->user_stack_id = s->stack_episode == s->off_since ? s->user_stack_id : WS_NO_STACK;
	r->kernel_stack_id = s->stack_episode == s->off_since ? s->kernel_stack_id : WS_NO_STACK;
	r->waker_pid = s->waker_pid;
	r->waker_tid = s->waker_tid;
	r->_pad = 0;
	__builtin_memcpy(r->comm, task->comm, sizeof(r->comm));
	bpf_seq_write(seq, r, sizeof(*r));
}

/* Adds `ns` of the ongoing phase to its stack row. */
static __noinline void ws_live_row(struct task_struct *task, struct ws_task *s, __u64 ns)
{
	struct ws_stack_key key = {};

	if (!task || !s)
		return;
	ws_phase_key(&key, task, s, s->state);
	ws_add(&key, ns);
}

/* Where a thread's marks and its CPU disagree, a switch went unseen
 * (unseen.bpf.h): settles it and returns the weight of the row of the phase
 * it ended (0: none). Only the kernel's CPU time, which moves only while
 * the thread runs, tells a missed switch from one in progress: a vCPU can
 * stall between the tracepoint and task->on_cpu far longer than
 * WS_UNSEEN_AFTER_NS. Out of line: inlined, its locals would grow the
 * iterator's frame past the verifier's combined stack bound. */
static __noinline __u64 ws_live_settle(struct task_struct *task, struct ws_task *s, __u64 now)
{
	__u32 st;

	if (!task || !s)
		return 0;
	if (!s->on_cpu_since && s->phase_start && task->on_cpu &&
	    ws_kernel_cpu_ns(task) != s->exec_out)
		return ws_unseen_in_split(task, s, now);
	if (s->on_cpu_since && !task->on_cpu && now > s->on_cpu_since + WS_UNSEEN_AFTER_NS &&
	    ws_kernel_cpu_ns(task) != s->exec_in) {
		st = ws_task_state(task);
		ws_switch_out_unseen(task, s,
				     ws_classify(st == TASK_RUNNING, task, st,
						 ws_is_kthread(task) ? 0 : ws_syscall(task)),
				     now);
	}
	return 0;
}

static __always_inline void ws_live_thread(struct seq_file *seq, struct task_struct *task)
{
	struct ws_task *s = bpf_task_storage_get(&tasks, task, 0, 0);
	__u64 now = bpf_ktime_get_ns(), phase, from, row_min;
	bool fresh = !s;

	if (!s) {
		s = bpf_task_storage_get(&tasks, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!s)
			return;
		ws_adopt(task, s, now);
	}
	if (!fresh) {
		__u64 w = ws_live_settle(task, s, now);

		if (w)
			ws_live_row(task, s, w);
	}
	if (s->on_cpu_since) {
		if (!fresh)
			ws_flush_cpu(s, now);
		ws_export(task, s);
		return;
	}
	phase = s->phase_start;
	if (!phase || now <= phase) {
		ws_export(task, s);
		return;
	}
	from = s->acct_from;
	if (from && now > from && __sync_val_compare_and_swap(&s->acct_from, from, now) == from)
		ws_count_ns(&s->c, s->state, now - from);
	ws_export(task, s);

	/* Walks of another task's memory are costly (page-table walks per
	 * read): only for threads blocked long enough to be listed. Shorter
	 * phases get their row, whole, with their switch-in stack. */
	row_min = offcpu_min_ns > offcpu_sample_ns ? offcpu_min_ns : offcpu_sample_ns;
	if (row_min < live_min_ns)
		row_min = live_min_ns;
	if (now - phase >= row_min && ws_task_stacks(task, s)) {
		from = s->row_from;
		if (from && now > from &&
		    __sync_val_compare_and_swap(&s->row_from, from, now) == from) {
			ws_live_row(task, s, now - from);
		}
	}
	if (now - phase >= live_min_ns)
		ws_live_record(seq, task, s, now);
}

#endif /* WALLSCOPE_LIVE_BPF_H */
