//! `--otlp-url` alone: the daemon sends OpenTelemetry profiles to a
//! receiver stand-in (`support::otlp`, which decodes them with the
//! published proto files), and what it sends is `/pprof` over the same
//! window (root; under CI=true this fails rather than skips).

use std::{collections::BTreeMap, io::Read as _, time::Duration};

use prost::Message as _;
use wallscope::export::pprof::proto::Profile as Pprof;

use crate::support::{
    otlp::{Profile, Receiver},
    pyroscope::wait_for,
    *,
};

/// Longest the first profiles may take: the daemon's first drains build
/// the host's unwind tables, which takes a debug build a while on a busy
/// host.
const FIRST: Duration = Duration::from_secs(180);
/// Longest a few more 2 s intervals may take on a busy host.
const SLACK: Duration = Duration::from_secs(60);

/// The profiles of `pid` of sample type `ty` received so far.
fn of(receiver: &Receiver, pid: u32, ty: &str) -> Vec<Profile> {
    receiver
        .received()
        .into_iter()
        .filter(|p| p.resource.get("process.pid") == Some(&pid.to_string()) && p.sample_type == ty)
        .collect()
}

/// `/pprof` of `pid` and `kind` over exactly `window` (Unix ns): the
/// nanoseconds by `state` label.
fn pprof_by_state(
    url: &str,
    pid: u32,
    kind: &str,
    (from, until): (u64, u64),
) -> BTreeMap<String, i64> {
    let secs = |ns: u64| format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
    let query = format!(
        "{url}/pprof?pid={pid}&kind={kind}&from={}&until={}",
        secs(from),
        secs(until)
    );
    let mut gz = Vec::new();
    ureq::get(&query)
        .call()
        .unwrap_or_else(|e| panic!("{query}: {e}"))
        .into_reader()
        .read_to_end(&mut gz)
        .unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .unwrap();
    let p = Pprof::decode(&raw[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    let ns = p
        .sample_type
        .iter()
        .position(|t| s(t.unit) == "nanoseconds")
        .unwrap();
    let mut by_state = BTreeMap::new();
    for sample in &p.sample {
        let state = sample
            .label
            .iter()
            .find(|l| s(l.key) == "state")
            .map_or("", |l| s(l.str));
        *by_state.entry(state.to_string()).or_insert(0) += sample.value[ns];
    }
    by_state
}

/// `p`'s nanoseconds by its samples' `wallscope.state` (`cpu` for the
/// CPU profile, whose samples carry none).
fn by_state(p: &Profile) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for s in &p.samples {
        let state = s
            .attributes
            .get("wallscope.state")
            .map_or("cpu", String::as_str);
        *out.entry(state.to_string()).or_insert(0) += s.value;
    }
    out
}

#[test]
fn sends_the_pprof_profiles_as_otlp() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let receiver = Receiver::start();
    let otlp_url = receiver.url();
    // As `support::pyroscope`'s daemon: the top 256, since ranking is by
    // wall time and a busy host has heavier processes than the workload.
    let daemon = Daemon::start(&[
        "--otlp-url",
        &otlp_url,
        "--push-interval",
        "2s",
        "--push-top",
        "256",
    ]);
    let url = &daemon.url;
    let work = Workload::start(&workload("mixed"), &["600"]);
    let pid = work.pid;

    // A full interval of the workload after its first: both profiles.
    let first = wait_for(FIRST, "profiles of `mixed`", || {
        of(&receiver, pid, "cpu/nanoseconds").first().cloned()
    });
    let (cpu, off) = wait_for(SLACK, "a full interval of `mixed`", || {
        let later = |ty| {
            of(&receiver, pid, ty)
                .into_iter()
                .find(|p| p.window().0 > first.window().0 && p.total() > 0)
        };
        let cpu = later("cpu/nanoseconds")?;
        let off = of(&receiver, pid, "off_cpu/nanoseconds")
            .into_iter()
            .find(|p| p.window() == cpu.window())?;
        Some((cpu, off))
    });
    assert!(receiver.invalid().is_empty(), "{:?}", receiver.invalid());

    // The resource is the process.
    for p in [&cpu, &off] {
        assert_eq!(p.resource["service.name"], "mixed");
        assert_eq!(p.resource["process.pid"], pid.to_string());
        assert!(!p.resource["host.name"].is_empty(), "{:?}", p.resource);
        assert_eq!(p.scope, "wallscope");
    }

    // Totals per state: the API's profile of the same window.
    let (window, length) = (cpu.window(), cpu.duration_nano);
    assert!(length > 0 && off.window() == window);
    let mut sent = by_state(&cpu);
    sent.extend(by_state(&off));
    let mut api = pprof_by_state(url, pid, "cpu", window);
    api.extend(pprof_by_state(url, pid, "offcpu", window));
    eprintln!("window {window:?}: sent {sent:?}, /pprof {api:?}");
    assert_eq!(
        sent.keys().collect::<Vec<_>>(),
        api.keys().collect::<Vec<_>>()
    );
    let total: i64 = api.values().sum();
    for (state, ns) in &api {
        let diff = (sent[state] - ns).abs() as f64 / total.max(1) as f64;
        assert!(
            diff <= 0.01,
            "{state}: sent {} ns, /pprof {ns} ns",
            sent[state]
        );
    }
    assert!(sent["cpu"] > 0, "{sent:?}");
    for state in sent.keys() {
        assert!(
            ["cpu", "runqueue", "throttled", "futex", "io", "sleep"].contains(&state.as_str()),
            "{state}"
        );
    }

    // Every sample names its thread, one of the workload's.
    let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for s in cpu.samples.iter().chain(&off.samples) {
        let tid = &s.attributes["thread.id"];
        assert!(tasks.contains(tid), "thread {tid} not in {tasks:?}");
        assert!(
            !s.attributes["thread.name"].is_empty(),
            "{:?}",
            s.attributes
        );
        assert!(s.frames.iter().all(|(_, ty)| !ty.is_empty()));
    }
    assert!(
        off.samples
            .iter()
            .all(|s| s.attributes.contains_key("wallscope.state")),
        "off-CPU samples carry their state"
    );
    // `mixed` is C: its own frames are native (kernel frames, when a
    // stack has them, kernel; wallscope's own `[unattributed]`).
    let mut types: Vec<&str> = cpu
        .samples
        .iter()
        .chain(&off.samples)
        .flat_map(|s| s.frames.iter().map(|(_, ty)| ty.as_str()))
        .collect();
    types.sort_unstable();
    types.dedup();
    assert!(types.contains(&"native"), "{types:?}");
    assert!(
        types
            .iter()
            .all(|t| ["native", "kernel", "wallscope"].contains(t)),
        "{types:?}"
    );

    // Counted under `otlp`, not `push`.
    let (_, health) = get(&format!("{url}/healthz"));
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert!(
        health["otlp"]["sent_requests"].as_u64() > Some(0),
        "{}",
        health["otlp"]
    );
    assert!(health["push"].is_null(), "{}", health["push"]);
    let (_, metrics) = get(&format!("{url}/metrics"));
    assert!(
        metrics.contains("wallscope_otlp_requests_total{outcome=\"sent\"} "),
        "no wallscope_otlp_requests_total"
    );
    // Windows follow each other: none was sent twice.
    let mut windows: Vec<(u64, u64)> = of(&receiver, pid, "cpu/nanoseconds")
        .iter()
        .map(Profile::window)
        .collect();
    windows.sort_unstable();
    for pair in windows.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlapping windows {pair:?}");
    }
    eprintln!(
        "otlp: {} requests, frame types {types:?}; {}",
        receiver.requests(),
        health["otlp"]
    );
    drop(work);
}
