// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* Entry points of every wallscope program: thin wrappers over the handlers
 * in *.bpf.h, which share the maps of aggregate.bpf.h. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "live.bpf.h"
#include "lifecycle.bpf.h"

/* Set by user space before load. */
const volatile bool include_idle = false;

/* On-CPU sampling: perf_event cpu-clock on every CPU. */
SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 id = bpf_get_current_pid_tgid();
	struct ws_stack_key key = {};
	struct ws_task *s;

	key.pid = id >> 32;
	key.tid = (__u32)id;
	if (key.tid == 0 && !include_idle)
		return 0;
	key.state = WS_STATE_CPU;
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	ws_stat_inc(WS_STAT_SAMPLES);

	/* Kernel threads have no user stack, and a sample taken in user mode
	 * has no kernel stack: asking would count a failure that is none.
	 * Kernel addresses are the upper half on x86-64. */
	key.stack_gen = ws_control(WS_CONTROL_GENERATION);
	key.user_stack_id = ws_is_kthread(task) ? WS_NO_STACK : ws_user_stack(ctx, key.stack_gen);
	key.kernel_stack_id = (long)ctx->regs.ip < 0 ? ws_kernel_stack(ctx, key.stack_gen)
						     : WS_NO_STACK;
	/* cpu-clock counts nanoseconds, so the period is the CPU time sampled. */
	ws_add(&key, ctx->sample_period);

	/* A thread that never switches out still shows its CPU time. */
	if (key.tid && (s = ws_task(task, false)))
		ws_flush_cpu(s, bpf_ktime_get_ns());
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
	ws_lifecycle_on_fork(parent, child);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	ws_unwind_on_exec();
	ws_forget_walks(p);
	ws_lifecycle_on_exec(p);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	ws_thread_exit(p);
	ws_lifecycle_on_exit(p);
	return 0;
}

SEC("tp_btf/task_rename")
int BPF_PROG(on_rename, struct task_struct *task, const char *comm)
{
	ws_lifecycle_on_rename(task, comm);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
