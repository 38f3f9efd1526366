/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * User stack walking through code without frame pointers.
 *
 * For a process that user space registered in `unwind_procs`, the walk
 * takes a table step while the pc is in a mapping with a table (CFA from
 * rsp or rbp plus an offset, return address at CFA-8, rbp restored from
 * CFA+offset or unchanged) and a frame-pointer step elsewhere (JIT code
 * with -XX:+PreserveFramePointer, libraries built with frame pointers).
 * While some of a process's tables are pending, code outside the loaded
 * ones may lack frame pointers: the innermost frame is checked
 * (pending.bpf.h) and a chain that ends there ends with
 * WS_UNWIND_PENDING_FRAME, never silently short.
 * Other processes keep the kernel's frame-pointer walk (bpf_get_stack).
 * Frames are one bpf_loop iteration each, so the verifier checks one step.
 * Every early end is counted by reason.
 */
#ifndef WALLSCOPE_UNWIND_BPF_H
#define WALLSCOPE_UNWIND_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "java.bpf.h"
#include "maps.bpf.h"
#include "pending.bpf.h"
#include "python.bpf.h"
#include "walk.bpf.h"
#include "wallscope.h"

/* Set by user space before load: false keeps the frame-pointer walk. */
const volatile bool unwind_tables = false;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, WS_UNWIND_ROWS);
	__type(key, __u32);
	__type(value, struct ws_unwind_row);
} unwind_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, WS_UNWIND_PROCS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct ws_unwind_proc);
} unwind_procs SEC(".maps");

/*
 * The rule found for a pc, per CPU, direct-mapped: the same return
 * addresses come back walk after walk, and a hit skips the mapping scan
 * and the search. Keyed by pid, registration epoch and pc, so an exec or a
 * re-registration (new mappings, tables evicted) never reuses a rule.
 */
#define WS_UNWIND_CACHE 1016 /* as many as fit the 32 KiB a per-CPU value may have */

struct ws_unwind_cached {
	__u64 pc;
	__u32 pid;
	__u32 epoch;
	struct ws_unwind_row row;
	__u32 _pad;
};

/* One value holds the whole cache: a walk looks it up once, not once a
 * frame (a map lookup costs more than the rest of a cached step). */
struct ws_rule_cache {
	struct ws_unwind_cached e[WS_UNWIND_CACHE];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ws_rule_cache);
} unwind_cache SEC(".maps");

#define WS_UNWIND_DONE 0xffffffffu

struct ws_unwind_search {
	__u64 vaddr;
	__u32 lo; /* the answer is in [lo, hi) */
	__u32 hi;
};

/* One halving step; a callback so the verifier checks it once instead of
 * every path through the halvings. */
static long ws_unwind_search_step(__u32 index, void *data)
{
	struct ws_unwind_search *q = data;
	struct ws_unwind_row *row;
	__u32 mid;

	if (q->lo + 1 >= q->hi)
		return 1;
	mid = q->lo + (q->hi - q->lo) / 2;
	row = bpf_map_lookup_elem(&unwind_rows, &mid);
	if (!row)
		return 1;
	if (row->pc <= q->vaddr)
		q->lo = mid;
	else
		q->hi = mid;
	return 0;
}

/* The last row with pc <= vaddr in mapping m's table: the page index
 * narrows the range to one page's rows, then a binary search. */
static __always_inline struct ws_unwind_row *ws_unwind_find(const struct ws_unwind_mapping *m,
							     __u64 vaddr)
{
	__u32 rows = m->index_start + m->page_count + 1, count = m->row_count;
	struct ws_unwind_search q = { .vaddr = vaddr, .lo = rows, .hi = rows + count };
	struct ws_unwind_row *row;
	__u64 page = vaddr >> 12;
	__u32 lo;

	if (count == 0 || vaddr > 0xffffffffULL)
		return NULL;
	if (page >= m->page_base && page - m->page_base < m->page_count) {
		__u32 k = m->index_start + (__u32)(page - m->page_base), k1 = k + 1;
		struct ws_unwind_row *a = bpf_map_lookup_elem(&unwind_rows, &k);
		struct ws_unwind_row *b = bpf_map_lookup_elem(&unwind_rows, &k1);

		if (a && b && a->pc <= b->pc && b->pc < count) {
			q.lo = rows + a->pc;
			q.hi = rows + b->pc + 1;
		}
	}
	bpf_loop(WS_UNWIND_SEARCH_STEPS, ws_unwind_search_step, &q, 0);
	lo = q.lo;
	row = bpf_map_lookup_elem(&unwind_rows, &lo);
	if (!row || row->pc > vaddr)
		return NULL;
	return row;
}

