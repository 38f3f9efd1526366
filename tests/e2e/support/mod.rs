//! Shared by the e2e tests: building workloads, the fixture that gates on
//! root/eBPF and takes turns, running the daemon, plain HTTP.
#![allow(dead_code)]

pub mod api;
pub mod browser;
pub mod caps;
pub mod cgroup;
pub mod crowd;
pub mod doc_examples;
pub mod fixture;
pub mod java;
pub mod java_frames;
pub mod kernel;
pub mod memcg;
pub mod otlp;
pub mod pyroscope;
pub mod rows;
pub mod spans;
pub mod users;

pub use fixture::Fixture;

use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex, OnceLock,
    },
    thread,
    time::{Duration, Instant},
};

/// Compiles `tests/workloads/NAME.c` with frame pointers, once per test
/// process (tests run in parallel and share the binary).
pub fn workload(name: &str) -> PathBuf {
    // Frame pointers everywhere, leaf functions included, and no tail
    // calls: the stacks the tests expect are then exact.
    let flags = [
        "-O1",
        "-fno-omit-frame-pointer",
        "-mno-omit-leaf-frame-pointer",
    ];
    build_workload(name, &flags)
}

/// Compiles `tests/workloads/NAME.c` optimized and without frame pointers.
pub fn workload_without_frame_pointers(name: &str) -> PathBuf {
    build_workload(name, &["-O2", "-fomit-frame-pointer"])
}

/// Compiles `tests/workloads/NAME.c` with frame pointers and extra
/// `flags` (e.g. `-D` switches) into a binary called `out_name`.
pub fn workload_variant(name: &str, out_name: &str, flags: &[&str]) -> PathBuf {
    let mut all = vec![
        "-O1",
        "-fno-omit-frame-pointer",
        "-mno-omit-leaf-frame-pointer",
    ];
    all.extend_from_slice(flags);
    build_workload_as(name, out_name, &all)
}

/// Compiles `tests/workloads/NAME.c` with gcc into a shared library
/// `out_name` (`-fPIC -shared`, plus `flags`): clang 14 cannot emit
/// TLSDESC (`-mtls-dialect=gnu2`).
pub fn shared_workload(name: &str, out_name: &str, flags: &[&str]) -> PathBuf {
    let mut cmd = Command::new("gcc");
    cmd.args(["-g", "-O1", "-fno-omit-frame-pointer", "-pthread"])
        .args(["-fPIC", "-shared"])
        .args(flags)
        .arg(format!("-Wl,-soname,{out_name}"));
    compile_once(name, out_name, cmd)
}

fn build_workload(name: &str, flags: &[&str]) -> PathBuf {
    build_workload_as(name, name, flags)
}

fn build_workload_as(name: &str, out_name: &str, flags: &[&str]) -> PathBuf {
    let mut cmd = Command::new("clang");
    cmd.args(["-g", "-fno-inline", "-pthread"])
        .arg("-fno-optimize-sibling-calls")
        .args(flags);
    compile_once(name, out_name, cmd)
}

/// Runs `cc -o OUT tests/workloads/NAME.c` once per output name.
fn compile_once(name: &str, out_name: &str, mut cc: Command) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/workloads/{name}.c"));
    let out = workloads_dir().join(out_name);
    if built.iter().any(|b| b == out_name) {
        return out;
    }
    let status = cc
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("running cc");
    assert!(status.success(), "compiling {}", src.display());
    built.push(out_name.to_string());
    out
}

