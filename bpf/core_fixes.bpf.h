/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * What vmlinux.h (this build host's kernel BTF) does not give the programs
 * for every kernel they load on: the CO-RE shims for fields that other
 * kernel versions name or place differently (relocated at load, checked
 * with bpf_core_field_exists before use), and kernel #defines, which BTF
 * does not carry.
 */
#ifndef WALLSCOPE_CORE_FIXES_BPF_H
#define WALLSCOPE_CORE_FIXES_BPF_H

#include "vmlinux.h"

/* Kernels before 5.14: the task state field is `state`; `__state` since. */
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

/* Kernels 6.18+: task-based CFS bandwidth throttling marks the task itself
 * (`throttled`); before, only its group's cfs_rq->throttle_count tells. */
struct task_struct___throttle {
	bool throttled;
} __attribute__((preserve_access_index));

/* include/linux/sched.h */
#define PF_EXITING 0x00000004
#define PF_KTHREAD 0x00200000
#define TASK_RUNNING 0x0
#define TASK_INTERRUPTIBLE 0x1
#define TASK_UNINTERRUPTIBLE 0x2
#define TASK_NOLOAD 0x400

/* include/uapi/asm-generic/errno-base.h */
#ifndef EEXIST
#define EEXIST 17
#endif

#endif /* WALLSCOPE_CORE_FIXES_BPF_H */
