// A fake CPython 3.FAKE_MINOR runtime built to attack an out-of-process
// reader (wallscope's src/python and its BPF walk). Built as
// libpython3.12.so or libpython3.13.so (build.sh), it exports what a reader
// looks for: `_PyRuntime` (the real size: a symbol-size check passes),
// `Py_Version`, `PyCode_Type` and `PyUnicode_Type`, and for 3.13 a
// `_Py_DebugOffsets` header with the right cookie. Everything reachable
// from there is hostile, and fake_py_rewrite() (called by fake_python.c
// every 100 ms) changes the attack each time, so a reader also sees torn,
// changing structures. Attacks, one per generation in turn:
//   cycles   plausible chain, but interp->next == interp, a thread list
//            looping back to its head, every frame's previous == itself
//   ring     rings of up to 200 distinct frames (past a walk's bound), every
//            other one a C-stack shim; two interpreters pointing at each
//            other; names that try to inject frames (`;`, `_[py]`, `\n`)
//   huge     strings of 2^40 bytes, invalid unicode kinds, a 262,144-long
//            thread list, absurd ids and line numbers
//   unmapped pointers to a hole, to a PROT_NONE page, to NULL+small,
//            straddling the end of a mapping
//   kernel   pointers to kernel, vsyscall and non-canonical addresses
//   spray    every word of the runtime and of each structure a random pick
//            of all of the above, including pointers to itself
//   offsets  (3.13) the debug header's offsets and sizes absurd: 2^40
//            sizes, offsets past the size, 2^63, unaligned; one field at
//            a time in turn, the rest plausible; (3.12) the 3.13 cookie
//   lies     the header's version and free-threading flag disagree with
//            Py_Version; the GIL pointer is a kernel address
// Threads whose pthread_self()/tid the program passes in are entered in
// the fake thread lists with their real ids, so a reader that registers
// them makes the BPF walk read the hostile frames while they spin.
//
// Offsets of the real layouts (pyenv 3.12.1 and 3.13.0, x86-64), from
// offsetof() on the interpreters' internal headers (Py_BUILD_CORE).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef FAKE_MINOR
#error "build with -DFAKE_MINOR=12 or 13"
#endif

#define EXPORT __attribute__((visibility("default")))

struct layout {
    size_t rt_size, rt_interp_head, rt_interp_main;
    size_t in_size, in_next, in_id, in_threads_head, in_ceval_gil, in_gil;
    size_t in_modules, in_sysdict, in_builtins;
    size_t ts_size, ts_prev, ts_next, ts_interp, ts_frame, ts_thread_id, ts_native_tid,
        ts_status;
    size_t cf_current_frame; // 3.12: tstate->cframe->current_frame; 3.13: none
    size_t fr_size, fr_code, fr_previous, fr_instr, fr_owner, fr_localsplus;
    size_t co_size, co_filename, co_name, co_qualname, co_firstlineno, co_linetable;
    size_t ob_type, str_length, str_state, str_ascii_size;
};

#if FAKE_MINOR == 12
#define VERSION_HEX 0x030c01f0UL
#define RT_SIZE 459944
static const struct layout L = {
    RT_SIZE, 40, 48, 383552, 0, 8, 72, 384, 1040, 944, 352, 360,
    288, 0, 8, 16, 56, 136, 144, 24, 0,
    80, 0, 8, 56, 70, 72, 200, 112, 120, 128, 68, 136, 8, 16, 32, 40,
};
#elif FAKE_MINOR == 13
#define VERSION_HEX 0x030d00f0UL
#define RT_SIZE 283320
static const struct layout L = {
    RT_SIZE, 632, 640, 194968, 7264, 7272, 7344, 16, 7752, 7656, 7640, 7648,
    304, 0, 8, 16, 72, 152, 160, 32, (size_t)-1,
    80, 0, 8, 56, 70, 72, 208, 112, 120, 128, 68, 136, 8, 16, 32, 40,
};
#else
#error "FAKE_MINOR must be 12 or 13"
#endif

