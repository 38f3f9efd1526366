// What a local unprivileged user can do to a profiler running as root
// (tests/security.rs runs it as `nobody`). Prints `ready <pid>`, waits a
// second (time for the test to plant files), then runs until killed:
//   attacker anonexec        spin in anonymous executable memory (JIT-like),
//                            so the profiler looks for /tmp/perf-PID.map
//   attacker fakejvm LIB     map LIB (a file named libjvm.so) executable and
//                            catch SIGQUIT: looks like a HotSpot JVM
//   attacker mapbig FILE     map FILE (huge, sparse) executable and spin
//   attacker burn MS         burn MS ms of CPU and exit (no ready line)
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void spin(void) {
    for (;;)
        for (int i = 0; i < 1000000; i++) sink += i;
}

static void burn(double seconds) {
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 10000; i++) sink += i;
}

static void on_quit(int sig) { (void)sig; }

static void map_exec(const char *path) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(path);
        exit(1);
    }
    if (mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
}

static void ready(void) {
    printf("ready %d\n", getpid());
    fflush(stdout);
    sleep(1);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "burn") && argc > 2) {
        burn(atoi(argv[2]) / 1000.0);
        return 0;
    }
    if (!strcmp(mode, "anonexec")) {
        // `jmp .`: the CPU stays in anonymous executable memory.
        unsigned char *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (code == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        code[0] = 0xeb;
        code[1] = 0xfe;
        ready();
        ((void (*)(void))code)();
        return 0;
    }
    if (!strcmp(mode, "fakejvm") && argc > 2) {
        map_exec(argv[2]);
        signal(SIGQUIT, on_quit);
        ready();
        spin();
    }
    if (!strcmp(mode, "mapbig") && argc > 2) {
        map_exec(argv[2]);
        ready();
        spin();
    }
    fprintf(stderr, "usage: attacker anonexec | fakejvm LIB | mapbig FILE | burn MS\n");
    return 2;
}
