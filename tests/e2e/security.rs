//! What a local unprivileged user (`nobody`) can do to the daemon running
//! as root: plant symlinks where the JVM attach client creates its trigger,
//! put FIFOs, symlinks, huge or absurd files where perf maps are read, map
//! huge sparse files executable, run thousands of distinct binaries. Each
//! is refused and counted, costs no memory, leaks no descriptor, and the
//! daemon keeps profiling and still stops on SIGTERM. Needs root.

use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use crate::support::{
    get,
    rows::json_at,
    rows::within,
    settle,
    users::{self, NOBODY},
    Daemon, Fixture, Workload, CATCH_UP,
};

/// A directory every user can enter, for this test process.
fn scratch() -> PathBuf {
    users::shared_dir("security", 0o755)
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

/// Starts the attacker as `nobody` in `cwd`.
fn as_nobody(cwd: &Path, args: &[&str]) -> Workload {
    let mut cmd = users::as_nobody(users::runnable_copy("attacker", &scratch()));
    cmd.args(args).current_dir(cwd);
    Workload::spawn(cmd)
}

/// What every test here starts with: its turn, its own daemon, and a
/// directory of its own removed at the end.
struct Scene {
    ws: Daemon,
    dir: PathBuf,
    cleanup: Cleanup,
    /// Alone: every other daemon would symbolize this test's workloads
    /// (1,200 binaries), which is noise for the memory and descriptor
    /// measurements.
    _fx: Fixture,
}

impl Scene {
    /// `None` when eBPF tests are skipped (never under CI=true).
    fn start(name: &str, daemon_args: &[&str]) -> Option<Scene> {
        let fx = Fixture::ebpf_alone()?;
        let ws = Daemon::start(daemon_args);
        // Past its first drains, which read every process on the host.
        settle(&ws.url);
        let dir = scratch().join(name);
        fs::create_dir_all(&dir).unwrap();
        Some(Scene {
            ws,
            cleanup: Cleanup(vec![dir.clone()]),
            dir,
            _fx: fx,
        })
    }
}

/// Paths removed when the test ends, failed or not.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
            let _ = fs::remove_dir_all(p);
        }
    }
}