#define FRAME_OWNED_BY_CSTACK 3

// CPython 3.13's _Py_DebugOffsets (Include/internal/pycore_runtime.h):
// everything after the cookie is a u64, in this order.
enum {
    D_VERSION, D_FREE_THREADED,
    D_RT_SIZE, D_RT_FINALIZING, D_RT_INTERP_HEAD,
    D_IN_SIZE, D_IN_ID, D_IN_NEXT, D_IN_THREADS_HEAD, D_IN_GC, D_IN_MODULES, D_IN_SYSDICT,
    D_IN_BUILTINS, D_IN_CEVAL_GIL, D_IN_GIL_STATE, D_IN_GIL_ENABLED, D_IN_GIL_LOCKED,
    D_IN_GIL_HOLDER,
    D_TS_SIZE, D_TS_PREV, D_TS_NEXT, D_TS_INTERP, D_TS_FRAME, D_TS_THREAD_ID, D_TS_NATIVE_TID,
    D_TS_DATASTACK, D_TS_STATUS,
    D_FR_SIZE, D_FR_PREVIOUS, D_FR_EXECUTABLE, D_FR_INSTR, D_FR_LOCALSPLUS, D_FR_OWNER,
    D_CO_SIZE, D_CO_FILENAME, D_CO_NAME, D_CO_QUALNAME, D_CO_LINETABLE, D_CO_FIRSTLINENO,
    D_CO_ARGCOUNT, D_CO_LOCALSPLUSNAMES, D_CO_LOCALSPLUSKINDS, D_CO_CODE_ADAPTIVE,
    D_OB_SIZE, D_OB_TYPE,
    D_TYPE_SIZE, D_TYPE_NAME, D_TYPE_REPR, D_TYPE_FLAGS,
    D_TUPLE_SIZE, D_TUPLE_ITEM, D_TUPLE_OB_SIZE,
    D_LIST_SIZE, D_LIST_ITEM, D_LIST_OB_SIZE,
    D_DICT_SIZE, D_DICT_KEYS, D_DICT_VALUES,
    D_FLOAT_SIZE, D_FLOAT_FVAL,
    D_LONG_SIZE, D_LONG_TAG, D_LONG_DIGIT,
    D_BYTES_SIZE, D_BYTES_OB_SIZE, D_BYTES_SVAL,
    D_STR_SIZE, D_STR_STATE, D_STR_LENGTH, D_STR_ASCII_SIZE,
    D_GC_SIZE, D_GC_COLLECTING,
    D_FIELDS
};
#define DEBUG_HEADER (8 + 8 * D_FIELDS) // 616: interpreters.head is at 632

EXPORT const unsigned long Py_Version = VERSION_HEX;
// Initialised, so that it lies in .data: in the file-backed mapping named
// libpython3.1X.so, as the real one does.
EXPORT __attribute__((aligned(64))) unsigned char _PyRuntime[RT_SIZE] = "xdebugpy";
EXPORT unsigned char PyCode_Type[416] = {1};
EXPORT unsigned char PyUnicode_Type[416] = {1};

// Where the fake structures live, 8 MiB:
#define ARENA (8UL << 20)
#define R_INTERP 0x000000UL  // two interpreters of 512 KiB
#define R_TSTATE 0x100000UL  // 64 thread states, 512 B apart
#define R_CFRAME 0x110000UL  // 64 _PyCFrames (3.12), 64 B apart
#define R_FRAME 0x120000UL   // 2,048 frames, 128 B apart
#define R_CODE 0x160000UL    // 256 code objects, 256 B apart
#define R_STR 0x170000UL     // 256 strings, 256 B apart (the last: a file)
#define R_LONGSTR 0x180000UL // one string of 60,000 bytes
#define R_DICT 0x1a0000UL    // a few dicts
#define R_CHAIN 0x400000UL   // 262,144 overlapping thread states, 16 B apart
#define N_TSTATE 64
#define N_FRAME 2048
#define N_CODE 256
#define N_STR 256
#define N_CHAIN 262144

