/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The innermost frame of a walk whose tables are pending.
 *
 * A frame-pointer step reads the caller from rbp, which is the current
 * function's frame only once its prologue ran. Compilers leave it out of
 * leaf functions (GCC's default -momit-leaf-frame-pointer, even with
 * -fno-omit-frame-pointer), and every function is without it in its first
 * and last instructions: there rbp is still the caller's frame, and the
 * step skips the caller (main;handler;leaf for main;handler;worker;leaf).
 * Only the innermost frame can be caught so: a caller's pc is at a call,
 * past its prologue. A table says where each pc's frame is; until it is
 * loaded, the innermost frame is stepped only where the code and the stack
 * show which case holds:
 *  - at `ret`, at the function's first instruction (push rbp, endbr64), or
 *    just after push rbp, the return address is on top of the stack;
 *  - else a word on top of the stack that returns from a direct call into
 *    the function at pc (its target at or below pc, and past the target of
 *    the call rbp's frame returns from, so not the caller's entry) is the
 *    return address of a function without a frame;
 *  - else, if the words between sp and rbp hold no return address and rbp's
 *    frame returns from a call into the function at pc (or an indirect
 *    one), rbp is the function's frame: a frame-pointer step.
 * Anything else ends the walk with WS_UNWIND_PENDING_FRAME (counted).
 */
#ifndef WALLSCOPE_PENDING_BPF_H
#define WALLSCOPE_PENDING_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "java.bpf.h"
#include "walk.bpf.h"
#include "wallscope.h"

/* Words on top of the stack searched for a return address. */
#define WS_PENDING_SCAN_WORDS 16
/* Code reads (the instruction before a candidate return address) per walk. */
#define WS_PENDING_CODE_READS 4
/* A call target farther below a pc than this is not its function's entry
 * (a PLT stub of another module, most often). */
#define WS_PENDING_MAX_FUNCTION (1ULL << 20)
/* A call whose target the instruction does not say (call *reg, call [mem]). */
#define WS_CALL_INDIRECT 1

/* Whether `ret` follows a call: 0 if not (or unreadable), WS_CALL_INDIRECT,
 * or the target of the direct call (e8 rel32) it returns from. Reads the
 * code into w->blob (scratch: the Java walk's, unused where this runs). */
static __always_inline __u64 ws_call_target(struct ws_unwind_walk *w, __u64 ret,
					    struct task_struct *task)
{
	__u64 code;
	__u8 b2, b3, b5, b6, b7;

	if (ret < 4096 + 8 || ret >= (1ULL << 47) || ws_read_user(w->blob, 8, ret - 8, task))
		return 0;
	code = *(__u64 *)w->blob;
	b2 = code >> 16;
	b3 = code >> 24;
	b5 = code >> 40;
	b6 = code >> 48;
	b7 = code >> 56;
	if (b3 == 0xe8)
		return ret + (__s64)(__s32)(code >> 32);
	if ((b6 == 0xff && (b7 & 0xf8) == 0xd0) ||   /* call reg */
	    (b5 == 0xff && (b6 & 0xf8) == 0x50) ||   /* call [reg+d8] */
	    (b2 == 0xff && (b3 == 0x15 || (b3 & 0xf8) == 0x90))) /* call [rip+d32], [reg+d32] */
		return WS_CALL_INDIRECT;
	return 0;
}

/* Whether call target `t` may be the entry of the function at `pc`. */
static __always_inline bool ws_entry_of(__u64 t, __u64 pc)
{
	return t > WS_CALL_INDIRECT && t <= pc && pc - t < WS_PENDING_MAX_FUNCTION;
}

/* Looks at word `i` from sp (the search's state is in `w`): returns 1
 * when the search ends. */
static __always_inline long ws_pending_scan_in(__u32 i, struct ws_unwind_walk *w,
					       struct task_struct *task)
{
	__u64 at, off, v, t;

	if (!w)
		return 1;
	/* From the window read before the search (ws_walk_read's reload
	 * would take more stack than a callback here may have). */
	at = w->sp + 8 * (__u64)i;
	off = at - w->win_start;
	if (at + 8 > w->scan_end || at < w->win_start || off + 8 > w->win_len)
		return 1;
	asm volatile("" : "+r"(off));
	if (off > WS_STACK_WINDOW - 8)
		return 1;
	v = *(__u64 *)(w->win + off);
	/* Not code: a small number, or an address in the stack. */
	if (v < 4096 || v >= (1ULL << 47) || (v >= w->sp && v - w->sp < (1 << 23)))
		return 0;
	if (w->scan_reads >= WS_PENDING_CODE_READS)
		return 1;
	w->scan_reads++;
	t = ws_call_target(w, v, task);
	if (t == WS_CALL_INDIRECT || (ws_entry_of(t, w->pc) && t > w->scan_after)) {
		w->scan_slot = i + 1;
		w->scan_indirect = t == WS_CALL_INDIRECT;
		return 1;
	}
	return 0;
}

