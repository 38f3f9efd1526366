// Syscall-heavy workload: most of its CPU is spent in the kernel, copying
// /dev/zero into a buffer, called from user functions with frame pointers.
// Usage: syscalls SECONDS
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static char buf[1 << 20];

__attribute__((noinline)) long read_zeroes(int fd)
{
	return read(fd, buf, sizeof(buf));
}

__attribute__((noinline)) void copy_loop(int fd, double seconds)
{
	time_t end = time(NULL) + (time_t)seconds;
	while (time(NULL) < end)
		for (int i = 0; i < 100; i++)
			if (read_zeroes(fd) <= 0)
				exit(1);
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 5;
	int fd = open("/dev/zero", O_RDONLY);
	if (fd < 0)
		return 1;
	printf("ready %d\n", getpid());
	fflush(stdout);
	copy_loop(fd, seconds);
	return 0;
}