static uint8_t *arena;      // the fake structures
static uint8_t *guard;      // a PROT_NONE page: mapped, unreadable
static uint64_t hole;       // an unmapped address
static uint64_t edge;       // 4 bytes before the end of the arena mapping
static unsigned rng = 1;

// A futex wait the program's sleeping threads do: some attacks make it the
// "GIL" (the reader's GIL address range then covers it).
static struct {
    pthread_mutex_t m;
    pthread_cond_t c;
} nap = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static const uint64_t kernel_ptrs[] = {
    0xffff888000000000UL, // direct map
    0xffffffff81000000UL, // kernel text
    0xffffffffff600000UL, // vsyscall page
    0x0000800000000000UL, // first non-canonical
    0xdead000000000000UL, // poison, non-canonical
    0xfffffffffffffff8UL, // wraps on + 8
};

static unsigned next_rand(void) {
    rng = rng * 1103515245u + 12345u;
    return rng >> 8;
}

static uint64_t at(uint64_t region, unsigned i, unsigned stride) {
    return (uint64_t)(uintptr_t)arena + region + (uint64_t)i * stride;
}
#define INTERP(i) at(R_INTERP, (i), 0x80000)
#define TSTATE(i) at(R_TSTATE, (i) % N_TSTATE, 512)
#define CFRAME(i) at(R_CFRAME, (i) % N_TSTATE, 64)
#define FRAME(i) at(R_FRAME, (i) % N_FRAME, 128)
#define CODE(i) at(R_CODE, (i) % N_CODE, 256)
#define STR(i) at(R_STR, (i) % N_STR, 256)

static void put64(uint64_t addr, size_t off, uint64_t v) {
    if (off != (size_t)-1)
        memcpy((void *)(uintptr_t)(addr + off), &v, 8);
}

static void put8(uint64_t addr, size_t off, uint8_t v) {
    *(uint8_t *)(uintptr_t)(addr + off) = v;
}

// Unicode state bits (3.12/3.13): interned:2 kind:3 compact:1 ascii:1.
#define STATE(kind, compact, ascii) (((kind) << 2) | ((compact) << 5) | ((ascii) << 6))

// A compact ASCII str at STR(i) holding `text` (at most 200 bytes) but
// claiming `length` (the real length if 0) and `state`.
static uint64_t make_str(unsigned i, const char *text, size_t n, uint64_t length, uint32_t state) {
    uint64_t s = STR(i);
    if (n > 200)
        n = 200;
    memset((void *)(uintptr_t)s, 0, 256);
    put64(s, 0, 1);
    put64(s, L.ob_type, (uint64_t)(uintptr_t)PyUnicode_Type);
    put64(s, L.str_length, length ? length : n);
    put64(s, 24, (uint64_t)-1);
    memcpy((void *)(uintptr_t)(s + L.str_state), &state, 4);
    memcpy((void *)(uintptr_t)(s + L.str_ascii_size), text, n);
    return s;
}

static uint64_t plain_str(unsigned i, const char *text) {
    return make_str(i, text, strlen(text), 0, STATE(1, 1, 1));
}

// Names that try to inject frames, lines or markers into a profile, or
// break its encoding.
static const char *const evil_names[] = {
    "main;evil_[py];[GIL]",
    "multi\nline 42\n",
    "fake.py:qualname_[py]",
    "[GIL]",
    "nul\0hidden",
    "\x1b[31mred\x1b[0m",
    "\xff\xfe not utf-8 \xc3",
    "<lambda>",
    "",
    "a b c 999",
};
#define N_EVIL (sizeof(evil_names) / sizeof(*evil_names))

static uint64_t make_code(unsigned i, uint64_t name, uint64_t qualname, uint64_t file, int32_t line) {
    uint64_t c = CODE(i);
    memset((void *)(uintptr_t)c, 0, 256);
    put64(c, 0, 1);
    put64(c, L.ob_type, (uint64_t)(uintptr_t)PyCode_Type);
    memcpy((void *)(uintptr_t)(c + L.co_firstlineno), &line, 4);
    put64(c, L.co_filename, file);
    put64(c, L.co_name, name);
    put64(c, L.co_qualname, qualname);
    put64(c, L.co_linetable, c); // itself, as a bytes object
    return c;
}

