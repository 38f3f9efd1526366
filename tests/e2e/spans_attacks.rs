//! Hostile thread contexts (#43), all at once: each attack of the C
//! writer runs as its own unprivileged user beside a normal writer: a
//! forged `OTEL_CTX` mapping, a TLS pointer into unmapped memory, a record
//! that changes under the reader, 255 attributes of 255 bytes, a new span
//! id every ~50 µs. The daemon stays up and within every memory bound, the
//! normal writer's spans still match its log, what each attack cost is
//! counted, and `/spans` of every attacker stays bounded. One run for all
//! five: hostile users do not take turns, and the suite pays one attack
//! window, not five. Needs root.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    spans::{check_all, known_since},
    support::{
        get, settle,
        spans::{c_attrs, grown, span_counters, CWriter, SpanWriter, C_ROUTES},
        users, Fixture,
    },
};

/// How long the attacks run once the normal writer's spans are known.
const ATTACK: Duration = Duration::from_secs(20);
/// The daemon's resident memory at any moment (`tests/e2e/memory_bounds.rs`).
const PEAK_RSS: u64 = 150 << 20;
/// Spans of the normal writer checked after the attack.
const CHECKED: usize = 10;
/// Most rows a `/spans` answer of an attacker may hold, and its size.
const LIMIT: usize = 50;
const MAX_ANSWER: usize = 1 << 20;

/// One attack: the writer's flag, its user, and the counter it must grow
/// (a counter whose path holds every word of one of `counted`).
struct Attack {
    flag: &'static str,
    uid: u32,
    counted: &'static [&'static [&'static str]],
    what: &'static str,
}

const ATTACKS: [Attack; 5] = [
    // Discovery refuses the mapping (the refusals report).
    Attack {
        flag: "--forge-ctx",
        uid: users::NOBODY,
        counted: &[&["refused", "otel"]],
        what: "refusal",
    },
    Attack {
        flag: "--tls-unmapped",
        uid: 60_431,
        counted: &[&["otel", "fail"]],
        what: "failed context read",
    },
    // A torn read is no failure the daemon can see: it takes what the
    // record holds at that instant, rendered as well-formed ids (checked
    // for every attacker). What is counted is that it read them.
    Attack {
        flag: "--flip",
        uid: 60_432,
        counted: &[&["otel", "reads"]],
        what: "context read",
    },
    Attack {
        flag: "--big-attrs",
        uid: 60_433,
        counted: &[&["attr", "cut"]],
        what: "attribute cut",
    },
    Attack {
        flag: "--churn",
        uid: 60_434,
        counted: &[&["span", "full"], &["span", "drop"], &["span", "aggregat"]],
        what: "span drop",
    },
];

/// The C writer (its executable variant) with the attack's flag, as its
/// user.
fn attacker(attack: &Attack) -> SpanWriter {
    let built = CWriter::Exe.command(&[]).get_program().to_owned();
    let dir = users::shared_dir("otel-attack", 0o755);
    let bin = dir.join("otel_writer");
    if !bin.exists() {
        fs::copy(&built, &bin).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = users::as_user(attack.uid, &bin);
    cmd.arg(attack.flag);
    SpanWriter::spawn(cmd)
}

/// `/healthz` now: the daemon answers, every memory holder is within its
/// bound and the resident memory within the promise.
fn healthy(url: &str, what: &str) -> Value {
    let (status, body) = get(&format!("{url}/healthz"));
    assert_eq!(status, 200, "{what}: {body}");
    let health: Value = serde_json::from_str(&body).unwrap();
    let memory = &health["memory"];
    for h in memory["holders"].as_array().expect("memory.holders") {
        if let (Some(bytes), Some(bound)) = (h["bytes"].as_u64(), h["bound"].as_u64()) {
            assert!(bytes <= bound, "{what}: holder over its bound: {h}");
        }
    }
    let rss = memory["rss_bytes"].as_u64().expect("memory.rss_bytes");
    assert!(rss <= PEAK_RSS, "{what}: resident {rss} B > {PEAK_RSS} B");
    health
}

/// `/spans` of an attacker: bounded by `limit` whatever it published, its
/// ids W3C lowercase hex; the number of spans it lists.
fn attacker_spans_bounded(url: &str, attack: &Attack, pid: u32) -> usize {
    let flag = attack.flag;
    let (status, body) = get(&format!("{url}/spans?pid={pid}&seconds=60&limit={LIMIT}"));
    assert!(matches!(status, 200 | 404), "{flag}: {status} {body}");
    assert!(
        body.len() <= MAX_ANSWER,
        "{flag}: /spans of {} B",
        body.len()
    );
    if status != 200 {
        return 0;
    }
    let v: Value = serde_json::from_str(&body).unwrap();
    let rows = v["spans"].as_array().cloned().unwrap_or_default();
    assert!(
        rows.len() <= LIMIT,
        "{flag}: {} rows > limit {LIMIT}",
        rows.len()
    );
    let hex = |v: &Value, n| {
        v.as_str().is_some_and(|s| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
    };
    for row in &rows {
        assert!(
            hex(&row["span_id"], 16) && hex(&row["trace_id"], 32),
            "{flag}: {row}"
        );
    }
    rows.len()
}

#[test]
#[ignore = "#43 blocked: with five flooders at once the normal writer's newest spans age out of the spans' store within ~15 s, and the shared daemon afterwards answers /runqueue?seconds=300 too slowly for the next tests (throttling); passes its other checks"]
fn hostile_writers_harm_no_one_and_each_attack_is_counted() {
    let Some(fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = fx.daemon();
    settle(url);
    let before = span_counters(&healthy(url, "before"));
    // A service of ~40 spans a second (each ~100 ms): three flooders share
    // the spans' store with it, so at 200 a second its newest spans would
    // age out in ~15 s, before the checks ask for them.
    let normal = SpanWriter::spawn(CWriter::Exe.command(&["--ms", "100"]));
    let mut bad: Vec<SpanWriter> = ATTACKS.iter().map(attacker).collect();
    let since = known_since(url, &normal);
    let end = Instant::now() + ATTACK;
    while Instant::now() < end {
        healthy(url, "during the attacks");
        thread::sleep(Duration::from_millis(500));
    }
    for (attack, writer) in ATTACKS.iter().zip(&mut bad) {
        assert!(
            writer.alive(),
            "{}: the attacker exited early: not an attack",
            attack.flag
        );
    }
    // Served in the attacks' last seconds: the spans' store keeps the
    // newest of each process (its older ones fold into aggregates).
    let last = end.checked_sub(Duration::from_secs(5)).unwrap_or(since);
    let spans = normal.spans_started_after(last.max(since), CHECKED, Duration::from_secs(10));
    settle(url);
    check_all(url, &normal, &spans, &C_ROUTES, c_attrs);
    let grown = grown(&before, &span_counters(&healthy(url, "after")));
    for (attack, writer) in ATTACKS.iter().zip(&bad) {
        let listed = attacker_spans_bounded(url, attack, writer.pid);
        if attack.flag == "--tls-unmapped" {
            // Its record pointer leads nowhere: no span can be read.
            assert_eq!(
                listed, 0,
                "{}: spans from an unreadable context",
                attack.flag
            );
        }
        let counted = grown.iter().any(|path| {
            let path = path.to_ascii_lowercase();
            (attack.counted.iter()).any(|words| words.iter().all(|w| path.contains(w)))
        });
        assert!(
            counted,
            "{}: no {} counted; grown: {grown:?}",
            attack.flag, attack.what
        );
    }
}
