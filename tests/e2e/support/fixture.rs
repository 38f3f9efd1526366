//! The one gate and turn every test of the real daemon takes. All modules
//! of the e2e binary run in one process, two tests at a time: a test that
//! measures time, CPU shares, memory or global counters must not share the
//! host with another module's workloads, and one that starts its own
//! daemon must not meet the shared one where a second wallscope changes
//! what it checks (JVM attaches, perf maps).
//!
//! ```ignore
//! let Some(fx) = Fixture::ebpf() else { return };
//! let url = fx.daemon();
//! ```

use std::{
    io::Write,
    sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Instant,
};

use super::{settle, Daemon};

/// A test's turn, held until dropped: shared turns run together, an
/// exclusive one runs while no other fixture is held.
pub struct Fixture {
    turn: Turn,
    /// When the test asked for its turn, and when it got it.
    asked: Instant,
    got: Instant,
}

enum Turn {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// Readers are shared turns, the writer the exclusive one; std's lock lets
/// no new reader in while a writer waits, so exclusive tests are not
/// starved.
static TURNS: RwLock<()> = RwLock::new(());

impl Fixture {
    /// eBPF is available (else `None`, see [`ebpf_available`]): a shared
    /// turn, alongside other shared tests. For tests that tolerate other
    /// workloads and daemons on the host.
    pub fn ebpf() -> Option<Fixture> {
        ebpf_available().then(Fixture::shared)
    }

    /// eBPF is available: an exclusive turn, the shared daemon left
    /// running. What the old per-file `SERIAL` locks were: for tests of the
    /// shared daemon that measure shares, time or counters.
    pub fn ebpf_serial() -> Option<Fixture> {
        ebpf_available().then(Fixture::exclusive)
    }

    /// eBPF is available: an exclusive turn with no shared daemon running,
    /// as in a test binary of its own. For tests that start their own
    /// daemon and measure its memory, descriptors or latency, or that a
    /// second wallscope would disturb (JVM attaches, unwind tables).
    pub fn ebpf_alone() -> Option<Fixture> {
        ebpf_available().then(|| {
            let fx = Fixture::exclusive();
            *pool() = None;
            fx
        })
    }

    /// A shared turn without the eBPF gate: in-process tests that measure
    /// latency and must not overlap a test that runs alone.
    pub fn in_process() -> Fixture {
        Fixture::shared()
    }

    fn shared() -> Fixture {
        let asked = Instant::now();
        let guard = TURNS.read().unwrap_or_else(|e| e.into_inner());
        Fixture {
            turn: Turn::Shared(guard),
            asked,
            got: Instant::now(),
        }
    }

    fn exclusive() -> Fixture {
        let asked = Instant::now();
        let guard = TURNS.write().unwrap_or_else(|e| e.into_inner());
        Fixture {
            turn: Turn::Exclusive(guard),
            asked,
            got: Instant::now(),
        }
    }

    /// Base URL of the daemon shared by all modules (no flags), started on
    /// first use; see [`super::daemon`].
    pub fn daemon(&self) -> &'static str {
        super::daemon()
    }

    /// Base URL of a shared daemon started with `args`, replacing the one
    /// started with other flags; only in an exclusive turn, since a shared
    /// test may be using the one it replaces.
    pub fn daemon_with(&self, args: &[&str]) -> &'static str {
        assert!(
            matches!(self.turn, Turn::Exclusive(_)) || args.is_empty(),
            "a daemon with flags replaces the shared one: take an exclusive turn"
        );
        pooled(args)
    }
}

/// Where each turn's test, kind, wait and length are written (appended,
/// a line per turn): which tests the suite's time goes to.
const TIMES: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/e2e-turns.tsv");

impl Drop for Fixture {
    fn drop(&mut self) {
        let kind = match self.turn {
            Turn::Shared(_) => "shared",
            Turn::Exclusive(_) => "exclusive",
        };
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let line = format!(
            "{test}\t{kind}\t{:.1}\t{:.1}\n",
            (self.got - self.asked).as_secs_f64(),
            self.got.elapsed().as_secs_f64()
        );
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(TIMES);
        let _ = file.and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// The pooled daemon: its flags, its URL (leaked: a few per run) and the
/// process, stopped when replaced.
type Pooled = Option<(Vec<String>, &'static str, Daemon)>;

fn pool() -> MutexGuard<'static, Pooled> {
    static POOL: Mutex<Pooled> = Mutex::new(None);
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Base URL of the pooled daemon with `args`, started (and past its first
/// drains, which build unwind tables for every binary on the host) if the
/// pool holds none or one with other flags.
pub(super) fn pooled(args: &[&str]) -> &'static str {
    let mut pool = pool();
    if let Some((flags, url, _)) = pool.as_ref() {
        if flags.iter().map(String::as_str).eq(args.iter().copied()) {
            return url;
        }
    }
    // Stopped before the next starts: never two shared daemons at once.
    *pool = None;
    let d = Daemon::start(args);
    settle(&d.url);
    let url: &'static str = d.url.clone().leak();
    *pool = Some((args.iter().map(|a| a.to_string()).collect(), url, d));
    url
}

/// True when eBPF tests can run. Without root they are skipped, except
/// under `CI=true`, where that is a failure.
fn ebpf_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("CI=true but not root: the eBPF tests must run, not skip");
    }
    eprintln!("skipping: eBPF tests need root");
    false
}
