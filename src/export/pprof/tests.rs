use std::{io::Read as _, path::Path};

use flate2::read::GzDecoder;

use super::*;
use crate::profile::{
    model::window::Window,
    report::query::{
        folded,
        tests::{offcpu_store, store},
    },
};

fn filter(kind: &str, group: &str, window: Window) -> Filter {
    Filter {
        pid: None,
        tid: None,
        kind: Kind::parse(kind).unwrap(),
        group: Group::parse(group).unwrap(),
        window,
        others_hidden: false,
    }
}

fn string(p: &Profile, i: i64) -> &str {
    &p.string_table[i as usize]
}

fn total(p: &Profile) -> i64 {
    p.sample.iter().map(|s| s.value[1]).sum()
}

/// The sample's string labels, `key=value`, and number labels, `key=#n`.
fn labels(p: &Profile, s: &Sample) -> Vec<String> {
    s.label
        .iter()
        .map(|l| match l.str {
            0 => format!("{}=#{}", string(p, l.key), l.num),
            v => format!("{}={}", string(p, l.key), string(p, v)),
        })
        .collect()
}

/// The sample's function names, root first, with their mappings.
fn frames(p: &Profile, s: &Sample) -> Vec<String> {
    s.location_id
        .iter()
        .rev()
        .map(|id| {
            let loc = &p.location[*id as usize - 1];
            let f = &p.function[loc.line[0].function_id as usize - 1];
            let m = &p.mapping[p
                .mapping
                .iter()
                .position(|m| m.id == loc.mapping_id)
                .unwrap()];
            format!("{}@{}", string(p, f.name), string(p, m.filename))
        })
        .collect()
}

