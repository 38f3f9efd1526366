/* Two threads ping-ponging a byte through two pipes: a context switch per
 * hop, for the thread-context cost bench (bench/otel_ctx.rs).
 *
 *   otel_pingpong SECONDS [--ctx]
 *
 * With --ctx the process publishes an OpenTelemetry context as a real
 * writer does: the process context (OTEP 4719: a memfd named OTEL_CTX
 * holding the header and a protobuf payload with threadlocal.* keys) and
 * the thread context (OTEP 4947: the exported TLS variable
 * otel_thread_ctx_v1, in the executable, pointing to each thread's record,
 * with a new span id every 1,000 round trips and one attribute). Prints
 * `ready <pid>`, then `round_trips <n>` when done. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

struct otel_record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t trace_flags;
	uint16_t attrs_size;
	uint8_t attrs[32];
} __attribute__((packed));
_Static_assert(__builtin_offsetof(struct otel_record, attrs) == 28, "OTEP 4947 record");

/* Exported (-rdynamic) so that readers find it in .dynsym. */
__attribute__((visibility("default"))) __thread struct otel_record *otel_thread_ctx_v1;

struct otel_header {
	char signature[8];
	uint32_t version;
	uint32_t payload_size;
	uint64_t published_at_ns;
	uint64_t payload;
};
_Static_assert(sizeof(struct otel_header) == 32, "OTEP 4719 header");

static int with_ctx;
static volatile int stop;
static int ab[2], ba[2];
static uint64_t trips;

/* Appends a length-delimited protobuf field (lengths < 128 here). */
static size_t field(uint8_t *out, size_t at, int number, const void *data, size_t len)
{
	out[at++] = (uint8_t)(number << 3 | 2);
	out[at++] = (uint8_t)len;
	memcpy(out + at, data, len);
	return at + len;
}

/* KeyValue{key, value: AnyValue{string_value}} */
static size_t string_kv(uint8_t *out, size_t at, int number, const char *key, const char *value)
{
	uint8_t any[64], kv[128];
	size_t a = field(any, 0, 1, value, strlen(value));
	size_t k = field(kv, 0, 1, key, strlen(key));
	k = field(kv, k, 2, any, a);
	return field(out, at, number, kv, k);
}

/* KeyValue{key, value: AnyValue{array_value: ArrayValue{values: [s]}}} */
static size_t array_kv(uint8_t *out, size_t at, int number, const char *key, const char *s)
{
	uint8_t str[64], arr[64], any[64], kv[128];
	size_t n = field(str, 0, 1, s, strlen(s));
	n = field(arr, 0, 1, str, n);
	n = field(any, 0, 5, arr, n);
	size_t k = field(kv, 0, 1, key, strlen(key));
	k = field(kv, k, 2, any, n);
	return field(out, at, number, kv, k);
}

static void publish_process_context(void)
{
	static uint8_t payload[256];
	uint8_t resource[64];
	size_t r = string_kv(resource, 0, 1, "service.name", "otel_pingpong");
	size_t n = field(payload, 0, 1, resource, r);
	n = string_kv(payload, n, 2, "threadlocal.schema_version", "tlsdesc_v1_dev");
	n = array_kv(payload, n, 2, "threadlocal.attribute_key_map", "http_route");

	int fd = memfd_create("OTEL_CTX", MFD_CLOEXEC);
	long page = sysconf(_SC_PAGESIZE);
	if (fd < 0 || ftruncate(fd, page) != 0) {
		perror("memfd_create");
		exit(1);
	}
	struct otel_header *h = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	madvise(h, page, MADV_DONTFORK);
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	memcpy(h->signature, "OTEL_CTX", 8);
	h->version = 2;
	h->payload_size = (uint32_t)n;
	h->payload = (uint64_t)(uintptr_t)payload;
	__atomic_store_n(&h->published_at_ns, (uint64_t)now.tv_sec * 1000000000 + now.tv_nsec,
			 __ATOMIC_RELEASE);
}

/* Makes `r` this thread's active span `n`: fresh ids, valid last. */
static void activate(struct otel_record *r, uint64_t n)
{
	__atomic_store_n(&r->valid, 0, __ATOMIC_RELEASE);
	memset(r->trace_id, 0, sizeof(r->trace_id));
	memcpy(r->trace_id + 8, &n, sizeof(n));
	memcpy(r->span_id, &n, sizeof(n));
	r->span_id[0] = (uint8_t)(pthread_self() & 0xff) | 1;
	r->trace_flags = 1;
	static const char route[] = "/pingpong";
	r->attrs[0] = 0;
	r->attrs[1] = sizeof(route) - 1;
	memcpy(r->attrs + 2, route, sizeof(route) - 1);
	r->attrs_size = 2 + sizeof(route) - 1;
	__atomic_store_n(&r->valid, 1, __ATOMIC_RELEASE);
	otel_thread_ctx_v1 = r;
}

/* Reads a byte from `in`, writes it to `out`, until stopped. */
static void *hop(void *arg)
{
	int *fds = arg; /* in, out */
	struct otel_record record;
	char c = 0;
	uint64_t n = 0;

	for (;;) {
		if (with_ctx && n % 1000 == 0)
			activate(&record, n / 1000 + 1);
		if (fds[0] >= 0 && read(fds[0], &c, 1) != 1)
			break;
		if (stop) {
			close(fds[1]);
			break;
		}
		if (write(fds[1], &c, 1) != 1)
			break;
		n++;
	}
	otel_thread_ctx_v1 = NULL;
	__atomic_fetch_add(&trips, n, __ATOMIC_RELAXED);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: otel_pingpong SECONDS [--ctx]\n");
		return 2;
	}
	int seconds = atoi(argv[1]);
	with_ctx = argc > 2 && strcmp(argv[2], "--ctx") == 0;
	if (pipe(ab) || pipe(ba)) {
		perror("pipe");
		return 1;
	}
	if (with_ctx)
		publish_process_context();
	printf("ready %d\n", getpid());
	fflush(stdout);

	int a[2] = {ba[0], ab[1]}, b[2] = {ab[0], ba[1]};
	pthread_t ta, tb;
	pthread_create(&tb, NULL, hop, b);
	pthread_create(&ta, NULL, hop, a);
	char c = 0;
	if (write(ba[1], &c, 1) != 1) /* the first ball */
		return 1;
	sleep(seconds);
	stop = 1;
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	printf("round_trips %lu\n", (unsigned long)(trips / 2));
	return 0;
}