static void make_frame(unsigned i, uint64_t code, uint64_t previous, uint8_t owner) {
    uint64_t f = FRAME(i);
    memset((void *)(uintptr_t)f, 0, 128);
    put64(f, L.fr_code, code);
    put64(f, L.fr_previous, previous);
    put64(f, L.fr_instr, code + 200);
    put8(f, L.fr_owner, owner);
}

// Thread state `i` running `frame`, for the real thread `id`/`tid`.
static void make_tstate(unsigned i, uint64_t interp, uint64_t prev, uint64_t next, uint64_t frame,
                        uint64_t id, int32_t tid) {
    uint64_t t = TSTATE(i);
    memset((void *)(uintptr_t)t, 0, 512);
    put64(t, L.ts_prev, prev);
    put64(t, L.ts_next, next);
    put64(t, L.ts_interp, interp);
    put64(t, L.ts_thread_id, id);
    memcpy((void *)(uintptr_t)(t + L.ts_native_tid), &tid, 4);
    if (L.cf_current_frame == (size_t)-1) {
        put64(t, L.ts_frame, frame);
    } else {
        put64(t, L.ts_frame, CFRAME(i));
        put64(CFRAME(i), L.cf_current_frame, frame);
    }
}

static void make_interp(unsigned i, uint64_t next, uint64_t threads, int64_t id, uint64_t gil) {
    uint64_t in = INTERP(i);
    memset((void *)(uintptr_t)in, 0, 8192 + 256);
    put64(in, L.in_next, next);
    put64(in, L.in_id, (uint64_t)id);
    put64(in, L.in_threads_head, threads);
    put64(in, L.in_ceval_gil, gil);
    // modules, sys and builtins dicts: a dict claiming 2^40 entries whose
    // keys are the dict itself.
    uint64_t d = at(R_DICT, i, 256);
    put64(d, 0, 1);
    put64(d, L.ob_type, d);
    put64(d, 16, 1UL << 40);
    put64(d, 24, 0);
    put64(d, 32, d);
    put64(d, 40, d);
    put64(in, L.in_modules, d);
    put64(in, L.in_sysdict, d);
    put64(in, L.in_builtins, d);
}

