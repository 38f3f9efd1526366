// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* Entry points of every wallscope program: thin wrappers over the handlers
 * in *.bpf.h, which share the maps of maps.bpf.h. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "lifecycle.bpf.h"
#include "live.bpf.h"
#include "offcpu.bpf.h"
#include "oncpu.bpf.h"
#include "unwind.bpf.h"

/* On-CPU sampling: perf_event cpu-clock on every CPU. */
SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	ws_on_cpu_sample(ctx);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	ws_on_switch(ctx, preempt, prev, next);
	return 0;
}

/* Loaded only where the kernel has this bare tracepoint (user space sets
 * stacks_at_switch_in then). */
SEC("tp_btf/sched_exit_tp")
int BPF_PROG(on_switched_in)
{
	ws_on_switched_in(ctx);
	return 0;
}

SEC("tp_btf/sched_waking")
int BPF_PROG(on_waking, struct task_struct *p)
{
	ws_on_waking(ctx, p);
	return 0;
}

/* Attached after on_switch where stacks are walked at switch-out. */
SEC("tp_btf/sched_switch")
int BPF_PROG(on_switched_out, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	ws_on_switched_out(ctx, prev);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	ws_on_wakeup(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *p)
{
	ws_on_wakeup_new(ctx, p);
	return 0;
}

/* Attached after on_switch: a /trace recording's switches (trace.bpf.h). */
SEC("tp_btf/sched_switch")
int BPF_PROG(trace_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	ws_trace_switch(prev, next);
	return 0;
}

/* Run once as a /trace recording starts (see trace.bpf.h). */
SEC("iter/task")
int trace_threads(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;

	if (task && task->pid)
		ws_trace_snapshot(task);
	return 0;
}

/* Read by user space at every drain (see live.bpf.h). */
SEC("iter.s/task")
int live_threads(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;

	if (task && task->pid)
		ws_live_thread(ctx->meta->seq, task);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	ws_unwind_on_fork(parent, child);
	ws_otel_on_fork(parent, child);
	ws_lifecycle_on_fork(parent, child);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	ws_unwind_on_exec();
	ws_forget_walks(p);
	ws_otel_forget(p);
	ws_lifecycle_on_exec(p);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	ws_thread_exit(p);
	ws_trace_exit(p);
	ws_lifecycle_on_exit(p);
	if (p->signal->live.counter == 0)
		ws_otel_forget(p);
	return 0;
}

SEC("tp_btf/task_rename")
int BPF_PROG(on_rename, struct task_struct *task, const char *comm)
{
	ws_lifecycle_on_rename(task, comm);
	return 0;
}

/* The kernel takes only GPL-compatible names here, Apache-2.0 is none:
 * "GPL" is the GPL-2.0 side of the SPDX line above. */
char LICENSE[] SEC("license") = "GPL";
