//! CPU budgets per user (`--user-cpu-ms`, docs/cpu-budget.md): one user
//! (`nobody`) churning perf maps of long unique names pays for the reading
//! and naming from their own budget, shown in `/healthz` `user_cpu`, and
//! past it only their frames degrade (counted); another user's process
//! with an ordinary perf map keeps its frames named. Needs root.

use std::{
    fs,
    path::PathBuf,
    time::{SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::support::{
    get, parse_folded, rows::json_at, rows::within, users, Fixture, Workload, CATCH_UP,
};

/// The other user's process runs as `daemon`.
const DAEMON_UID: u32 = 1;
/// Each pool's budget here: small, so that the churn is over it at once
/// and the other user's share (half of it) is still many times what an
/// ordinary perf map costs.
const BUDGET_MS: &str = "2";
/// Seconds of the other user's on-CPU samples in its perf map judged,
/// from the churn's first refusal (about 500 samples at 99 Hz).
const JUDGED_S: u64 = 5;
/// The frame an entry not named for its user's budget becomes.
const OVER_BUDGET: &str = "[perf-map over budget]";

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `names_attacker perfmap N BYTES MS` run as `uid`, from a copy every
/// user can run; its perf map removed when it is dropped.
struct Mapped {
    w: Workload,
    map: PathBuf,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.map);
        let _ = fs::remove_file(self.map.with_extension("map.tmp"));
    }
}

fn perf_mapper(uid: u32, entries: &str, bytes: &str, every_ms: &str) -> Mapped {
    let dir = users::shared_dir("cpu", 0o777);
    let bin = users::runnable_copy("names_attacker", &dir);
    let mut cmd = users::as_user(uid, &bin);
    cmd.args(["perfmap", entries, bytes, every_ms])
        .current_dir(&dir);
    let w = Workload::spawn(cmd);
    let map = PathBuf::from(format!("/tmp/perf-{}.map", w.pid));
    Mapped { w, map }
}

/// `uid`'s account in `/healthz` `user_cpu`.
fn account(h: &Value, uid: u32) -> Option<Value> {
    h["user_cpu"]["users"]
        .as_array()?
        .iter()
        .find(|u| u["uid"] == uid)
        .cloned()
}

fn n(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// On-CPU µs of `pid`'s samples over `from..until` whose leaf is a
/// perf-map frame: named from the map, and not (over budget, or unknown);
/// `None` when the query did not answer (asked again: a busy host).
fn perf_map_leaves(ws: &str, pid: u32, from: u64, until: u64) -> Option<(u64, u64)> {
    let (status, body) = get(&format!("{ws}/folded?pid={pid}&from={from}&until={until}"));
    if status != 200 {
        println!("/folded answered {status}: {body}");
        return None;
    }
    let (mut named, mut not) = (0, 0);
    for (frames, weight) in parse_folded(&body) {
        match frames.last().map(String::as_str) {
            Some(leaf) if leaf.starts_with("gen0_") => named += weight,
            Some(OVER_BUDGET | "[unknown]") => not += weight,
            _ => {}
        }
    }
    Some((named, not))
}

#[test]
fn one_users_perf_map_churn_is_charged_to_them_and_degrades_only_their_frames() {
    let Some(fx) = Fixture::ebpf_serial() else {
        return;
    };
    let ws = fx.daemon_with(&["--user-cpu-ms", BUDGET_MS]);
    // An ordinary JIT: 64 entries, written once.
    let normal = perf_mapper(DAEMON_UID, "64", "40", "86400000");
    // The churn: two processes whose maps of 5,000 unique 2 KB names are
    // rewritten every second, each with a thread running all over them.
    let churn = [
        perf_mapper(users::NOBODY, "5000", "2000", "1000"),
        perf_mapper(users::NOBODY, "5000", "2000", "1000"),
    ];
    let over = within(CATCH_UP, || {
        // Asked again when it did not answer (a busy host).
        let (status, body) = get(&format!("{ws}/healthz"));
        let h: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
        let nobody = account(&h, users::NOBODY)?;
        let refused = h["refused"]["perf_map"]["user_cpu"].as_u64().unwrap_or(0);
        (n(&nobody, "refused_last_minute") > 0.0
            && n(&nobody, "cpu_ms_last_minute") > 0.0
            && refused > 0)
            .then_some((h, now_s()))
    });
    let (h, since) = over.unwrap_or_else(|| {
        panic!(
            "the churning user never went over budget: {}",
            json_at(ws, "/healthz")["user_cpu"]
        )
    });
    let nobody = account(&h, users::NOBODY).unwrap();
    println!("nobody's account once over budget: {nobody}");
    assert_eq!(nobody["pool"], "users");
    assert!(nobody["refused_total"]["perf_map"].as_u64().unwrap_or(0) > 0);
    // The daemon is degraded, naming a churning process.
    let degraded = h["degraded"].to_string();
    assert!(
        churn
            .iter()
            .any(|c| degraded.contains(&format!("pid {} (", c.w.pid))),
        "{degraded}"
    );
    // The other user's frames, from then on, for JUDGED_S seconds of its
    // samples in its perf map.
    let judged = within(CATCH_UP, || {
        let until = now_s();
        if until <= since {
            return None;
        }
        let (named, not) = perf_map_leaves(ws, normal.w.pid, since, until)?;
        (named + not >= JUDGED_S * 1_000_000).then_some((named, not))
    });
    let (named, not) = judged.expect("the ordinary process's JIT samples never added up");
    let h = json_at(ws, "/healthz");
    let mine = account(&h, DAEMON_UID).expect("the ordinary process's user was never charged");
    let nobody = account(&h, users::NOBODY).unwrap();
    println!(
        "ordinary process: {:.1} s of its perf-map samples named, {:.1} s not; \
         its user: {mine}; nobody: {nobody}",
        named as f64 / 1e6,
        not as f64 / 1e6
    );
    assert!(
        named as f64 >= 0.95 * (named + not) as f64,
        "the other user's perf-map frames degraded: {named} ns named, {not} ns not"
    );
    assert!(n(&nobody, "refused_last_minute") > 0.0);
    assert!(n(&mine, "units_total") > 0.0, "{mine}");
    // /metrics carries the pools' totals.
    let (_, metrics) = get(&format!("{ws}/metrics"));
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("wallscope_user_cpu_refused_total{pool=\"users\"}"))
        .unwrap_or_else(|| panic!("no user_cpu refusals in /metrics"));
    assert!(!refused.ends_with(" 0"), "{refused}");
}