/// Compiles `tests/workloads/NAME.rs` as a release build without frame
/// pointers, with the rustc that runs the tests.
pub fn rust_workload(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/workloads/{name}.rs"));
    let out = workloads_dir().join(name);
    if !built.iter().any(|b| b == name) {
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let status = Command::new(rustc)
            .args(["--edition", "2021", "-C", "opt-level=2"])
            .args(["-C", "force-frame-pointers=no", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("running rustc");
        assert!(status.success(), "compiling {}", src.display());
        built.push(name.to_string());
    }
    out
}

fn workloads_dir() -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("workloads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Longest a workload may take to print `ready` (a JVM on a saturated
/// host takes seconds).
const READY_WITHIN: Duration = Duration::from_secs(180);

/// A started workload that printed `ready <pid>`.
pub struct Workload {
    pub child: Child,
    pub pid: u32,
    stdout: BufReader<std::process::ChildStdout>,
    /// What it printed before `ready`.
    preamble: String,
}

impl Workload {
    /// Starts `bin args...` and waits for its `ready <pid>` line.
    pub fn start(bin: &Path, args: &[&str]) -> Workload {
        let mut cmd = Command::new(bin);
        cmd.args(args);
        Workload::spawn(cmd)
    }

    /// Starts `cmd` and waits for its `ready <pid>` line.
    pub fn spawn(mut cmd: Command) -> Workload {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        // A workload that never gets ready must fail its test, not hang the
        // run: killed, its output ends.
        let ready = Arc::new(AtomicBool::new(false));
        let (watched, child_pid) = (ready.clone(), child.id() as libc::pid_t);
        thread::spawn(move || {
            let deadline = Instant::now() + READY_WITHIN;
            while Instant::now() < deadline && !watched.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(100));
            }
            if !watched.load(Ordering::Relaxed) {
                // SAFETY: kill has no memory preconditions; the child is
                // not reaped before `ready` is set or spawn panics.
                unsafe { libc::kill(child_pid, libc::SIGKILL) };
            }
        });
        // A JVM may print a thread dump first (SIGQUIT from an attach with
        // the attach mechanism disabled): keep it, read on to `ready`.
        let mut preamble = String::new();
        let pid = loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).unwrap_or(0) == 0 {
                ready.store(true, Ordering::Relaxed);
                panic!("no `ready <pid>` line within {READY_WITHIN:?}; printed:\n{preamble}");
            }
            if let Some(pid) = line
                .trim()
                .strip_prefix("ready ")
                .and_then(|p| p.parse().ok())
            {
                ready.store(true, Ordering::Relaxed);
                break pid;
            }
            preamble.push_str(&line);
        };
        Workload {
            child,
            pid,
            stdout,
            preamble,
        }
    }

    /// What it prints after `ready`, as it prints it.
    pub fn stdout(&mut self) -> &mut BufReader<std::process::ChildStdout> {
        &mut self.stdout
    }

    /// Kills the workload; returns the rest of what it printed.
    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let mut rest = std::mem::take(&mut self.preamble);
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        rest
    }

    /// Waits for the workload to finish successfully; returns the rest of
    /// what it printed.
    pub fn wait(mut self) -> String {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "workload failed: {status}");
        rest
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Longest a daemon may take to catch up with what happened before
/// [`settle`]: on a busy host a debug build symbolizes a batch in seconds
/// and builds the host's unwind tables in tens of seconds.
pub const CATCH_UP: Duration = Duration::from_secs(180);

