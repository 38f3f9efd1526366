// A lock convoy for /trace: `convoy-N` threads take one mutex in turn,
// spin a little holding it, release it and nap 1 ms, so each one blocks
// on the futex, is woken by the previous holder and waits its turn to run.
// A `napper` thread sleeps in 2 ms naps. Usage: convoy THREADS. Prints
// "ready <pid>" once every thread runs; runs until killed.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t started;
static volatile unsigned long sink;

static void nap(long ns)
{
	struct timespec t = {0, ns};
	nanosleep(&t, NULL);
}

__attribute__((noinline)) static void spin(long ns)
{
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do {
		for (int i = 0; i < 1000; i++)
			sink += i;
		clock_gettime(CLOCK_MONOTONIC, &b);
	} while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < ns);
}

__attribute__((noinline)) static void *convoy(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&started);
	for (;;) {
		pthread_mutex_lock(&lock);
		spin(300 * 1000);
		pthread_mutex_unlock(&lock);
		nap(1000 * 1000);
	}
	return NULL;
}

__attribute__((noinline)) static void *napper(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&started);
	for (;;)
		nap(2 * 1000 * 1000);
	return NULL;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4;
	pthread_t t;
	char name[16];

	if (n < 1 || n > 64)
		n = 4;
	pthread_barrier_init(&started, NULL, n + 2);
	for (int i = 0; i < n; i++) {
		pthread_create(&t, NULL, convoy, NULL);
		snprintf(name, sizeof(name), "convoy-%d", i);
		pthread_setname_np(t, name);
	}
	pthread_create(&t, NULL, napper, NULL);
	pthread_setname_np(t, "napper");
	pthread_barrier_wait(&started);
	printf("ready %d\n", getpid());
	fflush(stdout);
	for (;;)
		pause();
}
