/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Each process's share of the span maps: a process may add at most a
 * quarter of `span_records` and of `span_times` a second, so one that
 * floods span ids (a new one every few microseconds) fills neither map
 * for the others; what it is refused is counted.
 */
#ifndef WALLSCOPE_SPANQUOTA_BPF_H
#define WALLSCOPE_SPANQUOTA_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"
#include "wallscope.h"

/* A process's adds in the current second. */
struct ws_span_quota {
	__u64 second; /* bpf_ktime_get_ns() >> 30 */
	__u32 records;
	__u32 times;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, WS_OTEL_PROCS);
	__type(key, __u32);
	__type(value, struct ws_span_quota);
} span_quota SEC(".maps");

enum ws_span_map {
	WS_SPAN_MAP_RECORDS = 0,
	WS_SPAN_MAP_TIMES = 1,
};

/* Whether process `pid` may add one more entry to `which` this second. */
static __always_inline bool ws_span_quota_take(__u32 pid, enum ws_span_map which, __u64 now)
{
	struct ws_span_quota fresh = { .second = now >> 30 }, *q;
	__u32 n, limit;

	q = bpf_map_lookup_elem(&span_quota, &pid);
	if (!q) {
		bpf_map_update_elem(&span_quota, &pid, &fresh, BPF_NOEXIST);
		q = bpf_map_lookup_elem(&span_quota, &pid);
		if (!q)
			return true;
	}
	if (q->second != now >> 30) {
		/* A race here lets a few more through: harmless. */
		q->second = now >> 30;
		q->records = 0;
		q->times = 0;
	}
	if (which == WS_SPAN_MAP_RECORDS) {
		n = __sync_fetch_and_add(&q->records, 1);
		limit = WS_SPAN_RECORDS / 4;
	} else {
		n = __sync_fetch_and_add(&q->times, 1);
		limit = WS_SPAN_TIMES / 4;
	}
	if (n < limit)
		return true;
	ws_stat_inc(WS_STAT_SPAN_QUOTA_SPENT);
	return false;
}

#endif /* WALLSCOPE_SPANQUOTA_BPF_H */
