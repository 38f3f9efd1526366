/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Who kept a thread off the CPU (wallscope.h, struct ws_culprit_key).
 * Every switch appends the run that ends to its CPU's ring; a thread
 * switched in after a runqueue wait splits the wait among the runs of that
 * CPU that overlap it, newest first. No kprobe and no per-CPU kernel data
 * is needed: the ring is the attribution's own, in a per-CPU array.
 */
#ifndef WALLSCOPE_CULPRITS_BPF_H
#define WALLSCOPE_CULPRITS_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "wallscope.h"

/* Set by user space before load (`--culprits`). */
const volatile bool attribute_culprits = true;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_cpu_runs);
} cpu_runs SEC(".maps");

/* This CPU's ring, with the run of `prev` (since the last switch) ending
 * `now` appended. */
static __always_inline struct ws_cpu_runs *ws_note_run(struct task_struct *prev, __u64 now)
{
	__u32 zero = 0;
	struct ws_cpu_runs *r;
	struct ws_cpu_run *run;

	if (!attribute_culprits || !(r = bpf_map_lookup_elem(&cpu_runs, &zero)))
		return NULL;
	run = &r->runs[r->head & (WS_CPU_RUNS - 1)];
	run->start = r->last_switch;
	run->end = now;
	run->tgid = prev->tgid;
	r->head++;
	r->last_switch = now;
	return r;
}

/* Adds `ns` to what `culprit` kept (`pid`, `tid`) off the CPU. */
static __always_inline void ws_culprit_add(__u32 pid, __u32 tid, __u32 culprit, __u64 ns)
{
	void *map = ws_buffer() ? (void *)&culprits_1 : (void *)&culprits_0;
	struct ws_culprit_key key = { .pid = pid, .tid = tid, .culprit = culprit };
	__u64 zero = 0, *v = bpf_map_lookup_elem(map, &key);

	if (!v)
		v = ws_insert(map, &key, &zero, WS_STAT_CULPRITS_FULL);
	if (v)
		__sync_fetch_and_add(v, ns);
}

/* Splits the runqueue wait `from`..`now` of (`pid`, `tid`) among the runs
 * of `r`, the CPU it now gets; what they do not cover goes to
 * WS_CULPRIT_UNSEEN. Out of line: on_switch's own frame is near its bound. */
static __noinline void ws_blame(struct ws_cpu_runs *r, __u32 pid, __u32 tid, __u64 from,
				__u64 now)
{
	__u64 covered = 0, pending = 0, a, b;
	__u32 head, who = 0;

	if (!r || now <= from)
		return;
	head = r->head;
	for (__u32 k = 1; k <= WS_CPU_RUNS; k++) {
		struct ws_cpu_run *run = &r->runs[(head - k) & (WS_CPU_RUNS - 1)];

		if (!run->end || run->end <= from)
			break;
		a = run->start > from ? run->start : from;
		b = run->end < now ? run->end : now;
		if (b > a) {
			/* Runs of one process in a row make one map update. */
			if (pending && run->tgid != who) {
				ws_culprit_add(pid, tid, who, pending);
				pending = 0;
			}
			who = run->tgid;
			pending += b - a;
			covered += b - a;
		}
		if (run->start <= from)
			break;
	}
	if (pending)
		ws_culprit_add(pid, tid, who, pending);
	if (now - from > covered)
		ws_culprit_add(pid, tid, WS_CULPRIT_UNSEEN, now - from - covered);
}

#endif /* WALLSCOPE_CULPRITS_BPF_H */
