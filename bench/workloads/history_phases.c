// The history bench's process whose stacks change (bench/history.rs):
// THREADS `phase-N` threads each go through three call chains in turn, a
// new one every 20 s (staggered per thread), each a little CPU and a sleep
// at a depth that changes every phase, so what a thread's stacks are
// changes over the run; and two `writer-N` threads write 64 KiB to a file
// in DIR and fdatasync it, over and over (I/O waits). Prints
// "ready <pid>" once every thread runs; runs until killed.
// Usage: history_phases THREADS DIR.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PHASE_S 20
#define WRITE_BYTES (64 * 1024)

static volatile unsigned long sink;
static const char *dir;

static void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

__attribute__((noinline)) static void crunch(int rounds)
{
	unsigned long x = sink;
	for (int i = 0; i < rounds * 1000; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	sink = x;
}

// Recurses `depth` frames, then works and sleeps at the bottom.
__attribute__((noinline)) static void descend(int depth, long ms)
{
	if (depth > 0)
		descend(depth - 1, ms);
	else {
		crunch(20);
		nap_ms(ms);
	}
	sink++;
}

__attribute__((noinline)) static void phase_parse(int depth) { descend(depth, 30); }
__attribute__((noinline)) static void phase_index(int depth) { descend(depth, 50); }
__attribute__((noinline)) static void phase_flush(int depth) { crunch(50); descend(depth, 80); }

static void *phases(void *arg)
{
	long n = (long)arg;
	char name[16];

	snprintf(name, sizeof(name), "phase-%ld", n);
	pthread_setname_np(pthread_self(), name);
	for (;;) {
		long phase = (time(NULL) + n * 7) / PHASE_S;
		int depth = (int)(phase % 5) + 1;
		switch (phase % 3) {
		case 0: phase_parse(depth); break;
		case 1: phase_index(depth); break;
		default: phase_flush(depth); break;
		}
	}
	return NULL;
}

__attribute__((noinline)) static void write_and_sync(int fd, const char *buf)
{
	if (pwrite(fd, buf, WRITE_BYTES, 0) == WRITE_BYTES)
		fdatasync(fd);
}

static void *writer(void *arg)
{
	long n = (long)arg;
	char name[16], path[4096];
	static char buf[WRITE_BYTES];

	snprintf(name, sizeof(name), "writer-%ld", n);
	pthread_setname_np(pthread_self(), name);
	snprintf(path, sizeof(path), "%s/history_phases.%d.%ld", dir, getpid(), n);
	int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
	if (fd < 0) {
		perror(path);
		exit(1);
	}
	unlink(path);
	memset(buf, (int)n, sizeof(buf));
	for (;;) {
		write_and_sync(fd, buf);
		nap_ms(20);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3 || atol(argv[1]) <= 0) {
		fprintf(stderr, "usage: history_phases THREADS DIR\n");
		return 2;
	}
	long threads = atol(argv[1]);
	pthread_t t;

	dir = argv[2];
	for (long i = 0; i < threads; i++)
		if (pthread_create(&t, NULL, phases, (void *)i))
			return 1;
	for (long i = 0; i < 2; i++)
		if (pthread_create(&t, NULL, writer, (void *)i))
			return 1;
	printf("ready %d\n", getpid());
	fflush(stdout);
	for (;;)
		pause();
}
