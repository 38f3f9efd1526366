//! An OpenTelemetry thread-context writer per OTEP 4947 / 4719 in Rust,
//! for the span tests (#43): `tests/workloads/otel_writer.c` ported, its
//! default mode only (no attack modes, the variable in the program). It
//! publishes an OTEL_CTX process context (schema tlsdesc_v1_dev, key map
//! ["http_route", "http_method"]) and sets each worker thread's
//! `otel_thread_ctx_v1` to the record of the request it serves.
//!
//! Where the variable lives: stable Rust cannot give a `#[thread_local]`
//! static an exported, unmangled name, so it is defined in `.tbss` with
//! `global_asm!` and reached with local exec (thread pointer + link-time
//! offset), as C's `__thread` in an executable is; `build.rs` exports it
//! in `.dynsym`, where readers look for it. x86_64 Linux only.
//!
//! Usage: rust_otel_writer [--threads N] [--ms M]
//! Prints `ready <pid>`, `tls <tid> <thread pointer> <&otel_thread_ctx_v1>`
//! per worker, then per request
//! `span <trace_hex> <span_hex> <tid> <route> <duration_ns>`
//! (CLOCK_MONOTONIC around the time the record was active). Workers
//! alternate `/lock` (waits on a mutex the main thread holds, released
//! for a moment every M ms) and `/io` (reads a pipe a helper thread
//! answers after M ms).

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("the TLS variable is defined and reached for x86_64 Linux only");

use std::{
    arch::{asm, global_asm},
    ffi::{c_char, c_int, c_long, c_void},
    fmt,
    fs::File,
    io::{self, Read, Write},
    os::fd::FromRawFd,
    process,
    ptr::{self, null_mut},
    sync::{
        atomic::{compiler_fence, fence, AtomicPtr, Ordering},
        Mutex,
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

// The thread context (OTEP 4947): one pointer per thread, zero (no
// active span) in every new thread, as `.tbss` is.
global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".globl otel_thread_ctx_v1",
    ".type otel_thread_ctx_v1, @object",
    ".size otel_thread_ctx_v1, 8",
    ".balign 8",
    "otel_thread_ctx_v1:",
    ".zero 8",
    ".popsection",
);

/// This thread's `otel_thread_ctx_v1`: the thread pointer (`fs:0` holds
/// it) plus the variable's offset from it, fixed at link time.
fn slot() -> *mut *mut Record {
    let p: *mut *mut Record;
    // SAFETY: reads the thread pointer and adds a constant; no memory is
    // written.
    unsafe {
        asm!(
            "mov {p}, qword ptr fs:0",
            "lea {p}, [{p} + otel_thread_ctx_v1@tpoff]",
            p = out(reg) p,
            options(nostack, preserves_flags, readonly),
        );
    }
    p
}

/// The thread pointer, for the `tls` line (the tests compare it with what
/// a reader computes).
fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: a load of the TCB's self pointer.
    unsafe {
        asm!("mov {}, qword ptr fs:0", out(reg) tp, options(nostack, preserves_flags, readonly))
    };
    tp
}

// libc, declared here: the writer has no dependencies.
extern "C" {
    fn gettid() -> c_int;
    fn memfd_create(name: *const c_char, flags: u32) -> c_int;
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    fn prctl(option: c_int, ...) -> c_int;
}

const MFD_CLOEXEC: u32 = 1;
const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const MAP_SHARED: c_int = 0x01;
const MAP_PRIVATE: c_int = 0x02;
const MAP_ANONYMOUS: c_int = 0x20;
const MAP_FAILED: *mut c_void = !0 as *mut c_void;
const MADV_DONTFORK: c_int = 10;
const PR_SET_VMA: c_int = 0x53564d41;
const PR_SET_VMA_ANON_NAME: c_long = 0;

/// Room for the attributes: the two written here take 14 bytes at most
/// (a reader reads `attrs_size` of them, no more).
const ATTRS_ROOM: usize = 64;

/// The record (OTEP 4947): 28 header bytes, then attributes, each a key
/// index, a length and that many bytes of value.
#[repr(C, packed)]
struct Record {
    trace: [u8; 16],
    span: [u8; 8],
    valid: u8,
    flags: u8,
    attrs_size: u16,
    attrs: [u8; ATTRS_ROOM],
}

