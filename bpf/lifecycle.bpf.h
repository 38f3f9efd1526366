/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Process lifecycle events for the daemon's process table: one ring-buffer
 * record per fork, exec, exit or rename of a process. Threads are left out
 * (their names travel with every aggregated row), so the rate is the
 * host's process churn, not its context switches.
 */
#ifndef WALLSCOPE_LIFECYCLE_BPF_H
#define WALLSCOPE_LIFECYCLE_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "wallscope.h"

/* 256 KiB: ~5,000 events between two reads; the reader wakes on every
 * event, so this only fills if it is stalled. Losses are counted. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} proc_events SEC(".maps");

static __always_inline void ws_proc_event(__u32 kind, struct task_struct *task, __u32 parent)
{
	struct ws_proc_event *e = bpf_ringbuf_reserve(&proc_events, sizeof(*e), 0);

	if (!e) {
		ws_stat_inc(WS_STAT_PROC_EVENTS_LOST);
		return;
	}
	e->kind = kind;
	e->pid = task->tgid;
	e->parent = parent;
	e->_pad = 0;
	e->start_ns = task->group_leader->start_boottime;
	e->time_ns = bpf_ktime_get_boot_ns();
	__builtin_memcpy(e->comm, task->group_leader->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void ws_lifecycle_on_fork(struct task_struct *parent,
						 struct task_struct *child)
{
	/* A new thread is not a new process. */
	if (parent->tgid != child->tgid)
		ws_proc_event(WS_PROC_FORK, child, parent->tgid);
}

static __always_inline void ws_lifecycle_on_exec(struct task_struct *task)
{
	ws_proc_event(WS_PROC_EXEC, task, 0);
}

/* Called for every exiting thread: only the last one ends the process.
 * `signal->live` was decremented before the tracepoint, so it is zero
 * exactly then (the tracepoint's own group_dead argument is not in
 * kernels before 6.16). */
static __always_inline void ws_lifecycle_on_exit(struct task_struct *task)
{
	if (task->signal->live.counter == 0)
		ws_proc_event(WS_PROC_EXIT, task, 0);
}

/* prctl(PR_SET_NAME) and exec rename a thread; the process's name is its
 * main thread's. The new name is not in task->comm yet: it is `comm`. */
static __always_inline void ws_lifecycle_on_rename(struct task_struct *task, const char *comm)
{
	struct ws_proc_event *e;

	if (task->pid != task->tgid)
		return;
	e = bpf_ringbuf_reserve(&proc_events, sizeof(*e), 0);
	if (!e) {
		ws_stat_inc(WS_STAT_PROC_EVENTS_LOST);
		return;
	}
	e->kind = WS_PROC_RENAME;
	e->pid = task->tgid;
	e->parent = 0;
	e->_pad = 0;
	e->start_ns = task->start_boottime;
	e->time_ns = bpf_ktime_get_boot_ns();
	bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), comm);
	bpf_ringbuf_submit(e, 0);
}

#endif /* WALLSCOPE_LIFECYCLE_BPF_H */
