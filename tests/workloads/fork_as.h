// Forking a child with a chosen pid (root only): for tests of what a
// reused pid must not carry over from the process that had it before.
#ifndef FORK_AS_H
#define FORK_AS_H
#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

// Forks a child whose pid is `want`, by setting ns_last_pid to one less
// before each fork, retrying while another process takes `want` first
// (on a host busy forking, one may fork between the write and ours): for
// up to 30 s, in case that one lives a while. Returns 0 in the child,
// `want` in the parent, -1 if the pid stayed taken (or ns_last_pid cannot
// be written).
static pid_t fork_as(pid_t want)
{
	for (int tries = 0; tries < 30000; tries++) {
		FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
		if (!f)
			return -1;
		fprintf(f, "%d", want - 1);
		fclose(f);
		pid_t child = fork();
		if (child == 0) {
			if (getpid() != want)
				_exit(3);
			return 0;
		}
		if (child == want)
			return want;
		if (child > 0)
			waitpid(child, NULL, 0);
		usleep(1000);
	}
	fprintf(stderr, "pid %d stayed taken\n", want);
	return -1;
}
#endif