// The runtime's own fields, and for 3.13 the debug header describing L.
static void write_runtime(uint64_t interp_head, uint64_t interp_main) {
    uint64_t rt = (uint64_t)(uintptr_t)_PyRuntime;
    memset(_PyRuntime, 0, sizeof(_PyRuntime));
    put64(rt, L.rt_interp_head, interp_head);
    put64(rt, L.rt_interp_main, interp_main);
    if (FAKE_MINOR < 13)
        return;
    uint64_t d[D_FIELDS] = {0};
    d[D_VERSION] = VERSION_HEX;
    d[D_RT_SIZE] = L.rt_size;
    d[D_RT_INTERP_HEAD] = L.rt_interp_head;
    d[D_IN_SIZE] = L.in_size, d[D_IN_ID] = L.in_id, d[D_IN_NEXT] = L.in_next;
    d[D_IN_THREADS_HEAD] = L.in_threads_head, d[D_IN_MODULES] = L.in_modules;
    d[D_IN_SYSDICT] = L.in_sysdict, d[D_IN_BUILTINS] = L.in_builtins;
    d[D_IN_CEVAL_GIL] = L.in_ceval_gil, d[D_IN_GIL_STATE] = L.in_gil;
    d[D_IN_GIL_ENABLED] = 24, d[D_IN_GIL_LOCKED] = 16, d[D_IN_GIL_HOLDER] = 8;
    d[D_TS_SIZE] = L.ts_size, d[D_TS_PREV] = L.ts_prev, d[D_TS_NEXT] = L.ts_next;
    d[D_TS_INTERP] = L.ts_interp, d[D_TS_FRAME] = L.ts_frame;
    d[D_TS_THREAD_ID] = L.ts_thread_id, d[D_TS_NATIVE_TID] = L.ts_native_tid;
    d[D_TS_DATASTACK] = 40, d[D_TS_STATUS] = L.ts_status;
    d[D_FR_SIZE] = L.fr_size, d[D_FR_PREVIOUS] = L.fr_previous;
    d[D_FR_EXECUTABLE] = L.fr_code, d[D_FR_INSTR] = L.fr_instr;
    d[D_FR_LOCALSPLUS] = L.fr_localsplus, d[D_FR_OWNER] = L.fr_owner;
    d[D_CO_SIZE] = L.co_size, d[D_CO_FILENAME] = L.co_filename, d[D_CO_NAME] = L.co_name;
    d[D_CO_QUALNAME] = L.co_qualname, d[D_CO_LINETABLE] = L.co_linetable;
    d[D_CO_FIRSTLINENO] = L.co_firstlineno;
    d[D_OB_SIZE] = 16, d[D_OB_TYPE] = L.ob_type;
    d[D_TYPE_SIZE] = 416, d[D_TYPE_NAME] = 24, d[D_TYPE_FLAGS] = 168;
    d[D_DICT_SIZE] = 48, d[D_DICT_KEYS] = 32, d[D_DICT_VALUES] = 40;
    d[D_STR_SIZE] = 56, d[D_STR_STATE] = L.str_state, d[D_STR_LENGTH] = L.str_length;
    d[D_STR_ASCII_SIZE] = L.str_ascii_size;
    memcpy(_PyRuntime, "xdebugpy", 8);
    memcpy(_PyRuntime + 8, d, sizeof(d));
}

static void set_debug_field(int k, uint64_t v) {
    memcpy(_PyRuntime + 8 + 8 * k, &v, 8);
}

// A plausible world with the threads' real ids: one interpreter, the
// thread list a ring, frames `depth` long per thread (the last one
// previous to itself when `self_loop`, else to the thread's first: a ring).
static void world(const uint64_t *ids, const int *tids, int n, unsigned depth, int self_loop,
                  int evil, uint64_t gil) {
    uint64_t in = INTERP(0);
    if (n > N_TSTATE)
        n = N_TSTATE;
    for (unsigned i = 0; i < N_CODE; i++) {
        const char *name = evil ? evil_names[i % N_EVIL] : "cycle";
        unsigned j = i % (N_STR - 1);
        uint64_t s = evil ? make_str(j, name, strlen(name) + (i % N_EVIL == 4 ? 7 : 0), 0,
                                     STATE(1, 1, 1))
                          : plain_str(j, name);
        make_code(i, s, s, plain_str(N_STR - 1, "fake.py"), (int32_t)i);
    }
    unsigned per = depth ? depth : 1;
    if (per * (unsigned)n > N_FRAME)
        per = N_FRAME / (unsigned)n;
    for (int t = 0; t < n; t++) {
        unsigned first = (unsigned)t * per;
        for (unsigned k = 0; k < per; k++) {
            unsigned f = first + k;
            uint64_t prev = k + 1 < per ? FRAME(f + 1) : self_loop ? FRAME(f) : FRAME(first);
            // Every other frame a shim: an eval-loop boundary each time.
            make_frame(f, CODE(f), prev, evil && (k & 1) ? FRAME_OWNED_BY_CSTACK : 0);
        }
        uint64_t next = TSTATE((unsigned)(t + 1) % (unsigned)n);
        uint64_t prev = TSTATE((unsigned)(t + n - 1) % (unsigned)n);
        make_tstate((unsigned)t, in, prev, next, FRAME(first), ids[t], tids[t]);
    }
    make_interp(0, in, TSTATE(0), 0, gil);
    write_runtime(in, in);
}

