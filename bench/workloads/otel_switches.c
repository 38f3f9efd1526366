/* A switch-heavy OpenTelemetry thread-context writer (OTEP 4947, static
 * TLS in the executable) for bench/otelctx.rs: THREADS threads nap 20 us
 * in a loop, each under a span that changes every 100 naps. Prints its
 * variable's offset from the thread pointer, then runs until killed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "otel_record.h"

#define THREADS 2

static __thread struct otel_record records[2];

static void *worker(void *arg)
{
	struct timespec nap = { 0, 20000 };
	uint64_t span = (uint64_t)(uintptr_t)arg << 48;

	for (uint64_t i = 0;; i++) {
		if (i % 100 == 0) {
			/* Fill the record not in use, then publish it. */
			struct otel_record *r = &records[(i / 100) & 1];

			span++;
			memset(r, 0, sizeof(*r));
			memset(r->trace_id, 0x42, sizeof(r->trace_id));
			memcpy(r->span_id, &span, sizeof(span));
			r->valid = 1;
			r->attrs[0] = 0;
			r->attrs[1] = 4;
			memcpy(r->attrs + 2, "/api", 4);
			r->attrs_size = 6;
			__atomic_store_n(&otel_thread_ctx_v1, r, __ATOMIC_RELEASE);
		}
		nanosleep(&nap, NULL);
	}
	return NULL;
}

int main(void)
{
	uintptr_t tp;
	pthread_t t;

	__asm__("mov %%fs:0, %0" : "=r"(tp));
	printf("tp_offset %ld\n", (long)((uintptr_t)&otel_thread_ctx_v1 - tp));
	fflush(stdout);
	for (int i = 1; i < THREADS; i++)
		pthread_create(&t, NULL, worker, (void *)(intptr_t)i);
	worker((void *)0);
	return 0;
}
