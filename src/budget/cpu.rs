//! CPU budgets per user for the work done on a process's behalf: reading
//! its perf map, its JVM's or CPython's memory, attaching to its JVM.
//! That work follows what the process does (a perf map rewritten every
//! second, new code objects every loop, forged structures), so its cost
//! is its owner's to pay: one user's churn degrades only that user's
//! frames, counted.
//!
//! Each unit of work asks [`admit`] first, with the process's effective
//! uid (read once per process where its other facts are read); while the
//! user's bucket ([`ledger`]) is above zero the unit runs and is charged
//! the thread CPU time it took (`CLOCK_THREAD_CPUTIME_ID`: what the work
//! cost, not the time a busy host kept the thread waiting). Otherwise it
//! is skipped (its frames come out as the caller's over-budget marker)
//! and counted: `refused.WHAT.user_cpu` in `/healthz` and `/metrics`, the
//! user's `refused_total` in `/healthz` `user_cpu`, and the daemon
//! `degraded` naming the process. Cached results (a frame already named)
//! cost nothing and are never refused.
//!
//! Non-root users share one pool (`--user-cpu-ms` per second, split
//! evenly among the users with work); root's processes, the daemon's own
//! among them, draw from a pool of their own of the same size, so that
//! no user can starve root's services of names.

pub mod ledger;

use std::{
    marker::PhantomData,
    sync::{LazyLock, Mutex, MutexGuard, OnceLock},
    time::Instant,
};

use serde::Serialize;

use ledger::Ledger;
pub use ledger::{Policy, Pool, PoolTotals, UserCpu, UNKNOWN_USER};

use crate::untrusted::refusals::{self, Reason, What};

/// CPU ms per second of each pool by default: 1 % of one CPU for all
/// non-root users together, 1 % for root's processes. A debug build does
/// the same work about ten times slower: its default is ten times larger,
/// so that its tests see the frames a release daemon would.
pub const DEFAULT_MS_PER_S: u64 = if cfg!(debug_assertions) { 100 } else { 10 };
/// Seconds of its share a user's bucket holds: a JVM warming up or a
/// fresh perf map is read at once.
pub const BURST_S: u64 = 5;

/// The policy [`install`] set (the default's until then).
fn policy() -> Policy {
    *POLICY.get_or_init(|| Policy {
        ns_per_s: DEFAULT_MS_PER_S * 1_000_000,
        burst_s: BURST_S,
    })
}

static POLICY: OnceLock<Policy> = OnceLock::new();
static LEDGER: LazyLock<Mutex<Ledger>> = LazyLock::new(|| Mutex::new(Ledger::new(policy())));
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Sets each pool to `ms_per_s` CPU ms per second, before any work is
/// admitted; `false` if the budget was in use already.
pub fn install(ms_per_s: u64) -> bool {
    POLICY
        .set(Policy {
            ns_per_s: ms_per_s.saturating_mul(1_000_000),
            burst_s: BURST_S,
        })
        .is_ok()
}

fn ledger() -> MutexGuard<'static, Ledger> {
    LEDGER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Monotonic ns since the first use.
