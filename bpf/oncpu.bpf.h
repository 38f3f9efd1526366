/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* On-CPU sampling: perf_event cpu-clock on every CPU adds each sample's
 * period to the running thread's CPU row, with its stacks. */
#ifndef WALLSCOPE_ONCPU_BPF_H
#define WALLSCOPE_ONCPU_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "otelctx.bpf.h"
#include "task.bpf.h"
#include "unseen.bpf.h"
#include "stacks.bpf.h"
#include "wallscope.h"

/* Set by user space before load. */
const volatile bool include_idle = false;

static __always_inline void ws_on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 id = bpf_get_current_pid_tgid();
	struct ws_stack_key key = {};
	struct ws_task *s = NULL;
	__u64 now = 0;

	key.pid = id >> 32;
	key.tid = (__u32)id;
	if (key.tid == 0 && !include_idle)
		return;
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
	/* A thread that never switches out still shows its CPU time; one
	 * whose marks say off-CPU runs here, so its switch-in went unseen. */
	if (key.tid && (s = ws_task(task, false))) {
		now = bpf_ktime_get_ns();
		if (!s->on_cpu_since && s->phase_start)
			ws_switch_in_unseen(task, s, now);
		key.span = ws_otel_observe(task, s, now);
	}
	/* cpu-clock counts nanoseconds, so the period is the CPU time sampled. */
	ws_add(&key, ctx->sample_period);
	if (s)
		ws_flush_cpu(s, now);
}

#endif /* WALLSCOPE_ONCPU_BPF_H */
