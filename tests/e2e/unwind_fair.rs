//! Unwind tables shared fairly (issue 40): another user (`nobody`) runs
//! 500 distinct short-lived binaries without frame pointers, far more
//! tables than a small row array holds, while a long-running program
//! without frame pointers (whose own table is large) runs as a third user.
//! That program keeps its tables, so its stacks stay complete, and the
//! evictions are charged to `nobody` in `/healthz`. Needs root (eBPF).
//!
//! The long-running program is not root's: on a busy host root's own
//! processes (compilers, builds) may fill the array by themselves, and
//! among one user's tables the newest waits its turn (by design). As user
//! `daemon` it has a share of its own, which root's excess makes room for.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::support::{
    crowd, get, parse_folded,
    rows::{share_with_chain, show, within},
    settle,
    users::{as_nobody, as_user, shared_dir, NOBODY},
    Daemon, Fixture, Workload, CATCH_UP,
};

/// Distinct binaries `nobody` runs, how many at once, and how long each
/// lives (seconds: long enough for a drain to see it and a table to be
/// built).
const CHURN: usize = 500;
const AT_ONCE: usize = 25;
const CHURN_LIFE_S: u32 = 3;
/// Functions of each churn binary (about 2k rows of table each: 500 need
/// some 1M rows where the 2 MiB array holds 175k).
const CHURN_FUNCTIONS: usize = 600;
/// Functions of the long-running program: a table of some 21k rows, a
/// large part of its user's share and under the quarter of the array a
/// table may take.
const LONG_FUNCTIONS: usize = 7000;
/// The user the long-running program runs as.
const DAEMON_UID: u32 = 1;
/// What a copy of the churn binary is told apart by: the digits are
/// patched in each copy, so each is a distinct file with its own table.
const MARK: &str = "WSCHURN-0000";

/// The churn binary's `main`: wakes every 100 ms (so that drains see it)
/// for `argv[1]` seconds.
fn churn_main() -> String {
    format!(
        "static const char mark[] = \"{MARK}\";\n\
         int main(int argc, char **argv) {{\n\
         long until = time(0) + atol(argv[1]);\n\
         struct timespec nap = {{0, 100 * 1000 * 1000}};\n\
         for (long n = 0; time(0) < until; n++) {{ nanosleep(&nap, 0); f0(n + ((volatile const char *)mark)[8]); }}\n\
         return 0;\n}}\n"
    )
}

/// The long-running program's hot path, as `tests/workloads/nofp.c`: main -> run
/// -> stage_one -> stage_two -> burn, half of the time on CPU, for
/// `argv[1]` seconds; prints `ready PID`.
const LONG_MAIN: &str = "#define NOINLINE __attribute__((noinline))\n\
    static volatile unsigned long out;\n\
    NOINLINE unsigned long burn(unsigned long x) {\n\
      unsigned long a = x, b = x * 3, c = x * 5, d = x * 7;\n\
      for (int i = 0; i < 100000; i++) { a = a * 6364136223846793005UL + b; b ^= a >> 13; c += b * d; d ^= c << 7; }\n\
      return a + b + c + d; }\n\
    NOINLINE unsigned long stage_two(unsigned long x) { unsigned long r = burn(x); out += r; return r + 1; }\n\
    NOINLINE unsigned long stage_one(unsigned long x) { unsigned long r = stage_two(x ^ 0x9e37); out ^= r; return r * 3; }\n\
    NOINLINE void run(long until) {\n\
      unsigned long x = 1;\n\
      struct timespec nap = {0, 500 * 1000};\n\
      while (time(0) < until) { x = stage_one(x); nanosleep(&nap, 0); }\n\
      out += f0(x); }\n\
    int main(int argc, char **argv) {\n\
      printf(\"ready %d\\n\", getpid());\n\
      fflush(stdout);\n\
      run(time(0) + atol(argv[1]));\n\
      return 0; }\n";

