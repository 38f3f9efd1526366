/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Compiled Java frames without frame pointers. A JVM started without
 * -XX:+PreserveFramePointer uses rbp as a general register in compiled
 * code, so a frame-pointer chain breaks at the first compiled frame. But
 * every HotSpot code blob knows its frame size, and on x86-64 a compiled
 * frame (C1, C2, native wrapper, runtime stub) ends with its return
 * address and, under it, the caller's rbp: at a pc past the frame's
 * set-up, the caller's frame starts at sp + frame_size * 8. The blob of a
 * pc is found as HotSpot finds it, through its code heap's segment map.
 * Interpreted frames keep rbp as their frame pointer and save the sp of
 * their caller at rbp - 8 (unwind.bpf.h steps them).
 *
 * Everything read here belongs to the walked process, so everything is
 * bounded: segment-map hops and reads, the frame size. Anything
 * implausible ends the walk, counted in java_frames_refused.
 */
#ifndef WALLSCOPE_JAVA_BPF_H
#define WALLSCOPE_JAVA_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "walk.bpf.h"
#include "wallscope.h"

/* Where an interpreted frame keeps its caller's sp: rbp - 8
 * (frame::interpreter_frame_sender_sp_offset, -1 word). */
#define WS_JAVA_SENDER_SP_SLOT 8
/* Segment-map hops and reads per pc: a legitimate map reaches a block
 * start in one hop per 254 segments (a few more after free blocks were
 * joined); a forged one costs this much, once. */
#define WS_JAVA_MAX_HOPS 64
#define WS_JAVA_MAX_READS 4
/* A larger frame (64 KiB) is no compiled frame. */
#define WS_JAVA_MAX_FRAME_WORDS 8192

enum ws_java_found {
	WS_JAVA_NOT_CODE = 0, /* the pc is in none of the JVM's code heaps */
	WS_JAVA_RULE = 1,     /* the rule is in *row */
	WS_JAVA_REFUSED = 2,  /* in a code heap, but nothing plausible there */
};

/* What a segment-map hop needs (the walk's state is in `w`). */
struct ws_segmap_ctx {
	struct ws_unwind_walk *w;
	struct task_struct *task;
};

/* One hop back; reads the window of the map up to the segment reached
 * when the last read does not hold it. `task` as in ws_read_user. */
static __always_inline long ws_segmap_hop_in(struct ws_unwind_walk *w, struct task_struct *task)
{
	__u64 at, first, off;
	__u8 back;

	if (!w)
		return 1;
	at = w->seg_at;
	if (at < w->seg_first || at - w->seg_first >= w->seg_len) {
		__u32 len;

		first = at >= WS_SEGMAP_WINDOW - 1 ? at - (WS_SEGMAP_WINDOW - 1) : 0;
		len = at - first + 1;
		if (w->seg_reads >= WS_JAVA_MAX_READS || len == 0 || len > WS_SEGMAP_WINDOW)
			goto refuse;
		asm volatile("" : "+r"(len));
		if (len > WS_SEGMAP_WINDOW || ws_read_user(w->segmap, len, w->seg_map + first, task))
			goto refuse;
		w->seg_reads++;
		w->seg_first = first;
		w->seg_len = len;
	}
	off = at - w->seg_first;
	asm volatile("" : "+r"(off));
	if (off >= WS_SEGMAP_WINDOW)
		goto refuse;
	back = w->segmap[off];
	if (back == 0) {
		w->seg_found = 1;
		return 1;
	}
	if (back == 0xff || back > at) /* free, or before the heap */
		goto refuse;
	w->seg_at = at - back;
	return 0;
refuse:
	w->seg_found = 2;
	return 1;
}

static long ws_segmap_hop(__u32 index, void *data)
{
	struct ws_segmap_ctx *c = data;

	return ws_segmap_hop_in(c->w, NULL);
}

static long ws_segmap_hop_task(__u32 index, void *data)
{
	struct ws_segmap_ctx *c = data;

	return ws_segmap_hop_in(c->w, c->task);
}

/* The int of `width` bytes at `off` in the blob header read last (false:
 * outside it). */
