/*
 * Process lifecycle workload. Built twice (tests/lifecycle.rs): plain, and
 * with -DVARIANT_B, which renames every function (variant_a_* becomes
 * variant_b_*) and shifts the code, so that frames read with the other
 * build's maps would be wrong or unknown.
 * Usage:
 *   lifecycle spin SECONDS            spin in VARIANT(spin)
 *   lifecycle brief MS                spin MS milliseconds, then exit
 *   lifecycle exec SECONDS PROG ARGS  spin, then exec PROG ARGS (same pid)
 * Prints "ready PID" first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef VARIANT_B
#define VARIANT(name) variant_b_##name
/* Moves the code below to other addresses than in the plain build. */
__attribute__((used)) static void padding(void)
{
	__asm__ volatile(".fill 65536, 1, 0x90");
}
#else
#define VARIANT(name) variant_a_##name
#endif

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

NOINLINE void VARIANT(spin)(double seconds)
{
	double end = now() + seconds;

	while (now() < end)
		for (int i = 0; i < 10000; i++)
			sink += i;
}

NOINLINE void VARIANT(brief)(double seconds)
{
	VARIANT(spin)(seconds);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s spin|brief|exec ARG...\n", argv[0]);
		return 2;
	}
	printf("ready %d\n", getpid());
	fflush(stdout);
	if (!strcmp(argv[1], "spin")) {
		VARIANT(spin)(atof(argv[2]));
	} else if (!strcmp(argv[1], "brief")) {
		VARIANT(brief)(atof(argv[2]) / 1000);
	} else if (!strcmp(argv[1], "exec") && argc >= 4) {
		VARIANT(spin)(atof(argv[2]));
		execv(argv[3], argv + 3);
		perror("execv");
		return 1;
	} else {
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}
	return 0;
}
