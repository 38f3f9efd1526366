//! The per-user token buckets behind [`super`], pure: every call is given
//! the time (ns on a monotonic clock) and the CPU time charged, so that
//! tests drive the clock.
//!
//! Each pool ([`Pool`]) refills `ns_per_s` of CPU time per second, split
//! evenly among its users with work lately (never less than one
//! [`MAX_SPLIT`]th each); a user's bucket holds at most `burst_s` seconds
//! of its share. A unit of work runs while its user's bucket is above zero
//! and is charged what it took once done, so a bucket goes into debt by at
//! most one unit.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::untrusted::refusals::What;

/// The user charged for a process whose owner could not be read (it
/// exited), and the one users past [`MAX_USERS`] share.
pub const UNKNOWN_USER: u32 = u32::MAX;
/// Users with an account at once (an account is about 300 bytes).
pub const MAX_USERS: usize = 4096;
/// A user who asked for work this recently shares its pool's refill.
pub const ACTIVE_FOR_NS: u64 = 10 * SECOND;
/// The pool is split among at most this many users: past it each still
/// gets this fraction (so the users together may take more than the pool).
pub const MAX_SPLIT: u64 = 64;
/// Least a bucket holds when full: one unit (a perf-map step, a JVM's
/// heaps) must fit even at the smallest share.
const MIN_BURST_NS: u64 = 20 * MILLI;
/// The report's recent figures cover [`SLOTS`] slots of this length.
const SLOT_NS: u64 = 5 * SECOND;
const SLOTS: usize = 12;
/// How often the users active lately are counted again.
const RECOUNT_NS: u64 = SECOND;

const SECOND: u64 = 1_000_000_000;
const MILLI: u64 = 1_000_000;

/// Whose refill a user shares: root's processes (and the daemon's own)
/// have a pool of their own, so that no other user's work can starve
/// root's services of names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    Users,
    Root,
}

impl Pool {
    pub fn of(uid: u32) -> Pool {
        if uid == 0 {
            Pool::Root
        } else {
            Pool::Users
        }
    }

    /// Its name in `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Pool::Users => "users",
            Pool::Root => "root",
        }
    }
}

/// The budget's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Policy {
    /// CPU time each pool refills per second of wall time, ns (the users'
    /// pool split among its users with work).
    pub ns_per_s: u64,
    /// Seconds of its share a user's bucket holds at most.
    pub burst_s: u64,
}

/// One slot of the recent figures.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Which slot of time it holds (`now / SLOT_NS`).
    index: u64,
    cpu_ns: u64,
    units: u64,
    refused: u64,
}

#[derive(Debug, Clone)]
struct Account {
    /// CPU ns the user may still take (negative: in debt).
    tokens: i64,
    /// When `tokens` was last refilled.
    at: u64,
    /// When the user last asked for work.
    seen: u64,
    slots: [Slot; SLOTS],
    cpu_ns: u64,
    units: u64,
    /// Refusals by [`What`] (its index), since the account was opened.
    refused: [u64; What::ALL.len()],
}

impl Account {
    fn slot(&mut self, now: u64) -> &mut Slot {
        let index = now / SLOT_NS;
        let slot = &mut self.slots[(index % SLOTS as u64) as usize];
        if slot.index != index {
            *slot = Slot {
                index,
                ..Slot::default()
            };
        }
        slot
    }

    /// The slots of the last minute, summed.
    fn recent(&self, now: u64) -> Slot {
        let index = now / SLOT_NS;
        self.slots
            .iter()
            .filter(|s| s.index + SLOTS as u64 > index && s.index <= index)
            .fold(Slot::default(), |a, s| Slot {
                index,
                cpu_ns: a.cpu_ns + s.cpu_ns,
                units: a.units + s.units,
                refused: a.refused + s.refused,
            })
    }
}

/// One user's figures, for `/healthz` `user_cpu.users`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UserCpu {
    pub uid: u32,
    /// From `/etc/passwd`, when it names the uid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub pool: Pool,
    /// Its share of its pool's refill now.
    pub share_ms_per_s: f64,
    /// What its bucket holds (negative: in debt).
    pub balance_ms: f64,
    /// CPU time charged to it, units of work run and units refused, in
    /// the last minute.
    pub cpu_ms_last_minute: f64,
    pub units_last_minute: u64,
    pub refused_last_minute: u64,
    pub cpu_ms_total: f64,
    pub units_total: u64,
    /// Units refused since its account was opened, by kind of work.
    pub refused_total: BTreeMap<&'static str, u64>,
}

/// Every user's bucket.
#[derive(Debug, Clone)]
pub struct Ledger {
    policy: Policy,
    users: FxHashMap<u32, Account>,
    /// Users active lately in each pool (users, root), counted at
    /// `counted_at`.
    active: [u64; 2],
    counted_at: Option<u64>,
    /// Each pool's totals since start (accounts are let go of).
    totals: [PoolTotals; 2],
}