static __always_inline const struct ws_unwind_mapping *
ws_unwind_mapping(const struct ws_unwind_proc *proc, __u64 pc)
{
	for (int j = 0; j < WS_UNWIND_MAX_MAPPINGS; j++) {
		if (j >= proc->count)
			break;
		const struct ws_unwind_mapping *m = &proc->mappings[j];

		if (pc >= m->start && pc < m->end)
			return m;
	}
	return NULL;
}

/* The unwind rule for `at`: through the per-CPU cache for the current task;
 * without it for another task's walk, which may sleep mid-way and let
 * programs on this CPU rewrite a cache entry under it. */
static __always_inline bool ws_unwind_rule(struct ws_unwind_walk *w, __u64 at,
					   struct ws_unwind_row *out, struct ws_rule_cache *cache)
{
	const struct ws_unwind_proc *proc = &w->proc;
	const struct ws_unwind_mapping *m;
	struct ws_unwind_cached *c = NULL;
	__u32 slot;

	if (!proc->count) { /* no tables: frame pointers throughout */
		out->cfa_reg = WS_UNWIND_FP_STEP;
		return true;
	}
	if (cache) {
		slot = (__u32)((at ^ (at >> 17) ^ w->pid) * 0x9e3779b1u) % WS_UNWIND_CACHE;
		asm volatile("" : "+r"(slot));
		if (slot >= WS_UNWIND_CACHE)
			return false;
		c = &cache->e[slot];
		if (c->pc == at && c->pid == w->pid && c->epoch == proc->epoch) {
			*out = c->row;
			return true;
		}
	}
	m = ws_unwind_mapping(proc, at);
	out->cfa_reg = WS_UNWIND_FP_STEP;
	if (m) {
		struct ws_unwind_row *found = ws_unwind_find(m, at - m->bias);

		if (found)
			*out = *found;
		else
			out->cfa_reg = WS_CFA_NONE;
	}
	if (c) {
		c->pc = at;
		c->pid = w->pid;
		c->epoch = proc->epoch;
		c->row = *out;
	}
	return true;
}

/* Ends the walk at code whose table is pending: the callers are unknown,
 * which WS_UNWIND_PENDING_FRAME says in place of them. */
static __always_inline long ws_unwind_pending_end(struct ws_unwind_walk *w, struct ws_stack *s)
{
	__u32 len = w->len;

	w->stop = WS_STAT_UNWIND_PENDING;
	if (len < WS_MAX_STACK_DEPTH && len < w->max_len) {
		s->ips[len] = WS_UNWIND_PENDING_FRAME;
		w->len = len + 1;
	}
	return 1;
}

/* One frame: records the pc, then finds the caller's pc, sp and bp.
 * Returns 1 when the walk ends. */
static __always_inline long ws_unwind_step_in(struct ws_unwind_walk *w, struct ws_stack *s,
					      struct task_struct *task, struct ws_rule_cache *cache)
{
	const struct ws_unwind_proc *proc = &w->proc;
	struct ws_unwind_row row = {};
	__u64 ra = 0, bp, at;
	bool interpreted, unknown;
	__u32 len;

