// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* On-CPU sampling: a perf_event (cpu-clock) program on every CPU. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "aggregate.bpf.h"

/* Set by user space before load. */
const volatile bool include_idle = false;

#define PF_KTHREAD 0x00200000

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 id = bpf_get_current_pid_tgid();
	struct ws_stack_key key = {};

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
	bool user = !(BPF_CORE_READ(task, flags) & PF_KTHREAD);
	bool kernel = (long)ctx->regs.ip < 0;
	/* cpu-clock counts nanoseconds, so the period is the CPU time sampled. */
	ws_record(ctx, &key, ctx->sample_period, user, kernel);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
