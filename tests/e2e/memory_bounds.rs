//! The daemon's memory by holder (`/healthz` `memory`) under the input
//! that once made it spike to 1.4 GB (VmHWM): a process run as `nobody`
//! rewriting its perf map with unique long names while its thread runs in
//! the code the map names. Every holder stays within its bound, the
//! holders account for most of the RSS, and the peak stays under the
//! promise. Needs root (skips without eBPF, fails under CI).

use std::{
    fs,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use crate::support::{
    rows::json_at, rows::within, settle, users, Daemon, Fixture, Workload, CATCH_UP,
};
use serde_json::Value;

/// The promise: resident memory at any moment (`VmHWM`).
const PEAK: u64 = 150 << 20;
/// Resident memory no holder names (allocator free lists, thread stacks,
/// libraries) at most.
const UNACCOUNTED: u64 = 64 << 20;
/// How long the attack runs once the daemon reads its map.
const ATTACK: Duration = Duration::from_secs(30);

const HOLDERS: [&str; 15] = [
    "store",
    "stacks",
    "spans",
    "names",
    "elf_symbols",
    "unwind_tables",
    "jvm_code",
    "process_table",
    "query_buffers",
    "answers",
    "push_outbox",
    "batches",
    "bpf_maps",
    "allocator",
    "binary",
];

/// Checks one `/healthz` `memory`: the holders in the contract's order,
/// each within its bound, and what they leave unaccounted. Returns it.
fn check(memory: &Value) -> &Value {
    let holders = memory["holders"].as_array().expect("memory.holders");
    let names: Vec<&str> = holders
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, HOLDERS, "{memory}");
    for h in holders {
        let bytes = h["bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("bytes of {h}"));
        if let Some(bound) = h["bound"].as_u64() {
            assert!(bytes <= bound, "holder over its bound: {h}");
        }
    }
    let rss = memory["rss_bytes"].as_u64().unwrap();
    let sum: u64 = holders.iter().map(|h| h["bytes"].as_u64().unwrap()).sum();
    assert_eq!(
        memory["unaccounted_bytes"].as_u64(),
        Some(rss.saturating_sub(sum)),
        "{memory}"
    );
    memory
}

fn holder(memory: &Value, name: &str) -> u64 {
    let holders = memory["holders"].as_array().unwrap();
    let h = holders.iter().find(|h| h["name"] == name).unwrap();
    h["bytes"].as_u64().unwrap()
}

#[test]
fn a_perf_map_rewritten_with_unique_long_names_stays_within_every_bound() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let ws = Daemon::start(&[]);
    settle(&ws.url);
    let quiet = json_at(&ws.url, "/healthz")["memory"].clone();
    check(&quiet);
    assert!(
        holder(&quiet, "binary") > 0,
        "the daemon's code is resident: {quiet}"
    );
    assert!(holder(&quiet, "store") > 0, "{quiet}");

    let dir = users::shared_dir("memory", 0o777);
    let bin = users::runnable_copy("names_attacker", &dir);
    let mut cmd = users::as_nobody(&bin);
    // 20,000 new names of 2,000 bytes (40 MB) every second.
    cmd.args(["perfmap", "20000", "2000", "1000"])
        .current_dir(&dir);
    let a = Workload::spawn(cmd);
    let map = PathBuf::from(format!("/tmp/perf-{}.map", a.pid));
    let _cleanup = Cleanup(vec![map.with_extension("map.tmp"), map]);
    let names_before = holder(&quiet, "names");
    let read = within(CATCH_UP, || {
        let m = json_at(&ws.url, "/healthz")["memory"].clone();
        (holder(&m, "names") > names_before + (1 << 20)).then_some(())
    });
    assert!(
        read.is_some(),
        "the attacker's names never reached the daemon"
    );

    let (mut peak_names, mut peak_unaccounted) = (0, 0);
    let end = Instant::now() + ATTACK;
    while Instant::now() < end {
        let h = json_at(&ws.url, "/healthz");
        let m = check(&h["memory"]);
        peak_names = peak_names.max(holder(m, "names"));
        peak_unaccounted = peak_unaccounted.max(m["unaccounted_bytes"].as_u64().unwrap());
        thread::sleep(Duration::from_millis(250));
    }
    let last = json_at(&ws.url, "/healthz")["memory"].clone();
    check(&last);
    println!(
        "quiet: {quiet}\nunder attack: {last}\nnames at most {} MiB, unaccounted at most {} MiB",
        peak_names >> 20,
        peak_unaccounted >> 20
    );
    let hwm = last["hwm_bytes"].as_u64().unwrap();
    assert!(hwm < PEAK, "VmHWM {} MiB: {last}", hwm >> 20);
    assert!(
        peak_unaccounted < UNACCOUNTED,
        "{} MiB of RSS no holder names: {last}",
        peak_unaccounted >> 20
    );
    drop(a);
}

/// Files the attacker leaves in `/tmp`.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}
