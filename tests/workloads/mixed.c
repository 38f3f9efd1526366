// Four kinds of threads, each named for what it should mostly do:
//   lock-N   contend on one pthread mutex held for long stretches (futex)
//   sleeper  nanosleep in a loop (sleep)
//   reader   blocked reading a pipe the main thread writes slowly (sleep)
//   spinner  burns CPU (cpu)
// Usage: mixed SECONDS. Prints "ready <pid>", runs for SECONDS, then prints
// "life <tid> <microseconds>" for every thread: how long it really lived,
// and the kernel's account of each (account.h).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "account.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int stop;
static volatile unsigned long sink;
static int pipefd[2];

#define THREADS 6
static struct life {
	long tid;
	struct timespec start, end;
} lives[THREADS];
static int next_life;

/* Names the calling thread and notes when it started. */
static struct life *name_self(const char *name)
{
	struct life *l = &lives[__atomic_fetch_add(&next_life, 1, __ATOMIC_SEQ_CST)];
	clock_gettime(CLOCK_MONOTONIC, &l->start);
	l->tid = syscall(SYS_gettid);
	pthread_setname_np(pthread_self(), name);
	return l;
}

static void end_life(struct life *l)
{
	clock_gettime(CLOCK_MONOTONIC, &l->end);
	print_account();
}

static void spin_ms(int ms)
{
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do {
		for (int i = 0; i < 1000; i++)
			sink = sink * 31 + i;
		clock_gettime(CLOCK_MONOTONIC, &b);
	} while ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < ms);
}

/* Where the lock threads park: the frame a flame graph search looks for. */
__attribute__((noinline)) void contend_on_mutex(void)
{
	pthread_mutex_lock(&lock);
	__asm__ volatile("" ::: "memory"); /* no tail call: keep this frame */
}

__attribute__((noinline)) void hold_lock(void)
{
	contend_on_mutex();
	struct timespec ts = { 0, 50 * 1000 * 1000 };
	nanosleep(&ts, NULL); /* holding the lock, off-CPU: others wait on it */
	pthread_mutex_unlock(&lock);
}

static void *locker(void *arg)
{
	struct life *l = name_self(arg);
	/* A pause between turns, so that the lock goes round: glibc's mutex
	 * is unfair, and a thread that relocks at once can keep it for a
	 * while, sleeping more than it waits. */
	struct timespec pause = { 0, 1000 * 1000 };
	while (!stop) {
		hold_lock();
		nanosleep(&pause, NULL);
	}
	end_life(l);
	return NULL;
}

__attribute__((noinline)) void nap(void)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };
	nanosleep(&ts, NULL);
}

static void *sleeper(void *arg)
{
	struct life *l = name_self(arg);
	while (!stop)
		nap();
	end_life(l);
	return NULL;
}

__attribute__((noinline)) long wait_for_data(char *buf)
{
	return read(pipefd[0], buf, 1);
}

static void *reader(void *arg)
{
	char c;
	struct life *l = name_self(arg);
	while (wait_for_data(&c) > 0)
		;
	end_life(l);
	return NULL;
}

__attribute__((noinline)) void burn(void)
{
	spin_ms(100);
}

static void *spinner(void *arg)
{
	struct life *l = name_self(arg);
	while (!stop)
		burn();
	end_life(l);
	return NULL;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 5;
	pthread_t t[THREADS];
	if (pipe(pipefd))
		return 1;
	printf("ready %d\n", getpid());
	fflush(stdout);
	pthread_create(&t[0], NULL, locker, "lock-1");
	pthread_create(&t[1], NULL, locker, "lock-2");
	pthread_create(&t[2], NULL, locker, "lock-3");
	pthread_create(&t[3], NULL, sleeper, "sleeper");
	pthread_create(&t[4], NULL, reader, "reader");
	pthread_create(&t[5], NULL, spinner, "spinner");
	struct timespec tick = { 0, 200 * 1000 * 1000 };
	for (int i = 0; i < seconds * 5; i++) {
		nanosleep(&tick, NULL);
		if (write(pipefd[1], "x", 1) != 1)
			return 1;
	}
	stop = 1;
	close(pipefd[1]);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < THREADS; i++) {
		struct life *l = &lives[i];
		long us = (l->end.tv_sec - l->start.tv_sec) * 1000000L +
			  (l->end.tv_nsec - l->start.tv_nsec) / 1000;
		printf("life %ld %ld\n", l->tid, us);
	}
	return 0;
}
