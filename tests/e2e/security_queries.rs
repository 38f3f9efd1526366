//! Queries about one's own process cost bounded memory and time (issue
//! 38, point 2): `nobody` runs threads that sleep behind ever-new random
//! 127-frame call chains through JIT-like code named with 2 KB perf-map
//! names, so that every sleep is a new stack of huge frames; concurrent
//! `/folded`, `/flamegraph` and `/pprof` of its sleep over 60 s leave the
//! daemon, confined to the unit's 512 MiB, alive and well under it, each
//! answer within its bounds and marked truncated, the bounds counted.

use std::{
    fs,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use wallscope::{
    api::TRUNCATED_HEADER,
    profile::report::truncate::{Limits, LINE_EXTRA},
};

use crate::support::{
    memcg::ConfinedDaemon, rows::json_at, rows::within, users, Fixture, Workload,
};

/// The attacker: threads, chain depth, code regions, name bytes, sleep.
/// 3,000 names of 2,000 bytes: well within one perf map's part of the
/// budget (half of `perf_map_names`), so that the frames are named.
const ATTACK: [&str; 5] = ["8", "127", "3000", "2000", "1000"];
/// "Well under" the cgroup's 512 MiB.
const PEAK: u64 = 400 << 20;
/// Longest one answer may take on a busy host (a debug build; main took
/// 5.7–38.8 s of CPU per query before the fold by identity).
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// One answer: status, truncation header, body bytes, and how long it took.
struct Answer {
    truncated: Option<String>,
    body: Vec<u8>,
    took: Duration,
}

/// GET `url`, again after a 503 (two queries run at once, the others wait
/// at most 10 s) until it answers 200.
fn answer(url: &str) -> Answer {
    let started = Instant::now();
    loop {
        match ureq::get(url).timeout(Duration::from_secs(120)).call() {
            Ok(r) => {
                let truncated = r.header(TRUNCATED_HEADER).map(str::to_string);
                let mut body = Vec::new();
                std::io::Read::read_to_end(&mut r.into_reader(), &mut body).unwrap();
                let took = started.elapsed();
                return Answer {
                    truncated,
                    body,
                    took,
                };
            }
            Err(ureq::Error::Status(503, _)) if started.elapsed() < Duration::from_secs(120) => {
                thread::sleep(Duration::from_secs(2));
            }
            Err(e) => panic!("{url}: {e}"),
        }
    }
}

fn refused(h: &Value, reason: &str) -> u64 {
    h["refused"]["query"][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no refused.query.{reason} in {}", h["refused"]))
}

/// The attacker's perf map, removed when the test ends.
struct PerfMap(PathBuf);

impl Drop for PerfMap {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
fn queries_over_endless_huge_stacks_stay_bounded() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let mut ws = ConfinedDaemon::start(&[]);
    let url = ws.url().to_string();
    let dir = users::shared_dir("queries", 0o777);
    let bin = users::runnable_copy("stacks_attacker", &dir);
    let mut cmd = users::as_nobody(&bin);
    cmd.args(ATTACK).current_dir(&dir);
    let attacker = Workload::spawn(cmd);
    let _map = PerfMap(PathBuf::from(format!("/tmp/perf-{}.map", attacker.pid)));
    let pid = attacker.pid;

    // The store fills with the attacker's stacks (a new one every sleep),
    // until its sleep over 60 s folds to more than an answer holds.
    // 60 s: the sampled walks store some eight new stacks a second, each a
    // 32 KiB line; over 30 s that is just under the 8 MiB an answer holds.
    let q = format!("pid={pid}&kind=sleep&seconds=60");
    // Merged by the answer's bounds, or past the fold table's: either
    // way the answer is full.
    let merged = within(Duration::from_secs(240), || {
        let a = answer(&format!("{url}/folded?{q}"));
        let header = a.truncated.unwrap_or_default();
        eprintln!(
            "/folded of the attacker: {} bytes in {:?}, truncated: {header:?}",
            a.body.len(),
            a.took
        );
        let field = |name: &str| -> usize {
            header
                .split(' ')
                .find_map(|f| f.strip_prefix(name)?.parse().ok())
                .unwrap_or(0)
        };
        let merged = field("stacks=") + field("over_budget=");
        (merged > 0).then_some(merged)
    });
    ws.assert_survived("the attack alone");
    let merged = merged.unwrap_or_else(|| panic!("the attacker's stacks never filled an answer"));
    let stacks = json_at(&url, "/healthz")["stacks"].as_u64().unwrap_or(0);
    let before = json_at(&url, "/healthz");
    let peak_before = ws.cgroup.peak_bytes();

    let paths = [
        format!("/folded?{q}"),
        format!("/folded?{q}&group=thread"),
        format!("/flamegraph?{q}"),
        format!("/pprof?{q}"),
    ];
    let answers: Vec<(String, Answer)> = thread::scope(|s| {
        let running: Vec<_> = paths
            .iter()
            .map(|p| {
                let u = format!("{url}{p}");
                (p.clone(), s.spawn(move || answer(&u)))
            })
            .collect();
        running
            .into_iter()
            .map(|(p, h)| (p, h.join().unwrap()))
            .collect()
    });
    ws.assert_survived("the queries");
    let after = json_at(&url, "/healthz");
    let peak = ws.cgroup.peak_bytes();
    eprintln!(
        "{stacks} stacks in the store, {merged} of the attacker's merged; cgroup peak {} MiB before the queries, {} MiB after",
        peak_before >> 20,
        peak >> 20
    );
    for (p, a) in &answers {
        eprintln!(
            "{p}: {} bytes in {:?}, truncated: {:?}",
            a.body.len(),
            a.took,
            a.truncated
        );
        assert!(a.took < ANSWER_WITHIN, "{p} took {:?}", a.took);
        // A pprof of these stacks may fit its tables (its size is checked
        // below); the text answers cannot hold them.
        assert!(
            a.truncated.is_some() || p.starts_with("/pprof"),
            "{p} not marked truncated"
        );
    }
    assert!(peak < PEAK, "cgroup peak {} MiB", peak >> 20);

    // Folded text: within the stack and byte bounds, every line capped.
    for (_, a) in answers.iter().filter(|(p, _)| p.starts_with("/folded")) {
        let text = std::str::from_utf8(&a.body).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let merged = lines.iter().filter(|l| l.contains(";[truncated: ")).count();
        assert!(merged >= 1, "no [truncated] line");
        assert!(lines.len() <= Limits::API.stacks + merged);
        let longest = lines.iter().map(|l| l.len()).max().unwrap_or(0);
        assert!(
            longest < Limits::API.line_bytes + LINE_EXTRA,
            "a line of {longest} bytes"
        );
        assert!(text.len() <= Limits::API.bytes + merged * 256);
        assert!(
            lines.iter().any(|l| l.contains(" frames];")),
            "no elided line"
        );
        let header = a.truncated.as_deref().unwrap_or_default();
        assert!(header.contains("elided_lines="), "{header}");
    }
    let pprof = &answers[3].1;
    assert!(
        pprof.body.len() < wallscope::export::pprof::MAX_TABLE_BYTES,
        "pprof of {} bytes",
        pprof.body.len()
    );
    let svg = &answers[2].1;
    assert!(svg.body.len() < 64 << 20, "SVG of {} bytes", svg.body.len());

    // Each bound hit is counted (the table budget when pprof hit it).
    let pprof_cut = answers[3].1.truncated.is_some();
    let reasons: &[&str] = if pprof_cut {
        &["long_line", "too_many_entries", "budget"]
    } else {
        &["long_line", "too_many_entries"]
    };
    for &reason in reasons {
        assert!(
            refused(&after, reason) > refused(&before, reason),
            "refused.query.{reason} not counted: {}",
            after["refused"]["query"]
        );
    }
    attacker.stop();
}