/// The process context's header (OTEP 4719), at the start of its mapping.
#[repr(C)]
struct Header {
    signature: [u8; 8],
    version: u32,
    payload_size: u32,
    published_at_ns: u64,
    payload: u64,
}

/// Protobuf: a length-delimited field.
fn field(to: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    to.push(tag << 3 | 2);
    let mut len = bytes.len();
    while len >= 0x80 {
        to.push(len as u8 | 0x80);
        len >>= 7;
    }
    to.push(len as u8);
    to.extend_from_slice(bytes);
}

/// A message of length-delimited fields.
fn message(fields: &[(u8, &[u8])]) -> Vec<u8> {
    let mut m = Vec::new();
    for (tag, bytes) in fields {
        field(&mut m, *tag, bytes);
    }
    m
}

/// KeyValue{key, AnyValue{string_value}}.
fn kv_string(key: &str, value: &str) -> Vec<u8> {
    let any = message(&[(1, value.as_bytes())]);
    message(&[(1, key.as_bytes()), (2, &any)])
}

/// ProcessContext{resource{service.name}, extra_attributes[schema, key
/// map]}: byte for byte what the C writer encodes.
fn payload() -> Vec<u8> {
    let resource = message(&[(1, &kv_string("service.name", "otel-writer"))]);
    let schema = kv_string("threadlocal.schema_version", "tlsdesc_v1_dev");
    // AnyValue{array_value (5): ArrayValue{values: AnyValue{string}...}}
    let mut array = Vec::new();
    for key in ["http_route", "http_method"] {
        field(&mut array, 1, &message(&[(1, key.as_bytes())]));
    }
    let key_map = message(&[(5, &array)]);
    let key_map = message(&[(1, b"threadlocal.attribute_key_map"), (2, &key_map)]);
    message(&[(1, &resource), (2, &schema), (2, &key_map)])
}

/// Publishes the process context: a memfd named OTEL_CTX (anonymous
/// memory if memfd_create fails), the payload after the header, the
/// signature written last behind a fence so that a reader never sees a
/// signed, half-written header. Never unmapped.
fn publish() {
    const SIZE: usize = 4096;
    let body = payload();
    // SAFETY: plain libc calls on a mapping of our own; the header and
    // body (32 + < 200 bytes) fit in its page.
    unsafe {
        let fd = memfd_create(c"OTEL_CTX".as_ptr(), MFD_CLOEXEC);
        let h = if fd >= 0 {
            // Closed when dropped, after the mapping holds the file.
            let file = File::from_raw_fd(fd);
            if file.set_len(SIZE as u64).is_err() {
                process::exit(1);
            }
            let prot = PROT_READ | PROT_WRITE;
            mmap(null_mut(), SIZE, prot, MAP_SHARED, fd, 0)
        } else {
            let flags = MAP_PRIVATE | MAP_ANONYMOUS;
            mmap(null_mut(), SIZE, PROT_READ | PROT_WRITE, flags, -1, 0)
        };
        if h == MAP_FAILED {
            process::exit(1);
        }
        // A child would share the memfd page: keep the context ours.
        madvise(h, SIZE, MADV_DONTFORK);
        let h = h.cast::<Header>();
        let at = h.add(1).cast::<u8>();
        ptr::copy_nonoverlapping(body.as_ptr(), at, body.len());
        (*h).version = 2;
        (*h).payload_size = body.len() as u32;
        (*h).payload = at as u64;
        (*h).published_at_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        fence(Ordering::SeqCst);
        ptr::write_volatile(&raw mut (*h).signature, *b"OTEL_CTX");
        let name = c"OTEL_CTX".as_ptr();
        prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, h, SIZE, name);
    }
}

/// Span and trace ids: splitmix64, seeded per thread (ids need only be
/// distinct, not secret).
struct Ids(u64);