	len = w->len;
	if (len >= WS_MAX_STACK_DEPTH || len >= w->max_len) {
		w->stop = WS_STAT_UNWIND_TRUNCATED;
		return 1;
	}
	s->ips[len] = w->pc;
	w->len = len + 1;
	bp = w->bp;
	interpreted = w->pc >= proc->java.interp_start && w->pc < proc->java.interp_end;
	if (interpreted) {
		/* An interpreted Java frame: which method it runs is in the
		 * frame, not in the pc (all methods share the interpreter). */
		__u64 method = 0;

		if (bp && !ws_walk_read(w, bp - WS_JAVA_METHOD_SLOT, &method, task) &&
		    method && method < (1ULL << 47))
			s->ips[len] = WS_JAVA_METHOD_TAG | method;
	}
	/* A caller's pc is a return address, maybe just past its function. */
	at = len ? w->pc - 1 : w->pc;
	if (interpreted) {
		row.cfa_reg = WS_UNWIND_FP_STEP;
	} else if (proc->java.heap_count) {
		switch (ws_java_rule(w, at, len == 0, &row, task)) {
		case WS_JAVA_RULE:
			break;
		case WS_JAVA_REFUSED:
			w->stop = WS_STAT_JAVA_REFUSED;
			return 1;
		default:
			if (!ws_unwind_rule(w, at, &row, cache))
				return 1;
		}
	} else if (!ws_unwind_rule(w, at, &row, cache)) {
		return 1;
	}
	/* Code without a table while tables are pending: the innermost
	 * frame may not have set up rbp yet (pending.bpf.h). */
	unknown = proc->pending && !interpreted && row.cfa_reg == WS_UNWIND_FP_STEP;
	if (unknown && len == 0 && !ws_pending_top(w, &row, task)) {
		/* The innermost frame could not be vouched for (a call through
		 * a PLT stub defeats the check): its caller may be missing
		 * right here, which the marker says, and the frame-pointer
		 * chain above it is walked as usual (ending the stack here
		 * lost every caller of a syscall made through libc). */
		if (w->max_len > 1) {
			s->ips[1] = WS_UNWIND_PENDING_FRAME;
			w->len = 2;
		}
		ws_stat_inc(WS_STAT_UNWIND_PENDING);
	}
	if (row.cfa_reg == WS_UNWIND_FP_STEP) {
		/* Callers' frames sit higher on the stack: a chain that does
		 * not climb is not a frame chain (garbage in rbp); 0 ends it.
		 * An interpreted frame's caller may be compiled code, whose rbp
		 * is any value: there the sp it saved must climb instead. */
		__u64 sender = 0;

		if (!bp || ws_walk_read(w, bp + 8, &ra, task) || ws_walk_read(w, bp, &bp, task) ||
		    (!interpreted && bp && bp <= w->bp)) {
			/* The chain ends; in code whose table is pending, maybe
			 * only because it keeps no frame pointer. */
			if (unknown)
				return ws_unwind_pending_end(w, s);
			w->stop = WS_UNWIND_DONE;
			return 1;
		}
		w->sp = w->bp + 16;
		if (interpreted && !ws_walk_read(w, w->bp - WS_JAVA_SENDER_SP_SLOT, &sender, task) &&
		    sender >= w->sp && sender - w->sp < (1 << 20))
			w->sp = sender;
	} else {
		__u64 cfa;

		if (row.cfa_reg == WS_CFA_NONE) {
			w->stop = WS_STAT_UNWIND_NO_INFO;
			return 1;
		}
		if (row.cfa_reg == WS_CFA_END) {
			w->stop = WS_UNWIND_DONE;
			return 1;
		}
		if (row.cfa_reg > WS_CFA_RBP || row.rbp_rule > WS_RBP_AT_CFA) {
			w->stop = WS_STAT_UNWIND_UNSUPPORTED;
			return 1;
		}
		cfa = (row.cfa_reg == WS_CFA_RSP ? w->sp : w->bp) + (__s64)row.cfa_off;
		if (ws_walk_read(w, cfa - 8, &ra, task) ||
		    (row.rbp_rule == WS_RBP_AT_CFA &&
		     ws_walk_read(w, cfa + (__s64)row.rbp_off, &bp, task))) {
			w->stop = WS_STAT_UNWIND_READ_FAILED;
			return 1;
		}
		w->sp = cfa;
	}
	w->bp = bp;
	w->pc = ra;
	if (!ra) {
		w->stop = WS_UNWIND_DONE;
		return 1;
	}
	return 0;
}

/* The current task's walk and the stack it fills, handed to every step
 * (looked up once per walk, not once per frame). */
struct ws_walk_ctx {
	struct ws_unwind_walk *w;
	struct ws_stack *s;
	struct ws_rule_cache *cache;
};

static long ws_unwind_step(__u32 index, void *data)
{
	struct ws_walk_ctx *c = data;
	struct ws_unwind_walk *w = c->w;
	struct ws_stack *s = c->s;

	if (!w || !s)
		return 1;
	return ws_unwind_step_in(w, s, NULL, c->cache);
}

/* Sets up walk `w` of the task whose user registers are `regs`, with a
 * copy of its process's unwind tables (a step reads them without a
 * lookup). Returns the epoch of the registration it walks with, 0 when
 * the process has none: then every step is a frame-pointer step. */
