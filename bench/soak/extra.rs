//! The load issue #24 adds to the soak: a `cargo build` of a crate with
//! dependencies in a loop (rustc and libLLVM are large ELF files, and
//! every build spawns hundreds of processes), and one hostile input of
//! each kind the security tests use, run as `nobody` like they are.

use crate::common::{as_nobody, build_workload, find_tool, ROOT};
use crate::load::Group;
use anyhow::{Context, Result};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The crate built in a loop: two dependencies with their own trees.
const CARGO_TOML: &str = r#"[package]
name = "soakbuild"
version = "0.1.0"
edition = "2021"

[dependencies]
regex = "1"
serde_json = "1"
"#;
const MAIN_RS: &str = r#"fn main() {
    let re = regex::Regex::new(r"(\w+)=(\d+)").unwrap();
    let v: serde_json::Value = serde_json::json!({"n": re.captures_len()});
    println!("{v}");
}
"#;

/// One hostile input of each kind `tests/security*.rs` uses:
/// (workload, arguments; `{lib}` is a libjvm.so look-alike, `{jvm}` the
/// JDK's real libjvm, `{big}` a 3 GiB sparse file).
pub const ATTACKS: [(&str, &[&str]); 8] = [
    ("attacker", &["anonexec"]),
    ("attacker", &["fakejvm", "{lib}"]),
    ("attacker", &["mapbig", "{big}"]),
    // The 1.4 GB spike's cause: a perf map rewritten with new long names.
    ("names_attacker", &["perfmap", "30000", "2000", "2000"]),
    ("names_attacker", &["bigmap", "64"]),
    ("names_attacker", &["javanames", "{lib}", "4194304"]),
    ("jvm_attacker", &["stall", "{jvm}", "1000"]),
    ("slowjvm", &["{lib}", "trickle"]),
];

/// A command run back to back on a thread of the bench until stopped,
/// each run in its own process group (killed with the bench).
pub struct Repeat {
    stop: Arc<AtomicBool>,
    /// The process group of the current run (0 between runs).
    current: Arc<AtomicU32>,
    pub runs: Arc<AtomicU64>,
    pub failures: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Repeat {
    /// Runs the commands `make` returns, in order, over and over.
    pub fn start(make: impl Fn() -> Vec<Command> + Send + 'static) -> Repeat {
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let current = Arc::new(AtomicU32::new(0));
        let (s, r, f, c) = (
            stop.clone(),
            runs.clone(),
            failures.clone(),
            current.clone(),
        );
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let mut ok = true;
                for mut cmd in make() {
                    cmd.stdin(Stdio::null()).stdout(Stdio::null());
                    let done = Group::spawn(&mut cmd, libc::SIGKILL).and_then(|mut g| {
                        c.store(g.pid(), Ordering::SeqCst);
                        let status = g.0 .0.wait();
                        c.store(0, Ordering::SeqCst);
                        Ok(status?.success())
                    });
                    ok &= matches!(done, Ok(true));
                    if s.load(Ordering::Relaxed) {
                        return;
                    }
                }
                (if ok { &r } else { &f }).fetch_add(1, Ordering::Relaxed);
                if !ok {
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        });
        Repeat {
            stop,
            current,
            runs,
            failures,
            thread: Some(thread),
        }
    }

