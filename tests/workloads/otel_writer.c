/*
 * An OpenTelemetry thread-context writer per OTEP 4947 / 4719, for the
 * span tests: publishes an OTEL_CTX process context (schema
 * tlsdesc_v1_dev, key map ["http_route", "http_method"]) and sets each
 * worker thread's otel_thread_ctx_v1 to the record of the request it
 * serves.
 *
 * Where the variable lives (build switches):
 *   -DOTEL_PART_LIB      only the variable and its accessor: built as a
 *                        shared library with -fPIC -mtls-dialect=gnu2
 *                        (TLSDESC);
 *   -DOTEL_TLS_IN_EXE    the program defines it (build with -rdynamic:
 *                        local exec, exported in .dynsym);
 *   -DOTEL_TLS_LINKED    the library above, linked at start;
 *   -DOTEL_TLS_DLOPEN    the library above, dlopen'ed (path: argv[1]).
 *
 * Usage: otel_writer [LIB] [--threads N] [--ms M] [--forge-ctx]
 *   [--tls-unmapped] [--flip] [--big-attrs] [--churn]
 * Prints `tls <tid> <thread pointer> <&otel_thread_ctx_v1>` per worker,
 * `ready <pid>`, then per request
 * `span <trace_hex> <span_hex> <tid> <route> <duration_ns>`
 * (CLOCK_MONOTONIC around the time the record was active).
 * Attack modes: --forge-ctx (the header's size, pointer and
 * published_at_ns keep changing to lies), --tls-unmapped (the variable
 * points into unmapped memory), --flip (valid and span id rewritten
 * while the record is active), --big-attrs (255 attributes of 255
 * bytes), --churn (see churn_forever).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OTEL_PART_LIB
__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;
void **otel_slot(void) { return &otel_thread_ctx_v1; }
#else

#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif

#ifdef OTEL_TLS_IN_EXE
__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;
static void **otel_slot(void) { return &otel_thread_ctx_v1; }
#elif defined(OTEL_TLS_LINKED)
void **otel_slot(void);
#else
static void **(*otel_slot)(void);
#endif

/* The record (OTEP 4947): 28 header bytes, then attributes. */
struct record {
	uint8_t trace[16];
	uint8_t span[8];
	uint8_t valid;
	uint8_t flags;
	uint16_t attrs_size;
	uint8_t attrs[255 * 257];
} __attribute__((packed));

