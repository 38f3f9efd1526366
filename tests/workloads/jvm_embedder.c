// A program that maps a JVM's library without being the `java` launcher,
// as one that embeds a JVM (the JNI invocation API) does: its command
// line names the library, not a main class. Spins for SECONDS.
// Usage: jvm_embedder LIBJVM SECONDS. Prints "ready <pid>" once mapped.
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: jvm_embedder LIBJVM SECONDS\n");
		return 2;
	}
	// A JVM answers SIGQUIT with a thread dump; this one has none to give.
	signal(SIGQUIT, SIG_IGN);
	if (!dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL)) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	printf("ready %d\n", getpid());
	fflush(stdout);
	time_t end = time(NULL) + atoi(argv[2]);
	while (time(NULL) < end)
		for (int i = 0; i < 1000000; i++)
			sink = sink * 6364136223846793005UL + 1;
	return 0;
}