static void attack_cycles(const uint64_t *ids, const int *tids, int n) {
    world(ids, tids, n, 1, 1, 0, (uint64_t)(uintptr_t)&nap);
}

static void attack_ring(const uint64_t *ids, const int *tids, int n) {
    world(ids, tids, n, 200, 0, 1, INTERP(0) + L.in_gil);
    // Two interpreters, each the other's next; the second's threads are
    // the first's.
    make_interp(1, INTERP(0), TSTATE(0), 1, INTERP(1) + L.in_gil);
    put64(INTERP(0), L.in_next, INTERP(1));
    write_runtime(INTERP(1), INTERP(0));
}

static void attack_huge(const uint64_t *ids, const int *tids, int n) {
    world(ids, tids, n, 8, 0, 0, (uint64_t)(uintptr_t)&nap);
    // Names claiming 2^40 bytes, or with kinds and flags CPython never
    // writes (kind 7, non-compact with its data pointer in the kernel).
    static const uint32_t states[] = {STATE(1, 1, 1), STATE(4, 1, 0), STATE(7, 1, 0),
                                      STATE(1, 0, 0), STATE(2, 1, 1)};
    static const uint64_t lengths[] = {1UL << 40, (uint64_t)-1, 1UL << 63, 0x7fffffff, 65537};
    for (unsigned i = 0; i < N_CODE; i++) {
        uint64_t s = make_str(i, "huge", 4, lengths[i % 5], states[(i / 5) % 5]);
        put64(s, 56, kernel_ptrs[0]); // a non-compact string's data
        make_code(i, s, s, s, i & 1 ? INT32_MIN : INT32_MAX);
    }
    // A 60,000-byte name, and one claiming a bit more than it has.
    uint64_t big = (uint64_t)(uintptr_t)arena + R_LONGSTR;
    put64(big, 0, 1);
    put64(big, L.ob_type, (uint64_t)(uintptr_t)PyUnicode_Type);
    put64(big, L.str_length, 60000);
    uint32_t st = STATE(1, 1, 1);
    memcpy((void *)(uintptr_t)(big + L.str_state), &st, 4);
    memset((void *)(uintptr_t)(big + L.str_ascii_size), 'A', 60000);
    put64(CODE(0), L.co_qualname, big);
    put64(big + 60000, 0, 0);
    // A thread list of 262,144 states 16 bytes apart (each overlapping
    // the next), ending in NULL: only a bound on its length stops a walk.
    uint64_t chain = (uint64_t)(uintptr_t)arena + R_CHAIN;
    for (unsigned i = 0; i < N_CHAIN; i++) {
        uint64_t t = chain + 16UL * i;
        put64(t, 0, i ? t - 16 : 0);
        put64(t, 8, i + 1 < N_CHAIN ? t + 16 : 0);
    }
    put64(TSTATE(n - 1), L.ts_next, chain); // instead of back to the first
    put64(INTERP(0), L.in_id, (uint64_t)INT64_MIN);
}

// Pointer number `k` of the unreadable kinds.
static uint64_t unmapped_ptr(unsigned k) {
    switch (k % 5) {
    case 0: return hole;
    case 1: return (uint64_t)(uintptr_t)guard;
    case 2: return 16;
    case 3: return edge;
    default: return (uint64_t)(uintptr_t)guard + 4096 - 4;
    }
}

static void attack_unmapped(const uint64_t *ids, const int *tids, int n, unsigned gen) {
    world(ids, tids, n, 4, 0, 0, (uint64_t)(uintptr_t)&nap);
    unsigned k = gen / 8;
    // One link per generation leads nowhere readable, the others are sound.
    switch (k % 6) {
    case 0: write_runtime(unmapped_ptr(k), unmapped_ptr(k + 1)); break;
    case 1: put64(INTERP(0), L.in_threads_head, unmapped_ptr(k)); break;
    case 2:
        for (int t = 0; t < n && t < N_TSTATE; t++)
            put64(TSTATE(t), L.ts_next, unmapped_ptr(k + t));
        break;
    case 3:
        for (unsigned f = 0; f < N_FRAME; f++)
            put64(FRAME(f), f & 1 ? L.fr_previous : L.fr_code, unmapped_ptr(k + f));
        break;
    case 4:
        for (unsigned c = 0; c < N_CODE; c++)
            put64(CODE(c), c & 1 ? L.co_qualname : L.co_filename, unmapped_ptr(k + c));
        break;
    default:
        for (unsigned c = 0; c < N_CODE; c++)
            put64(CODE(c), L.ob_type, unmapped_ptr(k + c));
    }
}