static __always_inline __u32 ws_unwind_start(struct ws_unwind_walk *w, __u32 pid,
					    struct pt_regs *regs)
{
	struct ws_unwind_proc *proc = NULL;

	if (unwind_tables)
		proc = bpf_map_lookup_elem(&unwind_procs, &pid);
	if (proc) {
		__builtin_memcpy(&w->proc, proc, sizeof(w->proc));
		ws_stat_inc(w->proc.pending ? WS_STAT_UNWIND_PENDING_WALKS : WS_STAT_UNWIND_WALKS);
	} else {
		w->proc.count = 0;
		w->proc.epoch = 0;
		w->proc.pending = 0;
		w->proc.java.interp_start = 0;
		w->proc.java.interp_end = 0;
		w->proc.java.heap_count = 0;
		w->proc.python.minor = 0;
	}
	w->pc = regs->ip;
	w->sp = regs->sp;
	w->bp = regs->bp;
	w->len = 0;
	w->stop = 0;
	w->pid = pid;
	w->win_len = 0;
	w->win_start = 0;
	w->py_len = 0;
	w->max_len = WS_MAX_STACK_DEPTH;
	return proc ? (w->proc.epoch ? w->proc.epoch : 1) : 0;
}

/* The epoch of process `pid`'s registration now (0: none): a walk made
 * with an older one may lack tables loaded since. */
static __always_inline __u32 ws_unwind_epoch(__u32 pid)
{
	struct ws_unwind_proc *proc;

	if (!unwind_tables)
		return 0;
	proc = bpf_map_lookup_elem(&unwind_procs, &pid);
	return proc ? (proc->epoch ? proc->epoch : 1) : 0;
}

static __always_inline long ws_unwind_end(struct ws_unwind_walk *w)
{
	if (w->stop && w->stop != WS_UNWIND_DONE)
		ws_stat_inc(w->stop);
	return w->len;
}

/* Walks the current task's user stack into `s`: with its process's unwind
 * tables where it has them, else by frame pointers (as the kernel would,
 * but reading the stack in windows). Returns the number of frames (-1:
 * no scratch), and in `*tables` whether tables were used. */
static __always_inline long ws_unwind_user(struct ws_stack *s, __u32 *tables)
{
	__u32 zero = 0;
	struct ws_unwind_walk *w = bpf_map_lookup_elem(&unwind_walk, &zero);
	struct task_struct *cur = bpf_get_current_task_btf();

	if (!w)
		return -1;
	struct ws_walk_ctx c = { .w = w, .s = s, .cache = bpf_map_lookup_elem(&unwind_cache, &zero) };

	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(cur);

	*tables = ws_unwind_start(w, cur->tgid, regs);
	ws_python_walk(w, cur, regs, NULL);
	bpf_loop(WS_MAX_STACK_DEPTH + 1, ws_unwind_step, &c, 0);
	ws_python_append(w, s);
	return ws_unwind_end(w);
}

/* Whether process `pid` runs a registered Python interpreter: its walks
 * differ by Python stack where the native registers do not. */
static __always_inline bool ws_python_process(__u32 pid)
{
	struct ws_unwind_proc *proc;

	if (!unwind_tables)
		return false;
	proc = bpf_map_lookup_elem(&unwind_procs, &pid);
	return proc && proc->python.minor;
}

/* A new process starts with its parent's mappings: it takes the parent's
 * tables at once instead of waiting for user space to register it. */
static __always_inline void ws_unwind_on_fork(struct task_struct *parent,
					      struct task_struct *child)
{
	__u32 ppid = parent->tgid, cpid = child->tgid;
	struct ws_unwind_proc *proc;

	if (!unwind_tables || ppid == cpid)
		return;
	proc = bpf_map_lookup_elem(&unwind_procs, &ppid);
	if (proc)
		bpf_map_update_elem(&unwind_procs, &cpid, proc, BPF_NOEXIST);
}

/* The entry of a process whose tables are all pending. */
static const struct ws_unwind_proc ws_unwind_unregistered = { .pending = 1 };

/* An exec replaces the mappings: until user space registers the new image,
 * walk with frame pointers rather than with the old image's tables, as
 * code whose tables are pending (the new image may keep no frame
 * pointers). */
static __always_inline void ws_unwind_on_exec(void)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;

	if (unwind_tables)
		bpf_map_update_elem(&unwind_procs, &pid, &ws_unwind_unregistered, BPF_ANY);
}

#endif /* WALLSCOPE_UNWIND_BPF_H */
