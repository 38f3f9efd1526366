// The kernel's own account of the calling thread, for tests to compare the
// daemon's figures with: how much CPU the thread got depends on how busy
// the host is, but the daemon must agree with the kernel whatever it was.
#ifndef ACCOUNT_H
#define ACCOUNT_H
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

// Prints "account <tid> <cpu_ns> <runqueue_ns> <runs> <voluntary_switches>"
// from /proc/thread-self/schedstat (time on CPU, time waiting on a
// runqueue, times put on a CPU) and /proc/thread-self/status. Call it last
// thing before the thread ends.
static void print_account(void)
{
	unsigned long long cpu = 0, wait = 0, runs = 0, voluntary = 0;
	FILE *f = fopen("/proc/thread-self/schedstat", "r");
	if (f) {
		if (fscanf(f, "%llu %llu %llu", &cpu, &wait, &runs) != 3)
			cpu = wait = runs = 0;
		fclose(f);
	}
	f = fopen("/proc/thread-self/status", "r");
	if (f) {
		char line[256];
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "voluntary_ctxt_switches: %llu", &voluntary) == 1)
				break;
		fclose(f);
	}
	printf("account %ld %llu %llu %llu %llu\n", (long)syscall(SYS_gettid), cpu, wait, runs,
	       voluntary);
}
#endif
