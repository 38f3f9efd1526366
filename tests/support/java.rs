//! Java workloads: compiled once per test binary with the JDK on the
//! machine, run as an unprivileged user, optionally in their own pid and
//! mount namespaces (like a container).

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    thread,
    time::{Duration, Instant},
};

use super::Workload;

/// The user JVMs run as in tests (`nobody`).
pub const USER: u32 = 65534;

/// The JDK's `bin` directory: `$JAVA_HOME/bin`, else the one on `PATH`.
fn jdk_bin(tool: &str) -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) => Path::new(&home).join("bin").join(tool),
        None => PathBuf::from(tool),
    }
}

/// True when a JDK is there. Without one the Java tests skip, except
/// under `CI=true` (where `./dev test` installs it), where they fail.
pub fn jdk_available() -> bool {
    let ok = Command::new(jdk_bin("javac"))
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true but no JDK (javac) found: the Java tests must run");
        }
        eprintln!("skipping: no JDK (javac) found");
    }
    ok
}

/// Compiles `tests/workloads/java/*.java` once into a directory outside
/// `/tmp` (namespaced JVMs get a private `/tmp`) that every user can read.
pub fn classes() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/java");
        let dir = PathBuf::from(format!("/var/tmp/wallscope-java-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let sources: Vec<PathBuf> = fs::read_dir(&src)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "java"))
            .collect();
        let status = Command::new(jdk_bin("javac"))
            .arg("-d")
            .arg(&dir)
            .args(&sources)
            .status()
            .expect("running javac");
        assert!(status.success(), "javac failed");
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        dir
    })
}

/// How a Java workload is started.
#[derive(Debug, Clone, Default)]
pub struct JavaRun {
    /// In new pid and mount namespaces with a private `/tmp`.
    pub namespaced: bool,
    /// Restrict the JVM to these CPUs (`taskset -c`).
    pub cpus: Option<&'static str>,
    /// Extra JVM options.
    pub jvm_opts: Vec<String>,
    /// Leave out `-XX:+PreserveFramePointer`.
    pub no_frame_pointer: bool,
}

/// A running JVM: the workload and its pid as seen from the host.
pub struct Jvm {
    pub workload: Workload,
    pub pid: u32,
    pub map_cleanup: PerfMapCleanup,
}

/// Removes the JVM's `/tmp` perf map when the test is done with it: the JVM
/// never removes the map it was asked to write, and pids recycle, so a later
/// test would find it under another process's pid.
pub struct PerfMapCleanup(u32);

impl Drop for PerfMapCleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", self.0));
    }
}

impl JavaRun {
    /// Starts `CLASS args...` as user `nobody` with only
    /// `-XX:+PreserveFramePointer` (no perf-map flag, no agent) and waits
    /// for its `ready` line.
    pub fn start(&self, class: &str, args: &[&str]) -> Jvm {
        // The JVM prints its own pid, which in a pid namespace is not ours:
        // find it by a marker argument instead.
        let marker = format!("wallscope-test-{}-{:?}", std::process::id(), Instant::now());
        let mut cmd = if self.namespaced {
            let mut c = Command::new("unshare");
            c.args(["--pid", "--mount", "--mount-proc", "--fork", "--kill-child"])
                .args(["sh", "-c"])
                .arg("mount -t tmpfs tmpfs /tmp && exec \"$@\"")
                .arg("sh");
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", "exec \"$@\"", "sh"]);
            c
        };
        if let Some(cpus) = self.cpus {
            cmd.args(["taskset", "-c", cpus]);
        }
        cmd.args(["setpriv", "--reuid", &USER.to_string(), "--regid"])
            .arg(USER.to_string())
            .arg("--clear-groups")
            .arg(jdk_bin("java"))
            .args((!self.no_frame_pointer).then_some("-XX:+PreserveFramePointer"))
            .args(&self.jvm_opts)
            .arg("-cp")
            .arg(classes())
            .arg(class)
            .args(args)
            .arg(&marker)
            .current_dir("/");
        let workload = Workload::spawn(cmd);
        let pid = find_by_marker(&marker);
        Jvm {
            workload,
            pid,
            map_cleanup: PerfMapCleanup(pid),
        }
    }
}

/// The host pid of the `java` process whose command line holds `marker`.
fn find_by_marker(marker: &str) -> u32 {
    // A busy host may take a while to exec the JVM.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(&pid) = super::processes_running("java", marker).first() {
            return pid;
        }
        assert!(Instant::now() < deadline, "no java process with {marker}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// Share of `workers`' time whose stack has a Java caller (compiled,
/// interpreted, or not yet in the perf map) right above `park` and runs
/// through `chain` in order: a parked worker's stack from the thread start
/// to the futex wait.
pub fn complete_park_share(workers: &super::rows::Rows, park: &str, chain: &[&str]) -> f64 {
    let with_java_caller: super::rows::Rows = workers
        .iter()
        .filter(|(stack, _)| {
            let at = stack.iter().position(|f| f == park);
            at.and_then(|i| stack.get(i.checked_sub(1)?))
                .is_some_and(|caller| {
                    caller.ends_with("_[j]")
                        || caller == "Interpreter"
                        || caller == "[jvm code not in perf map]"
                })
        })
        .cloned()
        .collect();
    let total: u64 = workers.iter().map(|r| r.1).sum();
    super::rows::share_with_chain(&with_java_caller, chain)
        * with_java_caller.iter().map(|r| r.1).sum::<u64>() as f64
        / total.max(1) as f64
}
