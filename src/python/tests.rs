//! The reader against the interpreters installed here (each skipped when
//! absent; Debian's static 3.11 always is), and against fakes.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use super::*;
use crate::{
    process::remote::Budget,
    process::{files::ExecMapping, live::exec_mappings},
};

/// A child killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// Starts `cmd` and waits for it to print its first line.
fn start(mut cmd: Command) -> Running {
    let mut child = Running(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let out = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("child ready");
    assert_eq!(line.trim(), "ready");
    child
}

/// A thread blocked on a lock in `wait_here`, the main thread asleep in
/// `outer -> map -> lambda -> inner -> time.sleep`.
const SCRIPT: &str = r#"
import threading, time
lock = threading.Lock()
lock.acquire()
started = threading.Event()
def wait_here():
    started.set()
    lock.acquire()
worker = threading.Thread(target=wait_here, name="blocked-worker", daemon=True)
worker.start()
started.wait()
# The main thread's attributes in a dict of its own (3.11+: not in the
# instance's managed values any more), combined, keys not all str.
threading.main_thread().__dict__[0] = "an int key"
def inner():
    time.sleep(0.1)
    print("ready", flush=True)
    time.sleep(600)
def outer():
    # A call from C (map) between outer and inner: a second eval loop.
    for _ in map(lambda _: inner(), [0]):
        pass
outer()
"#;

fn tids(pid: u32) -> Vec<u32> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .collect();
    tids.sort_unstable();
    tids
}

/// Whether [start, end) lies in one writable mapping of `pid`.
fn writable(pid: u32, start: u64, end: u64) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines().any(|line| {
        let mut f = line.split_whitespace();
        let range = f.next().unwrap();
        let perms = f.next().unwrap();
        let (lo, hi) = range.split_once('-').unwrap();
        let lo = u64::from_str_radix(lo, 16).unwrap();
        let hi = u64::from_str_radix(hi, 16).unwrap();
        perms.contains('w') && lo <= start && end <= hi
    })
}

/// A stack as names and `|` for each EvalEnd.
fn named(py: &Interpreter, mem: &Remote, stack: &[PyEntry]) -> Vec<String> {
    stack
        .iter()
        .map(|e| match e {
            PyEntry::Code(code) => py.code_name(mem, *code).unwrap().qualname,
            PyEntry::EvalEnd => "|".to_string(),
        })
        .collect()
}

/// The walk as the BPF program makes it, from `walk_layout()` alone.
fn walk_like_bpf(mem: &Remote, w: &UnwindPython, tstate: u64) -> Vec<PyEntry> {
    use crate::bpf::abi::{PyEntry as Walk, PY_FRAME_READ, PY_NO_FIELD};
    let mut frame = mem.u64(tstate + u64::from(w.tstate_frame)).unwrap();
    if w.cframe_frame != PY_NO_FIELD && frame != 0 {
        frame = mem.u64(frame + u64::from(w.cframe_frame)).unwrap();
    }
    let mut out = Vec::new();
    while frame != 0 && out.len() < MAX_FRAMES {
        let buf = mem.bytes(frame, PY_FRAME_READ.into()).unwrap();
        let code = PyEntry::Code(crate::process::remote::uint_at(
            &buf,
            w.frame_code.into(),
            8,
        ));
        let entry = buf.get(usize::from(w.frame_entry)).copied();
        match w.entry {
            e if e == Walk::WS_PY_ENTRY_EVERY as u8 => out.extend([code, PyEntry::EvalEnd]),
            e if e == Walk::WS_PY_ENTRY_FLAG as u8 => {
                out.push(code);
                if entry != Some(0) {
                    out.push(PyEntry::EvalEnd);
                }
            }
            _ if entry == Some(w.shim_owner) => out.push(PyEntry::EvalEnd),
            _ => out.push(code),
        }
        frame = crate::process::remote::uint_at(&buf, w.frame_back.into(), 8);
    }
    out.truncate(MAX_FRAMES);
    out
}