/// Compiles the churn binary once and writes `CHURN` copies into a
/// directory `nobody` can run them from, each with its own mark.
fn churn_binaries() -> PathBuf {
    let dir = shared_dir("unwind-churn", 0o755);
    let first = dir.join("build");
    crowd::compile(&crowd::source(CHURN_FUNCTIONS, &churn_main()), &first);
    let bytes = fs::read(&first).unwrap();
    let at = bytes
        .windows(MARK.len())
        .position(|w| w == MARK.as_bytes())
        .expect("the mark in the binary");
    for i in 0..CHURN {
        let mut copy = bytes.clone();
        let digits = format!("{i:04}");
        copy[at + MARK.len() - 4..at + MARK.len()].copy_from_slice(digits.as_bytes());
        let path = dir.join(format!("churn-{i}"));
        fs::write(&path, &copy).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

/// `nobody` running the churn binaries of `dir`, `AT_ONCE` at a time;
/// killed when dropped (a binary left running ends within its life).
struct Churn(Child);

impl Churn {
    fn start(dir: &Path) -> Churn {
        let script = format!(
            "cd {dir} && i=0; while [ $i -lt {CHURN} ]; do j=0; \
             while [ $j -lt {AT_ONCE} ]; do ./churn-$((i + j)) {CHURN_LIFE_S} & j=$((j + 1)); done; \
             wait; i=$((i + {AT_ONCE})); done",
            dir = dir.display()
        );
        let child = as_nobody("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the churn");
        Churn(child)
    }

    fn done(&mut self) -> bool {
        self.0.try_wait().ok().flatten().is_some()
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `/healthz` `pipeline.unwind`; `Null` when the daemon did not answer in
/// time (a saturated host).
fn unwind(url: &str) -> Value {
    let (status, body) = get(&format!("{url}/healthz"));
    match status {
        200 => serde_json::from_str::<Value>(&body).unwrap()["pipeline"]["unwind"].clone(),
        _ => Value::Null,
    }
}

/// `uid`'s entry of `unwind.users`.
fn user(unwind: &Value, uid: u32) -> Value {
    unwind["users"]
        .as_array()
        .and_then(|users| users.iter().find(|u| u["uid"] == uid).cloned())
        .unwrap_or(Value::Null)
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// Share of `pid`'s CPU samples of the last `seconds` whose stack is
/// complete, down to `_start` through `main` and `run` (a walk that lost
/// the program's table stops at its first frame without frame pointers),
/// and the heaviest stacks; `None` if there are none yet or the daemon did
/// not answer.
fn complete(url: &str, pid: u32, seconds: u64) -> Option<(f64, String)> {
    let (status, body) = get(&format!(
        "{url}/folded?pid={pid}&kind=cpu&seconds={seconds}"
    ));
    let rows = (status == 200).then(|| parse_folded(&body))?;
    let share = share_with_chain(&rows, &["_start", "__libc_start_main", "main", "run"]);
    (!rows.is_empty()).then(|| (share, show(&rows)))
}

#[test]
fn another_users_churn_of_binaries_evicts_only_its_own_tables() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let churn_dir = churn_binaries();
    let program: PathBuf = shared_dir("unwind-long", 0o755).join("long");
    crowd::compile(&crowd::source(LONG_FUNCTIONS, LONG_MAIN), &program);

    // 2 MiB hold about 175k rows: glibc (29k), the long-running program
    // (about 21k) and 500 churn tables (2k each) do not fit together.
    let daemon = Daemon::start(&["--unwind-table-mb", "2"]);
    let url = daemon.url.as_str();
    let mut cmd = as_user(DAEMON_UID, &program);
    cmd.arg("600");
    let long = Workload::spawn(cmd);
    // It walks with its tables before the churn starts.
    let warm = within(CATCH_UP, || {
        let (share, _) = complete(url, long.pid, 3)?;
        (share >= 0.95).then_some(())
    });
    assert!(
        warm.is_some(),
        "the long-running program never walked complete: {:?}\n{}",
        complete(url, long.pid, 10),
        unwind(url)
    );

    let started = Instant::now();
    let mut churn = Churn::start(&churn_dir);
    // The churn runs to its end, and its tables had to make room for
    // each other: evictions, charged to nobody.
    let contended = within(Duration::from_secs(600), || {
        let u = unwind(url);
        (churn.done() && n(&user(&u, NOBODY), "evictions_caused") >= 1).then_some(())
    });
    assert!(
        contended.is_some(),
        "the churn did not contend for the array (done: {}): {}",
        churn.done(),
        unwind(url)
    );
    settle(url);
    let seconds = started.elapsed().as_secs() + 1;
    let (share, rows) = within(CATCH_UP, || complete(url, long.pid, seconds))
        .expect("the long-running program's stacks");
    let after =
        within(CATCH_UP, || Some(unwind(url)).filter(|u| !u.is_null())).expect("/healthz answers");
    eprintln!(
        "long-running program complete {share:.3} over {seconds} s of churn; \
         nobody: {}; daemon: {}; root: {}",
        user(&after, NOBODY),
        user(&after, DAEMON_UID),
        user(&after, 0)
    );
    assert!(
        share >= 0.95,
        "{share:.3} complete over the churn:\n{rows}\n{after}"
    );

    // /healthz charges the evictions to nobody's churn; the long-running
    // program is not among the processes whose stacks an eviction cut
    // short, and its user lost no table to another user's.
    let nobody = user(&after, NOBODY);
    assert!(n(&nobody, "evictions_caused") >= 1, "{after}");
    assert!(
        n(&after, "tables_evicted") >= n(&nobody, "evictions_caused"),
        "{after}"
    );
    let partial = after["partial"].as_array().expect("partial list");
    assert!(
        !partial
            .iter()
            .any(|p| p["pid"] == long.pid && n(p, "tables_evicted") > 0),
        "the long-running program lost tables: {after}"
    );
    let daemon_user = user(&after, DAEMON_UID);
    assert_eq!(n(&daemon_user, "tables_lost_to_others"), 0, "{after}");
    drop(churn);
    let _ = fs::remove_dir_all(&churn_dir);
}