/* bpf_loop callbacks. They look the walk up themselves: a context
 * holding it would take stack the iterator's walk has not to spare. */
static long ws_pending_scan_step(__u32 index, void *data)
{
	__u32 zero = 0;

	return ws_pending_scan_in(index, bpf_map_lookup_elem(&unwind_walk, &zero), NULL);
}

/* The iterator's, given the walked task (live.bpf.h). */
static long ws_pending_scan_step_task(__u32 index, void *data);

/* What the search found (everything read again from `w`: values kept
 * across the search would take the walk's stack). */
static __always_inline bool ws_pending_verdict(struct ws_unwind_walk *w, struct ws_unwind_row *row)
{
	__u64 t1 = w->scan_t1;
	bool into = t1 == WS_CALL_INDIRECT || ws_entry_of(t1, w->pc);

	/* An indirect call's return is taken only where rbp's frame cannot be
	 * pc's: it would as well be a stale word of that frame. */
	if (w->scan_slot && (!w->scan_indirect || !into)) {
		row->cfa_off = 8 * w->scan_slot;
		return true;
	}
	/* No return address on top, the words up to rbp all seen (a frame
	 * larger than the search may hide one), and rbp's frame returns into
	 * pc's function (or, by an indirect call, into one that may be). */
	if (!w->scan_slot && w->bp >= w->sp && w->bp - w->sp <= 8 * WS_PENDING_SCAN_WORDS &&
	    w->scan_reads < WS_PENDING_CODE_READS && into) {
		row->cfa_reg = WS_UNWIND_FP_STEP;
		return true;
	}
	return false;
}

/* The rule of the innermost frame at w->pc, whose code has no table yet
 * (see above): false when neither the code nor the stack tells. */
static __always_inline bool ws_pending_top(struct ws_unwind_walk *w, struct ws_unwind_row *row,
					   struct task_struct *task)
{
	__u64 pc = w->pc, sp = w->sp, bp = w->bp, t1 = 0;
	bool frame = bp >= sp && bp - sp < (1 << 20);
	__u32 at4;
	__u8 before;

	row->cfa_reg = WS_CFA_RSP;
	row->cfa_off = 0;
	row->rbp_rule = WS_RBP_SAME;
	row->rbp_off = 0;
	/* w->blob: the code around pc (the Java walk's scratch, unused here). */
	if (pc >= 8 && !ws_read_user(w->blob, 16, pc - 8, task)) {
		at4 = *(__u32 *)(w->blob + 8);
		before = w->blob[7];
		if ((at4 & 0xff) == 0xc3) { /* ret: nothing above the return address */
			row->cfa_off = 8;
			return true;
		}
		if ((at4 & 0xff) == 0x55 || at4 == 0xfa1e0ff3) /* push rbp, endbr64: an entry */
			row->cfa_off = 8;
		else if (before == 0x55 && (at4 & 0xffffff) == 0xe58948) /* then mov rbp, rsp */
			row->cfa_off = 16;
		if (row->cfa_off) {
			/* Elsewhere than in a prologue (code without frame
			 * pointers saving rbp), the word must be a return. */
			return !ws_walk_read(w, sp + row->cfa_off - 8, &w->scan_word, task) &&
			       ws_call_target(w, w->scan_word, task) != 0;
		}
	}
	/* rbp's frame returns from a call into pc's function, or into its
	 * caller's: what a word under it must be past to be pc's return. */
	if (frame && !ws_walk_read(w, bp + 8, &w->scan_word, task))
		t1 = ws_call_target(w, w->scan_word, task);
	w->scan_t1 = t1;
	w->scan_after = ws_entry_of(t1, pc) ? t1 : 0;
	w->scan_end = frame && bp < sp + 8 * WS_PENDING_SCAN_WORDS ? bp
								  : sp + 8 * WS_PENDING_SCAN_WORDS;
	w->scan_reads = 0;
	w->scan_slot = 0;
	w->scan_indirect = 0;
	if (ws_walk_read(w, sp, &w->scan_word, task))
		return false;
	if (task)
		bpf_loop(WS_PENDING_SCAN_WORDS, ws_pending_scan_step_task, &task, 0);
	else
		bpf_loop(WS_PENDING_SCAN_WORDS, ws_pending_scan_step, NULL, 0);
	return ws_pending_verdict(w, row);
}

#endif /* WALLSCOPE_PENDING_BPF_H */
