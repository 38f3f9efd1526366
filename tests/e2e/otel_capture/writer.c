/* An OpenTelemetry thread-context writer per OTEP 4947, its TLS variable
 * in the executable (static TLS), or in a library loader.c loads with
 * dlopen (-DWRITER_LIBRARY: dynamic TLS): two threads, each running SPANS spans
 * of a CPU part and a sleep, with a pause under no span between them.
 * Prints where its variable is (the executable: its offset from the thread
 * pointer; the library: loader.c says), waits for a line
 * on stdin, then one line per span: id, tid, duration (ns). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "otel_record.h"

#define SPANS 12
#define WORKERS 2

static __thread struct otel_record record;

static uint64_t clock_ns(clockid_t clock)
{
	struct timespec t;

	clock_gettime(clock, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static uint64_t now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

/* Runs for ns of this thread's CPU time, not of wall time: on a busy host
 * a wall-time spin may get the CPU for none of it, and a span with no CPU
 * sample would fail the test for the host's load. */
static void spin(uint64_t ns)
{
	uint64_t end = clock_ns(CLOCK_THREAD_CPUTIME_ID) + ns;

	while (clock_ns(CLOCK_THREAD_CPUTIME_ID) < end)
		;
}

static void nap(uint64_t ns)
{
	struct timespec t = { 0, (long)ns };

	nanosleep(&t, NULL);
}

static void *worker(void *arg)
{
	int w = (int)(intptr_t)arg;
	char route[8];
	int n = snprintf(route, sizeof(route), "/w%d", w);

	for (int i = 0; i < SPANS; i++) {
		/* Written while no reader can see it (the pointer is NULL). */
		memset(&record, 0, sizeof(record));
		memset(record.trace_id, 0x10 + w, sizeof(record.trace_id));
		record.span_id[0] = 0xa0 + w;
		record.span_id[7] = i + 1;
		record.valid = 1;
		record.flags = 1;
		record.attrs[0] = 0;
		record.attrs[1] = n;
		memcpy(record.attrs + 2, route, n);
		record.attrs_size = 2 + n;
		uint64_t start = now_ns();
		__atomic_store_n(&otel_thread_ctx_v1, &record, __ATOMIC_RELEASE);
		spin(20000000);
		nap(30000000);
		__atomic_store_n(&otel_thread_ctx_v1, NULL, __ATOMIC_RELEASE);
		uint64_t end = now_ns();
		/* One line in one write: the workers print at once. */
		char id[17];
		for (int b = 0; b < 8; b++)
			snprintf(id + 2 * b, 3, "%02x", record.span_id[b]);
		flockfile(stdout);
		printf("span %s %d %llu\n", id, gettid(), (unsigned long long)(end - start));
		fflush(stdout);
		funlockfile(stdout);
		nap(20000000);
	}
	return NULL;
}

/* Waits for the go line, then runs the workers. */
static int run(void)
{
	char line[8];
	pthread_t threads[WORKERS];

	if (!fgets(line, sizeof(line), stdin))
		return 1;
	for (int w = 0; w < WORKERS; w++)
		pthread_create(&threads[w], NULL, worker, (void *)(intptr_t)w);
	for (int w = 0; w < WORKERS; w++)
		pthread_join(threads[w], NULL);
	return 0;
}

#ifdef WRITER_LIBRARY
/* Built as a library loaded with dlopen (loader.c): dynamic TLS. */
__attribute__((visibility("default"))) int writer_run(void)
{
	return run();
}
#else
int main(void)
{
	uintptr_t tp;

	__asm__("mov %%fs:0, %0" : "=r"(tp));
	printf("tp_offset %ld\n", (long)((uintptr_t)&otel_thread_ctx_v1 - tp));
	fflush(stdout);
	return run();
}
#endif