fn refused(url: &str, what: &str, reason: &str) -> u64 {
    json_at(url, "/healthz")["refused"][what][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no refused.{what}.{reason} in /healthz"))
}

/// Waits until the `what`/`reason` refusal count exceeds `before`.
fn wait_refused(url: &str, what: &str, reason: &str, before: u64) {
    let seen = within(CATCH_UP, || {
        (refused(url, what, reason) > before).then_some(())
    });
    assert!(
        seen.is_some(),
        "{what} never refused for {reason} within {CATCH_UP:?}"
    );
}

struct Snapshot {
    content: Vec<u8>,
    uid: u32,
    mode: u32,
}

fn snapshot(path: &Path) -> Snapshot {
    let meta = fs::symlink_metadata(path).unwrap();
    Snapshot {
        content: fs::read(path).unwrap(),
        uid: meta.uid(),
        mode: meta.mode(),
    }
}

#[test]
fn planted_attach_triggers_are_refused_and_their_targets_untouched() {
    let Some(mut scene) = Scene::start("trigger", &[]) else {
        return;
    };
    let dir = scene.dir.clone();
    let ws = &scene.ws;
    // A root-owned secret in a root-owned directory, and a libjvm.so look-alike.
    let victim = dir.join("victim");
    fs::write(&victim, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
    let libjvm = dir.join("libjvm.so");
    fs::copy("/lib/x86_64-linux-gnu/libm.so.6", &libjvm).unwrap();
    fs::set_permissions(&libjvm, fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let cwd = dir.join("cwd");
    fs::create_dir_all(&cwd).unwrap();
    chown(&cwd, NOBODY);
    let before = snapshot(&victim);
    let refusals = refused(&ws.url, "attach_trigger", "exists");

    let fake = as_nobody(&cwd, &["fakejvm", libjvm.to_str().unwrap()]);
    let name = format!(".attach_pid{}", fake.pid);
    let planted = [cwd.join(&name), PathBuf::from("/tmp").join(&name)];
    scene.cleanup.0.extend(planted.iter().cloned());
    for link in &planted {
        std::os::unix::fs::symlink(&victim, link).unwrap();
        chown(link, NOBODY);
    }
    // Both places tried (a busy host may take a while to get there) ...
    let mut now = refusals;
    within(CATCH_UP, || {
        now = refused(&ws.url, "attach_trigger", "exists");
        (now >= refusals + 2).then_some(())
    });
    assert!(now >= refusals + 2, "refusals {refusals} -> {now}");
    // ... and refused, not truncated nor chowned.
    let after = snapshot(&victim);
    assert_eq!(after.content, before.content, "victim's content changed");
    assert_eq!(after.uid, before.uid, "victim's owner changed");
    assert_eq!(after.mode, before.mode, "victim's mode changed");
    // Reported as a JVM that could not be attached, not retried.
    let mut last = serde_json::Value::Null;
    let report = within(CATCH_UP, || {
        last = json_at(&ws.url, "/processes");
        let row = last.as_array()?.iter().find(|p| p["pid"] == fake.pid)?;
        (row["jvm"]["attach"] == "refused").then(|| row.clone())
    });
    assert!(report.is_some(), "fake JVM not reported as refused: {last}");
}

#[test]
fn hostile_perf_maps_are_refused_and_profiling_goes_on() {
    let Some(mut scene) = Scene::start("perfmap", &[]) else {
        return;
    };
    let dir = scene.dir.clone();
    let ws = &mut scene.ws;
    let secret = dir.join("secret");
    fs::write(&secret, "7f0000000000 1000 root-only\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();

    type Plant = fn(&Path, &Path);
    let variants: [(&str, Plant); 4] = [
        ("symlink", |map, secret| {
            std::os::unix::fs::symlink(secret, map).unwrap()
        }),
        ("too_big", |map, _| {
            // 2 GB, sparse.
            fs::File::create(map).unwrap().set_len(2 << 30).unwrap()
        }),
        ("long_line", |map, _| {
            let line = format!("7f0000000000 10 {}\n", "x".repeat(10 << 20));
            fs::write(map, line.repeat(3)).unwrap()
        }),
        // Last: it stays in place for the SIGTERM below.
        ("wrong_type", |map, _| {
            let c = std::ffi::CString::new(map.to_str().unwrap()).unwrap();
            // SAFETY: valid C string.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }),
    ];
    let mut running = Vec::new();
    for (reason, plant) in variants {
        let before = refused(&ws.url, "perf_map", reason);
        let w = as_nobody(&dir, &["anonexec"]);
        let map = PathBuf::from(format!("/tmp/perf-{}.map", w.pid));
        scene.cleanup.0.push(map.clone());
        // Pids recycle: a JVM from an earlier test may have left a map
        // under this pid (the JVM never removes its own).
        let _ = fs::remove_file(&map);
        plant(&map, &secret);
        chown(&map, NOBODY);
        wait_refused(&ws.url, "perf_map", reason, before);
        running.push(w);
    }
    // Still profiling: the spinning attackers themselves are busy processes.
    let listed = within(CATCH_UP, || {
        let list = json_at(&ws.url, "/processes?seconds=60");
        let busy = list
            .as_array()?
            .iter()
            .filter(|p| running.iter().any(|w| p["pid"] == w.pid))
            .filter(|p| p["cpu_us"].as_u64().unwrap_or(0) > 0)
            .count();
        (busy == running.len()).then_some(())
    });
    assert!(
        listed.is_some(),
        "/processes stopped listing busy processes"
    );
    let (status, body) = get(&format!(
        "{}/folded?pid={}&seconds=60",
        ws.url, running[0].pid
    ));
    assert_eq!(status, 200, "{body}");

    // The FIFO is still there: the daemon must still stop promptly.
    let took = ws.terminate(Duration::from_secs(2));
    let (took, status) = took.expect("SIGTERM did not stop the daemon within 2 s");
    eprintln!("stopped in {took:?}: {status}");
    assert!(status.success(), "{status}");
}

fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn a_huge_sparse_file_mapped_executable_costs_no_memory() {
    let Some(scene) = Scene::start("sparse", &[]) else {
        return;
    };
    let dir = scene.dir.clone();
    let ws = &scene.ws;
    let big = dir.join("big.so");
    let file = fs::File::create(&big).unwrap();
    file.set_len(3 << 30).unwrap();
    drop(file);
    fs::set_permissions(&big, fs::Permissions::from_mode(0o644)).unwrap();
    // Let the daemon settle: its first drains symbolize and build unwind
    // tables for every process on the host.
    let mut last = rss_kib(ws.pid());
    let settled = within(Duration::from_secs(30), || {
        thread::sleep(Duration::from_secs(2));
        let now = rss_kib(ws.pid());
        let steady = now < last + 4096;
        last = now;
        steady.then_some(())
    });
    assert!(settled.is_some(), "daemon RSS never settled");
    let refusals = refused(&ws.url, "elf", "too_big");
    let base = rss_kib(ws.pid());
    let w = as_nobody(&dir, &["mapbig", big.to_str().unwrap()]);
    let mut peak = base;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        peak = peak.max(rss_kib(ws.pid()));
        thread::sleep(Duration::from_millis(20));
    }
    // The process was seen (so its mappings were read) and the file looked
    // at; a busy host may take longer to get there: watch on until then.
    let mut last = (0, String::new());
    let looked = within(CATCH_UP, || {
        peak = peak.max(rss_kib(ws.pid()));
        last = get(&format!("{}/folded?pid={}&seconds=60", ws.url, w.pid));
        (last.0 == 200 && refused(&ws.url, "elf", "too_big") > refusals).then_some(())
    });
    assert!(
        looked.is_some(),
        "the 3 GB file was never looked at; /folded: {} {}",
        last.0,
        last.1
    );
    let grew = (peak - base.min(peak)) / 1024;
    eprintln!("RSS {} MiB -> peak {} MiB", base / 1024, peak / 1024);
    assert!(grew < 50, "RSS grew by {grew} MiB");
    drop(w);
}

/// Descriptors of `pid` and how many point to deleted files.
fn fds(pid: u32) -> (usize, Vec<String>) {
    let mut deleted = Vec::new();
    let mut n = 0;
    for e in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        n += 1;
        if let Ok(target) = fs::read_link(e.path()) {
            let t = target.to_string_lossy().to_string();
            // memfds always read as deleted; they pin nothing on disk.
            if t.ends_with(" (deleted)") && !t.starts_with("/memfd:") {
                deleted.push(t);
            }
        }
    }
    (n, deleted)
}

#[test]
fn distinct_short_lived_binaries_leave_no_descriptors_behind() {
    let Some(scene) = Scene::start("binaries", &["--frequency", "499"]) else {
        return;
    };
    let dir = scene.dir.clone();
    let ws = &scene.ws;
    thread::sleep(Duration::from_secs(3));
    let (fds_before, _) = fds(ws.pid());
    // 1,200 copies: distinct inodes, so distinct files to symbolize.
    let copies: Vec<PathBuf> = (0..1200)
        .map(|i| {
            let p = dir.join(format!("bin{i}"));
            fs::copy(users::runnable_copy("attacker", &scratch()), &p).unwrap();
            p
        })
        .collect();
    let (mut max_fds, mut ran) = (0, 0);
    for pair in copies.chunks(2) {
        let mut children: Vec<_> = pair
            .iter()
            .map(|p| Command::new(p).args(["burn", "20"]).spawn().unwrap())
            .collect();
        for c in &mut children {
            assert!(c.wait().unwrap().success());
            ran += 1;
        }
        if ran % 100 == 0 {
            max_fds = max_fds.max(fds(ws.pid()).0);
        }
    }
    thread::sleep(Duration::from_secs(2));
    for p in &copies {
        fs::remove_file(p).unwrap();
    }
    // The last files are released within a couple of batches; a busy host
    // may delay them.
    let mut released = fds(ws.pid());
    within(CATCH_UP, || {
        released = fds(ws.pid());
        released.1.is_empty().then_some(())
    });
    let (after, deleted) = released;
    eprintln!("fds: {fds_before} before, at most {max_fds} while running, {after} after");
    let health = json_at(&ws.url, "/healthz");
    eprintln!("pipeline: {}", health["pipeline"]);
    assert!(deleted.is_empty(), "fds to deleted files: {deleted:?}");
    let bound = fds_before + 2 * 64;
    assert!(
        max_fds <= bound,
        "{max_fds} fds while running, bound {bound}"
    );
    assert!(after <= bound, "{after} fds after, bound {bound}");
}
