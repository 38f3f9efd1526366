/*
 * A process that forks a short-lived child without exec (a pre-fork
 * server's worker): the parent spins, so wallscope registers it, then the
 * child naps in child_loop -> child_nap for two seconds and exits. Built
 * without frame pointers.
 * Usage: forker. Prints "ready PID", then "child PID".
 */
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;

NOINLINE void child_nap(void)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };

	nanosleep(&ts, NULL);
	sink++;
}

NOINLINE void child_loop(void)
{
	for (int i = 0; i < 100; i++)
		child_nap();
	sink++;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(void)
{
	double until = now() + 3;
	pid_t child;

	printf("ready %d\n", getpid());
	fflush(stdout);
	while (now() < until)
		sink++;
	child = fork();
	if (child == 0) {
		child_loop();
		_exit(0);
	}
	printf("child %d\n", child);
	fflush(stdout);
	waitpid(child, NULL, 0);
	return 0;
}
