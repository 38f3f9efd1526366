// A hung lock, as in an incident: the holder takes a mutex, then blocks
// reading a pipe nobody writes; four waiters pile up on the mutex; a
// bystander burns CPU (so the kernel's account has something to agree with).
// Usage: hung SECONDS [WAITERS] (4 waiters by default, at most 4). Prints "ready <pid>", then "holder <tid>" and
// "waiter <tid>" lines once every thread is in place; after SECONDS the main
// thread writes the pipe and everything ends, each thread printing its
// kernel account (account.h).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "account.h"

#define MAX_WAITERS 4

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t placed;
static int pipefd[2];
static volatile int stop;
static volatile unsigned long sink;

static void name_self(const char *name)
{
	pthread_setname_np(pthread_self(), name);
	printf("%s %ld\n", name, (long)syscall(SYS_gettid));
	fflush(stdout);
}

__attribute__((noinline)) void holder_reads_pipe(void)
{
	char c;
	if (read(pipefd[0], &c, 1) != 1)
		exit(1);
}

static void *holder(void *arg)
{
	name_self("holder");
	pthread_mutex_lock(&lock);
	pthread_barrier_wait(&placed);
	holder_reads_pipe();
	pthread_mutex_unlock(&lock);
	print_account();
	return NULL;
}

__attribute__((noinline)) void waiter_wants_lock(void)
{
	pthread_mutex_lock(&lock);
	pthread_mutex_unlock(&lock);
}

static void *waiter(void *arg)
{
	name_self("waiter");
	pthread_barrier_wait(&placed);
	waiter_wants_lock();
	print_account();
	return NULL;
}

__attribute__((noinline)) void bystander_spins(void)
{
	while (!stop)
		for (int i = 0; i < 100000; i++)
			sink = sink * 31 + i;
}

static void *bystander(void *arg)
{
	name_self("bystander");
	bystander_spins();
	print_account();
	return NULL;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 60;
	int waiters = argc > 2 ? atoi(argv[2]) : MAX_WAITERS;
	pthread_t threads[MAX_WAITERS + 2];

	if (waiters < 1 || waiters > MAX_WAITERS)
		return 2;

	if (pipe(pipefd))
		return 1;
	printf("ready %d\n", getpid());
	fflush(stdout);
	// The holder takes the lock before any waiter reaches for it.
	pthread_barrier_init(&placed, NULL, 2);
	pthread_create(&threads[0], NULL, holder, NULL);
	pthread_barrier_wait(&placed);
	pthread_barrier_destroy(&placed);
	pthread_barrier_init(&placed, NULL, waiters + 1);
	for (int i = 0; i < waiters; i++)
		pthread_create(&threads[i + 1], NULL, waiter, NULL);
	pthread_barrier_wait(&placed);
	pthread_create(&threads[waiters + 1], NULL, bystander, NULL);
	printf("placed\n");
	fflush(stdout);
	sleep(seconds);
	if (write(pipefd[1], "x", 1) != 1)
		return 1;
	stop = 1;
	for (int i = 0; i < waiters + 2; i++)
		pthread_join(threads[i], NULL);
	print_account();
	return 0;
}
