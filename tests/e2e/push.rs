//! `--push-url`: the daemon pushes to a Pyroscope stand-in
//! (`support::pyroscope`, which checks requests as Pyroscope does) and
//! rides out a server that refuses, fails, hangs or is down (root; under
//! CI=true this fails rather than skips).

use std::{
    io::Read as _,
    time::{Duration, Instant},
};

use crate::support::{
    pyroscope::{wait_for, Mode, Pyroscope, Received},
    *,
};
use prost::Message as _;
use wallscope::export::pprof::proto::Profile;

/// Longest the first profiles may take: the daemon's first drains build
/// the host's unwind tables, which takes a debug build a while on a busy
/// host.
const FIRST: Duration = Duration::from_secs(180);
/// Longest anything else may take (a few 2 s intervals, the 10 s request
/// timeout), with room for a busy host.
const SLACK: Duration = Duration::from_secs(60);

fn health(url: &str) -> serde_json::Value {
    let (status, body) = get(&format!("{url}/healthz"));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The profiles of `series` for service `mixed` received so far.
fn of_series(server: &Pyroscope, series: &str) -> Vec<Received> {
    server
        .received()
        .into_iter()
        .filter(|r| r.label("service_name") == "mixed" && r.label("__name__") == series)
        .collect()
}

/// Unix seconds with nanoseconds, as `from`/`until` take them.
fn unix(ns: i64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// `/pprof` of `pid` for `kind` over exactly the window of `r`.
fn pprof_total(url: &str, pid: u32, kind: &str, r: &Received, ty: &str) -> i64 {
    let (from, until) = r.window();
    let query = format!(
        "{url}/pprof?pid={pid}&kind={kind}&from={}&until={}",
        unix(from),
        unix(until)
    );
    let answer = ureq::get(&query)
        .call()
        .unwrap_or_else(|e| panic!("{query}: {e}"));
    let mut gz = Vec::new();
    answer.into_reader().read_to_end(&mut gz).unwrap();
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut bytes)
        .unwrap();
    let profile = Received {
        labels: Default::default(),
        profile: Profile::decode(&bytes[..]).unwrap(),
    };
    profile.total(ty)
}

/// The names of the sample types of `r`, `type/unit`.
fn sample_types(r: &Received) -> Vec<String> {
    let p = &r.profile;
    p.sample_type
        .iter()
        .map(|t| format!("{}/{}", r.string(t.r#type), r.string(t.unit)))
        .collect()
}

#[test]
fn pushes_profiles_and_rides_out_a_failing_server() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let server = Pyroscope::start();
    let daemon = server.daemon(&["--push-label", "env=test", "--push-label", "team=perf"]);
    let url = &daemon.url;
    // Spinning, futex, sleeping and pipe-reading threads, for ten minutes
    // (killed when the test ends).
    let work = Workload::start(&workload("mixed"), &["600"]);

    // Both series arrive, labelled and valid.
    let (cpu, off) = wait_for(FIRST, "profiles of `mixed`", || {
        let cpu = of_series(&server, "process_cpu");
        let off = of_series(&server, "wallscope_offcpu");
        (!cpu.is_empty() && !off.is_empty()).then(|| (cpu[0].clone(), off[0].clone()))
    });
    assert!(server.invalid().is_empty(), "{:?}", server.invalid());
    for r in [&cpu, &off] {
        assert_eq!(r.label("env"), "test");
        assert_eq!(r.label("team"), "perf");
        assert!(!r.label("hostname").is_empty());
        assert_eq!(r.labels.len(), 5, "{:?}", r.labels);
    }
    assert_eq!(sample_types(&cpu), ["samples/count", "cpu/nanoseconds"]);
    assert_eq!(sample_types(&off), ["samples/count", "wall/nanoseconds"]);
    // Off-CPU samples carry their state and nothing else: other sample
    // labels would each make a series in Pyroscope.
    let mut states: Vec<&str> = off
        .profile
        .sample
        .iter()
        .flat_map(|s| &s.label)
        .map(|l| {
            assert_eq!(off.string(l.key), "state");
            off.string(l.str)
        })
        .collect();
    states.sort_unstable();
    states.dedup();
    assert!(
        states
            .iter()
            .all(|s| ["runqueue", "throttled", "futex", "io", "sleep"].contains(s)),
        "{states:?}"
    );

    // Totals: a pushed window is the API's profile of that window.
    let next = wait_for(SLACK, "a full interval of `mixed`", || {
        of_series(&server, "process_cpu")
            .into_iter()
            .find(|r| r.total("cpu") > 0 && r.window().0 > cpu.window().0)
    });
    for (r, kind, ty) in [(&next, "cpu", "cpu"), (&off, "offcpu", "wall")] {
        let pushed = r.total(ty);
        let api = pprof_total(url, work.pid, kind, r, ty);
        let diff = (pushed - api).abs() as f64 / api.max(1) as f64;
        assert!(
            pushed > 0 && diff <= 0.01,
            "{kind}: pushed {pushed} ns, /pprof {api} ns over {:?}",
            r.window()
        );
    }

    // A server that refuses, fails, hangs or is gone: counted, retried,
    // and the daemon drains and serves all along.
    for (mode, counter) in [
        (Mode::BadRequest, "http_4xx"),
        (Mode::Unavailable, "http_5xx"),
        (Mode::Hang, "timeout"),
        (Mode::Down, "refused"),
    ] {
        let before = health(url);
        server.set_mode(mode);
        let h = wait_for(SLACK, &format!("a {counter} failure"), || {
            let h = health(url);
            (h["push"]["failed"][counter].as_u64() > before["push"]["failed"][counter].as_u64())
                .then_some(h)
        });
        let drains = |h: &serde_json::Value| h["pipeline"]["drains"].as_u64().unwrap();
        let intervals = |h: &serde_json::Value| h["push"]["intervals"].as_u64().unwrap();
        let later = wait_for(SLACK, "drains and intervals going on", || {
            let later = health(url);
            (drains(&later) > drains(&h) + 1 && intervals(&later) > intervals(&h)).then_some(later)
        });
        assert!(
            later["push"]["last_error"].as_str().is_some(),
            "{}",
            later["push"]
        );
        let (status, body) = get(&format!("{url}/folded?pid={}&seconds=5", work.pid));
        assert_eq!(status, 200, "{mode:?}: {body}");
        if mode == Mode::BadRequest {
            assert!(
                h["push"]["rejected_profiles"].as_u64() > Some(0),
                "{}",
                h["push"]
            );
        }
    }
    let (_, metrics) = get(&format!("{url}/metrics"));
    for outcome in ["sent", "timeout", "refused", "http_4xx", "http_5xx"] {
        let line = format!("wallscope_push_requests_total{{outcome=\"{outcome}\"}} ");
        let n: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line} in /metrics"))
            .parse()
            .unwrap();
        assert!(n > 0, "{line}{n}");
    }

    // Back up: the next interval arrives.
    let recovered = Instant::now();
    let had = of_series(&server, "process_cpu").len();
    server.set_mode(Mode::Ok);
    wait_for(SLACK, "a profile after recovery", || {
        (of_series(&server, "process_cpu").len() > had).then_some(())
    });
    assert!(server.invalid().is_empty(), "{:?}", server.invalid());
    // Windows follow each other: none was pushed twice.
    let mut windows: Vec<(i64, i64)> = of_series(&server, "process_cpu")
        .iter()
        .map(Received::window)
        .collect();
    windows.sort_unstable();
    for pair in windows.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlapping windows {pair:?}");
    }
    eprintln!(
        "recovered in {:?}; push: {}",
        recovered.elapsed(),
        health(url)["push"]
    );
    drop(work);
}