    /// Kills the current run; returns runs completed and failed.
    pub fn stop(&mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let pid = self.current.load(Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: kill(2) on the group of our child, not yet reaped
            // (the thread resets `current` after its wait).
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (get(&self.runs), get(&self.failures))
    }
}

impl Drop for Repeat {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `cargo clean` then `cargo build` of a crate depending on `regex` and
/// `serde_json`, in `dir/soakbuild` with its own target directory; the
/// first run fetches the dependencies from crates.io. Its output goes to
/// `dir/cargo.log`.
pub fn cargo_loop(dir: &Path) -> Result<Repeat> {
    // `cargo bench` says which cargo runs it.
    let cargo = match std::env::var_os("CARGO") {
        Some(c) => PathBuf::from(c),
        None => find_tool("cargo", "rustup")?,
    };
    let krate = dir.join("soakbuild");
    fs::create_dir_all(krate.join("src"))?;
    fs::write(krate.join("Cargo.toml"), CARGO_TOML)?;
    fs::write(krate.join("src/main.rs"), MAIN_RS)?;
    let log = dir.join("cargo.log");
    Ok(Repeat::start(move || {
        let cmd = |args: &[&str]| {
            let mut c = Command::new(&cargo);
            c.args(args)
                .current_dir(&krate)
                .env("CARGO_TARGET_DIR", krate.join("target"));
            if let Ok(f) = fs::OpenOptions::new().create(true).append(true).open(&log) {
                c.stderr(f);
            }
            c
        };
        vec![cmd(&["clean", "-q"]), cmd(&["build", "-q", "-j", "2"])]
    }))
}

/// The running attackers.
pub struct Hostile {
    /// What runs (program and arguments) and its process.
    pub attackers: Vec<(String, Vec<String>, Group)>,
    /// Attackers that exited (the daemon hung up on one, say) and were
    /// started again.
    pub restarts: u64,
    dir: PathBuf,
}

impl Hostile {
    /// Pids of the attackers, named.
    pub fn names(&self) -> Vec<String> {
        let name = |(n, a, _): &(String, Vec<String>, Group)| format!("{n} {}", a.join(" "));
        self.attackers.iter().map(name).collect()
    }

    /// Starts again the attackers that exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for (name, args, g) in &mut self.attackers {
            if g.0 .0.try_wait()?.is_some() {
                *g = spawn_attacker(&self.dir, name, args)?;
                self.restarts += 1;
            }
        }
        Ok(())
    }
}

/// `dir/name args` as `nobody`, once it printed its `ready` line. It
/// ignores SIGPIPE: the daemon hanging up on an attach is no reason to die.
fn spawn_attacker(dir: &Path, name: &str, args: &[String]) -> Result<Group> {
    let mut cmd = as_nobody(&dir.join(name));
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    Group::ignore_sigpipe(&mut cmd);
    let mut g = Group::spawn(&mut cmd, libc::SIGKILL)?;
    g.wait_ready(&format!("{name} {}", args.join(" ")))?;
    Ok(g)
}

impl Drop for Hostile {
    fn drop(&mut self) {
        for (_, _, g) in &self.attackers {
            let _ = fs::remove_file(format!("/tmp/perf-{}.map", g.pid()));
            let _ = fs::remove_file(format!("/tmp/.java_pid{}", g.pid()));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Builds the attackers (as the tests do) into a directory `nobody` can
/// use and starts [`ATTACKS`], each as `nobody`, returning once each has
/// printed its `ready` line.
pub fn start_attackers(java: &Path) -> Result<Hostile> {
    let dir = PathBuf::from(format!("/var/tmp/wallscope-soak-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777))?;
    let lib = dir.join("libjvm.so");
    fs::copy("/lib/x86_64-linux-gnu/libm.so.6", &lib).context("a libjvm.so look-alike")?;
    fs::set_permissions(&lib, fs::Permissions::from_mode(0o644))?;
    let big = dir.join("big.so");
    fs::File::create(&big)?.set_len(3 << 30)?;
    fs::set_permissions(&big, fs::Permissions::from_mode(0o644))?;
    let java = fs::canonicalize(java)?;
    let jvm = java
        .parent()
        .context("java has no directory")?
        .join("../lib/server/libjvm.so");
    let jvm = fs::canonicalize(&jvm).with_context(|| format!("{jvm:?}"))?;
    let mut hostile = Hostile {
        attackers: Vec::new(),
        restarts: 0,
        dir: dir.clone(),
    };
    for (name, args) in ATTACKS {
        let bin = dir.join(name);
        if !bin.exists() {
            let src = Path::new(ROOT).join(format!("tests/workloads/{name}.c"));
            build_workload(&src, &bin)?;
        }
        let args: Vec<String> = args
            .iter()
            .map(|a| match *a {
                "{lib}" => lib.display().to_string(),
                "{jvm}" => jvm.display().to_string(),
                "{big}" => big.display().to_string(),
                a => a.to_string(),
            })
            .collect();
        let g = spawn_attacker(&dir, name, &args)?;
        hostile.attackers.push((name.to_string(), args, g));
    }
    Ok(hostile)
}
