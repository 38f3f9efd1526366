/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * OpenTelemetry thread context (OTEP 4947): the span a thread runs under,
 * read from its `otel_thread_ctx_v1` TLS variable while the thread is
 * stopped, as the spec requires: at an on-CPU sample and at its own
 * switch-out (the programs run in its context then, so its memory is the
 * current one). A process is read only once user space has registered in
 * `otel_procs` how its thread pointer leads to the variable; for any other
 * process the cost is that one lookup.
 *
 * Attribution: off-CPU time belongs to the span read at the switch-out
 * that began it (a thread's context cannot change while it is off the
 * CPU). On-CPU time of a run during which the span changed is split as
 * the samples bound the change: the old span gets the time up to the last
 * sample (or the switch-in) that still saw it, the new one from the first
 * that saw it, the gap between split in half.
 *
 * The thread pointer is task->thread.fsbase: what the kernel set
 * (clone's TLS, arch_prctl). A thread that moves its FS base itself with
 * wrfsbase is read at the old one until its next switch saves it.
 */
#ifndef WALLSCOPE_OTELCTX_BPF_H
#define WALLSCOPE_OTELCTX_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "spantimes.bpf.h"
#include "task.bpf.h"
#include "wallscope.h"

WS_HASH(otel_procs, WS_OTEL_PROCS, __u32, struct ws_otel_proc);
/* Records of spans first seen since user space last took them. */
WS_HASH(span_records, WS_SPAN_RECORDS, struct ws_span_record_key, struct ws_span_record);

/* The record's fixed header, as OTEP 4947 lays it out. */
struct ws_otel_header {
	__u8 trace_id[16];
	__u64 span_id; /* its bytes as the record holds them */
	__u8 valid;    /* 1: valid; anything else: no context */
	__u8 flags;
	__u16 attrs_size;
};

/* Per CPU: the header read and the record being written. The programs
 * that read contexts (sched_switch, with interrupts off, and the sampler)
 * do not interrupt one another. */
struct ws_otel_scratch {
	struct ws_otel_header hdr;
	struct ws_span_record rec;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_otel_scratch);
} otel_scratch SEC(".maps");

/* Glibc's unallocated dtv entry (TLS_DTV_UNALLOCATED). */
#define WS_DTV_UNALLOCATED ((__u64)-1)

/* Where `t`'s record pointer lives (0: nowhere yet, e.g. a dtv entry not
 * allocated). Sets *failed when a read fails. */
static __always_inline __u64 ws_otel_slot(struct task_struct *t, struct ws_otel_proc *p,
					  bool *failed)
{
	__u64 tp = t->thread.fsbase, dtv = 0, block = 0;

	if (!tp)
		return 0;
	if (p->kind == WS_OTEL_TLS_STATIC)
		return tp + p->tp_offset;
	if (p->kind != WS_OTEL_TLS_DTV || p->module > 0xffff)
		return 0;
	if (bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(tp + 8)) ||
	    bpf_probe_read_user(&block, sizeof(block), (void *)(dtv + p->module * 16))) {
		*failed = true;
		return 0;
	}
	if (!block || block == WS_DTV_UNALLOCATED)
		return 0;
	return block + p->offset;
}

/* Writes the record of span `span` of `t` (its header in `x`, its
 * attributes at `attrs`), unless one is waiting already. */
static __always_inline void ws_otel_record(struct task_struct *t, struct ws_otel_scratch *x,
					   __u64 attrs, __u64 now)
{
	struct ws_span_record_key key = { .pid = t->tgid, .span = x->hdr.span_id };
	struct ws_span_record *r = &x->rec;
	__u32 len = x->hdr.attrs_size;
	long err;

	if (bpf_map_lookup_elem(&span_records, &key) ||
	    !ws_span_quota_take(key.pid, WS_SPAN_MAP_RECORDS, now))
		return;
	__builtin_memcpy(r->trace_id, x->hdr.trace_id, sizeof(r->trace_id));
	r->flags = x->hdr.flags;
	r->attrs_size = x->hdr.attrs_size;
	r->tid = t->pid;
	r->seen_ns = now;
	if (len > WS_SPAN_ATTR_BYTES) {
		len = WS_SPAN_ATTR_BYTES;
		ws_stat_inc(WS_STAT_SPAN_ATTRS_CUT);
	}
	if (len && bpf_probe_read_user(r->attrs, len, (void *)attrs)) {
		len = 0;
		ws_stat_inc(WS_STAT_SPAN_ATTRS_CUT);
	}
	r->attrs_len = len;
	err = bpf_map_update_elem(&span_records, &key, r, BPF_NOEXIST);
	if (err && err != -EEXIST)
		ws_stat_inc(WS_STAT_SPAN_RECORDS_FULL);
}

