// The soak bench's many-threads process (bench/soak.rs): THREADS threads on
// 64 KiB stacks (10,000 default-sized 8 MiB stacks would reserve 80 GB of
// address space), each sleeping 200-300 ms then doing a few microseconds of
// arithmetic, for ever: thousands of mostly sleeping threads, each with a
// sleep, a runqueue and now and then a CPU row per drain.
// Usage: soak_threads THREADS. Prints "ready <pid>" once every thread runs.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STACK_SIZE (64 * 1024)

static volatile unsigned long sink;

__attribute__((noinline)) static void little_work(unsigned long seed)
{
	for (int i = 0; i < 1000; i++)
		seed = seed * 6364136223846793005UL + (unsigned long)i;
	sink += seed;
}

static void *sleeper(void *arg)
{
	unsigned long x = (unsigned long)arg * 2654435761UL + 1;
	char name[16];

	snprintf(name, sizeof(name), "sleeper-%lu", (unsigned long)arg);
	pthread_setname_np(pthread_self(), name);
	for (;;) {
		// xorshift: a per-thread pseudo-random 200-300 ms nap, so the
		// wakeups spread over time instead of coming in waves.
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		struct timespec ts = { 0, (200 + (long)(x % 101)) * 1000 * 1000 };
		nanosleep(&ts, NULL);
		little_work(x);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	long threads = argc > 1 ? atol(argv[1]) : 10000;
	pthread_attr_t attr;
	int err;

	if (threads <= 0) {
		fprintf(stderr, "usage: soak_threads THREADS\n");
		return 2;
	}
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, STACK_SIZE);
	for (long i = 0; i < threads; i++) {
		pthread_t t;

		err = pthread_create(&t, &attr, sleeper, (void *)i);
		if (err) {
			fprintf(stderr, "thread %ld of %ld: %s\n", i, threads, strerror(err));
			return 1;
		}
	}
	printf("ready %d\n", getpid());
	fflush(stdout);
	for (;;)
		pause();
}
