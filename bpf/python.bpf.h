/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * CPython frames. The interpreter's frames are data, not native frames:
 * every Python function runs in a native _PyEval_EvalFrameDefault frame
 * (3.11+: several Python calls share one), so the native walk alone shows
 * the interpreter, never the user's code. The thread's PyThreadState (from
 * `python_threads`, which user space keeps from the interpreter's thread
 * list) leads to its innermost frame; each frame to its code object and
 * its caller. The walk records the code objects, innermost first, with a
 * marker after each eval-loop call's frames, and appends them after the
 * native frames; user space names the code objects and puts each call's
 * frames in place of its native eval frame.
 *
 * Python frames are walked before the native ones and keep their room in
 * the stack: a deep native stack is cut at the outer end, never the
 * Python frames that explain it. Everything read belongs to the walked
 * process: frames are bounded (WS_PY_MAX_FRAMES), a chain that loops or
 * leaves user memory ends the walk (WS_PY_CUT, counted).
 */
#ifndef WALLSCOPE_PYTHON_BPF_H
#define WALLSCOPE_PYTHON_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "arch.bpf.h"
#include "maps.bpf.h"
#include "walk.bpf.h"
#include "wallscope.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, WS_PY_THREADS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ws_py_thread_key);
	__type(value, __u64);
} python_threads SEC(".maps");

/* User addresses stay below 2^47. */
#define WS_PY_USER_END (1ULL << 47)

/* Appends one entry to the walk's Python frames; false when full. */
static __always_inline bool ws_py_push(struct ws_unwind_walk *w, __u64 entry)
{
	__u32 len = w->py_len;

	if (len >= WS_PY_MAX_FRAMES)
		return false;
	w->py[len & (WS_PY_MAX_FRAMES - 1)] = entry;
	w->py_len = len + 1;
	return true;
}

/* The word at `off` of the frame read last (false: outside the read). */
static __always_inline bool ws_py_word(struct ws_unwind_walk *w, __u32 off, __u64 *out)
{
	asm volatile("" : "+r"(off));
	if (off > WS_PY_FRAME_READ - 8)
		return false;
	*out = *(__u64 *)(w->py_buf + off);
	return true;
}

static __always_inline bool ws_py_byte(struct ws_unwind_walk *w, __u32 off, __u8 *out)
{
	asm volatile("" : "+r"(off));
	if (off > WS_PY_FRAME_READ - 1)
		return false;
	*out = w->py_buf[off];
	return true;
}

/* Ends the chain with WS_PY_CUT (the last slot is kept for it). */
static __always_inline long ws_py_cut(struct ws_unwind_walk *w)
{
	if (w->py_len >= WS_PY_MAX_FRAMES)
		w->py_len = WS_PY_MAX_FRAMES - 1;
	ws_py_push(w, WS_PY_CUT);
	ws_stat_inc(WS_STAT_PY_CUT);
	return 1;
}

/* One frame of the chain. Returns 1 when the walk ends. */
static __always_inline long ws_py_step_in(struct ws_unwind_walk *w, struct task_struct *task)
{
	const struct ws_python_code *py = &w->proc.python;
	__u64 frame = w->py_frame, code = 0, back = 0;
	__u8 entry = 0;

	if (!frame)
		return 1;
	if (frame >= WS_PY_USER_END || w->py_len >= WS_PY_MAX_FRAMES - 1 ||
	    ws_read_user(w->py_buf, WS_PY_FRAME_READ, frame, task) ||
	    !ws_py_word(w, py->frame_back, &back) || !ws_py_word(w, py->frame_code, &code) ||
	    (py->entry != WS_PY_ENTRY_EVERY && !ws_py_byte(w, py->frame_entry, &entry)) ||
	    back == frame)
		return ws_py_cut(w);
	w->py_frame = back;
	if (py->entry == WS_PY_ENTRY_SHIM && entry == py->shim_owner) {
		/* A shim under an eval-loop call's frames: they end here. */
		if (w->py_len && w->py[(w->py_len - 1) & (WS_PY_MAX_FRAMES - 1)] != WS_PY_EVAL_END)
			ws_py_push(w, WS_PY_EVAL_END);
		return 0;
	}
	if (code >= WS_PY_USER_END || code < 4096)
		return ws_py_cut(w);
	ws_py_push(w, WS_PY_FRAME_TAG | code);
	if (py->entry == WS_PY_ENTRY_EVERY || (py->entry == WS_PY_ENTRY_FLAG && entry))
		ws_py_push(w, WS_PY_EVAL_END);
	return 0;
}

