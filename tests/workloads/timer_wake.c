// A thread woken only by a timer, next to an unrelated busy thread on the
// same CPU: every timer interrupt lands on the busy thread, which must not
// be taken for the sleeper's waker.
// Usage: timer_wake SECONDS. Prints "ready <pid>" and "ticker <tid>".
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;
static volatile unsigned long sink;

static void pin_to_cpu0(const char *name)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(0, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	pthread_setname_np(pthread_self(), name);
}

__attribute__((noinline)) void ticker_naps(void)
{
	struct timespec nap = { 0, 2 * 1000 * 1000 };
	while (!stop)
		nanosleep(&nap, NULL);
}

static void *ticker(void *arg)
{
	pin_to_cpu0("ticker");
	printf("ticker %ld\n", (long)syscall(SYS_gettid));
	fflush(stdout);
	ticker_naps();
	return NULL;
}

__attribute__((noinline)) void hog_spins(void)
{
	while (!stop)
		for (int i = 0; i < 100000; i++)
			sink = sink * 31 + i;
}

static void *hog(void *arg)
{
	pin_to_cpu0("hog");
	hog_spins();
	return NULL;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 5;
	pthread_t t[2];

	printf("ready %d\n", getpid());
	fflush(stdout);
	pthread_create(&t[0], NULL, hog, NULL);
	pthread_create(&t[1], NULL, ticker, NULL);
	sleep(seconds);
	stop = 1;
	pthread_join(t[0], NULL);
	pthread_join(t[1], NULL);
	return 0;
}
