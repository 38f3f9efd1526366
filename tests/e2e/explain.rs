//! `/explain` (issue #42) on two incidents the tests set up, each asked
//! of the shared daemon: a Python service whose request threads wait for
//! the GIL held by a background loop (the GIL finding first, naming the
//! holder thread and the function it runs), and a Java service capped by
//! a fixed pool blocked on a slow downstream (the pool finding first, with
//! its thread count and a capacity within 10 % of the throughput the
//! service measures itself). Each also inside a container (pid and mount
//! namespaces), the GIL one in a cgroup of a cgroup2 hierarchy the test
//! mounts. Also the text answer, `name=`, the command line and bad input.

use std::{
    io::BufRead,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::support::{
    get,
    java::{JavaRun, Jdk},
    rows::{json_at, within},
    workload, Fixture, Workload, CATCH_UP,
};

/// The window the incidents are explained over.
const WINDOW_S: u64 = 10;
/// How long the daemon may take to see an incident through a whole
/// window: a busy host symbolizes slowly (each test takes 5-30 s when
/// the host is not starved).
const WITHIN: Duration = CATCH_UP;

fn python() -> PathBuf {
    std::fs::canonicalize("/usr/bin/python3").expect("/usr/bin/python3 is missing")
}

fn script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads/python")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The workload's next line after `ready`, without its `prefix `.
fn next_line(w: &mut Workload, prefix: &str) -> String {
    let mut line = String::new();
    w.stdout().read_line(&mut line).unwrap();
    line.trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("expected `{prefix}...`, got {line:?}"))
        .trim()
        .to_string()
}

fn findings(answer: &Value) -> &Vec<Value> {
    answer["findings"].as_array().expect("findings")
}

fn finding<'a>(answer: &'a Value, kind: &str) -> Option<&'a Value> {
    findings(answer).iter().find(|f| f["kind"] == kind)
}

fn tids(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

#[test]
fn the_gil_holder_and_its_function_are_named_first() {
    let Some(fx) = Fixture::ebpf() else {
        return;
    };
    let ws = fx.daemon();
    let mut w = Workload::start(&python(), &[&script("gil_holder.py"), "--requests", "6"]);
    let line = next_line(&mut w, "tids");
    let (background, requests) = {
        let mut parts = line.split_whitespace();
        let b: u64 = parts.next().unwrap()["background=".len()..]
            .parse()
            .unwrap();
        let r: Vec<u64> = parts.next().unwrap()["request=".len()..]
            .split(',')
            .map(|t| t.parse().unwrap())
            .collect();
        (b, r)
    };
    let pid = w.pid;
    let query = format!("/explain?pid={pid}&seconds={WINDOW_S}");
    // Once Python's thread names are read, and every request thread was
    // seen waiting for the GIL with the holder's frames known.
    let named = || {
        json_at(ws, &format!("/threads?pid={pid}&seconds={WINDOW_S}"))["threads"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "background-loop"))
    };
    let answer = within(WITHIN, || {
        let answer = json_at(ws, &query);
        let gil = finding(&answer, "gil")?;
        let waiting = tids(&gil["numbers"]["waiting_tids"]);
        let seen = requests.iter().all(|t| waiting.contains(t))
            && gil["numbers"]["holder"]["frame"].is_string()
            && named();
        seen.then_some(answer)
    });
    let answer = answer.unwrap_or_else(|| {
        panic!(
            "no GIL finding with every request thread waiting within {WITHIN:?}: {:#}",
            json_at(ws, &query)
        )
    });
    println!("{answer:#}");
    let first = &findings(&answer)[0];
    assert_eq!(
        first["kind"], "gil",
        "the GIL finding is not first: {answer:#}"
    );
    let holder = &first["numbers"]["holder"];
    assert_eq!(holder["tid"], background, "{first:#}");
    assert_eq!(holder["name"], "background-loop", "{first:#}");
    let frame = holder["frame"].as_str().unwrap();
    assert!(
        frame.starts_with("crunch_forever (gil_holder.py:"),
        "the holder's function: {frame}"
    );
    assert!(holder["held_share"].as_f64().unwrap() > 0.5, "{first:#}");
    let headline = first["headline"].as_str().unwrap();
    assert!(
        headline.contains("background-loop") && headline.contains("crunch_forever"),
        "{headline}"
    );
    assert!(
        first["evidence"]
            .as_str()
            .unwrap()
            .starts_with(&format!("/threads?pid={pid}&")),
        "{first:#}"
    );
    let (status, evidence) = get(&format!("{ws}{}", first["evidence"].as_str().unwrap()));
    assert_eq!(status, 200, "{evidence}");

    // Found by its script's name: the same process, the same first finding.
    let by_name = json_at(
        ws,
        &format!("/explain?name=gil_holder.py%20--requests%206&seconds={WINDOW_S}"),
    );
    assert_eq!(by_name["pid"], pid, "{by_name:#}");
    assert_eq!(findings(&by_name)[0]["kind"], "gil", "{by_name:#}");

    // The same as text, and from the command line.
    let (status, text) = get(&format!("{ws}{query}&format=text"));
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("1. [gil]") && text.contains("background-loop"),
        "{text}"
    );
    let cli = Command::new(env!("CARGO_BIN_EXE_wallscope"))
        .args(["explain", "--pid", &pid.to_string(), "--seconds", "10"])
        .args(["--url", ws])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success(), "{cli:?}");
    assert!(
        out.contains("[gil]") && out.contains("background-loop"),
        "{out}"
    );
    bad_input_is_refused(ws, pid);
}