static void attack_kernel(const uint64_t *ids, const int *tids, int n, unsigned gen) {
    world(ids, tids, n, 4, 0, 0, kernel_ptrs[gen % 6]);
    const unsigned nk = sizeof(kernel_ptrs) / sizeof(*kernel_ptrs);
    for (unsigned f = 0; f < N_FRAME; f++)
        if (f % 4 == 3)
            put64(FRAME(f), L.fr_previous, kernel_ptrs[f % nk]);
    for (unsigned c = 0; c < N_CODE; c++)
        put64(CODE(c), L.co_qualname, kernel_ptrs[c % nk]);
    if (gen / 8 % 2)
        write_runtime(kernel_ptrs[gen / 16 % nk], kernel_ptrs[1]);
}

// A word from everything hostile, including `self` (the word's address).
static uint64_t spray_word(uint64_t self) {
    unsigned r = next_rand();
    switch (r % 9) {
    case 0: return self;
    case 1: return self - 8;
    case 2: return INTERP(r % 2);
    case 3: return TSTATE(r);
    case 4: return FRAME(r);
    case 5: return CODE(r);
    case 6: return kernel_ptrs[r % 6];
    case 7: return unmapped_ptr(r);
    default: return r & 1 ? 1UL << 40 : (uint64_t)-1;
    }
}

static void spray(uint64_t start, size_t bytes) {
    for (size_t off = 0; off + 8 <= bytes; off += 8)
        put64(start, off, spray_word(start + off));
}

static void attack_spray(const uint64_t *ids, const int *tids, int n, unsigned gen) {
    world(ids, tids, n, 4, 0, 0, (uint64_t)(uintptr_t)&nap);
    rng = gen;
    size_t keep = FAKE_MINOR >= 13 ? DEBUG_HEADER : 0; // the header stays plausible
    spray((uint64_t)(uintptr_t)_PyRuntime + keep, sizeof(_PyRuntime) - keep);
    spray(INTERP(0), 8192 + 256);
    spray(at(R_TSTATE, 0, 0), N_TSTATE * 512);
    spray(at(R_CFRAME, 0, 0), N_TSTATE * 64);
    spray(at(R_FRAME, 0, 0), N_FRAME * 128);
    spray(at(R_CODE, 0, 0), N_CODE * 256);
    // The threads keep their real ids: the BPF walk reads their sprayed
    // frames.
    for (int t = 0; t < n && t < N_TSTATE; t++) {
        put64(TSTATE(t), L.ts_thread_id, ids[t]);
        memcpy((void *)(uintptr_t)(TSTATE(t) + L.ts_native_tid), &tids[t], 4);
    }
}