static int threads = 4, ms = 20;
static int forge, tls_unmapped, flip, big_attrs, churn;
static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(int clock)
{
	struct timespec t;
	clock_gettime(clock, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

/* Protobuf: a length-delimited field (every length here < 16384). */
static size_t field(uint8_t *to, int tag, const void *bytes, size_t len)
{
	size_t n = 0;
	to[n++] = (uint8_t)(tag << 3 | 2);
	if (len >= 128) {
		to[n++] = (uint8_t)(len | 0x80);
		to[n++] = (uint8_t)(len >> 7);
	} else {
		to[n++] = (uint8_t)len;
	}
	memcpy(to + n, bytes, len);
	return n + len;
}

/* KeyValue{key, AnyValue{string_value}}. */
static size_t kv_string(uint8_t *to, const char *key, const char *value)
{
	uint8_t any[256], kv[512];
	size_t a = field(any, 1, value, strlen(value));
	size_t k = field(kv, 1, key, strlen(key));
	k += field(kv + k, 2, any, a);
	return field(to, 2, kv, k); /* ProcessContext.extra_attributes */
}

static size_t payload(uint8_t *to)
{
	uint8_t any[256], arr[256], val[256], kv[512], res[512], rkv[256];
	size_t n = 0, a = 0, v, k, r;
	const char *keys[] = {"http_route", "http_method"};
	/* resource: service.name */
	v = field(val, 1, "otel-writer", 11);
	k = field(rkv, 1, "service.name", 12);
	k += field(rkv + k, 2, val, v);
	r = field(res, 1, rkv, k);
	n += field(to, 1, res, r);
	n += kv_string(to + n, "threadlocal.schema_version", "tlsdesc_v1_dev");
	for (int i = 0; i < 2; i++) {
		v = field(val, 1, keys[i], strlen(keys[i]));
		a += field(arr + a, 1, val, v);
	}
	v = field(any, 5, arr, a);
	k = field(kv, 1, "threadlocal.attribute_key_map", 29);
	k += field(kv + k, 2, any, v);
	n += field(to + n, 2, kv, k);
	return n;
}

struct header {
	char signature[8];
	uint32_t version;
	uint32_t payload_size;
	uint64_t published_at_ns;
	uint64_t payload;
};

static struct header *publish(void)
{
	int fd = memfd_create("OTEL_CTX", MFD_CLOEXEC);
	struct header *h;
	if (fd >= 0) {
		if (ftruncate(fd, 4096) != 0)
			exit(1);
		h = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
	} else {
		h = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	if (h == MAP_FAILED)
		exit(1);
	madvise(h, 4096, MADV_DONTFORK);
	uint8_t *body = (uint8_t *)(h + 1);
	h->version = 2;
	h->payload_size = (uint32_t)payload(body);
	h->payload = (uint64_t)(uintptr_t)body;
	h->published_at_ns = now_ns(CLOCK_REALTIME);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	memcpy(h->signature, "OTEL_CTX", 8);
	prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, h, 4096, "OTEL_CTX");
	return h;
}

/* --forge-ctx: the header keeps changing, to lies a reader must refuse. */
static void *forger(void *arg)
{
	struct header *h = arg;
	for (uint64_t i = 1;; i++) {
		h->published_at_ns = i;
		h->payload_size = (i % 3 == 0) ? 0xfffffff0u : 64;
		h->payload = (i % 3 == 1) ? 0x10 : h->payload;
		usleep(100);
	}
	return NULL;
}

static void fill_random(uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)random();
	b[0] |= 1; /* never all zero */
}

static void hex(char *to, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sprintf(to + 2 * i, "%02x", b[i]);
}

static uint16_t set_attrs(struct record *r, const char *route)
{
	size_t n = 0;
	if (big_attrs) {
		for (int i = 0; i < 255; i++) {
			r->attrs[n++] = (uint8_t)(i % 2);
			r->attrs[n++] = 255;
			memset(r->attrs + n, 'a' + i % 26, 255);
			n += 255;
		}
		return (uint16_t)n;
	}
	const char *attrs[2] = {route, "GET"};
	for (int i = 0; i < 2; i++) {
		size_t len = strlen(attrs[i]);
		r->attrs[n++] = (uint8_t)i;
		r->attrs[n++] = (uint8_t)len;
		memcpy(r->attrs + n, attrs[i], len);
		n += len;
	}
	return (uint16_t)n;
}

/* Waits ~ms: on the mutex the main thread holds, or on a pipe answered
 * after ms by a helper thread. */
static void *answer(void *arg)
{
	int fd = *(int *)arg;
	usleep(ms * 1000);
	if (write(fd, "x", 1) != 1)
		abort();
	return NULL;
}

static void serve(struct record *r, int lock)
{
	if (lock) {
		pthread_mutex_lock(&held);
		pthread_mutex_unlock(&held);
	} else {
		int p[2];
		char c;
		pthread_t t;
		if (pipe(p) != 0)
			abort();
		pthread_create(&t, NULL, answer, &p[1]);
		if (read(p[0], &c, 1) != 1)
			abort();
		pthread_join(t, NULL);
		close(p[0]);
		close(p[1]);
	}
	/* A little CPU, changing the record under a reader if asked. */
	uint64_t until = now_ns(CLOCK_MONOTONIC) + 1000000;
	while (now_ns(CLOCK_MONOTONIC) < until) {
		if (flip) {
			r->valid ^= 1;
			fill_random(r->span, 8);
		}
	}
	r->valid = 1;
}

/* --churn: one record always active, a new span id every ~50 us (over
 * a million a minute per thread); prints `churn <tid> <ids so far>` each
 * second instead of a line per span. */
static void churn_forever(void **slot, struct record *r)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);
	fill_random(r->trace, 16);
	r->valid = 1;
	r->attrs_size = set_attrs(r, "/io");
	*slot = r;
	uint64_t next = now_ns(CLOCK_MONOTONIC) + 1000000000ull;
	for (unsigned long n = 1;; n++) {
		fill_random(r->span, 8);
		usleep(50);
		if (now_ns(CLOCK_MONOTONIC) >= next) {
			next += 1000000000ull;
			pthread_mutex_lock(&out);
			printf("churn %d %lu\n", tid, n);
			fflush(stdout);
			pthread_mutex_unlock(&out);
		}
	}
}

