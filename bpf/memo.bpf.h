/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Reusing a thread's recent user stack walks (see ws_user_stack_memo). */
#ifndef WALLSCOPE_MEMO_BPF_H
#define WALLSCOPE_MEMO_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "stacks.bpf.h"
#include "wallscope.h"

/* A user stack walked for a thread in its own context, kept so that the
 * next walk from the same place reuses it (see ws_user_stack_memo). */
struct ws_walk_memo {
	__u64 ip; /* user registers the walk started from */
	__u64 sp;
	__u64 bp;
	__u64 top; /* hash of the WS_MEMO_TOP_WORDS words at sp */
	__u64 walked; /* when (bpf_ktime_get_ns) */
	__u32 gen; /* generation of stack_id */
	__s32 stack_id;
};

#define WS_MEMO_TOP_WORDS 8
/* How long a walk is reused: a process's tables arrive a drain after it
 * starts (or maps new code), and walks made before stop early; they must
 * not stand for its stacks from then on. One walk a second per call site
 * costs next to nothing. */
#define WS_MEMO_TTL_NS 1000000000ULL

/* A thread's last two walks, kept in its task storage. */
struct ws_walk_memos {
	struct ws_walk_memo m[2];
	__u32 next; /* the one a new walk replaces */
	__u32 _pad;
};

/* Hash of the words at the top of the current task's user stack (0 when
 * unreadable): with the registers, what tells two walks from one place
 * apart when the same function is reached from two callers. */
static __always_inline __u64 ws_stack_top(__u64 sp)
{
	__u64 words[WS_MEMO_TOP_WORDS], h = 0x9e3779b97f4a7c15ULL;

	if (bpf_probe_read_user(words, sizeof(words), (void *)sp))
		return 0;
	for (int i = 0; i < WS_MEMO_TOP_WORDS; i++) {
		h = (h ^ words[i]) * 0xff51afd7ed558ccdULL;
		h ^= h >> 32;
	}
	return h | 1;
}

/*
 * The current task's user stack in generation `gen`. Most waits of a
 * thread repeat at one call site (a loop around read, futex_wait,
 * epoll_wait), so a thread that is where one of its last two walks
 * started (same ip, sp and frame pointer, and the same words at the stack
 * top) reuses that walk instead of walking again. The stack top is read
 * only when the registers match: that first read of the thread's memory
 * costs about what a short walk does. Two calls of one function from
 * different callers at the very same stack depth, with identical top
 * words, would share a stack: the approximation docs/design.md states ("Walk less").
 */
static __always_inline __s32 ws_user_stack_memo(void *ctx, struct ws_walk_memos *s, __u32 gen)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(cur);
	__u64 ip = regs->ip, sp = regs->sp, bp = regs->bp, top = 0, now = bpf_ktime_get_ns();
	struct ws_walk_memo *m;
	__s32 id;

	/* A Python thread's native registers say nothing of its Python
	 * stack (every call runs in the same eval loop): walked each time. */
	if (ws_python_process(cur->tgid))
		return ws_user_stack(ctx, gen);
	for (int i = 0; i < 2; i++) {
		m = &s->m[i];
		if (!m->top || m->ip != ip || m->sp != sp || m->bp != bp ||
		    now - m->walked > WS_MEMO_TTL_NS)
			continue;
		if (!top)
			top = ws_stack_top(sp);
		if (m->top != top)
			continue;
		id = ws_renew_stack(m->stack_id, m->gen, gen);
		if (id == WS_NO_STACK)
			break;
		m->stack_id = id;
		m->gen = gen;
		ws_stat_inc(WS_STAT_WALKS_REUSED);
		return id;
	}
	id = ws_user_stack(ctx, gen);
	if (id == WS_NO_STACK)
		return id;
	m = &s->m[s->next & 1];
	s->next++;
	m->ip = ip;
	m->sp = sp;
	m->bp = bp;
	m->top = top ? top : ws_stack_top(sp); /* the walk just read these words: cheap now */
	m->walked = now;
	m->gen = gen;
	m->stack_id = id;
	return id;
}

#endif /* WALLSCOPE_MEMO_BPF_H */
