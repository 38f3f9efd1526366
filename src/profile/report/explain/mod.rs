//! `/explain`: findings that state a cause with its numbers, ranked by
//! the thread time each explains, for one process or, host-wide, for the
//! processes that lost the most time waiting (not at rest), each with its
//! top finding. Each finding links the one call that shows its evidence.
//!
//! One module per kind of finding, each a function of what the window
//! holds of the process ([`Ctx`]): a new kind is a module and a line in
//! [`FINDERS`].

pub mod gil;
pub mod host;
pub mod io;
pub mod locks;
pub mod pool;
pub mod quota;
pub mod runqueue;
pub mod seen;
pub mod text;
pub mod waits;

#[cfg(test)]
mod tests;

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{disclosure::Sight, host_facts::HostFacts, stuck::WaitFacts};
use crate::profile::model::{
    live::LiveView,
    state::State,
    store::{Recorded, Snapshot},
    window::Window,
};
use seen::Seen;
use waits::{Object, WaitClass};

/// What a finding says is the cause. Ties of rank go to the earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Threads that can never go on: a lock cycle, a pool waiting on
    /// itself, a pool all blocked.
    Deadlock,
    /// Python threads waiting for the GIL, and who holds it.
    Gil,
    /// A pool whose threads all wait in one place.
    PoolSaturation,
    /// Runnable threads held back by their cgroup's CPU quota.
    CpuQuota,
    /// Runnable threads waiting for a CPU.
    RunqueueStarvation,
    /// Threads waiting for a lock or another thread's result.
    LockContention,
    /// Threads waiting on a socket, a file, a pipe or a device.
    IoWait,
}

/// One cause, with its numbers.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Finding {
    pub kind: Kind,
    /// 1 for the finding that explains the most time.
    pub rank: usize,
    /// Thread time (summed over threads) in the window the cause explains:
    /// what the findings are ranked by.
    pub score_us: u64,
    /// One sentence: the cause, with its numbers.
    pub headline: String,
    /// The numbers, by name (kind-specific).
    pub numbers: serde_json::Value,
    /// The one call (path and query) that shows the evidence.
    pub evidence: String,
}

impl Finding {
    /// A finding not ranked yet.
    pub fn new(
        kind: Kind,
        score_us: u64,
        headline: String,
        numbers: serde_json::Value,
        evidence: String,
    ) -> Finding {
        Finding {
            kind,
            rank: 0,
            score_us,
            headline,
            numbers,
            evidence,
        }
    }
}

/// What the finders read: the process over the window, and what else a
/// kind needs (the store for culprits, the live view for stuck threads,
/// the live host for what the store does not hold, such as cgroups).
pub struct Ctx<'a> {
    pub seen: &'a Seen,
    pub store: &'a Snapshot,
    pub host: &'a dyn HostFacts,
    pub window: Window,
    pub live: &'a LiveView,
    pub facts: &'a WaitFacts,
    pub sight: &'a Sight,
    pub now: SystemTime,
    /// The pid of the daemon answering (its threads are noise to name).
    pub own_pid: u32,
}

impl Ctx<'_> {
    /// `path?pid=P&<the window>` and `extra` (`&name=value`...).
    pub fn link(&self, path: &str, extra: &str) -> String {
        format!(
            "{path}?pid={}&{}{extra}",
            self.seen.pid,
            window_query(&self.window)
        )
    }
}

/// The window as a query: the range asked for (to the millisecond), or
/// the last N seconds.
pub fn window_query(w: &Window) -> String {
    let unix = |t: SystemTime| {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        format!("{}.{:03}", d.as_secs(), d.subsec_millis())
    };
    if w.absolute {
        format!("from={}&until={}", unix(w.from), unix(w.until))
    } else {
        format!("seconds={}", w.seconds())
    }
}

/// The kinds of finding, in the order they are looked for.
const FINDERS: [fn(&Ctx) -> Vec<Finding>; 6] = [
    locks::find,
    gil::find,
    pool::find,
    quota::find,
    runqueue::find,
    io::find,
];

/// Every finding of `ctx`'s process, ranked: most time explained first.
pub fn findings(ctx: &Ctx) -> Vec<Finding> {
    let mut all: Vec<Finding> = FINDERS.iter().flat_map(|find| find(ctx)).collect();
    all.sort_by(|a, b| b.score_us.cmp(&a.score_us).then(a.kind.cmp(&b.kind)));
    let mut all = behind_their_pools(all);
    for (i, f) in all.iter_mut().enumerate() {
        f.rank = i + 1;
    }
    all
}

/// Ranked findings with each wait a saturated pool is made of (an I/O or
/// lock wait of the pool's threads only, at the pool's place) moved right
/// after that pool: the pool's score already holds that time, so the two
/// scores are near equal and either could come first, but the pool is
/// the cause the wait explains.
fn behind_their_pools(ranked: Vec<Finding>) -> Vec<Finding> {
    let is_part_of = |wait: &Finding, pool: &Finding| {
        let (w, p) = (&wait.numbers, &pool.numbers);
        let same_place = match wait.kind {
            Kind::IoWait => w["wait"] == p["wait"],
            Kind::LockContention => {
                p["wait"]["class"] == "lock" && w["frame"] == p["wait"]["frame"]
            }
            _ => false,
        };
        let members = p["tids"].as_array();
        same_place
            && w["tids"]
                .as_array()
                .is_some_and(|tids| tids.iter().all(|t| members.is_some_and(|m| m.contains(t))))
    };
    // The pool each finding is part of, by index.
    let part_of: Vec<Option<usize>> = ranked
        .iter()
        .map(|f| {
            ranked
                .iter()
                .position(|p| p.kind == Kind::PoolSaturation && is_part_of(f, p))
        })
        .collect();
    let mut slots: Vec<Option<Finding>> = ranked.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(slots.len());
    for i in 0..slots.len() {
        if part_of[i].is_some() {
            continue;
        }
        out.extend(slots[i].take());
        for (j, pool) in part_of.iter().enumerate() {
            if *pool == Some(i) {
                out.extend(slots[j].take());
            }
        }
    }
    out
}

