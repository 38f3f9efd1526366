/* A thread that spins at a fixed stack depth, for the walk microbenchmark
 * (bench/walk.rs): `deep N` recurses N times below main and spins there.
 * Built twice, with and without frame pointers. */
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink;
volatile int stop;

static unsigned long level(int left, unsigned long acc);
/* Called through a volatile pointer: the compiler can neither inline the
 * recursion nor turn it into a loop, so every level is a real frame. */
static unsigned long (*volatile next_level)(int, unsigned long) = level;

__attribute__((noinline)) static unsigned long level(int left, unsigned long acc)
{
	volatile char pad[24]; /* a frame of realistic size */

	pad[0] = (char)left;
	if (left > 0)
		return next_level(left - 1, acc + pad[0]) + pad[0];
	while (!stop)
		sink += acc++;
	return acc;
}

int main(int argc, char **argv)
{
	int levels = argc > 1 ? atoi(argv[1]) : 30;

	if (levels < 0 || levels > 1000) {
		fprintf(stderr, "usage: deep LEVELS (0..1000)\n");
		return 2;
	}
	return (int)level(levels, 0);
}
