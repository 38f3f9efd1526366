// CPU-bound threads, optionally all pinned to one CPU (CPU starvation).
// Usage: starve THREADS SECONDS [CPU]. Prints "ready <pid>", and the
// kernel's account of each thread as it ends (account.h).
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "account.h"

static double seconds;
static int pin = -1;
static volatile unsigned long sink;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void crunch(void)
{
	unsigned long x = sink;
	for (int i = 0; i < 100000; i++)
		x = x * 2862933555777941757UL + 3037000493UL;
	sink = x;
}

static void *worker(void *arg)
{
	(void)arg;
	if (pin >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(pin, &set);
		pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	}
	pthread_setname_np(pthread_self(), "cruncher");
	double end = now() + seconds;
	while (now() < end)
		crunch();
	print_account();
	return NULL;
}

int main(int argc, char **argv)
{
	int threads = argc > 1 ? atoi(argv[1]) : 4;
	seconds = argc > 2 ? atof(argv[2]) : 5;
	pin = argc > 3 ? atoi(argv[3]) : -1;
	if (threads < 1 || threads > 64)
		return 2;
	printf("ready %d\n", getpid());
	fflush(stdout);
	pthread_t t[64];
	for (int i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	return 0;
}