/* The span `t` runs under (0: none), read through `p`; its header is left
 * in `x`. */
static __always_inline __u64 ws_otel_read(struct task_struct *t, struct ws_otel_proc *p,
					  struct ws_otel_scratch *x, __u64 *rec)
{
	bool failed = false;
	__u64 slot = ws_otel_slot(t, p, &failed);

	ws_stat_inc(WS_STAT_OTEL_READS);
	*rec = 0;
	if (slot && bpf_probe_read_user(rec, sizeof(*rec), (void *)slot))
		failed = true;
	if (*rec && bpf_probe_read_user(&x->hdr, WS_OTEL_HEADER, (void *)*rec))
		failed = true;
	if (failed) {
		ws_stat_inc(WS_STAT_OTEL_READ_FAILED);
		return 0;
	}
	if (!*rec || x->hdr.valid != 1)
		return 0;
	return x->hdr.span_id;
}

/* Reads `t`'s span (none where `p` is NULL: the process left otel_procs)
 * and, if it changed, splits the run's CPU time and moves the thread's
 * time to the new span. Out of line, so that sched_switch's program pays
 * the verifier's cost of it once. */
static __noinline __u64 ws_otel_update(struct task_struct *t, struct ws_task *s,
				       struct ws_otel_proc *p, __u64 now)
{
	__u32 zero = 0;
	struct ws_otel_scratch *x = bpf_map_lookup_elem(&otel_scratch, &zero);
	struct ws_span_acc *a;
	__u64 span = 0, rec = 0, seen, mid;

	if (!t || !s || !x)
		return 0;
	a = &s->c.span;
	if (p)
		span = ws_otel_read(t, p, x, &rec);
	if (span == a->id) {
		a->seen_ns = now;
		return span;
	}
	/* The last sight of the old span: a sample, or the switch-in (the
	 * context was the switch-out's until then). */
	seen = a->seen_ns > s->in_at ? a->seen_ns : s->in_at;
	mid = seen && seen < now ? seen + (now - seen) / 2 : now;
	ws_flush_cpu(s, mid);
	ws_span_flush(t, a, mid);
	a->id = span;
	a->from_ns = mid;
	a->seen_ns = now;
	if (span)
		ws_otel_record(t, x, rec + WS_OTEL_HEADER, now);
	return span;
}

/* The span of `t`, a thread being sampled or switched out (`s`: its
 * storage): one lookup for a process without a context. */
static __always_inline __u64 ws_otel_observe(struct task_struct *t, struct ws_task *s, __u64 now)
{
	__u32 pid = t->tgid;
	struct ws_otel_proc *p = bpf_map_lookup_elem(&otel_procs, &pid);

	if (!p && !s->c.span.id)
		return 0;
	/* An exiting thread runs no more user code, so its context cannot
	 * change, and past exit_mm its memory cannot be read: each thread's
	 * last switch-out would count a failed read. */
	if (t->flags & PF_EXITING)
		return s->c.span.id;
	return ws_otel_update(t, s, p, now);
}

/* A process's registration follows its memory: a fork's child has its
 * parent's (the same image, the same TLS layout), an exec's new image has
 * none until user space finds it again, an ended process none. */
static __always_inline void ws_otel_on_fork(struct task_struct *parent, struct task_struct *child)
{
	__u32 ppid = parent->tgid, cpid = child->tgid;
	struct ws_otel_proc *p;

	if (child->pid != child->tgid || cpid == ppid)
		return;
	p = bpf_map_lookup_elem(&otel_procs, &ppid);
	if (p)
		bpf_map_update_elem(&otel_procs, &cpid, p, BPF_NOEXIST);
}

static __always_inline void ws_otel_forget(struct task_struct *t)
{
	__u32 pid = t->tgid;

	bpf_map_delete_elem(&otel_procs, &pid);
}

#endif /* WALLSCOPE_OTELCTX_BPF_H */
