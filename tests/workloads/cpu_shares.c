// CPU-bound workload whose three functions take 60/30/10 % of its CPU.
// Usage: cpu_shares SECONDS [THREADS [cpu]]: with `cpu`, each thread runs
// until it had SECONDS of CPU, however long a busy host makes that take.
// Prints "ready <pid>" once running and "iterations <n>" (total across
// threads) at the end, so benchmarks can use it as a throughput measure,
// and the kernel's account of each thread as it ends (account.h).
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "account.h"

static volatile unsigned long sink;
static double seconds;
static clockid_t clock_id = CLOCK_MONOTONIC;

// One unit of work; each function below runs it its share of times, inline
// in its own body so samples land in that function.
#define UNIT()                                                                 \
	do {                                                                   \
		unsigned long x = sink;                                        \
		for (int i = 0; i < 20000; i++)                                \
			x = x * 6364136223846793005UL + 1442695040888963407UL; \
		sink = x;                                                      \
	} while (0)

__attribute__((noinline)) void heavy(void) { for (int i = 0; i < 6; i++) UNIT(); }
__attribute__((noinline)) void medium(void) { for (int i = 0; i < 3; i++) UNIT(); }
__attribute__((noinline)) void light(void) { UNIT(); }

static double now(void)
{
	struct timespec ts;
	clock_gettime(clock_id, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void *run(void *arg)
{
	unsigned long *iterations = arg;
	double end = now() + seconds;
	while (now() < end) {
		heavy();
		medium();
		light();
		(*iterations)++;
	}
	print_account();
	return NULL;
}

int main(int argc, char **argv)
{
	seconds = argc > 1 ? atof(argv[1]) : 5;
	int threads = argc > 2 ? atoi(argv[2]) : 1;
	if (argc > 3 && strcmp(argv[3], "cpu") == 0)
		clock_id = CLOCK_THREAD_CPUTIME_ID;
	if (threads < 1 || threads > 256 || seconds <= 0) {
		fprintf(stderr, "usage: cpu_shares SECONDS [THREADS]\n");
		return 2;
	}
	printf("ready %d\n", getpid());
	fflush(stdout);
	pthread_t tids[256];
	unsigned long counts[256] = {0};
	for (int i = 1; i < threads; i++)
		pthread_create(&tids[i], NULL, run, &counts[i]);
	run(&counts[0]);
	unsigned long total = counts[0];
	for (int i = 1; i < threads; i++) {
		pthread_join(tids[i], NULL);
		total += counts[i];
	}
	printf("iterations %lu\n", total);
	return 0;
}
