// Stacks without end, made by an unprivileged user
// (tests/e2e/security_queries.rs runs it as `nobody`): THREADS threads
// sleep, over and over, behind a new random chain of DEPTH calls through
// REGIONS JIT-like code regions, each named in /tmp/perf-PID.map with a
// unique name of BYTES bytes. Every sleep is a new stack of huge frames.
// With REWRITE_MS (bench/cost.rs), the map is written anew every
// REWRITE_MS ms with names never used before, as a JIT that recompiles
// everything would. Prints `ready <pid>`, then runs until killed:
//   stacks_attacker THREADS DEPTH REGIONS BYTES SLEEP_US [REWRITE_MS]
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SLOT 16

// push rbp; mov rbp,rsp; mov rax,[rdi]; add rdi,8; call rax; pop rbp; ret
static const unsigned char REGION[SLOT] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x8b,
                                           0x07, 0x48, 0x83, 0xc7, 0x08, 0xff,
                                           0xd0, 0x5d, 0xc3, 0x90};

static unsigned char *code;
static size_t regions, depth;
static long sleep_us;

// The chain's last callee: a frame-pointer C function that sleeps.
__attribute__((noinline)) static void leaf(void) {
    struct timespec ts = {sleep_us / 1000000, (sleep_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    __asm__ volatile("" ::: "memory");
}

static void *sleeper(void *arg) {
    uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    void **chain = calloc(depth + 1, sizeof(void *));
    for (;;) {
        // chain[i] is the callee of the region before it; leaf last.
        for (size_t i = 0; i + 1 < depth; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            chain[i] = code + (x % regions) * SLOT;
        }
        chain[depth - 1] = (void *)leaf;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ((void (*)(void **))(code + (x % regions) * SLOT))(chain);
    }
    return NULL;
}

// Writes the perf map, generation `gen`'s names, through a rename: the
// profiler never reads half a map.
static int write_map(unsigned gen, size_t bytes) {
    char path[64], tmp[64];
    snprintf(path, sizeof(path), "/tmp/perf-%d.map", getpid());
    snprintf(tmp, sizeof(tmp), "/tmp/perf-%d.map.tmp", getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        return -1;
    }
    char *pad = malloc(bytes + 1);
    memset(pad, 'j', bytes);
    pad[bytes] = 0;
    for (size_t i = 0; i < regions; i++) {
        char head[32];
        int h = snprintf(head, sizeof(head), "g%u_jit%zu_", gen, i);
        fprintf(f, "%lx %x %s%s\n", (unsigned long)(code + i * SLOT), SLOT, head,
                pad + (h < (int)bytes ? h : (int)bytes));
    }
    free(pad);
    fclose(f);
    return rename(tmp, path);
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s THREADS DEPTH REGIONS BYTES SLEEP_US [REWRITE_MS]\n",
                argv[0]);
        return 2;
    }
    long rewrite_ms = argc == 7 ? atol(argv[6]) : 0;
    int threads = atoi(argv[1]);
    depth = strtoul(argv[2], NULL, 10);
    regions = strtoul(argv[3], NULL, 10);
    size_t bytes = strtoul(argv[4], NULL, 10);
    sleep_us = atol(argv[5]);
    if (depth < 2 || regions < 1 || bytes < 32) {
        fprintf(stderr, "need DEPTH >= 2, REGIONS >= 1, BYTES >= 32\n");
        return 2;
    }
    code = mmap(NULL, regions * SLOT, PROT_READ | PROT_WRITE | PROT_EXEC,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    for (size_t i = 0; i < regions; i++) memcpy(code + i * SLOT, REGION, SLOT);
    if (write_map(0, bytes))
        return 1;
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        pthread_create(&t, NULL, sleeper, (void *)(uintptr_t)(i + 1));
    }
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (unsigned gen = 1;; gen++) {
        if (rewrite_ms <= 0) {
            pause();
            continue;
        }
        struct timespec ts = {rewrite_ms / 1000, (rewrite_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        write_map(gen, bytes);
    }
}