/// What one pool's users were charged and refused since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolTotals {
    pub cpu_ns: u64,
    pub units: u64,
    pub refused: u64,
}

impl Ledger {
    pub fn new(policy: Policy) -> Ledger {
        Ledger {
            policy,
            users: FxHashMap::default(),
            active: [0; 2],
            counted_at: None,
            totals: [PoolTotals::default(); 2],
        }
    }

    /// `pool`'s totals since start.
    pub fn totals(&self, pool: Pool) -> PoolTotals {
        self.totals[pool as usize]
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Whether a unit of `uid`'s work may run at `now`; a refusal is
    /// counted against `uid` as `what`.
    pub fn admit(&mut self, uid: u32, what: What, now: u64) -> bool {
        let uid = self.open(uid, now);
        let (rate, cap) = self.share(uid, now);
        let Some(a) = self.users.get_mut(&uid) else {
            return true;
        };
        refill(a, rate, cap, now);
        a.seen = now;
        if a.tokens > 0 {
            return true;
        }
        self.refused(uid, what, now);
        false
    }

    /// Counts one unit of `uid`'s refused as `what`.
    pub fn refused(&mut self, uid: u32, what: What, now: u64) {
        let uid = self.open(uid, now);
        self.totals[Pool::of(uid) as usize].refused += 1;
        if let Some(a) = self.users.get_mut(&uid) {
            a.seen = now;
            a.refused[what as usize] += 1;
            a.slot(now).refused += 1;
        }
    }

    /// Whether `uid` may run work at `now`, without asking (nothing
    /// counted).
    pub fn allows(&mut self, uid: u32, now: u64) -> bool {
        let uid = self.account_of(uid);
        let (rate, cap) = self.share(uid, now);
        self.users.get_mut(&uid).is_none_or(|a| {
            refill(a, rate, cap, now);
            a.tokens > 0
        })
    }

    /// Charges `cpu_ns` of one unit of work to `uid`.
    pub fn charge(&mut self, uid: u32, cpu_ns: u64, now: u64) {
        let uid = self.open(uid, now);
        let (rate, cap) = self.share(uid, now);
        let pool = &mut self.totals[Pool::of(uid) as usize];
        pool.cpu_ns += cpu_ns;
        pool.units += 1;
        if let Some(a) = self.users.get_mut(&uid) {
            refill(a, rate, cap, now);
            a.tokens = a
                .tokens
                .saturating_sub(i64::try_from(cpu_ns).unwrap_or(i64::MAX));
            a.seen = now;
            a.cpu_ns += cpu_ns;
            a.units += 1;
            let slot = a.slot(now);
            slot.cpu_ns += cpu_ns;
            slot.units += 1;
        }
    }

    /// Every user's figures, most CPU in the last minute first.
    pub fn report(&mut self, now: u64) -> Vec<UserCpu> {
        self.forget_idle(now);
        let uids: Vec<u32> = self.users.keys().copied().collect();
        let mut out: Vec<UserCpu> = uids
            .into_iter()
            .filter_map(|uid| {
                let (rate, cap) = self.share(uid, now);
                let a = self.users.get_mut(&uid)?;
                refill(a, rate, cap, now);
                let recent = a.recent(now);
                let ms = |ns: u64| ns as f64 / MILLI as f64;
                Some(UserCpu {
                    uid,
                    name: None,
                    pool: Pool::of(uid),
                    share_ms_per_s: ms(rate),
                    balance_ms: a.tokens as f64 / MILLI as f64,
                    cpu_ms_last_minute: ms(recent.cpu_ns),
                    units_last_minute: recent.units,
                    refused_last_minute: recent.refused,
                    cpu_ms_total: ms(a.cpu_ns),
                    units_total: a.units,
                    refused_total: What::ALL
                        .iter()
                        .filter(|w| a.refused[**w as usize] > 0)
                        .map(|w| (w.name(), a.refused[*w as usize]))
                        .collect(),
                })
            })
            .collect();
        out.sort_by(|a, b| b.cpu_ms_last_minute.total_cmp(&a.cpu_ms_last_minute));
        out
    }

    /// The account `uid` is charged to: its own, or [`UNKNOWN_USER`]'s
    /// when [`MAX_USERS`] others have one.
    fn account_of(&self, uid: u32) -> u32 {
        if self.users.contains_key(&uid) || self.users.len() < MAX_USERS {
            uid
        } else {
            UNKNOWN_USER
        }
    }

    /// Opens `uid`'s account (full) if it has none, first letting go of
    /// the accounts of users idle for a minute and repaid; the account
    /// charged.
    fn open(&mut self, uid: u32, now: u64) -> u32 {
        if self.users.contains_key(&uid) {
            return uid;
        }
        if self.users.len() >= MAX_USERS {
            self.forget_idle(now);
        }
        let uid = self.account_of(uid);
        if !self.users.contains_key(&uid) {
            self.counted_at = None;
            self.users.insert(
                uid,
                Account {
                    tokens: i64::MAX,
                    at: now,
                    seen: now,
                    slots: [Slot::default(); SLOTS],
                    cpu_ns: 0,
                    units: 0,
                    refused: [0; What::ALL.len()],
                },
            );
        }
        uid
    }

    /// Forgets users who asked for nothing in the last minute and whose
    /// bucket is full again (forgetting a debt would forgive it).
    pub fn forget_idle(&mut self, now: u64) {
        let window = SLOT_NS * SLOTS as u64;
        let uids: Vec<u32> = self.users.keys().copied().collect();
        for uid in uids {
            let (rate, cap) = self.share(uid, now);
            if let Some(a) = self.users.get_mut(&uid) {
                refill(a, rate, cap, now);
                if now.saturating_sub(a.seen) >= window && a.tokens >= cap {
                    self.users.remove(&uid);
                    self.counted_at = None;
                }
            }
        }
    }

    /// `uid`'s refill rate (ns per s) and bucket size (ns) at `now`.
    fn share(&mut self, uid: u32, now: u64) -> (u64, i64) {
        if self
            .counted_at
            .is_none_or(|at| now.saturating_sub(at) >= RECOUNT_NS)
        {
            self.counted_at = Some(now);
            self.active = [0; 2];
            for (&u, a) in &self.users {
                if now.saturating_sub(a.seen) < ACTIVE_FOR_NS {
                    self.active[Pool::of(u) as usize] += 1;
                }
            }
        }
        let pool = Pool::of(uid);
        let counted = self
            .users
            .get(&uid)
            .is_some_and(|a| now.saturating_sub(a.seen) < ACTIVE_FOR_NS);
        let users = (self.active[pool as usize] + u64::from(!counted)).clamp(1, MAX_SPLIT);
        let rate = self.policy.ns_per_s / users;
        let cap = (rate * self.policy.burst_s).max(MIN_BURST_NS);
        (rate, i64::try_from(cap).unwrap_or(i64::MAX))
    }
}

/// Adds to `a` what `rate` (ns per s) refilled since it was last
/// refilled, up to `cap`.
fn refill(a: &mut Account, rate: u64, cap: i64, now: u64) {
    let elapsed = now.saturating_sub(a.at);
    a.at = a.at.max(now);
    let add = u128::from(elapsed) * u128::from(rate) / u128::from(SECOND);
    let add = i64::try_from(add).unwrap_or(i64::MAX);
    a.tokens = a.tokens.saturating_add(add).min(cap);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = MILLI;
    const S: u64 = SECOND;

    fn ledger() -> Ledger {
        Ledger::new(Policy {
            ns_per_s: 10 * MS,
            burst_s: 5,
        })
    }

    /// Runs units of `cost` for `uid` from `from` every `every` until
    /// `until`: how many ran and how many were refused.
    fn drive(l: &mut Ledger, uid: u32, cost: u64, from: u64, every: u64, until: u64) -> (u64, u64) {
        let (mut ran, mut refused) = (0, 0);
        let mut now = from;
        while now < until {
            if l.admit(uid, What::PerfMap, now) {
                l.charge(uid, cost, now);
                ran += 1;
            } else {
                refused += 1;
            }
            now += every;
        }
        (ran, refused)
    }

    #[test]
    fn a_user_alone_spends_its_burst_then_the_pools_rate() {
        let mut l = ledger();
        // 1 ms units every 10 ms (100 ms/s wanted) for 60 s.
        let (ran, refused) = drive(&mut l, 1000, MS, 0, 10 * MS, 60 * S);
        // The burst (50 ms) and 10 ms/s over 60 s, within one unit.
        let spent = ran * MS;
        assert!(
            (649 * MS..=651 * MS).contains(&spent),
            "{} ms spent",
            spent / MS
        );
        assert_eq!(ran + refused, 6000);
        let r = &l.report(60 * S)[0];
        assert_eq!((r.uid, r.pool), (1000, Pool::Users));
        assert_eq!(r.refused_total["perf_map"], refused);
        assert!(r.refused_last_minute > 0 && r.refused_last_minute <= refused);
        // The last minute's slots: at most 60 s of the 10 ms/s rate.
        assert!(r.cpu_ms_last_minute <= 611.0, "{}", r.cpu_ms_last_minute);
        assert!(r.cpu_ms_last_minute >= 540.0, "{}", r.cpu_ms_last_minute);
    }

    #[test]
    fn a_hog_gets_half_the_pool_once_another_user_has_work() {
        let mut l = ledger();
        let (mut hog, mut other) = ((0, 0), (0, 0));
        let mut now = 0;
        // Both want far more than the pool, in 0.5 ms units.
        while now < 100 * S {
            for (uid, sum) in [(1, &mut hog), (2, &mut other)] {
                if l.admit(uid, What::Python, now) {
                    l.charge(uid, MS / 2, now);
                    sum.0 += 1;
                } else {
                    sum.1 += 1;
                }
            }
            now += MS;
        }
        let ms = |n: u64| n / 2;
        // 5 ms/s each (with their first bursts), within a few units.
        for (ran, _) in [hog, other] {
            assert!((500..=560).contains(&ms(ran)), "{} ms", ms(ran));
        }
        assert!(hog.1 > 0 && other.1 > 0);
    }

    #[test]
    fn a_light_user_keeps_its_work_beside_a_hog() {
        let mut l = ledger();
        let mut light_refused = 0;
        let mut now = 0;
        while now < 60 * S {
            // The hog asks every ms for 2 ms units.
            if l.admit(65534, What::PerfMap, now) {
                l.charge(65534, 2 * MS, now);
            }
            // The light user: 50 us every 100 ms (0.5 ms/s).
            if now % (100 * MS) == 0 {
                if l.admit(1, What::PerfMap, now) {
                    l.charge(1, 50_000, now);
                } else {
                    light_refused += 1;
                }
            }
            now += MS;
        }
        assert_eq!(light_refused, 0);
        let report = l.report(now);
        let hog = report.iter().find(|u| u.uid == 65534).unwrap();
        assert!(hog.refused_last_minute > 0);
        // Half the pool at most, with its burst and one unit of debt.
        assert!(hog.cpu_ms_last_minute <= 5.0 * 60.0 + 50.0 + 2.0, "{hog:?}");
    }

    #[test]
    fn root_draws_from_its_own_pool() {
        let mut l = ledger();
        let mut now = 0;
        let mut root_refused = 0;
        while now < 30 * S {
            for uid in [1000, 1001, 1002] {
                if l.admit(uid, What::PerfMap, now) {
                    l.charge(uid, 5 * MS, now);
                }
            }
            // Root wants 8 ms/s of its 10.
            if now % (100 * MS) == 0 {
                if l.admit(0, What::PerfMap, now) {
                    l.charge(0, 800_000, now);
                } else {
                    root_refused += 1;
                }
            }
            now += MS;
        }
        assert_eq!(root_refused, 0);
        let report = l.report(now);
        let root = report.iter().find(|u| u.uid == 0).unwrap();
        assert_eq!(root.pool, Pool::Root);
        assert!((root.share_ms_per_s - 10.0).abs() < 1e-9, "{root:?}");
        let user = report.iter().find(|u| u.uid == 1000).unwrap();
        assert!((user.share_ms_per_s - 10.0 / 3.0).abs() < 1e-3, "{user:?}");
        let (users, root_total) = (l.totals(Pool::Users), l.totals(Pool::Root));
        assert_eq!(root_total.refused, 0);
        assert_eq!(root_total.units, 300);
        assert!(users.refused > 0 && users.units > 0);
    }

    #[test]
    fn a_debt_is_repaid_at_the_rate_and_never_forgiven() {
        let mut l = ledger();
        assert!(l.admit(7, What::JvmMemory, 0));
        // One unit of 200 ms: 20 s of a lone user's refill.
        l.charge(7, 200 * MS, 0);
        assert!(!l.admit(7, What::JvmMemory, S));
        assert!(!l.allows(7, 14 * S), "140 of its 150 ms of debt repaid");
        assert!(l.allows(7, 16 * S));
        // Idle for a minute: forgotten only once full again.
        l.charge(7, 1000 * MS, 16 * S);
        l.forget_idle(80 * S);
        assert!(!l.allows(7, 80 * S), "still in debt after 64 s");
        l.forget_idle(200 * S);
        assert!(l.report(200 * S).is_empty());
    }

    #[test]
    fn users_past_the_most_share_one_account() {
        let mut l = ledger();
        for uid in 0..MAX_USERS as u32 {
            assert!(l.admit(uid + 1, What::Python, 0));
        }
        l.charge(9_999_999, MS, 0);
        l.charge(9_999_998, MS, 0);
        let report = l.report(0);
        assert_eq!(report.len(), MAX_USERS + 1);
        let unknown = report.iter().find(|u| u.uid == UNKNOWN_USER).unwrap();
        assert_eq!(unknown.units_total, 2);
        // A minute later the idle ones go, and newcomers get their own.
        l.charge(5, MS, 61 * S);
        l.charge(9_999_999, MS, 62 * S);
        let report = l.report(62 * S);
        assert!(report.iter().any(|u| u.uid == 9_999_999));
        assert!(report.len() <= 3, "{}", report.len());
    }
}
