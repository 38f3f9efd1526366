// Runs a fake CPython (fake_libpython.c) for a profiler to read: dlopens
// LIB (default libpython3.12.so beside this binary), starts three threads
// alternating CPU bursts and sleep and two sleeping, and every 100 ms has the library rewrite
// its hostile interpreter state with all six threads' real ids, so that a
// reader walks the hostile frames of threads it samples. Prints
// `ready <pid>`, then runs until killed.
//   fake_python [LIB]
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SPINNERS 3
#define NAPPERS 2
#define THREADS (1 + SPINNERS + NAPPERS)

static uint64_t ids[THREADS];
static int tids[THREADS];
static pthread_barrier_t started;
static void (*nap)(int ms);

static void enter(int i) {
    ids[i] = (uint64_t)pthread_self();
    tids[i] = gettid();
    pthread_barrier_wait(&started);
}

// A few native frames under the spinning, for a walk to cross.
static __attribute__((noinline)) unsigned long burn(unsigned long x, int depth) {
    if (depth > 0)
        return burn(x * 6364136223846793005UL + 1, depth - 1) + 1;
    for (int i = 0; i < 1000000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

static void *spin(void *arg) {
    int i = (int)(intptr_t)arg;
    char name[16];
    snprintf(name, sizeof(name), "fake-spin-%d", i);
    pthread_setname_np(pthread_self(), name);
    enter(i);
    // Half the time on CPU (bursts of about 10 ms), half asleep: samples
    // both ways, and a 2-CPU host keeps room for the profiler.
    volatile unsigned long sink = 0;
    struct timespec rest = {0, 10 * 1000000L};
    for (;;) {
        for (int k = 0; k < 10; k++)
            sink += burn(sink, 4 + i);
        nanosleep(&rest, NULL);
    }
    return NULL;
}

static void *napper(void *arg) {
    int i = (int)(intptr_t)arg;
    char name[16];
    snprintf(name, sizeof(name), "fake-nap-%d", i);
    pthread_setname_np(pthread_self(), name);
    enter(i);
    for (;;)
        nap(50);
    return NULL;
}

int main(int argc, char **argv) {
    char lib[PATH_MAX];
    if (argc > 1) {
        snprintf(lib, sizeof(lib), "%s", argv[1]);
    } else {
        ssize_t n = readlink("/proc/self/exe", lib, sizeof(lib) - 64);
        if (n < 0) {
            perror("/proc/self/exe");
            return 1;
        }
        lib[n] = 0;
        strcpy(strrchr(lib, '/') + 1, "libpython3.12.so");
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    int (*rewrite)(unsigned, const uint64_t *, const int *, int) = dlsym(h, "fake_py_rewrite");
    nap = (void (*)(int))dlsym(h, "fake_py_nap");
    if (!rewrite || !nap) {
        fprintf(stderr, "%s is no fake libpython\n", lib);
        return 1;
    }
    pthread_barrier_init(&started, NULL, THREADS);
    pthread_t t;
    for (int i = 1; i <= SPINNERS; i++)
        pthread_create(&t, NULL, spin, (void *)(intptr_t)i);
    for (int i = SPINNERS + 1; i < THREADS; i++)
        pthread_create(&t, NULL, napper, (void *)(intptr_t)i);
    enter(0);
    // The first state is written before `ready`: a reader never sees
    // the plain initial one.
    if (rewrite(0, ids, tids, THREADS)) {
        fprintf(stderr, "fake_py_rewrite failed\n");
        return 1;
    }
    printf("ready %d\n", getpid());
    fflush(stdout);
    struct timespec tick = {0, 100 * 1000000L};
    for (unsigned gen = 1;; gen++) {
        nanosleep(&tick, NULL);
        rewrite(gen, ids, tids, THREADS);
    }
}
