// Processes of two users around one another, for the test that a user
// other than root reads other users' processes only as counts
// (tests/e2e/security_disclosure.rs). Prints "ready <pid>", then:
//   disclose hog FILE SECONDS    spins on CPU 0 (keeps others off it),
//                                FILE (not ELF: no unwind table can be
//                                built for it) mapped executable
//   disclose spin SECONDS        spins on any CPU
//   disclose waker FIFO SECONDS  writes a byte to FIFO every 2 ms (wakes
//                                its reader)
//   disclose own FIFO SECONDS    a thread `own-spin` spins on CPU 0, the
//                                main thread reads FIFO (woken by a waker)
//   disclose sleep SECONDS       sleeps
//   disclose reuse PID UID SECONDS (run by its full path)
//                                (root) starts `disclose sleep SECONDS` as
//                                pid PID and user UID, by setting
//                                ns_last_pid before forking, retrying while
//                                another process takes PID first; waits
//                                for it (it prints the ready line).
#define _GNU_SOURCE
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fork_as.h"

static double until;
static volatile unsigned long sink;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void ready(void)
{
	printf("ready %d\n", getpid());
	fflush(stdout);
}

static void pin0(void)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(0, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

static void spin(void)
{
	while (now() < until) {
		unsigned long x = sink;
		for (int i = 0; i < 100000; i++)
			x = x * 2862933555777941757UL + 3037000493UL;
		sink = x;
	}
}

static void *own_spin(void *arg)
{
	(void)arg;
	prctl(PR_SET_NAME, "own-spin");
	pin0();
	spin();
	return NULL;
}

// Runs `self` (this program, by the path it was started with) as above.
static int reuse(const char *self, int want, int uid, const char *seconds)
{
	pid_t child = fork_as(want);
	if (child < 0)
		return 2;
	if (child == 0) {
		// After the change of user, which clears the death signal.
		if (setgroups(0, NULL) || setresgid(uid, uid, uid) ||
		    setresuid(uid, uid, uid))
			_exit(4);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(5);
		execl(self, self, "sleep", seconds, (char *)NULL);
		_exit(2);
	}
	waitpid(child, NULL, 0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: disclose ROLE [ARGS] SECONDS\n");
		return 2;
	}
	const char *role = argv[1];
	until = now() + atof(argv[argc - 1]);
	if (!strcmp(role, "reuse") && argc == 5)
		return reuse(argv[0], atoi(argv[2]), atoi(argv[3]), argv[4]);
	if (!strcmp(role, "spin")) {
		ready();
		spin();
		return 0;
	}
	if (!strcmp(role, "hog") && argc == 4) {
		int fd = open(argv[2], O_RDONLY);
		if (fd < 0 || mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED)
			return 2;
		pin0();
		ready();
		spin();
		return 0;
	}
	if (!strcmp(role, "sleep")) {
		ready();
		while (now() < until)
			usleep(100000);
		return 0;
	}
	if (argc != 4)
		return 2;
	if (!strcmp(role, "waker")) {
		int fd = open(argv[2], O_WRONLY);
		if (fd < 0)
			return 2;
		ready();
		while (now() < until) {
			if (write(fd, "x", 1) != 1)
				return 2;
			usleep(2000);
		}
		return 0;
	}
	if (!strcmp(role, "own")) {
		// Read-write: the open does not wait for a writer.
		int fd = open(argv[2], O_RDWR);
		if (fd < 0)
			return 2;
		pthread_t t;
		pthread_create(&t, NULL, own_spin, NULL);
		ready();
		char c;
		while (now() < until && read(fd, &c, 1) == 1)
			;
		return 0;
	}
	return 2;
}
