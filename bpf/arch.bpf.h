/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * What depends on the CPU architecture. The programs are x86-64's: besides
 * the syscall numbers below, they read x86-64 registers (pt_regs ip, sp,
 * bp, orig_ax in task.bpf.h, memo.bpf.h, unwind.bpf.h), the unwinder
 * follows x86-64's frame layout and HotSpot's x86-64 interpreter frames.
 * build.rs sets __TARGET_ARCH_* from the Rust target.
 */
#ifndef WALLSCOPE_ARCH_BPF_H
#define WALLSCOPE_ARCH_BPF_H

#if defined(__TARGET_ARCH_x86)
/* arch/x86/entry/syscalls/syscall_64.tbl */
#define WS_NR_FUTEX 202
#define WS_NR_FUTEX_WAITV 449
#else
#error "wallscope's BPF programs support x86-64 only (see bpf/arch.bpf.h)"
#endif

#endif /* WALLSCOPE_ARCH_BPF_H */