fn now_ns() -> u64 {
    let epoch = EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// CPU time the calling thread has used, ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// One unit of work being measured: charged to its user the CPU time its
/// thread used from [`admit`] (or [`measure`]) to its drop. Not `Send`:
/// the clock is the thread's.
#[must_use = "the unit is charged when the meter is dropped"]
pub struct Meter {
    uid: u32,
    start: u64,
    _thread: PhantomData<*const ()>,
}

impl Drop for Meter {
    fn drop(&mut self) {
        charge(self.uid, thread_cpu_ns().saturating_sub(self.start));
    }
}

/// Charges `cpu_ns` of one unit of work to `uid`.
pub fn charge(uid: u32, cpu_ns: u64) {
    ledger().charge(uid, cpu_ns, now_ns());
}

/// Asks to run one unit of `what` for process `pid` of user `uid`: a
/// [`Meter`] to hold while it runs, or `None` (counted against the user,
/// and as `what`/`user_cpu` naming `pid`) when the user is over budget.
pub fn admit(uid: u32, pid: u32, what: What) -> Option<Meter> {
    if !ledger().admit(uid, what, now_ns()) {
        refusals::count_for(what, Reason::UserCpu, pid);
        return None;
    }
    Some(measure(uid))
}

/// Measures work already decided on (the JVM agent's turns, which ask
/// [`allows`] first), for `uid`.
pub fn measure(uid: u32) -> Meter {
    Meter {
        uid,
        start: thread_cpu_ns(),
        _thread: PhantomData,
    }
}

/// Whether `uid` may run work now (nothing counted).
pub fn allows(uid: u32) -> bool {
    ledger().allows(uid, now_ns())
}

/// Counts a unit of `what` for `pid` refused because [`allows`] said no.
pub fn refuse(uid: u32, pid: u32, what: What) {
    ledger().refused(uid, what, now_ns());
    refusals::count_for(what, Reason::UserCpu, pid);
}

/// `/healthz` `user_cpu`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// CPU ms per second each pool refills.
    pub pool_ms_per_s: f64,
    pub burst_s: u64,
    /// Users with an account (work in the last minute), most CPU first.
    pub users: Vec<UserCpu>,
    /// Users with an account the reader may not see (`/healthz` read by a
    /// user other than root).
    pub other_users: usize,
}

/// Every user's figures, named from `/etc/passwd`.
pub fn report() -> Report {
    let (policy, mut users) = {
        let mut l = ledger();
        (l.policy(), l.report(now_ns()))
    };
    let names = user_names(users.iter().map(|u| u.uid));
    for u in &mut users {
        u.name = names
            .iter()
            .find(|(id, _)| *id == u.uid)
            .map(|(_, n)| n.clone());
    }
    Report {
        pool_ms_per_s: policy.ns_per_s as f64 / 1e6,
        burst_s: policy.burst_s,
        users,
        other_users: 0,
    }
}

/// What each pool's users were charged and refused since start (for
/// `/metrics`).
pub fn totals() -> [(Pool, PoolTotals); 2] {
    let l = ledger();
    [Pool::Users, Pool::Root].map(|pool| (pool, l.totals(pool)))
}

/// Bytes of `/etc/passwd` read at most to name users.
const PASSWD_BYTES: u64 = 1 << 20;

/// Names of `uids` in `/etc/passwd` (the local file only: no NSS call
/// that could wait on a directory server).
fn user_names(uids: impl Iterator<Item = u32>) -> Vec<(u32, String)> {
    use std::io::Read;
    let wanted: Vec<u32> = uids.collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let mut text = String::new();
    let read = std::fs::File::open("/etc/passwd")
        .and_then(|f| f.take(PASSWD_BYTES).read_to_string(&mut text));
    if read.is_err() {
        return Vec::new();
    }
    passwd_names(&text, &wanted)
}

fn passwd_names(text: &str, wanted: &[u32]) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let uid: u32 = fields.nth(1)?.parse().ok()?;
            wanted
                .contains(&uid)
                .then(|| (uid, name.chars().take(64).collect()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_named_from_passwd_lines() {
        let text = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\nbad line\n";
        assert_eq!(
            passwd_names(text, &[65534, 7]),
            [(65534, "nobody".to_string())]
        );
    }

    #[test]
    fn the_thread_clock_counts_work_not_waiting() {
        let start = thread_cpu_ns();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let slept = thread_cpu_ns() - start;
        let mut x = 0u64;
        let begun = Instant::now();
        while begun.elapsed().as_millis() < 20 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let worked = thread_cpu_ns() - start - slept;
        assert!(slept < worked, "slept {slept} ns, worked {worked} ns ({x})");
    }
}
