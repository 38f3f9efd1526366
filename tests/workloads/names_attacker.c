// Name and perf-map attacks on a profiler running as root
// (tests/security_names.rs runs it as `nobody`). Prints `ready <pid>`, then
// runs until killed:
//   names_attacker perfmap N BYTES MS  spin over N entries of JIT-like code
//                                      and rewrite /tmp/perf-PID.map every
//                                      MS ms with N new names of BYTES each
//   names_attacker bigmap MB           spin in JIT-like code and keep a
//                                      MB MiB perf map, its first and last
//                                      lines rewritten every second
//   names_attacker javanames LIB BYTES look like a HotSpot JVM (map LIB,
//                                      named libjvm.so; catch SIGQUIT) and
//                                      answer the attach protocol: thread
//                                      names of BYTES bytes and names with
//                                      `;`, a new thread every 2 s
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SLOT 16

static unsigned char *code;
static size_t slots;

static void ready(void) {
    printf("ready %d\n", getpid());
    fflush(stdout);
}

// A NOP sled of `n` slots ending in a jump back: samples land all over it.
static void make_sled(size_t n) {
    size_t len = n * SLOT + 8;
    code = mmap(NULL, len, PROT_READ | PROT_WRITE | PROT_EXEC,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(code, 0x90, n * SLOT);
    unsigned char *jmp = code + n * SLOT;
    int rel = (int)(-(long)(n * SLOT) - 5);
    jmp[0] = 0xe9;
    memcpy(jmp + 1, &rel, 4);
    slots = n;
}

static void *spin(void *arg) {
    (void)arg;
    ((void (*)(void))code)();
    return NULL;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void map_path(char *path, size_t len, const char *suffix) {
    snprintf(path, len, "/tmp/perf-%d.map%s", getpid(), suffix);
}

// Writes the perf map anew (through a rename: the profiler never sees half).
static void write_map(unsigned gen, size_t n, size_t bytes) {
    char path[64], tmp[64];
    map_path(path, sizeof(path), "");
    map_path(tmp, sizeof(tmp), ".tmp");
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        exit(1);
    }
    char *pad = malloc(bytes + 1);
    memset(pad, 'x', bytes);
    pad[bytes] = 0;
    for (size_t i = 0; i < n; i++) {
        char head[48];
        int h = snprintf(head, sizeof(head), "gen%u_%zu_", gen, i);
        fprintf(f, "%lx %x %s%s\n", (unsigned long)(code + i * SLOT), SLOT, head,
                pad + (h < (int)bytes ? h : (int)bytes));
    }
    free(pad);
    fclose(f);
    rename(tmp, path);
}

static _Noreturn void perfmap(size_t n, size_t bytes, int ms) {
    make_sled(n);
    write_map(0, n, bytes);
    pthread_t t;
    pthread_create(&t, NULL, spin, NULL);
    ready();
    for (unsigned gen = 1;; gen++) {
        sleep_ms(ms);
        write_map(gen, n, bytes);
    }
}

static int bigmap(long mb) {
    make_sled(4096);
    char path[64];
    map_path(path, sizeof(path), "");
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    long target = mb << 20;
    char name[120];
    memset(name, 'n', sizeof(name) - 1);
    name[sizeof(name) - 1] = 0;
    for (long i = 0; ftell(f) < target - 256; i++)
        fprintf(f, "%lx %x big_%ld_%s\n", (unsigned long)(code + (i % slots) * SLOT),
                SLOT, i, name);
    fclose(f);
    pthread_t t;
    pthread_create(&t, NULL, spin, NULL);
    ready();
    int fd = open(path, O_WRONLY);
    struct stat st;
    fstat(fd, &st);
    for (unsigned gen = 0;; gen++) {
        sleep_ms(1000);
        // Same length, other text at both ends: rewritten, the
        // profiler's copy is stale.
        char line[64];
        int len = snprintf(line, sizeof(line), "%lx %x g%010u\n",
                           (unsigned long)code, SLOT, gen);
        pwrite(fd, line, len, 0);
        pwrite(fd, line, len, st.st_size - len);
        futimens(fd, NULL);
    }
}

static void on_quit(int sig) { (void)sig; }

static void *sleeper(void *arg) {
    (void)arg;
    sleep(3600);
    return NULL;
}

// Answers every attach request; a thread dump names each thread.
static void serve(int listener, size_t bytes) {
    static char req[4096];
    char *big = malloc(bytes + 1);
    unsigned gen = 0;
    for (;;) {
        int c = accept(listener, NULL, NULL);
        if (c < 0)
            continue;
        ssize_t got = read(c, req, sizeof(req) - 1);
        req[got > 0 ? got : 0] = 0;
        // "1\0jcmd\0COMMAND\0\0\0"
        const char *cmd = req + strlen(req) + 1;
        cmd += strlen(cmd) + 1;
        FILE *out = fdopen(c, "w");
        if (strstr(cmd, "Thread.print")) {
            fprintf(out, "0\nFull thread dump Fake VM:\n\n");
            gen++;
            memset(big, 'a' + gen % 26, bytes);
            big[bytes] = 0;
            // Every thread of ours, the first with the huge name, the
            // others with frames to inject.
            DIR *ls = opendir("/proc/self/task");
            struct dirent *e;
            int i = 0;
            while (ls && (e = readdir(ls))) {
                int tid = atoi(e->d_name);
                if (tid <= 0)
                    continue;
                if (i++ == 0)
                    fprintf(out, "\"%s\" #1 prio=5 os_prio=0 tid=0x1 nid=0x%x runnable\n",
                            big, tid);
                else
                    fprintf(out, "\"pool-%d;injected_frame;evil\" #%d prio=5 os_prio=0 "
                                 "tid=0x1 nid=0x%x waiting\n", i, i, tid);
            }
            if (ls)
                closedir(ls);
        } else if (strstr(cmd, "VM.version")) {
            fprintf(out, "0\nFake VM version 17\n");
        } else {
            fprintf(out, "0\n");
        }
        fclose(out);
    }
}

struct server_arg {
    int s;
    size_t bytes;
};

static void *server(void *p) {
    struct server_arg *a = p;
    serve(a->s, a->bytes);
    return NULL;
}

static int javanames(const char *lib, size_t bytes) {
    int fd = open(lib, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 ||
        mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
        perror(lib);
        return 1;
    }
    signal(SIGQUIT, on_quit);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "/tmp/.java_pid%d", getpid());
    unlink(addr.sun_path);
    if (bind(s, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(s, 8) != 0) {
        perror("bind");
        return 1;
    }
    make_sled(64);
    pthread_t t;
    pthread_create(&t, NULL, spin, NULL);
    static struct server_arg arg;
    arg.s = s;
    arg.bytes = bytes;
    pthread_create(&t, NULL, server, &arg);
    ready();
    // New threads every 2 s: the profiler asks for their names.
    for (;;) {
        pthread_create(&t, NULL, sleeper, NULL);
        sleep_ms(2000);
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "perfmap") && argc > 4)
        perfmap(atol(argv[2]), atol(argv[3]), atoi(argv[4]));
    if (!strcmp(mode, "bigmap") && argc > 2)
        return bigmap(atol(argv[2]));
    if (!strcmp(mode, "javanames") && argc > 3)
        return javanames(argv[2], atol(argv[3]));
    fprintf(stderr, "usage: names_attacker perfmap N BYTES MS | bigmap MB | "
                    "javanames LIB BYTES\n");
    return 2;
}
