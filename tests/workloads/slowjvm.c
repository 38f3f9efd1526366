// A fake HotSpot JVM that answers attach requests slowly: it maps LIB (a
// file named libjvm.so) executable, catches SIGQUIT, opens the attach
// socket /tmp/.java_pid<PID> itself, and for each client reads the
// request, then either says nothing (MODE silent) or trickles one byte of
// a never-ending reply every 200 ms (MODE trickle), until the client
// hangs up. Prints `ready <pid>`.
//
//   slowjvm LIB silent|trickle
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static void on_quit(int sig) { (void)sig; }

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: slowjvm LIB silent|trickle\n");
        return 2;
    }
    int trickle = !strcmp(argv[2], "trickle");
    int lib = open(argv[1], O_RDONLY);
    struct stat st;
    if (lib < 0 || fstat(lib, &st) != 0 ||
        mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, lib, 0) == MAP_FAILED) {
        perror(argv[1]);
        return 1;
    }
    signal(SIGQUIT, on_quit);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "/tmp/.java_pid%d", getpid());
    unlink(addr.sun_path);
    int srv = socket(AF_UNIX, SOCK_STREAM, 0);
    if (srv < 0 || bind(srv, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(srv, 16) != 0) {
        perror("attach socket");
        return 1;
    }
    chmod(addr.sun_path, 0600);
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (;;) {
        int c = accept(srv, NULL, NULL);
        if (c < 0)
            continue;
        char req[256];
        if (read(c, req, sizeof req) <= 0) {
            close(c);
            continue;
        }
        if (trickle) {
            // A status line, then output that never ends.
            if (write(c, "0\n", 2) == 2)
                while (nap_ms(200), write(c, "x", 1) == 1) {
                }
        } else {
            // Wait for the client to give up.
            while (read(c, req, sizeof req) > 0) {
            }
        }
        close(c);
    }
}