/// The `/explain?pid=` answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Explanation {
    pub pid: u32,
    pub process: String,
    pub seconds: u64,
    pub window: String,
    #[serde(flatten)]
    pub recorded: Recorded,
    /// Its threads' wall time in the window, summed.
    pub wall_us: u64,
    /// Of it, time lost waiting (for a CPU, a lock, the GIL, I/O), not at
    /// rest.
    pub waiting_us: u64,
    /// Most time explained first.
    pub findings: Vec<Finding>,
    /// Why there is no finding, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The explanation of `ctx`'s process.
pub fn explain(ctx: &Ctx) -> Explanation {
    let findings = findings(ctx);
    let t = &ctx.seen.threads;
    let note = findings.is_empty().then(|| {
        format!(
            "no cause found in the {}: its threads neither waited long for a CPU, the GIL, a lock or I/O, nor filled a pool",
            ctx.window.describe()
        )
    });
    Explanation {
        pid: ctx.seen.pid,
        process: t.comm.clone(),
        seconds: ctx.window.seconds(),
        window: ctx.window.describe(),
        recorded: Recorded::default(),
        wall_us: t.process.wall_us,
        waiting_us: waiting_us(ctx.seen),
        findings,
        note,
    }
}

/// Time `seen`'s threads lost waiting: for a CPU (runqueue, throttled),
/// and blocked in waits that are not rest.
pub fn waiting_us(seen: &Seen) -> u64 {
    let p = &seen.threads.process;
    let blocked_ns: u64 = seen
        .rows
        .iter()
        .filter(|r| matches!(r.state, State::Futex | State::Io | State::Sleep))
        .filter(|r| waits::suffers(waits::classify(r.state, &r.stack)))
        .map(|r| r.ns)
        .sum();
    p.runqueue_us + p.throttled_us + blocked_ns / 1000
}

/// Where a thread waits: what on, in which syscall, from which frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Place {
    pub class: WaitClass,
    pub syscall: Option<String>,
    pub frame: Option<String>,
}

impl Place {
    pub fn of(class: WaitClass, stack: &[impl AsRef<str>]) -> Place {
        Place {
            class,
            syscall: waits::syscall(stack).map(str::to_string),
            frame: waits::app_frame(stack),
        }
    }

    /// `read on a socket in Client.call`.
    pub fn describe(&self) -> String {
        let what = match self.class {
            WaitClass::Io(o) => match &self.syscall {
                Some(s) => format!("{s} on a {}", o.name()),
                None => format!("I/O on a {}", o.name()),
            },
            WaitClass::Lock => "a lock or another thread's result".to_string(),
            WaitClass::Gil => "the GIL".to_string(),
            WaitClass::Rest | WaitClass::Other => match &self.syscall {
                Some(s) => s.clone(),
                None => "a wait".to_string(),
            },
        };
        match &self.frame {
            Some(f) => format!("{what} in {f}"),
            None => what,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let object = match self.class {
            WaitClass::Io(o) => Some(o),
            _ => None,
        };
        serde_json::json!({
            "class": self.class_name(),
            "object": object.map(Object::name),
            "syscall": self.syscall,
            "frame": self.frame,
        })
    }

    fn class_name(&self) -> &'static str {
        match self.class {
            WaitClass::Gil => "gil",
            WaitClass::Rest => "rest",
            WaitClass::Lock => "lock",
            WaitClass::Io(_) => "io",
            WaitClass::Other => "other",
        }
    }
}

/// The `n` findings of `found` that explain the most, most first.
pub fn strongest(mut found: Vec<Finding>, n: usize) -> Vec<Finding> {
    found.sort_by_key(|f| std::cmp::Reverse(f.score_us));
    found.truncate(n);
    found
}

/// `ns` of waiting as a share of the wall time of `seen`'s threads `tids`.
pub fn share_of_threads<'a>(seen: &Seen, tids: impl IntoIterator<Item = &'a u32>, ns: u64) -> f64 {
    let wall_us: u64 = tids
        .into_iter()
        .filter_map(|t| seen.thread(*t))
        .map(|t| t.time.wall_us)
        .sum();
    ns as f64 / (wall_us.max(1) * 1000) as f64
}

/// `1 thread`, `3 threads`.
pub fn threads(n: usize) -> String {
    format!("{n} thread{}", if n == 1 { "" } else { "s" })
}

/// `12.3 s`, or `850 ms` below a second.
pub fn secs(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{:.1} s", us as f64 / 1e6)
    } else {
        format!("{} ms", (us + 500) / 1000)
    }
}

/// `45 %`.
pub fn pct(share: f64) -> String {
    format!("{:.0} %", share * 100.0)
}