/// Bad parameters answer 400 naming the parameter; the command line exits
/// 2 with the daemon's message.
fn bad_input_is_refused(ws: &str, pid: u32) {
    for (query, param) in [
        ("pid=abc".to_string(), "pid"),
        (format!("pid={pid}&limit=3"), "limit"),
        ("limit=0".to_string(), "limit"),
        ("format=html".to_string(), "format"),
    ] {
        let (status, body) = get(&format!("{ws}/explain?{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(param), "{query}: {body}");
    }
    let (status, body) = get(&format!("{ws}/explain?pid=4000000"));
    assert_eq!(status, 404, "{body}");
    let cli = Command::new(env!("CARGO_BIN_EXE_wallscope"))
        .args(["explain", "--pid", "4000000", "--url", ws])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&cli.stderr);
    assert_eq!(cli.status.code(), Some(2), "{err}");
    assert!(err.contains("unknown pid 4000000"), "{err}");
    // Host-wide: at most `limit` processes, each with its time lost.
    let host = json_at(ws, "/explain?seconds=10&limit=3");
    let listed = host["processes"].as_array().unwrap();
    assert!(listed.len() <= 3, "{host:#}");
    assert!(listed.iter().all(|p| p["waiting_us"].as_u64().is_some()));
}

/// The downstream's answer delay and the pool's size.
const DELAY_MS: u64 = 50;
const POOL_THREADS: u64 = 8;

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Reads the service's `done <tasks> <epoch ms>` lines into `progress`
/// up to one printed at `until_ms` or later.
fn read_progress(w: &mut Workload, progress: &mut Vec<(u64, u64)>, until_ms: u64) {
    while progress.last().is_none_or(|p| p.0 < until_ms) {
        let line = next_line(w, "done");
        let (done, ms) = line.split_once(' ').unwrap();
        progress.push((ms.parse().unwrap(), done.parse().unwrap()));
    }
}

#[test]
fn a_pool_capped_by_a_slow_downstream_is_named_with_its_capacity() {
    pool_incident(JavaRun::default());
}

/// The same pool incident inside a container (its own pid and mount
/// namespaces, a private `/tmp`): the JVM's threads and frames are found
/// through the namespace.
#[test]
fn a_saturated_pool_is_named_inside_a_container() {
    pool_incident(JavaRun {
        namespaced: true,
        ..JavaRun::default()
    });
}

fn pool_incident(run: JavaRun) {
    let Some(fx) = Fixture::ebpf().filter(|_| Jdk::Default.available()) else {
        return;
    };
    let ws = fx.daemon();
    let delay = DELAY_MS.to_string();
    let mut downstream = Workload::start(
        &python(),
        &[&script("slow_downstream.py"), "--delay-ms", &delay],
    );
    let port = next_line(&mut downstream, "port");
    let mut jvm = run.start("SaturatedPool", &[&port, &POOL_THREADS.to_string()]);
    let pid = jvm.pid;
    // The service's own count of tasks done, as (epoch ms, done).
    let mut progress: Vec<(u64, u64)> = Vec::new();
    read_progress(&mut jvm.workload, &mut progress, 0);
    let steady_from = progress[0].0;
    let query = format!("/explain?pid={pid}&seconds={WINDOW_S}");
    let started = Instant::now();
    // Once a whole window of the service running is recorded, and the
    // daemon found the pool.
    let answer = within(WITHIN + Duration::from_secs(WINDOW_S), || {
        let asked = epoch_ms();
        let answer = json_at(ws, &query);
        let found = finding(&answer, "pool_saturation").is_some()
            && asked > steady_from + (WINDOW_S + 2) * 1000;
        found.then_some((asked, answer))
    });
    let Some((asked, answer)) = answer else {
        panic!(
            "no pool finding within {:?}: {:#}",
            started.elapsed(),
            json_at(ws, &query)
        )
    };
    println!("{answer:#}");
    read_progress(&mut jvm.workload, &mut progress, asked);
    // The throughput the service measured over the window's seconds.
    let end = progress.iter().rev().find(|p| p.0 <= asked).unwrap();
    let start = progress
        .iter()
        .rev()
        .find(|p| p.0 <= asked - WINDOW_S * 1000)
        .unwrap_or(&progress[0]);
    let measured = (end.1 - start.1) as f64 * 1000.0 / (end.0 - start.0) as f64;
    let first = &findings(&answer)[0];
    assert_eq!(
        first["kind"], "pool_saturation",
        "the pool finding is not first: {answer:#}"
    );
    let n = &first["numbers"];
    assert_eq!(n["pool"], "pool-1-thread-*", "{first:#}");
    assert_eq!(n["threads"], POOL_THREADS, "{first:#}");
    assert_eq!(n["wait"]["object"], "socket", "{first:#}");
    let capacity = n["capacity_per_s"].as_f64().unwrap();
    let ideal = POOL_THREADS as f64 * 1000.0 / DELAY_MS as f64;
    println!("capacity {capacity:.1}/s; measured {measured:.1}/s; threads / delay {ideal:.1}/s");
    assert!(
        (capacity - measured).abs() <= 0.1 * measured,
        "capacity {capacity:.1}/s vs the {measured:.1} tasks/s the service completed: {first:#}"
    );
    // Nothing completes faster than the downstream answers.
    assert!(measured <= ideal * 1.02, "{measured} > {ideal}");
    let frame = n["wait"]["frame"].as_str().unwrap_or_default();
    assert_eq!(frame, "SaturatedPool.callDownstream", "{first:#}");
    assert!(
        first["evidence"]
            .as_str()
            .unwrap()
            .starts_with(&format!("/threads?pid={pid}&")),
        "{first:#}"
    );
    drop(downstream);
}

/// A lock-order deadlock (two C pools, each thread holding the lock the
/// other pool waits for) is the first finding, certain, naming both pools.
#[test]
fn a_deadlock_is_the_first_finding() {
    let Some(fx) = Fixture::ebpf() else {
        return;
    };
    let ws = fx.daemon();
    let w = Workload::start(&workload("lockorder"), &[]);
    let query = format!("/explain?pid={}&seconds={WINDOW_S}", w.pid);
    // `/blocked` lists threads blocked for a second or more.
    let answer = within(WITHIN, || {
        let answer = json_at(ws, &query);
        finding(&answer, "deadlock").is_some().then_some(answer)
    })
    .unwrap_or_else(|| panic!("no deadlock within {WITHIN:?}: {:#}", json_at(ws, &query)));
    let first = &findings(&answer)[0];
    assert_eq!(first["kind"], "deadlock", "{answer:#}");
    assert_eq!(first["numbers"]["pattern"], "lock_cycle", "{first:#}");
    assert_eq!(first["numbers"]["certainty"], "certain", "{first:#}");
    assert_eq!(
        first["numbers"]["pools"],
        serde_json::json!(["alpha-*", "beta-*"]),
        "{first:#}"
    );
    assert_eq!(
        first["evidence"],
        format!("/blocked?pid={}&format=text", w.pid)
    );
}

/// Without a daemon: a malformed pid is a usage error (2), no daemon at
/// the address a failure (1), each with a message.
#[test]
fn the_command_line_refuses_bad_input_and_says_when_no_daemon_answers() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_wallscope"))
            .arg("explain")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--pid", "x"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--pid"), "{err}");
    let (code, err) = run(&["--seconds", "-3"]);
    assert_eq!(code, Some(2), "{err}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, err) = run(&["--pid", "1", "--url", &format!("http://{closed}")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no answer from"), "{err}");
}