/// What the stacks of SCRIPT's threads are in 3.`minor`: main, worker.
fn expected(minor: u8) -> (Vec<&'static str>, Vec<&'static str>) {
    match minor {
        // Every frame is one call of the eval loop.
        10 => (
            vec!["inner", "|", "<lambda>", "|", "outer", "|", "<module>", "|"],
            vec![
                "wait_here",
                "|",
                "run",
                "|",
                "_bootstrap_inner",
                "|",
                "_bootstrap",
                "|",
            ],
        ),
        // Python-to-Python calls stay in one eval loop call, those from C
        // (map) start another; 3.11's Thread.run calls its target through
        // C (CALL_FUNCTION_EX), 3.12's inline.
        _ => {
            let main = vec![
                "inner",
                "outer.<locals>.<lambda>",
                "|",
                "outer",
                "<module>",
                "|",
            ];
            let mut worker = vec![
                "wait_here",
                "Thread.run",
                "Thread._bootstrap_inner",
                "Thread._bootstrap",
                "|",
            ];
            if minor == 11 {
                worker.insert(1, "|");
            }
            (main, worker)
        }
    }
}

fn check_interpreter(bin: &str, minor: u8) {
    if !Path::new(bin).exists() {
        eprintln!("skipped: no {bin}");
        return;
    }
    let mut cmd = Command::new(bin);
    cmd.args(["-I", "-c", SCRIPT]);
    let child = start(cmd);
    let pid = child.pid();
    let maps = exec_mappings(pid).unwrap();
    let t0 = Instant::now();
    let py = find(pid, &maps).unwrap_or_else(|e| panic!("{bin}: {e}"));
    eprintln!("{bin}: found in {:?}: {py:x?}", t0.elapsed());
    assert_eq!(py.minor, minor);
    assert_eq!(py.version >> 16, 0x0300 | u32::from(minor));

    let walk = py.walk_layout();
    assert_eq!(walk.minor, minor);
    assert!(walk.gil_start != 0 && walk.gil_start < walk.gil_end);
    assert!(
        writable(pid, walk.gil_start, walk.gil_end),
        "GIL {:#x}..{:#x} in writable memory",
        walk.gil_start,
        walk.gil_end
    );
    let entry = if minor == 10 {
        crate::bpf::abi::PyEntry::WS_PY_ENTRY_EVERY
    } else if minor == 11 {
        crate::bpf::abi::PyEntry::WS_PY_ENTRY_FLAG
    } else {
        crate::bpf::abi::PyEntry::WS_PY_ENTRY_SHIM
    };
    assert_eq!(walk.entry, entry as u8);
    assert_eq!(walk.shim_owner, if minor >= 12 { 3 } else { 0 });
    assert_eq!(
        walk.cframe_frame == crate::bpf::abi::PY_NO_FIELD,
        !(11..=12).contains(&minor)
    );

    let mem = Remote::with_budget(pid, Budget::new(100_000, 64 << 20));
    let threads = py.threads(&mem).unwrap();
    assert_eq!(threads.len(), 2, "{threads:x?}");
    if minor >= 11 {
        let mut native: Vec<u32> = threads.iter().map(|t| t.native_tid.unwrap()).collect();
        native.sort_unstable();
        assert_eq!(native, tids(pid));
    } else {
        assert!(threads.iter().all(|t| t.native_tid.is_none()));
    }

    // The worker may still be on its way into the lock: look again until
    // both stacks are as expected.
    let (main_want, worker_want) = expected(minor);
    let deadline = Instant::now() + Duration::from_secs(10);
    let (main, worker) = loop {
        let mut stacks: Vec<(PyThread, Vec<String>)> = threads
            .iter()
            .map(|t| (*t, named(&py, &mem, &py.stack(&mem, t.tstate).unwrap())))
            .collect();
        stacks.sort_by_key(|(_, s)| s.first() != Some(&"inner".to_string()));
        let ok = stacks[0].1 == main_want && stacks[1].1 == worker_want;
        if ok || Instant::now() > deadline {
            assert_eq!(stacks[0].1, main_want, "main thread of {bin}");
            assert_eq!(stacks[1].1, worker_want, "worker of {bin}");
            break (stacks[0].0, stacks[1].0);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if minor >= 11 {
        assert_eq!(main.native_tid, Some(pid), "the main thread runs <module>");
    }
    for t in [main, worker] {
        assert_eq!(
            walk_like_bpf(&mem, &walk, t.tstate),
            py.stack(&mem, t.tstate).unwrap()
        );
    }
    // The file and line of a frame's code.
    let stack = py.stack(&mem, worker.tstate).unwrap();
    let PyEntry::Code(code) = stack[0] else {
        panic!("{stack:?}")
    };
    let name = py.code_name(&mem, code).unwrap();
    assert_eq!((name.file.as_str(), name.first_line), ("<string>", 6));
    let PyEntry::Code(run) = stack[stack.len() - 2] else {
        panic!("{stack:?}")
    };
    let name = py.code_name(&mem, run).unwrap();
    assert!(name.file.ends_with("/threading.py"), "{name:?}");
    assert!(name.qualname.ends_with("_bootstrap"), "{name:?}");
    // Not a code object: refused.
    assert!(matches!(
        py.code_name(&mem, worker.tstate),
        Err(PyError::Implausible(_))
    ));

    let names = py.thread_names(&mem).unwrap();
    eprintln!("{bin}: names {names:x?}");
    assert!(
        names.contains(&(worker.thread_id, "blocked-worker".to_string())),
        "{names:?}"
    );
    assert!(
        names.contains(&(main.thread_id, "MainThread".to_string())),
        "{names:?}"
    );
    assert!(!mem.exhausted());
}

#[test]
fn python_3_10() {
    check_interpreter("/root/.pyenv/versions/3.10.13/bin/python3.10", 10);
}

#[test]
fn python_3_11() {
    check_interpreter("/root/.pyenv/versions/3.11.7/bin/python3.11", 11);
}

#[test]
fn python_3_11_debian_static() {
    check_interpreter("/usr/bin/python3.11", 11);
}

#[test]
fn python_3_12() {
    check_interpreter("/root/.pyenv/versions/3.12.1/bin/python3.12", 12);
}

#[test]
fn python_3_13() {
    check_interpreter("/root/.pyenv/versions/3.13.0/bin/python3.13", 13);
}

#[test]
fn python_3_9_is_unsupported_and_others_are_not_python() {
    let me = std::process::id();
    assert_eq!(
        find(me, &exec_mappings(me).unwrap()).unwrap_err(),
        PyError::NotPython
    );
    let bin = "/root/.pyenv/versions/3.9.18/bin/python3.9";
    if !Path::new(bin).exists() {
        eprintln!("skipped: no {bin}");
        return;
    }
    let mut cmd = Command::new(bin);
    cmd.args([
        "-I",
        "-c",
        "import time; print('ready', flush=True); time.sleep(600)",
    ]);
    let child = start(cmd);
    let maps = exec_mappings(child.pid()).unwrap();
    assert_eq!(
        find(child.pid(), &maps).unwrap_err(),
        PyError::Unsupported(9)
    );
}

/// A library exporting `_PyRuntime`, `Py_Version` and `PyCode_Type`,
/// filled at load time as `FAKE_MODE` says; and a program that loads the
/// library named by its argument.
const FAKE_LIB: &str = r#"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
uint64_t _PyRuntime[8192] __attribute__((aligned(64)));
uint32_t Py_Version = 0x030c01f0;
uint64_t PyCode_Type[64];
static uint64_t interp[2048], tstate[64], frame[16], dict[8], keys[64];
static const char code_name[] = "code";
__attribute__((constructor)) static void fill(void) {
    const char *mode = getenv("FAKE_MODE");
    uint64_t self = (uint64_t)_PyRuntime, x = 0x9e3779b97f4a7c15;
    PyCode_Type[3] = (uint64_t)code_name;
    for (int i = 0; i < 8192; i++) {
        if (!strcmp(mode, "ones")) _PyRuntime[i] = ~0ULL;
        else if (!strcmp(mode, "self")) _PyRuntime[i] = self;
        else if (!strcmp(mode, "random")) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; _PyRuntime[i] = x; }
        else if (!strcmp(mode, "near")) _PyRuntime[i] = self + 8 * (i % 64);
    }
    if (!strncmp(mode, "v13", 3)) {
        /* _Py_DebugOffsets as 3.13's, pointing into the arrays above */
        uint64_t *d = _PyRuntime + 1;
        Py_Version = 0x030d00f0;
        memcpy(_PyRuntime, "xdebugpy", 8);
        d[0] = 0x030d00f0; d[1] = 0;
        d[2] = 65536; d[4] = 1024;
        d[5] = 16384; d[6] = 8; d[7] = 0; d[8] = 16; d[10] = 24; d[13] = 32; d[14] = 64;
        d[18] = 304; d[20] = 8; d[21] = 16; d[22] = 72; d[23] = 152; d[24] = 160;
        d[27] = 80; d[28] = 8; d[29] = 0; d[32] = 70;
        d[33] = 200; d[34] = 112; d[36] = 128; d[38] = 68;
        d[44] = 8; d[45] = 400; d[46] = 24; d[48] = 168;
        d[56] = 32; d[57] = 40; d[61] = 16; d[62] = 24;
        d[67] = 32; d[68] = 16; d[69] = 40;
        _PyRuntime[1024 / 8] = (uint64_t)interp;
        interp[0] = (uint64_t)interp;             /* next: itself */
        interp[1] = !strcmp(mode, "v13-loop");    /* id */
        interp[2] = (uint64_t)tstate;             /* threads.head */
        interp[3] = (uint64_t)dict;               /* imports.modules */
        interp[4] = (uint64_t)&interp[8];         /* ceval.gil -> _gil */
        tstate[1] = (uint64_t)tstate;             /* next: itself */
        tstate[2] = (uint64_t)interp;
        tstate[9] = (uint64_t)frame;              /* current_frame */
        frame[1] = (uint64_t)frame;               /* previous: itself */
        dict[4] = (uint64_t)keys;                 /* ma_keys */
        keys[1] = 40 | 40 << 8 | 1 << 16;         /* log2 sizes 40, unicode */
        keys[3] = 1ULL << 40;                     /* entries */
    }
}
"#;

const FAKE_MAIN: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (!dlopen(argv[1], RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    printf("ready\n");
    fflush(stdout);
    sleep(600);
    return 0;
}
"#;

fn cc(args: &[&str]) {
    let status = Command::new("cc").args(args).status().unwrap();
    assert!(status.success(), "cc {args:?}");
}

#[test]
fn fake_interpreters_are_refused_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let lib_c = dir.path().join("fake.c");
    let main_c = dir.path().join("main.c");
    std::fs::write(&lib_c, FAKE_LIB).unwrap();
    std::fs::write(&main_c, FAKE_MAIN).unwrap();
    let main = dir.path().join("fakepy");
    cc(&[
        "-o",
        main.to_str().unwrap(),
        main_c.to_str().unwrap(),
        "-ldl",
    ]);
    for minor in [12, 13] {
        let lib = dir.path().join(format!("libpython3.{minor}.so"));
        cc(&[
            "-shared",
            "-fPIC",
            "-o",
            lib.to_str().unwrap(),
            lib_c.to_str().unwrap(),
        ]);
    }
    let run = |mode: &str, minor: u8| {
        let lib = dir.path().join(format!("libpython3.{minor}.so"));
        let mut cmd = Command::new(&main);
        cmd.arg(&lib).env("FAKE_MODE", mode);
        let child = start(cmd);
        let maps = exec_mappings(child.pid()).unwrap();
        assert!(maps
            .iter()
            .any(|m| m.path.ends_with(&format!("libpython3.{minor}.so"))));
        let t0 = Instant::now();
        let found = find(child.pid(), &maps);
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "{mode}: {:?}",
            t0.elapsed()
        );
        (child, maps, found)
    };
    for mode in ["zero", "ones", "self", "random", "near", "v13"] {
        let (_child, _, found) = run(mode, 12);
        let err = found.expect_err(mode);
        assert!(
            matches!(err, PyError::Implausible(_) | PyError::Read(_)),
            "{mode}: {err}"
        );
    }
    let (_child, _, found) = run("v13-loop", 13);
    assert!(matches!(found, Err(PyError::Implausible(_))), "{found:?}");

    // Plausible enough to be found; then every list it holds loops or is
    // out of reach, and each read stops at once.
    let (child, maps, found) = run("v13", 13);
    let py = found.unwrap();
    assert_eq!(py.minor, 13);
    let mem = Remote::with_budget(child.pid(), Budget::new(10_000, 16 << 20));
    let t0 = Instant::now();
    assert!(matches!(py.threads(&mem), Err(PyError::Implausible(_))));
    let head = mem.u64(py.interp + 16).unwrap();
    assert!(matches!(py.stack(&mem, head), Err(PyError::Implausible(_))));
    assert!(py.thread_names(&mem).is_err());
    assert!(py.code_name(&mem, head).is_err());
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert!(!mem.exhausted());
    drop(maps);
}

/// Mappings as `find` sees them, with one renamed (a file name that is
/// no interpreter's is not looked at).
#[test]
fn only_interpreter_names_are_opened() {
    let me = std::process::id();
    let maps: Vec<ExecMapping> = exec_mappings(me)
        .unwrap()
        .into_iter()
        .map(|mut m| {
            if m.path.contains("libc.so") {
                m.path = "/nowhere/libpython3.12.so.1.0".into();
            }
            m
        })
        .collect();
    // libc under an interpreter's name: opened (by device and inode, not
    // the path), no _PyRuntime in it.
    assert!(matches!(find(me, &maps), Err(PyError::File(_))));
}
