// A lock-order deadlock between two pools: `alpha-N` threads take lock A
// then lock B, `beta-N` threads B then A, each holding the first while it
// waits a moment, so every thread ends up waiting for the other pool's.
// An idle pool `idle-N` waits on a condition variable meanwhile (waiting
// for work: not a deadlock). Usage: lockorder THREADS_PER_POOL. Prints
// "ready <pid>" once the deadlock is in place; runs until killed.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock_b = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t idle_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t no_work = PTHREAD_COND_INITIALIZER;
static pthread_barrier_t holding;

__attribute__((noinline)) static void take_in_order(pthread_mutex_t *first, pthread_mutex_t *second)
{
	pthread_mutex_lock(first);
	pthread_barrier_wait(&holding);
	pthread_mutex_lock(second);
	pthread_mutex_unlock(second);
	pthread_mutex_unlock(first);
}

__attribute__((noinline)) static void *alpha(void *arg)
{
	(void)arg;
	take_in_order(&lock_a, &lock_b);
	return NULL;
}

__attribute__((noinline)) static void *beta(void *arg)
{
	(void)arg;
	take_in_order(&lock_b, &lock_a);
	return NULL;
}

__attribute__((noinline)) static void *idle(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&idle_lock);
	for (;;)
		pthread_cond_wait(&no_work, &idle_lock);
	return NULL;
}

static void start(void *(*fn)(void *), const char *pool, int n)
{
	char name[16];
	pthread_t t;
	pthread_create(&t, NULL, fn, NULL);
	snprintf(name, sizeof(name), "%s-%d", pool, n);
	pthread_setname_np(t, name);
}

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	// One thread per pool takes its first lock before the other's second:
	// both first locks are held before either second lock is tried.
	pthread_barrier_init(&holding, NULL, 2);
	start(alpha, "alpha", 1);
	start(beta, "beta", 1);
	for (int i = 1; i <= 2; i++)
		start(idle, "idle", i);
	printf("ready %d\n", getpid());
	fflush(stdout);
	for (;;)
		pause();
}
