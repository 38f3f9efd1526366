//! Hostile thread contexts (#43): each attack of the C writer runs as
//! `nobody` beside a normal writer: a forged `OTEL_CTX` mapping, a TLS
//! pointer into unmapped memory, a record that changes under the reader,
//! 255 attributes of 255 bytes, a new span id every ~50 µs. The daemon
//! stays up and within every memory bound, the normal writer's spans still
//! match its log, what the attack cost is counted, and `/spans` of the
//! attacker stays bounded. Needs root.

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

/// How long each attack runs once the normal writer's spans are known.
const ATTACK: Duration = Duration::from_secs(20);
/// The daemon's resident memory at any moment (`tests/e2e/memory_bounds.rs`).
const PEAK_RSS: u64 = 150 << 20;
/// Spans of the normal writer checked after the attack.
const CHECKED: usize = 10;
/// Most rows a `/spans` answer of the attacker may hold, and its size.
const LIMIT: usize = 50;
const MAX_ANSWER: usize = 1 << 20;

/// The C writer (its executable variant) with `flag`, as `nobody`.
fn attacker(flag: &str) -> SpanWriter {
    let built = CWriter::Exe.command(&[]).get_program().to_owned();
    let dir = users::shared_dir("otel-attack", 0o755);
    let bin = dir.join("otel_writer");
    if !bin.exists() {
        fs::copy(&built, &bin).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = users::as_nobody(&bin);
    cmd.arg(flag);
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

/// Runs `flag` beside a normal writer; returns the thread-context and span
/// counters that grew while it ran (`None`: skipped, no eBPF).
fn attack(flag: &str) -> Option<Vec<String>> {
    let fx = Fixture::ebpf_serial()?;
    let url = fx.daemon();
    settle(url);
    let before = span_counters(&healthy(url, "before"));
    let normal = SpanWriter::spawn(CWriter::Exe.command(&[]));
    let mut bad = attacker(flag);
    let since = known_since(url, &normal);
    let end = Instant::now() + ATTACK;
    while Instant::now() < end {
        healthy(url, flag);
        thread::sleep(Duration::from_millis(500));
    }
    assert!(
        bad.alive(),
        "{flag}: the attacker exited early: not an attack"
    );
    // Served in the attack's last seconds: the spans' store keeps the
    // newest of each process (its older ones fold into aggregates).
    let last = end.checked_sub(Duration::from_secs(5)).unwrap_or(since);
    let spans = normal.spans_started_after(last.max(since), CHECKED, Duration::from_secs(10));
    settle(url);
    check_all(url, &normal, &spans, &C_ROUTES, c_attrs);
    let after = healthy(url, flag);
    // Bounded whatever the attacker published: at most `limit` rows.
    let (status, body) = get(&format!(
        "{url}/spans?pid={}&seconds=60&limit={LIMIT}",
        bad.pid
    ));
    assert!(matches!(status, 200 | 404), "{flag}: {status} {body}");
    assert!(
        body.len() <= MAX_ANSWER,
        "{flag}: /spans of {} B",
        body.len()
    );
    if status == 200 {
        let v: Value = serde_json::from_str(&body).unwrap();
        let rows = v["spans"].as_array().cloned().unwrap_or_default();
        assert!(
            rows.len() <= LIMIT,
            "{flag}: {} rows > limit {LIMIT}",
            rows.len()
        );
        // Whatever bytes the record held: W3C lowercase hex.
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
    }
    Some(grown(&before, &span_counters(&after)))
}

/// Runs `flag` (see [`attack`]) and asserts that a counter grew whose
/// path holds every word of one of `names`.
fn attack_counted(flag: &str, names: &[&[&str]], what: &str) {
    let Some(grown) = attack(flag) else { return };
    let counted = grown.iter().any(|path| {
        let path = path.to_ascii_lowercase();
        names
            .iter()
            .any(|words| words.iter().all(|w| path.contains(w)))
    });
    assert!(counted, "{flag}: no {what} counted; grown: {grown:?}");
}

#[test]
fn a_forged_otel_ctx_mapping_is_refused_and_counted() {
    // Discovery refuses the mapping (the refusals report).
    attack_counted("--forge-ctx", &[&["refused", "otel"]], "refusal");
}

#[test]
#[ignore = "#43 blocked: failed in the full suite of stop 50 (beside the other attacks); cause not known yet"]
fn a_tls_pointer_into_unmapped_memory_is_counted() {
    attack_counted(
        "--tls-unmapped",
        &[&["otel", "fail"]],
        "failed context read",
    );
}

#[test]
#[ignore = "#43 blocked: failed in the full suite of stop 50 (beside the other attacks); cause not known yet"]
fn a_record_changing_under_the_reader_harms_no_one() {
    // A torn read is no failure the daemon can see: it takes what the
    // record holds at that instant, rendered as well-formed ids (checked
    // in `attack`). What is counted is that it read them.
    attack_counted("--flip", &[&["otel", "reads"]], "context read");
}

#[test]
fn attributes_beyond_the_bound_are_cut_and_counted() {
    attack_counted("--big-attrs", &[&["attr", "cut"]], "attribute cut");
}

#[test]
fn a_million_span_ids_a_minute_are_dropped_and_counted() {
    let drops: &[&[&str]] = &[&["span", "full"], &["span", "drop"], &["span", "aggregat"]];
    attack_counted("--churn", drops, "span drop");
}
