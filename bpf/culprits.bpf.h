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

/* A hash of `t`'s name (16 bytes as two words). */
static __always_inline __u32 ws_comm_hash(struct task_struct *t)
{
	__u64 w[2];

	__builtin_memcpy(w, t->comm, sizeof(w));
	return (__u32)((w[0] * 0x9E3779B97F4A7C15ULL ^ w[1] * 0xC2B2AE3D27D4EB4FULL) >> 32) | 1;
}

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
	run->comm_hash = ws_comm_hash(prev);
	r->head++;
	r->last_switch = now;
	return r;
}

/* Who kept a thread off the CPU in its runqueue waits since the last
 * export: the first WS_CULPRIT_SLOTS processes (tgid + 1; 0: free), then
 * the others together, and what no run covered. In its task storage. */
struct ws_culprit_slots {
	__u32 slot[WS_CULPRIT_SLOTS];
	__u32 comm_hash[WS_CULPRIT_SLOTS];
	__u64 ns[WS_CULPRIT_SLOTS];
	__u64 others_ns;
	__u64 unseen_ns;
};

/* Adds `ns` to what `culprit` kept (`pid`, `tid`) off the CPU, in the
 * active buffer (at export: counts.bpf.h). */
static __noinline void ws_culprit_add(__u32 pid, __u32 tid, __u32 culprit, __u64 ns)
{
	void *map = ws_buffer() ? (void *)&culprits_1 : (void *)&culprits_0;
	struct ws_culprit_key key = { .pid = pid, .tid = tid, .culprit = culprit };
	__u64 zero = 0, *v = bpf_map_lookup_elem(map, &key);

	if (!v)
		v = ws_insert(map, &key, &zero, WS_STAT_CULPRITS_FULL);
	if (v)
		__sync_fetch_and_add(v, ns);
}

/* Map rows one wait may add to when its thread's slots are taken (a
 * script's short-lived children are a new process each); past them, the
 * time goes to the others. Bounds a switch's cost however many processes
 * ran during the wait. */
#define WS_CULPRIT_ROWS_PER_WAIT 4

/* Adds `ns` kept by `tgid` (named `comm`, hashed) from thread `pid_tid`
 * (tgid << 32 | tid) to `k`: in the process's slot; when every slot is
 * another process's, in a namesake's (a script's short-lived children are a
 * new process each: their time stays theirs, their count is lost), else to
 * its map row while `*rows` lasts, else to the others. */
static __always_inline void ws_culprit_note(struct ws_culprit_slots *k, __u32 tgid, __u32 comm,
					    __u64 ns, __u64 pid_tid, __u32 *rows)
{
	__u32 want = tgid + 1;

	for (int i = 0; i < WS_CULPRIT_SLOTS; i++) {
		/* Claimed free, or found: a race to claim it for the same
		 * process ends here too. */
		if (!k->slot[i] && __sync_val_compare_and_swap(&k->slot[i], 0, want) == 0) {
			k->comm_hash[i] = comm;
			__sync_fetch_and_add(&k->ns[i], ns);
			return;
		}
		if (k->slot[i] == want) {
			__sync_fetch_and_add(&k->ns[i], ns);
			return;
		}
	}
	for (int i = 0; i < WS_CULPRIT_SLOTS; i++) {
		if (k->comm_hash[i] == comm) {
			__sync_fetch_and_add(&k->ns[i], ns);
			return;
		}
	}
	if (*rows) {
		(*rows)--;
		ws_culprit_add(pid_tid >> 32, (__u32)pid_tid, tgid, ns);
		return;
	}
	__sync_fetch_and_add(&k->others_ns, ns);
}

/* What the ring walk of ws_blame carries from one run to the next. */
struct ws_blame_walk {
	struct ws_cpu_runs *r;
	struct ws_culprit_slots *k;
	__u64 from, now, pid_tid;
	__u64 covered, pending;
	__u32 head, who, who_comm, rows;
};

/* One run of the ring, the newest first (`i` runs back): its overlap with
 * the wait goes to its process. 1 ends the walk. */
static long ws_blame_run(__u64 i, void *data)
{
	struct ws_blame_walk *w = data;
	struct ws_cpu_runs *r = w->r;
	struct ws_cpu_run *run;
	__u64 a, b;

	if (!r || !w->k)
		return 1;
	run = &r->runs[(w->head - 1 - (__u32)i) & (WS_CPU_RUNS - 1)];
	if (!run->end || run->end <= w->from)
		return 1;
	a = run->start > w->from ? run->start : w->from;
	b = run->end < w->now ? run->end : w->now;
	if (b > a) {
		/* Runs of one process in a row are noted once. */
		if (w->pending && run->tgid != w->who) {
			ws_culprit_note(w->k, w->who, w->who_comm, w->pending, w->pid_tid, &w->rows);
			w->pending = 0;
		}
		w->who = run->tgid;
		w->who_comm = run->comm_hash;
		w->pending += b - a;
		w->covered += b - a;
	}
	return run->start <= w->from;
}

/* Splits the runqueue wait `from`..`now` of thread `pid_tid` among the
 * runs of `r`, the CPU it now gets, into its slots `k` (see
 * ws_culprit_note); what the runs do not cover is unseen. The walk is a
 * bpf_loop: verified once, not once per run. Out of line: on_switch's own
 * frame is near its bound. */
static __noinline void ws_blame(struct ws_cpu_runs *r, struct ws_culprit_slots *k, __u64 from,
				__u64 now, __u64 pid_tid)
{
	struct ws_blame_walk w = {
		.r = r,
		.k = k,
		.from = from,
		.now = now,
		.pid_tid = pid_tid,
		.rows = WS_CULPRIT_ROWS_PER_WAIT,
	};

	if (!r || !k || now <= from)
		return;
	w.head = r->head;
	bpf_loop(WS_CPU_RUNS, ws_blame_run, &w, 0);
	if (w.pending)
		ws_culprit_note(k, w.who, w.who_comm, w.pending, pid_tid, &w.rows);
	if (now - from > w.covered)
		__sync_fetch_and_add(&k->unseen_ns, now - from - w.covered);
}

#endif /* WALLSCOPE_CULPRITS_BPF_H */