impl Ids {
    fn fill(&mut self, b: &mut [u8]) {
        for chunk in b.chunks_mut(8) {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
        b[0] |= 1; // never all zero
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Prints one line whole (stdout's lock), at once: the tests read lines
/// as they come. A reader gone ends the writer, as SIGPIPE ends the C
/// one (Rust ignores SIGPIPE).
fn say(line: fmt::Arguments) {
    let mut out = io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        process::exit(1);
    }
}

/// Held by the main thread, released for a moment every `ms`: `/lock`
/// requests wait ~`ms` for it.
static HELD: Mutex<()> = Mutex::new(());

/// Serves one request: waits ~`ms` on the mutex or on a pipe a helper
/// thread answers after `ms`, then a millisecond of CPU.
fn serve(lock: bool, ms: u64) {
    if lock {
        drop(HELD.lock().unwrap_or_else(|e| e.into_inner()));
    } else {
        let (mut rx, mut tx) = io::pipe().unwrap_or_else(|_| process::abort());
        let answer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(ms));
            if tx.write_all(b"x").is_err() {
                process::abort();
            }
        });
        let mut c = [0u8; 1];
        if rx.read_exact(&mut c).is_err() {
            process::abort();
        }
        let _ = answer.join();
    }
    let until = Instant::now() + Duration::from_millis(1);
    while Instant::now() < until {}
}

/// Sets the record for a request on `route`: ids, flags, attributes
/// (http_route = route, http_method = GET), then `valid`.
fn fill(r: &mut Record, route: &str, ids: &mut Ids) {
    ids.fill(&mut r.trace);
    ids.fill(&mut r.span);
    r.flags = 1;
    let mut n = 0;
    for (key, value) in [route, "GET"].iter().enumerate() {
        r.attrs[n] = key as u8;
        r.attrs[n + 1] = value.len() as u8;
        r.attrs[n + 2..n + 2 + value.len()].copy_from_slice(value.as_bytes());
        n += 2 + value.len();
    }
    r.attrs_size = n as u16;
    r.valid = 1;
}

fn worker(id: u64, ms: u64) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { gettid() };
    let slot = slot();
    say(format_args!(
        "tls {tid} {:x} {:x}",
        thread_pointer(),
        slot as usize
    ));
    // Never freed: the thread serves until the process ends.
    let r: *mut Record = Box::into_raw(Box::new(Record {
        trace: [0; 16],
        span: [0; 8],
        valid: 0,
        flags: 0,
        attrs_size: 0,
        attrs: [0; ATTRS_ROOM],
    }));
    let clock = SystemTime::now().duration_since(UNIX_EPOCH);
    let seed = (process::id() as u64) << 32 ^ tid as u64 ^ clock.map_or(0, |d| d.as_nanos() as u64);
    let mut ids = Ids(seed);
    // SAFETY: `slot` is this thread's variable, 8-aligned in `.tbss`.
    let published = unsafe { AtomicPtr::from_ptr(slot) };
    for n in 0u64.. {
        let lock = (n + id).is_multiple_of(2);
        let route = if lock { "/lock" } else { "/io" };
        // SAFETY: `r` is this thread's own and not published now: no
        // reader looks at it while it is rewritten.
        fill(unsafe { &mut *r }, route, &mut ids);
        let start = Instant::now();
        // Release: the record's writes are all done (in program order,
        // which is what a reader interrupting this thread sees) before
        // the pointer to it.
        published.store(r, Ordering::Release);
        serve(lock, ms);
        published.store(null_mut(), Ordering::Release);
        // Nor may the next request's writes move above the clearing.
        compiler_fence(Ordering::SeqCst);
        let took = start.elapsed().as_nanos();
        // SAFETY: unpublished again; read only by this thread.
        let (trace, span) = unsafe { ((*r).trace, (*r).span) };
        let (th, sh) = (hex(&trace), hex(&span));
        say(format_args!("span {th} {sh} {tid} {route} {took}"));
        thread::sleep(Duration::from_millis(3));
    }
}

fn main() {
    let (mut threads, mut ms) = (4u64, 20u64);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = |v: Option<String>| v.and_then(|v| v.parse().ok());
        match arg.as_str() {
            "--threads" => threads = value(args.next()).unwrap_or_else(|| process::exit(2)),
            "--ms" => ms = value(args.next()).unwrap_or_else(|| process::exit(2)),
            _ => process::exit(2),
        }
    }
    publish();
    // Held from before the workers start.
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    say(format_args!("ready {}", process::id()));
    for w in 0..threads {
        thread::spawn(move || worker(w, ms));
    }
    loop {
        thread::sleep(Duration::from_millis(ms));
        drop(held);
        thread::yield_now();
        held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    }
}