#[test]
fn cpu_profiles_are_typed_as_go_does() {
    let (store, now) = store();
    let p = build(
        &store.snapshot(),
        &filter("cpu", "thread", Window::last(30, now)),
        Detail::Threads,
    );
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (string(&p, t.r#type), string(&p, t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let period = p.period_type.unwrap();
    assert_eq!(
        (string(&p, period.r#type), string(&p, period.unit)),
        ("cpu", "nanoseconds")
    );
    assert_eq!(string(&p, p.default_sample_type), "cpu");
    assert_eq!(total(&p), 15_000);
    assert_eq!(p.duration_nanos, 30_000_000_000);
    let thread_11_b = p
        .sample
        .iter()
        .find(|s| frames(&p, s).last().unwrap() == "b@[native]")
        .unwrap();
    assert_eq!(
        labels(&p, thread_11_b),
        [
            "state=cpu",
            "pid=#10",
            "comm=ten",
            "thread_id=#11",
            "thread_name=t",
            "pool=t"
        ]
    );
    assert_eq!(thread_11_b.value, [1, 2_000]);
    let ids = p.location.iter().map(|l| l.id);
    let ids = ids.chain(p.function.iter().map(|f| f.id));
    assert!(ids.chain(p.mapping.iter().map(|m| m.id)).all(|id| id != 0));
}

#[test]
fn totals_match_folded_for_every_kind_and_group() {
    let (store, now) = offcpu_store();
    let store = store.snapshot();
    for kind in Kind::names() {
        for group in Group::names() {
            let f = Filter {
                pid: Some(10),
                ..filter(kind, group, Window::last(30, now))
            };
            let p = build(&store, &f, Detail::Threads);
            let series = build(&store, &f, Detail::Series);
            let want = folded(&store, &f).total_ns as i64;
            assert_eq!(total(&p), want, "{kind} {group}");
            assert_eq!(total(&series), want, "{kind} {group}");
        }
    }
}

#[test]
fn states_are_labels_and_kernel_frames_have_their_mapping() {
    let (store, now) = offcpu_store();
    let store = store.snapshot();
    let wall = build(
        &store,
        &filter("wall", "thread", Window::last(30, now)),
        Detail::Threads,
    );
    let of_state = |p: &Profile, state: &str| -> i64 {
        let label = format!("state={state}");
        p.sample
            .iter()
            .filter(|s| labels(p, s).contains(&label))
            .map(|s| s.value[1])
            .sum()
    };
    // (CPU rows of thread 11 exceed its exact CPU time and are scaled.)
    {
        let state = "throttled";
        let alone = build(
            &store,
            &filter(state, "thread", Window::last(30, now)),
            Detail::Threads,
        );
        // Wall rows are scaled to exact totals and completed by
        // [unattributed]: only the stack rows compare.
        let stacks_only: i64 = wall
            .sample
            .iter()
            .filter(|s| labels(&wall, s).contains(&format!("state={state}")))
            .filter(|s| !frames(&wall, s).iter().any(|f| f.contains("unattributed")))
            .map(|s| s.value[1])
            .sum();
        assert_eq!(stacks_only, total(&alone), "{state}");
        assert_eq!(of_state(&alone, state), total(&alone), "{state}");
    }
    let wakeups = build(
        &store,
        &filter("wakeup", "process", Window::last(30, now)),
        Detail::Threads,
    );
    let irq = wakeups
        .sample
        .iter()
        .map(|s| frames(&wakeups, s))
        .find(|f| f[0] == "[softirq]@[wallscope]")
        .unwrap();
    assert_eq!(
        irq,
        [
            "[softirq]@[wallscope]",
            "net_rx_action@[kernel.kallsyms]",
            "try_to_wake_up@[kernel.kallsyms]",
            "[wakes t [tid 11]]@[wallscope]"
        ]
    );
}

#[test]
fn encoded_profile_matches_golden() {
    let (store, now) = offcpu_store();
    let window = Window::between(now - std::time::Duration::from_secs(30), now);
    let p = build(
        &store.snapshot(),
        &filter("wall", "thread", window),
        Detail::Threads,
    );
    let gz = encode_gzip(&p);
    assert_eq!(decode_gzip(&gz), p, "round trip");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/offcpu.pb.gz");
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, &gz).unwrap();
    }
    let expected = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with BLESS=1 to create it)", path.display()));
    // Compared decoded: another gzip implementation or level changes the
    // bytes, not the profile.
    let expected = decode_gzip(&expected);
    if expected != p {
        panic!(
            "profile differs from {} (BLESS=1 rewrites it after an intended change):\n{}",
            path.display(),
            changed_lines(&format!("{expected:#?}"), &format!("{p:#?}"))
        );
    }
    // The same window twice is the same bytes.
    let again = build(
        &store.snapshot(),
        &filter("wall", "thread", window),
        Detail::Threads,
    );
    assert_eq!(encode_gzip(&again), gz);
}

fn decode_gzip(gz: &[u8]) -> Profile {
    let mut raw = Vec::new();
    GzDecoder::new(gz).read_to_end(&mut raw).unwrap();
    Profile::decode(&raw[..]).unwrap()
}

/// The lines of two pretty-printed profiles that differ, by line number
/// (at most 40).
fn changed_lines(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    (0..e.len().max(a.len()))
        .filter(|&i| e.get(i) != a.get(i))
        .take(40)
        .map(|i| {
            let (x, y) = (e.get(i).unwrap_or(&""), a.get(i).unwrap_or(&""));
            format!("{:5} - {x}\n      + {y}\n", i + 1)
        })
        .collect()
}

/// One thread's 10 ms on stack `main;work`, 4 ms of it under a span of
/// trace `0x0a…` with `http_route=/cart`.
fn span_store() -> (crate::profile::model::store::Snapshot, Window) {
    use crate::profile::model::{
        spans::{SpanId, SpanRecord, SpanSample, TraceId},
        store::Store,
        Sample as Row, Slice,
    };
    use std::{sync::Arc, time::Duration};
    let end = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_001);
    let start = end - Duration::from_secs(1);
    let mut slice = Slice::empty(start, end);
    let stack: crate::profile::model::Stack = ["main", "work"].map(Arc::from).into();
    let row = |ns| Row {
        pid: 5,
        tid: 6,
        state: State::Cpu,
        stack: stack.clone(),
        ns,
        count: ns / 1_000_000,
    };
    slice.samples.push(row(10_000_000));
    let span = SpanId::from_raw(0x77).unwrap();
    slice.spans.records.push(SpanRecord {
        pid: 5,
        span,
        trace: TraceId([0xa; 16]),
        flags: 1,
        attrs: vec![("http_route".into(), "/cart".into())],
        attrs_cut: false,
    });
    slice.spans.samples.push(SpanSample {
        pid: 5,
        tid: 6,
        span,
        state: State::Cpu,
        stack: stack.clone(),
        ns: 4_000_000,
        count: 4,
    });
    let mut store = Store::new(Duration::from_secs(600));
    store.push(slice);
    (store.snapshot(), Window::between(start, end))
}

#[test]
fn time_under_a_span_carries_its_labels_and_counts_once() {
    let (store, window) = span_store();
    let p = build(&store, &filter("cpu", "thread", window), Detail::Threads);
    assert_eq!(total(&p), 10_000_000, "no time counted twice");
    let tagged: Vec<_> = (p.sample.iter())
        .filter(|s| labels(&p, s).iter().any(|l| l.starts_with("span_id=")))
        .collect();
    assert_eq!(tagged.len(), 1);
    assert_eq!(tagged[0].value[1], 4_000_000);
    let l = labels(&p, tagged[0]);
    let trace = format!("trace_id={}", "0a".repeat(16));
    let span = format!(
        "span_id={}",
        crate::profile::model::spans::SpanId::from_raw(0x77)
            .unwrap()
            .hex()
    );
    for want in [
        trace.as_str(),
        span.as_str(),
        "attr.http_route=/cart",
        "thread_id=#6",
    ] {
        assert!(l.iter().any(|x| x == want), "{want} in {l:?}");
    }
    // Pushed series (Pyroscope) keep their labels as they were.
    let series = build(&store, &filter("cpu", "thread", window), Detail::Series);
    assert_eq!(total(&series), 10_000_000);
    assert!(series
        .sample
        .iter()
        .all(|s| !labels(&series, s).iter().any(|l| l.starts_with("span_id="))));
}