static void attack_offsets(const uint64_t *ids, const int *tids, int n, unsigned gen) {
    world(ids, tids, n, 4, 1, 0, (uint64_t)(uintptr_t)&nap);
    if (FAKE_MINOR < 13) {
        // A 3.13 header in a 3.12: a reader must go by the version.
        memcpy(_PyRuntime, "xdebugpy", 8);
        uint64_t v = 0x030d00f0;
        memcpy(_PyRuntime + 8, &v, 8);
        return;
    }
    static const uint64_t absurd[] = {1UL << 40, 1UL << 63, (uint64_t)-1, (uint64_t)-8,
                                      RT_SIZE + 8, 7, 0};
    unsigned k = gen / 8;
    if (k % 3 == 0) {
        // Everything absurd at once.
        for (int f = D_RT_SIZE; f < D_FIELDS; f++)
            set_debug_field(f, absurd[((unsigned)f + k) % 7]);
    } else {
        // One field absurd, the others sound, a different one each time;
        // every third time the structures' sizes claim 2^40 too.
        set_debug_field(D_RT_SIZE + (int)(k % (D_FIELDS - D_RT_SIZE)), absurd[k % 7]);
        static const int sizes[] = {D_RT_SIZE, D_IN_SIZE, D_TS_SIZE, D_FR_SIZE, D_CO_SIZE};
        for (unsigned s = 0; k % 3 == 2 && s < 5; s++)
            set_debug_field(sizes[s], 1UL << 40);
    }
    // Offsets inside the sizes but that make every field the same one:
    // next == prev == the thread itself, previous == the frame.
    if (k % 5 == 4) {
        set_debug_field(D_TS_NEXT, L.ts_prev);
        set_debug_field(D_FR_PREVIOUS, L.fr_code);
        set_debug_field(D_IN_THREADS_HEAD, L.in_next);
    }
}

static void attack_lies(const uint64_t *ids, const int *tids, int n, unsigned gen) {
    world(ids, tids, n, 3, 0, 1, kernel_ptrs[gen % 3]);
    if (FAKE_MINOR >= 13) {
        static const uint64_t versions[] = {0x030e00f0, 0x020712f0, 0x030c01f0, 0};
        set_debug_field(D_VERSION, versions[gen / 8 % 4]);
        set_debug_field(D_FREE_THREADED, 1);
    }
    // Thread states claiming other processes' and impossible thread ids.
    for (int t = 0; t < n && t < N_TSTATE; t++) {
        int32_t tid = t & 1 ? 1 : -1;
        memcpy((void *)(uintptr_t)(TSTATE(t) + L.ts_native_tid), &tid, 4);
        put64(TSTATE(t), L.ts_thread_id, t & 2 ? 0 : ids[0]);
    }
}

EXPORT const char *fake_py_attack(unsigned gen) {
    static const char *const names[] = {"cycles", "ring",  "huge",    "unmapped",
                                        "kernel", "spray", "offsets", "lies"};
    return names[gen % 8];
}

static int init(void) {
    if (arena)
        return 0;
    void *a = mmap(NULL, ARENA + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *g = mmap(NULL, 2 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED || g == MAP_FAILED)
        return -1;
    // The page after the arena unmapped: `edge` straddles the end.
    munmap((uint8_t *)a + ARENA, 4096);
    // The second guard page unmapped: a hole next to a mapping.
    munmap((uint8_t *)g + 4096, 4096);
    arena = a;
    guard = g;
    hole = (uint64_t)(uintptr_t)g + 4096;
    edge = (uint64_t)(uintptr_t)arena + ARENA - 4;
    return 0;
}

// Rewrites everything for generation `gen`: the attack is gen % 8. `ids`
// are the threads' pthread_self(), `tids` their kernel ids. Returns -1 if
// the arena could not be mapped.
EXPORT int fake_py_rewrite(unsigned gen, const uint64_t *ids, const int *tids, int n) {
    if (init() || n <= 0)
        return -1;
    switch (gen % 8) {
    case 0: attack_cycles(ids, tids, n); break;
    case 1: attack_ring(ids, tids, n); break;
    case 2: attack_huge(ids, tids, n); break;
    case 3: attack_unmapped(ids, tids, n, gen); break;
    case 4: attack_kernel(ids, tids, n, gen); break;
    case 5: attack_spray(ids, tids, n, gen); break;
    case 6: attack_offsets(ids, tids, n, gen); break;
    default: attack_lies(ids, tids, n, gen);
    }
    return 0;
}

// Sleeps `ms` in a condition wait on the library's own futex (the "GIL"
// of some attacks).
EXPORT void fake_py_nap(int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&nap.m);
    pthread_cond_timedwait(&nap.c, &nap.m, &ts);
    pthread_mutex_unlock(&nap.m);
}
