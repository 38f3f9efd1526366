/*
 * Built WITHOUT frame pointers (-O2 -fomit-frame-pointer): only unwind
 * tables can walk it. The main thread burns CPU in main -> run -> stage_one
 * -> stage_two -> burn; a second thread sleeps in sleeper -> nap_outer ->
 * nap_inner -> nanosleep (glibc, no frame pointers either).
 * Usage: nofp SECONDS. Prints "ready PID", then "done".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;
static double seconds;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Keeps registers busy so the compiler spills and pushes: the CFA moves. */
NOINLINE unsigned long burn(unsigned long x)
{
	unsigned long a = x, b = x * 3, c = x * 5, d = x * 7, e = x * 11;

	for (int i = 0; i < 200000; i++) {
		a = a * 6364136223846793005UL + b;
		b ^= a >> 13;
		c += b * d;
		d ^= c << 7;
		e += a ^ d;
	}
	return a + b + c + d + e;
}

NOINLINE unsigned long stage_two(unsigned long x)
{
	unsigned long r = burn(x);

	sink += r;
	return r + 1;
}

NOINLINE unsigned long stage_one(unsigned long x)
{
	unsigned long r = stage_two(x ^ 0x9e37);

	sink ^= r;
	return r * 3;
}

NOINLINE void run(double until)
{
	unsigned long x = 1;

	while (now() < until)
		x = stage_one(x);
}

NOINLINE void nap_inner(void)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };

	nanosleep(&ts, NULL);
	sink++;
}

NOINLINE void nap_outer(double until)
{
	while (now() < until)
		nap_inner();
	sink++;
}

static void *sleeper(void *arg)
{
	nap_outer(*(double *)arg);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t;
	double until;

	seconds = argc > 1 ? atof(argv[1]) : 5;
	until = now() + seconds;
	pthread_create(&t, NULL, sleeper, &until);
	printf("ready %d\n", getpid());
	fflush(stdout);
	run(until);
	pthread_join(t, NULL);
	printf("done\n");
	return 0;
}
