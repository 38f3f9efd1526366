// The soak bench's process churn (bench/soak.rs): spawns RATE short-lived
// processes (/bin/true, or each PROGRAM in turn: the cost bench's distinct
// binaries) a second, paced on absolute deadlines, until SIGTERM; then
// prints "spawned N" and exits. A late tick (busy host) is not made up for
// with a burst: the schedule restarts from now.
// Usage: soak_spawner RATE [PROGRAM...].
#define _GNU_SOURCE
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static long long ns(const struct timespec *t)
{
	return t->tv_sec * 1000000000LL + t->tv_nsec;
}

int main(int argc, char **argv)
{
	long rate = argc > 1 ? atol(argv[1]) : 100;
	char *child[] = { "/bin/true", NULL };
	char **programs = argc > 2 ? argv + 2 : child;
	int count = argc > 2 ? argc - 2 : 1;
	unsigned long spawned = 0, failed = 0;
	struct timespec next, now;

	if (rate <= 0) {
		fprintf(stderr, "usage: soak_spawner RATE [PROGRAM...]\n");
		return 2;
	}
	signal(SIGTERM, on_term);
	long long step = 1000000000LL / rate;
	clock_gettime(CLOCK_MONOTONIC, &next);
	while (!stop) {
		pid_t pid;

		child[0] = programs[(spawned + failed) % count];
		if (posix_spawn(&pid, child[0], NULL, NULL, child, environ) == 0)
			spawned++;
		else
			failed++;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		long long t = ns(&next) + step;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (t < ns(&now) - 100000000LL)
			t = ns(&now);
		next.tv_sec = t / 1000000000LL;
		next.tv_nsec = t % 1000000000LL;
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	while (wait(NULL) > 0)
		;
	printf("spawned %lu failed %lu\n", spawned, failed);
	return 0;
}