static __always_inline bool ws_blob_int(struct ws_unwind_walk *w, __u32 off, __u32 width,
					__s64 *out)
{
	asm volatile("" : "+r"(off));
	if (off > WS_JAVA_BLOB_HEADER - 8)
		return false;
	*out = width == 2 ? *(__s16 *)(w->blob + off) : *(__s32 *)(w->blob + off);
	return true;
}

/* Where the innermost compiled frame's return address is, by the code
 * around its pc: a frame stopped in its set-up or in its return sequence
 * is not (yet, or any more) as frame_size says. HotSpot's x86-64 C1 and C2
 * emit those few instructions alike: [stack bang] push rbp; sub rsp, N
 * (or C2's sub rsp, N; mov [rsp+N-8], rbp) ... add rsp, N; pop rbp;
 * [cmp rsp, [r15+poll]; ja stub;] ret. Tiny methods spend a good part of
 * their time there: without this, 5-9 % of a JDK 25 pool's samples lost
 * their callers during warm-up. */
enum ws_java_leaf {
	WS_LEAF_WHOLE = 0,	 /* the frame as frame_size says */
	WS_LEAF_RET_ON_TOP = 1,	 /* no frame (yet, or any more): cfa = sp + 8 */
	WS_LEAF_RBP_ON_TOP = 2,	 /* rbp pushed, nothing else: cfa = sp + 16 */
	WS_LEAF_RBP_UNSAVED = 3, /* frame grown, caller's rbp not yet stored */
};

static __always_inline enum ws_java_leaf ws_java_leaf_shape(struct ws_unwind_walk *w, __u64 pc,
							     bool setting_up,
							     struct task_struct *task)
{
	/* c[8] is the byte at pc; the blob header is read and done with. */
	const __u8 *c = w->blob;

	if (pc < 8 || ws_read_user(w->blob, 16, pc - 8, task))
		return setting_up ? WS_LEAF_RET_ON_TOP : WS_LEAF_WHOLE;
	if (c[8] == 0xc3 ||			      /* ret */
	    c[7] == 0x5d ||			      /* just after pop rbp */
	    (c[4] == 0x49 && c[5] == 0x3b && c[6] == 0x67) || /* after cmp rsp, [r15+d8] */
	    (c[1] == 0x49 && c[2] == 0x3b && c[3] == 0xa7))   /* after cmp rsp, [r15+d32] */
		return WS_LEAF_RET_ON_TOP;
	if (c[8] == 0x5d) /* at pop rbp */
		return WS_LEAF_RBP_ON_TOP;
	if (!setting_up)
		return WS_LEAF_WHOLE;
	if (c[7] == 0x55) /* just after push rbp */
		return WS_LEAF_RBP_ON_TOP;
	if (c[1] == 0x48 && c[2] == 0x81 && c[3] == 0xec && c[0] != 0x55)
		return WS_LEAF_RBP_UNSAVED; /* after C2's sub rsp, imm32 */
	if ((c[4] == 0x48 && c[5] == 0x83 && c[6] == 0xec) || /* after sub rsp, imm8 */
	    (c[1] == 0x48 && c[2] == 0x81 && c[3] == 0xec) || /* after sub rsp, imm32 */
	    (c[3] == 0x48 && c[4] == 0x89 && c[5] == 0x6c && c[6] == 0x24) || /* mov [rsp+d8], rbp */
	    (c[0] == 0x48 && c[1] == 0x89 && c[2] == 0xac && c[3] == 0x24) || /* mov [rsp+d32], rbp */
	    (c[8] == 0x41 && c[9] == 0x81 && c[10] == 0x7f) || /* the entry barrier's cmp */
	    (c[0] == 0x41 && c[1] == 0x81 && c[2] == 0x7f))	 /* and its jump */
		return WS_LEAF_WHOLE;
	return WS_LEAF_RET_ON_TOP;
}

/* The rule that steps out of the frame at `pc` (`leaf`: the innermost
 * frame, which may be stopped anywhere, even before its frame is set up)
 * if `pc` is in one of the walked JVM's code heaps. */
