// A thread per request, as some JVM servers do: the main thread starts
// COUNT threads at PER_SECOND, each named "req-<n>", living LIFE_MS
// (asleep) and ending. Usage: thread_per_request COUNT PER_SECOND LIFE_MS.
// Prints "ready <pid>", then, once every thread has ended,
// "started <count>" (the threads it started).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long life_ms;

static void pause_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000 * 1000 };
	nanosleep(&ts, NULL);
}

static void *request(void *arg)
{
	char name[16];
	snprintf(name, sizeof(name), "req-%ld", (long)arg);
	pthread_setname_np(pthread_self(), name);
	pause_ms(life_ms);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s COUNT PER_SECOND LIFE_MS\n", argv[0]);
		return 2;
	}
	long count = atol(argv[1]), per_second = atol(argv[2]);
	life_ms = atol(argv[3]);
	if (count <= 0 || per_second <= 0 || life_ms < 0)
		return 2;
	pthread_t *threads = calloc(count, sizeof(*threads));
	if (!threads)
		return 1;
	printf("ready %d\n", getpid());
	fflush(stdout);
	long started = 0;
	for (long i = 0; i < count; i++) {
		if (pthread_create(&threads[i], NULL, request, (void *)(i + 1)) == 0)
			started++;
		else
			threads[i] = 0;
		pause_ms(1000 / per_second);
	}
	for (long i = 0; i < count; i++)
		if (threads[i])
			pthread_join(threads[i], NULL);
	printf("started %ld\n", started);
	return 0;
}
