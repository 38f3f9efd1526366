/*
 * Many mostly sleeping threads, as a big thread-per-request server has:
 * each sleeps 200-300 ms in idle_wait, then works briefly in short_work.
 * Usage: many_threads COUNT SECONDS. Prints "ready PID" once all started.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;
static volatile int stop;

NOINLINE void short_work(void)
{
	for (int i = 0; i < 500; i++)
		sink += i;
}

NOINLINE void idle_wait(unsigned *seed)
{
	struct timespec ts = { 0, (200 + rand_r(seed) % 100) * 1000 * 1000 };

	nanosleep(&ts, NULL);
}

static void *worker(void *arg)
{
	unsigned seed = (unsigned)(unsigned long)arg;

	while (!stop) {
		idle_wait(&seed);
		short_work();
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int count = argc > 1 ? atoi(argv[1]) : 10000;
	int seconds = argc > 2 ? atoi(argv[2]) : 10;
	pthread_attr_t attr;
	pthread_t *threads = calloc(count, sizeof(*threads));
	int started = 0;

	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64 * 1024);
	for (int i = 0; i < count; i++)
		if (pthread_create(&threads[i], &attr, worker, (void *)(unsigned long)(i + 1)) == 0)
			started++;
	printf("ready %d\n", getpid());
	printf("threads %d\n", started);
	fflush(stdout);
	sleep(seconds);
	stop = 1;
	for (int i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	return 0;
}