static __always_inline enum ws_java_found ws_java_rule(struct ws_unwind_walk *w, __u64 pc,
						       bool leaf, struct ws_unwind_row *row,
						       struct task_struct *task)
{
	const struct ws_java_code *j = &w->proc.java;
	const struct ws_java_heap *h = NULL;
	struct ws_segmap_ctx q = { .w = w, .task = task };
	__u64 blob, code_begin;
	__s64 frame_size = 0, complete = 0, code = 0;
	__u32 log2;

	for (int i = 0; i < WS_JAVA_MAX_HEAPS; i++) {
		if (i >= j->heap_count)
			break;
		if (pc >= j->heaps[i].low && pc < j->heaps[i].high) {
			h = &j->heaps[i];
			break;
		}
	}
	if (!h)
		return WS_JAVA_NOT_CODE;
	log2 = h->log2_segment;
	if (log2 < 4 || log2 > 16)
		return WS_JAVA_REFUSED;
	w->seg_map = h->segmap;
	w->seg_at = (pc - h->low) >> log2;
	w->seg_first = 0;
	w->seg_len = 0;
	w->seg_reads = 0;
	w->seg_found = 0;
	bpf_loop(WS_JAVA_MAX_HOPS, task ? ws_segmap_hop_task : ws_segmap_hop, &q, 0);
	if (w->seg_found != 1)
		return WS_JAVA_REFUSED;
	blob = h->low + (w->seg_at << log2) + j->block_header;
	if (ws_read_user(w->blob, WS_JAVA_BLOB_HEADER, blob, task) ||
	    !ws_blob_int(w, j->frame_size, 4, &frame_size) ||
	    !ws_blob_int(w, j->frame_complete, j->frame_complete_width, &complete) ||
	    frame_size < 0 || frame_size > WS_JAVA_MAX_FRAME_WORDS)
		return WS_JAVA_REFUSED;
	if (j->code_is_offset) {
		if (!ws_blob_int(w, j->code, 4, &code))
			return WS_JAVA_REFUSED;
		code_begin = blob + code;
	} else {
		__u32 off = j->code;

		asm volatile("" : "+r"(off));
		if (off > WS_JAVA_BLOB_HEADER - 8)
			return WS_JAVA_REFUSED;
		code_begin = *(__u64 *)(w->blob + off);
	}
	row->cfa_reg = WS_CFA_RSP;
	row->rbp_rule = WS_RBP_SAME;
	row->rbp_off = 0;
	if (frame_size == 0) {
		/* No frame size (stubs): those that call or run long (array
		 * copies, the call stub) set up an rbp frame, which then points
		 * just above sp; else the innermost one returns from the top of
		 * the stack. Stepped by rbp without the frame-pointer chain's
		 * climbing check: the caller's rbp is compiled code's, any value. */
		if (w->bp >= w->sp && w->bp - w->sp < (1 << 16)) {
			row->cfa_reg = WS_CFA_RBP;
			row->cfa_off = 16;
			row->rbp_rule = WS_RBP_AT_CFA;
			row->rbp_off = -16;
		} else if (leaf) {
			row->cfa_off = 8;
		} else {
			return WS_JAVA_REFUSED;
		}
		return WS_JAVA_RULE;
	}
	ws_stat_inc(WS_STAT_JAVA_FRAMES);
	switch (leaf ? ws_java_leaf_shape(w, pc, complete > 0 && pc < code_begin + complete, task)
		     : WS_LEAF_WHOLE) {
	case WS_LEAF_RET_ON_TOP:
		row->cfa_off = 8;
		return WS_JAVA_RULE;
	case WS_LEAF_RBP_ON_TOP:
		row->cfa_off = 16;
		break;
	case WS_LEAF_RBP_UNSAVED:
		row->cfa_off = frame_size * 8;
		return WS_JAVA_RULE;
	default:
		row->cfa_off = frame_size * 8;
	}
	row->rbp_rule = WS_RBP_AT_CFA;
	row->rbp_off = -16;
	return WS_JAVA_RULE;
}

#endif /* WALLSCOPE_JAVA_BPF_H */