/// The host pid of the one process `launcher` (an `unshare --fork`) forked.
fn forked_by(launcher: u32) -> u32 {
    let children = format!("/proc/{launcher}/task/{launcher}/children");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = text.split_whitespace().find_map(|p| p.parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < deadline, "{launcher} forked nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The same GIL incident inside a container (its own pid and mount
/// namespaces): the daemon sees host tids, the interpreter its own, and
/// the holder is still named with its function.
#[test]
fn the_gil_holder_is_named_inside_a_container() {
    let Some(fx) = Fixture::ebpf() else {
        return;
    };
    let ws = fx.daemon();
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--mount", "--fork", "--kill-child", "--mount-proc"])
        .arg(python())
        .args([&script("gil_holder.py"), "--requests", "4"]);
    let mut w = Workload::spawn(cmd);
    let requests = next_line(&mut w, "tids")
        .split_whitespace()
        .nth(1)
        .map_or(0, |r| r.split(',').count());
    assert_eq!(requests, 4);
    let pid = forked_by(w.child.id());
    assert_ne!(pid, w.pid, "the ready line names the namespace's pid");
    let query = format!("/explain?pid={pid}&seconds={WINDOW_S}");
    let answer = within(WITHIN, || {
        let answer = json_at(ws, &query);
        let gil = finding(&answer, "gil")?;
        let ready = gil["numbers"]["waiting_threads"].as_u64() >= Some(requests as u64)
            && gil["numbers"]["holder"]["name"] == "background-loop"
            && gil["numbers"]["holder"]["frame"].is_string();
        ready.then_some(answer)
    })
    .unwrap_or_else(|| {
        panic!(
            "no GIL finding naming the holder within {WITHIN:?}: {:#}",
            json_at(ws, &query)
        )
    });
    let first = &findings(&answer)[0];
    assert_eq!(first["kind"], "gil", "{answer:#}");
    let holder = &first["numbers"]["holder"];
    assert_eq!(holder["name"], "background-loop", "{first:#}");
    // A host tid of the process, not the interpreter's own.
    let tid = holder["tid"].as_u64().unwrap();
    assert!(
        Path::new(&format!("/proc/{pid}/task/{tid}")).exists(),
        "holder tid {tid} is not a thread of host pid {pid}: {first:#}"
    );
    let frame = holder["frame"].as_str().unwrap();
    assert!(
        frame.starts_with("crunch_forever (gil_holder.py:"),
        "{frame}"
    );
}

/// A cgroup2 hierarchy mounted by the test (the host's unified hierarchy,
/// seen through a mount of its own), unmounted when dropped.
struct Cgroup2Mount(tempfile::TempDir);

impl Cgroup2Mount {
    fn new() -> Cgroup2Mount {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "cgroup2", "none"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mounting cgroup2: {status}");
        Cgroup2Mount(dir)
    }
}

impl Drop for Cgroup2Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// The GIL incident in a cgroup of a cgroup2 hierarchy the test mounts:
/// the same finding first, and the process's v2 cgroup is the test's.
#[test]
fn the_gil_holder_is_named_in_a_cgroup2_the_test_mounted() {
    use crate::support::cgroup::{start_command_in, Cgroup};
    let Some(fx) = Fixture::ebpf() else {
        return;
    };
    let ws = fx.daemon();
    let mount = Cgroup2Mount::new();
    let (path, mut w) = {
        let cg = Cgroup::create(mount.0.path(), "ws-test-explain-v2/service");
        let command = format!(
            "'{}' '{}' --requests 3",
            python().display(),
            script("gil_holder.py")
        );
        let w = start_command_in(&cg, &command);
        ("/ws-test-explain-v2/service", (w, cg))
    };
    let line = next_line(&mut w.0, "tids");
    let requests = line
        .split_whitespace()
        .find_map(|p| p.strip_prefix("request="))
        .map_or(0, |r| r.split(',').count());
    assert_eq!(requests, 3, "{line}");
    let pid = w.0.pid;
    let query = format!("/explain?pid={pid}&seconds={WINDOW_S}");
    let answer = within(WITHIN, || {
        let answer = json_at(ws, &query);
        let gil = finding(&answer, "gil")?;
        let ready = gil["numbers"]["waiting_threads"].as_u64() >= Some(requests as u64)
            && gil["numbers"]["holder"]["name"] == "background-loop";
        ready.then_some(answer)
    })
    .unwrap_or_else(|| {
        panic!(
            "no GIL finding within {WITHIN:?}: {:#}",
            json_at(ws, &query)
        )
    });
    assert_eq!(findings(&answer)[0]["kind"], "gil", "{answer:#}");
    let rows = json_at(ws, &format!("/processes?seconds={WINDOW_S}"));
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in /processes"));
    assert_eq!(row["cgroups"]["v2"], path, "{row:#}");
    drop(w);
}