/// Waits until the daemon at `url` has what happened before the call in
/// its store: it drained twice since (the second empties the buffer the
/// first swapped out) and every drained batch was symbolized or dropped.
/// Panics after [`CATCH_UP`].
pub fn settle(url: &str) {
    let health = |url: &str| {
        let (status, body) = get(&format!("{url}/healthz"));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let drains = |h: &serde_json::Value| n(&h["pipeline"]["drains"]);
    let from = drains(&health(url));
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let h = health(url);
        // Every drain symbolized into the store, merged into a later one
        // while the symbolizer was behind, or dropped (the store's slice
        // count says nothing: it merges old slices).
        let stored = n(&h["pipeline"]["symbolized_batches"])
            + n(&h["pipeline"]["batches_dropped"])
            + n(&h["pipeline"]["batches_merged"]);
        let all_stored = stored >= drains(&h);
        if drains(&h) >= from + 2 && all_stored {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{url} did not catch up within {CATCH_UP:?}: {}",
            h["pipeline"]
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// Runs workload `name args` to completion while the shared daemon
/// watches, then lets the daemon catch up; returns the pid and what the
/// workload printed after `ready`.
pub fn run_with_output(name: &str, args: &[&str]) -> (u32, String) {
    let url = daemon();
    // Not behind on earlier workloads: it reads this one's maps in time.
    settle(url);
    let w = Workload::start(&workload(name), args);
    let pid = w.pid;
    let out = w.wait();
    settle(url);
    (pid, out)
}

/// [`run_with_output`] without the output.
pub fn run(name: &str, args: &[&str]) -> u32 {
    run_with_output(name, args).0
}

/// `/folded` rows of the shared daemon for `query` (which must answer 200).
pub fn folded_rows(query: &str) -> (Vec<(Vec<String>, u64)>, String) {
    let (status, body) = get(&format!("{}/folded?{query}", daemon()));
    assert_eq!(status, 200, "{query}: {body}");
    (parse_folded(&body), body)
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Base URL of the daemon shared by all modules, started on first use
/// and past its first drains (which build unwind tables for every binary
/// on the host); it runs until the test process ends or a test takes
/// [`Fixture::ebpf_alone`]. Call it only while holding a [`Fixture`].
pub fn daemon() -> &'static str {
    fixture::pooled(&[])
}

/// A `wallscope serve` of one's own, stopped when dropped.
pub struct Daemon {
    pub url: String,
    child: Child,
}

impl Daemon {
    /// Starts `wallscope serve` with extra arguments on a free port and
    /// waits until it answers. It gets PR_SET_PDEATHSIG, so it dies with
    /// the tests even if they are killed.
    pub fn start(args: &[&str]) -> Daemon {
        let daemon = Daemon::spawn(args);
        daemon.wait_ready();
        daemon
    }

    /// [`Daemon::start`] without the wait: it may still be loading.
    pub fn spawn(args: &[&str]) -> Daemon {
        Daemon::spawn_with(args, |_| {})
    }

    /// [`Daemon::spawn`], with `prepare` given the command last (e.g. to
    /// move the child into a cgroup before it execs).
    pub fn spawn_with(args: &[&str], prepare: impl FnOnce(&mut Command)) -> Daemon {
        let port = free_port();
        // Another build of the daemon may stand in, e.g. the last release
        // for a page's "before" screenshot.
        let bin = std::env::var_os("WALLSCOPE_E2E_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_wallscope").into());
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(args);
        if caps::requested() {
            let (granted, _) = caps::grantable(&caps::unit_caps());
            cmd = caps::under(&granted, &cmd);
        }
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        // PDEATHSIG fires when the spawning *thread* exits: spawn from a
        // thread that never does.
        prepare(&mut cmd);
        let (tx, rx) = mpsc::channel();
        spawner().send((cmd, tx)).unwrap();
        let child = rx.recv().unwrap().expect("starting wallscope serve");
        let url = format!("http://127.0.0.1:{port}");
        Daemon { url, child }
    }

    /// Waits until it answers `/healthz`.
    pub fn wait_ready(&self) {
        // Loading and verifying the BPF programs takes seconds on a quiet
        // host and far longer on a saturated one.
        let deadline = Instant::now() + Duration::from_secs(90);
        while get(&format!("{}/healthz", self.url)).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "wallscope serve did not answer /healthz within 90 s"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and waits up to `limit` for the daemon to exit: how
    /// long it took and how it exited, or `None` if it still runs (it is
    /// killed when dropped).
    pub fn terminate(&mut self, limit: Duration) -> Option<(Duration, std::process::ExitStatus)> {
        let started = Instant::now();
        // SAFETY: kill has no memory preconditions; the child is not reaped
        // yet, so its pid is still ours.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some((started.elapsed(), status));
            }
            thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

impl Daemon {
    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// A thread that lives as long as the test process and spawns children.
fn spawner() -> mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<SpawnRequest>();
            thread::spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                loop {
                    thread::park();
                }
            });
            Mutex::new(tx)
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Pids of the processes whose program name ends in `program` and whose
/// arguments include `arg`.
pub fn processes_running(program: &str, arg: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let named = args.first()?.ends_with(program.as_bytes());
            (named && args.contains(&arg.as_bytes())).then_some(pid)
        })
        .collect()
}

/// GET returning status and body (any status).
pub fn get(url: &str) -> (u16, String) {
    match ureq::get(url).timeout(Duration::from_secs(30)).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// Parses folded text into (stack, value) rows, checking the format.
pub fn parse_folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .map(|line| {
            let (stack, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}"));
            (stack.split(';').map(str::to_string).collect(), value)
        })
        .collect()
}

/// Share (0..1) of the total value of stacks containing `frame`.
pub fn share_of(rows: &[(Vec<String>, u64)], frame: &str) -> f64 {
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let with: u64 = rows
        .iter()
        .filter(|r| r.0.iter().any(|f| f == frame))
        .map(|r| r.1)
        .sum();
    with as f64 / total.max(1) as f64
}

/// A microsecond field of a `/threads` row, as f64 (panics if missing).
pub fn us(t: &serde_json::Value, field: &str) -> f64 {
    t[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {t}")) as f64
}