static void *worker(void *arg)
{
	long id = (long)arg;
	pid_t tid = (pid_t)syscall(SYS_gettid);
	void **slot = otel_slot();
	uint64_t tp;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(tp));
	struct record *r = calloc(1, sizeof *r);
	pthread_mutex_lock(&out);
	printf("tls %d %lx %lx\n", tid, (unsigned long)tp, (unsigned long)(uintptr_t)slot);
	fflush(stdout);
	pthread_mutex_unlock(&out);
	if (churn)
		churn_forever(slot, r);
	for (long n = 0;; n++) {
		int lock = (n + id) % 2 == 0;
		const char *route = lock ? "/lock" : "/io";
		fill_random(r->trace, 16);
		fill_random(r->span, 8);
		r->valid = 1;
		r->flags = 1;
		r->attrs_size = set_attrs(r, route);
		uint64_t start = now_ns(CLOCK_MONOTONIC);
		*slot = tls_unmapped ? (void *)(uintptr_t)0x10 : r;
		serve(r, lock);
		*slot = NULL;
		uint64_t took = now_ns(CLOCK_MONOTONIC) - start;
		char th[33], sh[17];
		hex(th, r->trace, 16);
		hex(sh, r->span, 8);
		pthread_mutex_lock(&out);
		printf("span %s %s %d %s %lu\n", th, sh, tid, route, (unsigned long)took);
		fflush(stdout);
		pthread_mutex_unlock(&out);
		usleep(3000);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int i = 1;
#ifdef OTEL_TLS_DLOPEN
	if (argc < 2)
		return 2;
	void *lib = dlopen(argv[i++], RTLD_NOW);
	if (!lib || !(otel_slot = (void **(*)(void))dlsym(lib, "otel_slot"))) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 1;
	}
#endif
	for (; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--ms") && i + 1 < argc)
			ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--forge-ctx"))
			forge = 1;
		else if (!strcmp(argv[i], "--tls-unmapped"))
			tls_unmapped = 1;
		else if (!strcmp(argv[i], "--flip"))
			flip = 1;
		else if (!strcmp(argv[i], "--big-attrs"))
			big_attrs = 1;
		else if (!strcmp(argv[i], "--churn"))
			churn = 1;
		else
			return 2;
	}
	srandom((unsigned)getpid());
	struct header *h = publish();
	if (forge) {
		pthread_t f;
		pthread_create(&f, NULL, forger, h);
	}
	/* Held, then released for a moment every ms: lock waiters wait ~ms. */
	pthread_mutex_lock(&held);
	printf("ready %d\n", getpid());
	fflush(stdout);
	pthread_t t;
	for (long w = 0; w < threads; w++)
		pthread_create(&t, NULL, worker, (void *)w);
	for (;;) {
		usleep(ms * 1000);
		pthread_mutex_unlock(&held);
		sched_yield();
		pthread_mutex_lock(&held);
	}
}
#endif
