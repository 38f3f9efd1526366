// A request loop built with frame pointers: main -> handler -> one of
// three workers -> a shared leaf. Requests go to the workers in turn, and
// the work per request (leaf calls) makes their CPU shares 60/30/10.
// Usage: handler_shares SECONDS. Prints "ready <pid>", runs SECONDS of
// wall time, then "cpu_ns <a> <b> <c>": the kernel's account of the CPU
// each worker took (the thread's CPU clock around each call).
//
// Built as a C programmer would (`cc -O1 -fno-omit-frame-pointer`): GCC
// then leaves the frame pointer out of `leaf`, a leaf function (its
// default -momit-leaf-frame-pointer), so a frame-pointer walk from inside
// `leaf` skips the worker that called it.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;
static unsigned long long spent[3];

NOINLINE void leaf(void)
{
	unsigned long x = sink;

	for (int i = 0; i < 20000; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	sink = x;
}

NOINLINE void worker_a(void)
{
	for (int i = 0; i < 6; i++)
		leaf();
}

NOINLINE void worker_b(void)
{
	for (int i = 0; i < 3; i++)
		leaf();
}

NOINLINE void worker_c(void)
{
	leaf();
}

static unsigned long long clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

NOINLINE void handler(int request)
{
	unsigned long long from = clock_ns(CLOCK_THREAD_CPUTIME_ID);

	switch (request % 3) {
	case 0:
		worker_a();
		break;
	case 1:
		worker_b();
		break;
	default:
		worker_c();
	}
	spent[request % 3] += clock_ns(CLOCK_THREAD_CPUTIME_ID) - from;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 10;
	unsigned long long end = clock_ns(CLOCK_MONOTONIC) + (unsigned long long)(seconds * 1e9);

	printf("ready %d\n", getpid());
	fflush(stdout);
	for (int request = 0; clock_ns(CLOCK_MONOTONIC) < end; request++)
		handler(request);
	printf("cpu_ns %llu %llu %llu\n", spent[0], spent[1], spent[2]);
	return 0;
}