struct ws_py_walk_ctx {
	struct ws_unwind_walk *w;
	struct task_struct *task; /* NULL: the current task */
};

static long ws_py_step(__u32 index, void *data)
{
	struct ws_py_walk_ctx *c = data;

	return ws_py_step_in(c->w, NULL);
}

static long ws_py_step_task(__u32 index, void *data)
{
	struct ws_py_walk_ctx *c = data;

	return ws_py_step_in(c->w, c->task);
}

/* Walks the Python frames of `t` (whose user registers are `regs`) into
 * w->py when its process has a registered interpreter and the thread a
 * known thread state; `task` as in ws_read_user. Leaves the native walk
 * the room they do not take. */
static __noinline void ws_python_walk(struct ws_unwind_walk *w, struct task_struct *t,
				   struct pt_regs *regs, struct task_struct *task)
{
	/* Little on this stack: the drain-time iterator calls it with its
	 * own near the combined limit (the key and frame live in `w`). */
	struct ws_py_walk_ctx c = { .w = w, .task = task };
	const struct ws_python_code *py = &w->proc.python;
	__u64 *tstate;

	w->py_len = 0;
	w->max_len = WS_MAX_STACK_DEPTH;
	if (!py->minor)
		return;
	w->py_key.pid = w->pid;
	w->py_key._pad = 0;
	w->py_key.thread_id = t->thread.fsbase;
	tstate = bpf_map_lookup_elem(&python_threads, &w->py_key);
	if (!tstate) {
		ws_stat_inc(WS_STAT_PY_THREAD_UNKNOWN);
		return;
	}
	ws_stat_inc(WS_STAT_PY_WALKS);
	/* Waiting on the GIL's lock or condition: the futex word is in it. */
	if (regs->orig_ax == WS_NR_FUTEX && regs->di >= py->gil_start && regs->di < py->gil_end)
		ws_py_push(w, WS_PY_GIL);
	if (ws_read_user(&w->py_frame, sizeof(w->py_frame), *tstate + py->tstate_frame, task))
		w->py_frame = 0;
	if (w->py_frame && py->cframe_frame != WS_PY_NO_FIELD &&
	    ws_read_user(&w->py_frame, sizeof(w->py_frame), w->py_frame + py->cframe_frame, task))
		w->py_frame = 0;
	bpf_loop(WS_PY_MAX_FRAMES, task ? ws_py_step_task : ws_py_step, &c, 0);
	w->max_len = WS_MAX_STACK_DEPTH - w->py_len;
}

struct ws_py_append_ctx {
	struct ws_unwind_walk *w;
	struct ws_stack *s;
};

static long ws_py_append_one(__u32 i, void *data)
{
	struct ws_py_append_ctx *c = data;
	struct ws_unwind_walk *w = c->w;
	struct ws_stack *s = c->s;
	__u32 at;

	if (!w || !s || i >= w->py_len)
		return 1;
	at = w->len;
	if (at >= WS_MAX_STACK_DEPTH)
		return 1;
	s->ips[at] = w->py[i & (WS_PY_MAX_FRAMES - 1)];
	w->len = at + 1;
	return 0;
}

/* Appends the Python frames after the native ones (not inlined: its
 * context would sit on the drain-time iterator's stack). */
static __noinline void ws_python_append(struct ws_unwind_walk *w, struct ws_stack *s)
{
	struct ws_py_append_ctx c = { .w = w, .s = s };

	if (w->py_len)
		bpf_loop(WS_PY_MAX_FRAMES, ws_py_append_one, &c, 0);
}

#endif /* WALLSCOPE_PYTHON_BPF_H */
