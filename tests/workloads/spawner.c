// A script-like parent that forks short-lived CPU-bound children: each
// execs this program again as `spawner child MS`, burns MS ms of CPU and
// exits. Usage: spawner PER_SECOND SECONDS MS [CPU] (CPU: the parent and
// so its children run on that CPU only). Prints "ready <pid>", then,
// once every child is reaped, the kernel's account of their CPU time:
// "children_cpu_us <n> children <count>".
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void burn(double seconds)
{
	double until = cpu_now() + seconds;
	unsigned long x = sink;
	while (cpu_now() < until)
		for (int i = 0; i < 10000; i++)
			x = x * 2862933555777941757UL + 3037000493UL;
	sink = x;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "child") == 0) {
		burn(atoi(argv[2]) / 1000.0);
		return 0;
	}
	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: spawner PER_SECOND SECONDS MS [CPU]\n");
		return 2;
	}
	if (argc == 5) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(atoi(argv[4]), &set);
		sched_setaffinity(0, sizeof(set), &set);
	}
	int per_second = atoi(argv[1]);
	double end = now() + atof(argv[2]), gap = 1.0 / per_second;
	long children = 0;
	// The program's own path: exec'd as /proc/self/exe, a child would be
	// named "exe".
	char self[4096];
	ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (len <= 0)
		return 1;
	self[len] = 0;
	printf("ready %d\n", getpid());
	fflush(stdout);
	for (double next = now(); now() < end; next += gap) {
		pid_t pid = fork();
		if (pid == 0) {
			execl(self, "spawner", "child", argv[3], (char *)NULL);
			_exit(127);
		}
		if (pid > 0)
			children++;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		double wait = next + gap - now();
		if (wait > 0) {
			struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
			nanosleep(&ts, NULL);
		}
	}
	while (wait(NULL) > 0)
		;
	struct rusage ru;
	getrusage(RUSAGE_CHILDREN, &ru);
	long us = ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec + ru.ru_stime.tv_sec * 1000000L +
		  ru.ru_stime.tv_usec;
	printf("children_cpu_us %ld children %ld\n", us, children);
	return 0;
}
