// Park/unpark churn: a pool of workers waits on a condition variable and is
// handed bursts of tiny tasks, one signal per task.
// Usage: churn WORKERS SECONDS. Prints "ready <pid>", and the kernel's
// account of each worker as it ends (account.h).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "account.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER;
static int queued, stop;
static volatile unsigned long sink;

__attribute__((noinline)) void tiny_task(void)
{
	for (int i = 0; i < 200; i++)
		sink += i;
}

static void *worker(void *arg)
{
	char name[16];
	snprintf(name, sizeof(name), "pool-worker-%ld", (long)arg);
	pthread_setname_np(pthread_self(), name);
	pthread_mutex_lock(&lock);
	while (!stop) {
		while (!queued && !stop)
			pthread_cond_wait(&ready, &lock);
		if (queued) {
			queued--;
			pthread_mutex_unlock(&lock);
			tiny_task();
			pthread_mutex_lock(&lock);
		}
	}
	pthread_mutex_unlock(&lock);
	print_account();
	return NULL;
}

/* The waker. Glibc has no frame pointers, so a frame-pointer walk from
 * inside pthread_cond_signal skips its immediate caller: wake_one is that
 * caller, and submit_burst the function a user should see. */
__attribute__((noinline)) void wake_one(void)
{
	pthread_cond_signal(&ready);
}

__attribute__((noinline)) void submit_burst(int tasks)
{
	for (int i = 0; i < tasks; i++) {
		pthread_mutex_lock(&lock);
		queued++;
		pthread_mutex_unlock(&lock);
		wake_one();
	}
}

int main(int argc, char **argv)
{
	long workers = argc > 1 ? atol(argv[1]) : 4;
	double seconds = argc > 2 ? atof(argv[2]) : 5;
	if (workers < 1 || workers > 64)
		return 2;
	printf("ready %d\n", getpid());
	fflush(stdout);
	pthread_t t[64];
	for (long i = 0; i < workers; i++)
		pthread_create(&t[i], NULL, worker, (void *)(i + 1));
	struct timespec gap = { 0, 2 * 1000 * 1000 };
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		submit_burst(8);
		nanosleep(&gap, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
	pthread_mutex_lock(&lock);
	stop = 1;
	pthread_cond_broadcast(&ready);
	pthread_mutex_unlock(&lock);
	for (long i = 0; i < workers; i++)
		pthread_join(t[i], NULL);
	return 0;
}
