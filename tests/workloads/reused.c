// One pid, three programs, for the test that no cache of the daemon
// carries one program's frames, names or JVM state into the next.
//
// Every role spins, on a thread named "<role>-spin", in anonymous
// executable memory at one fixed address (JIT code, as the daemon sees
// it); argv is cosmetic (the daemon reads it as a `java` command line).
//   WS_ROLE=old  maps a file named libjvm.so (WS_LIBJVM), writes a perf
//                map naming the code `old_jit_frame`;
//   WS_ROLE=new  maps no libjvm and writes no perf map; on SIGUSR1 it
//                execs this binary again as WS_ROLE=exec with argv
//                `java -cp x com.example.ExecMain`;
//   WS_ROLE=exec maps libjvm.so again and names the code `exec_jit_frame`.
// WS_REUSE_PID=P: start the program (argv, minus this variable) as pid P,
// by setting ns_last_pid before forking (root), retrying while another
// process takes P first; then wait for it.
// Prints "ready <pid>" once spinning.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fork_as.h"

#define CODE_AT ((void *)0x7e5500000000UL)

static volatile sig_atomic_t exec_now;

static void on_usr1(int sig) {
    (void)sig;
    exec_now = 1;
}

static void *spin(void *name) {
    prctl(PR_SET_NAME, name);
    ((void (*)(void))CODE_AT)();
    return NULL;
}

static int launch_as(int want, char **argv) {
    unsetenv("WS_REUSE_PID");
    // A name of its own: the launcher waits while the program runs, and
    // its waiting is pushed too; the test tells programs by their names.
    prctl(PR_SET_NAME, "reuse-launcher");
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return 2;
    self[n] = 0;
    pid_t child = fork_as(want);
    if (child < 0)
        return 2;
    if (child == 0) {
        // Gone with the launcher, whatever it runs by then.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(self, argv);
        _exit(2);
    }
    int status;
    waitpid(child, &status, 0);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    const char *reuse = getenv("WS_REUSE_PID");
    if (reuse)
        return launch_as(atoi(reuse), argv);
    const char *role = getenv("WS_ROLE");
    if (!role)
        return 2;
    const char *libjvm = getenv("WS_LIBJVM");
    if (strcmp(role, "new") != 0 && (!libjvm || !dlopen(libjvm, RTLD_NOW))) {
        fprintf(stderr, "cannot map %s\n", libjvm ? libjvm : "(WS_LIBJVM unset)");
        return 2;
    }
    unsigned char *code = mmap(CODE_AT, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (code != CODE_AT)
        return 2;
    // pause; jmp back to the pause
    memcpy(code, "\xf3\x90\xeb\xfc", 4);
    const char *jit_name = strcmp(role, "old") == 0    ? "old_jit_frame"
                           : strcmp(role, "exec") == 0 ? "exec_jit_frame"
                                                       : NULL;
    if (jit_name) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
        FILE *map = fopen(path, "w");
        if (!map)
            return 2;
        fprintf(map, "%lx 4 %s\n", (unsigned long)CODE_AT, jit_name);
        fclose(map);
    }
    signal(SIGUSR1, on_usr1);
    static char thread_name[16];
    snprintf(thread_name, sizeof thread_name, "%s-spin", role);
    pthread_t t;
    pthread_create(&t, NULL, spin, thread_name);
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (int i = 0; i < 6000 && !exec_now; i++)
        usleep(100000);
    if (exec_now) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
            return 2;
        self[n] = 0;
        setenv("WS_ROLE", "exec", 1);
        char *args[] = {"java", "-cp", "x", "com.example.ExecMain", NULL};
        execv(self, args);
        return 2;
    }
    return 0;
}
