use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, SystemTime},
};

use prost::Message as _;

use super::{proto::*, *};
use crate::{
    export::{
        pprof::FrameKind,
        push::{Chosen, Encode},
    },
    process::container::Container,
    profile::model::state::State,
    profile::{
        model::{
            counters::{RawThread, ThreadCounters},
            ThreadInfo,
        },
        model::{
            store::Store,
            window::{unix_nanos, Window},
            Sample as Row, Slice,
        },
    },
};

const APP: u32 = 4_194_300;
const MS: u64 = 1_000_000;
const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn thread(tid: u32, state: State, ns: u64) -> RawThread {
    let mut counters = ThreadCounters::default();
    counters.ns[state as usize] = ns;
    RawThread {
        tid,
        pid: APP,
        comm: String::new(),
        counters,
    }
}

/// One second of the app in a container: its main thread on CPU 300 ms
/// (native and kernel frames), `worker-1` in a futex 700 ms (Python) and
/// asleep 100 ms (Java).
fn store(end: SystemTime) -> Store {
    let row = |tid, state, frames: &[&str], ns| Row {
        pid: APP,
        tid,
        state,
        stack: frames.iter().map(|f| Arc::<str>::from(*f)).collect(),
        ns,
        count: 3,
    };
    let mut slice = Slice::empty(end - Duration::from_secs(1), end);
    slice.samples = vec![
        row(
            APP,
            State::Cpu,
            &["main", "work", "do_sys_open_[k]"],
            300 * MS,
        ),
        row(
            APP + 1,
            State::Futex,
            &[
                "main",
                "Thread.run (threading.py:999)_[py]",
                "futex_wait_[k]",
            ],
            700 * MS,
        ),
        row(APP + 1, State::Sleep, &["main", "Foo.bar_[j]"], 100 * MS),
    ];
    slice.thread_totals = vec![
        thread(APP, State::Cpu, 300 * MS),
        thread(APP + 1, State::Futex, 700 * MS),
        thread(APP + 1, State::Sleep, 100 * MS),
    ];
    for (tid, name) in [(APP, "app"), (APP + 1, "worker-1")] {
        let name = Arc::from(name);
        slice.threads.insert(tid, ThreadInfo { pid: APP, name });
    }
    slice.processes = HashMap::from([(APP, Arc::from("app"))]);
    let container = Container {
        id: ID.into(),
        runtime: "docker",
        cgroup: String::new(),
        pod_uid: None,
        namespace: None,
        pod: None,
        container: None,
    };
    slice.containers = HashMap::from([(APP, Arc::new(container))]);
    let mut store = Store::new(Duration::from_secs(600));
    store.push(slice);
    store
}

fn chosen() -> Chosen {
    Chosen {
        pid: APP,
        service: "app".into(),
        container: vec![("container_id", ID.into())],
    }
}

/// Every index into the dictionary is in range, and each table starts
/// with its zero value.
fn check_indices(r: &ExportProfilesServiceRequest) {
    let d = r.dictionary.as_ref().expect("a dictionary");
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.mapping_table[0], Mapping::default());
    assert_eq!(d.location_table[0], Location::default());
    assert_eq!(d.function_table[0], Function::default());
    assert_eq!(d.attribute_table[0], KeyValueAndUnit::default());
    assert_eq!(d.stack_table[0], Stack::default());
    assert_eq!(d.link_table[0].trace_id, [0; 16]);
    let ok = |i: i32, len: usize| usize::try_from(i).is_ok_and(|i| i < len);
    let string = |i: i32| assert!(ok(i, d.string_table.len()), "string {i}");
    let attrs = |ids: &[i32]| {
        for &i in ids {
            assert!(i > 0 && ok(i, d.attribute_table.len()), "attribute {i}");
        }
    };
    for a in &d.attribute_table {
        string(a.key_strindex);
        string(a.unit_strindex);
    }
    for m in &d.mapping_table {
        string(m.filename_strindex);
    }
    for f in &d.function_table {
        string(f.name_strindex);
        string(f.system_name_strindex);
        string(f.filename_strindex);
    }
    for l in &d.location_table[1..] {
        assert!(ok(l.mapping_index, d.mapping_table.len()));
        attrs(&l.attribute_indices);
        for line in &l.lines {
            assert!(line.function_index > 0 && ok(line.function_index, d.function_table.len()));
        }
    }
    for s in &d.stack_table {
        for &i in &s.location_indices {
            assert!(i > 0 && ok(i, d.location_table.len()), "location {i}");
        }
    }
    for rp in &r.resource_profiles {
        for p in rp.scope_profiles.iter().flat_map(|s| &s.profiles) {
            let t = p.sample_type.expect("a sample type");
            string(t.type_strindex);
            string(t.unit_strindex);
            for s in &p.samples {
                assert!(s.stack_index > 0 && ok(s.stack_index, d.stack_table.len()));
                assert!(ok(s.link_index, d.link_table.len()));
                attrs(&s.attribute_indices);
                assert_eq!(s.values.len(), 1);
            }
        }
    }
}

/// The attributes at `ids`, as `key=value`.
fn attributes(d: &ProfilesDictionary, ids: &[i32]) -> BTreeMap<String, String> {
    ids.iter()
        .map(|&i| {
            let a = &d.attribute_table[i as usize];
            let value = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(n)) => n.to_string(),
                other => format!("{other:?}"),
            };
            (d.string_table[a.key_strindex as usize].clone(), value)
        })
        .collect()
}

#[test]
fn a_process_becomes_a_resource_with_a_cpu_and_an_offcpu_profile() {
    let end = SystemTime::now();
    let window = Window::between(end - Duration::from_secs(2), end);
    let snapshot = store(end).snapshot();
    let mut otlp = Otlp {
        senders: 4,
        host: Some("box".into()),
    };
    let (requests, trimmed) = otlp.requests(&snapshot, window, &[chosen()], 3);
    assert_eq!(trimmed.samples, 0);
    assert_eq!(requests.len(), 1);
    assert_eq!((requests[0].profiles, requests[0].interval), (2, 3));
    let r = ExportProfilesServiceRequest::decode(&requests[0].body[..]).unwrap();
    check_indices(&r);
    let d = r.dictionary.as_ref().unwrap();
    let string = |i: i32| d.string_table[i as usize].as_str();

    let [rp] = &r.resource_profiles[..] else {
        panic!("one resource: {:?}", r.resource_profiles)
    };
    let resource: BTreeMap<&str, String> = rp
        .resource
        .iter()
        .flat_map(|r| &r.attributes)
        .map(|kv| {
            (
                kv.key.as_str(),
                format!("{:?}", kv.value.as_ref().unwrap().value),
            )
        })
        .collect();
    assert_eq!(resource["service.name"], "Some(StringValue(\"app\"))");
    assert_eq!(resource["process.pid"], format!("Some(IntValue({APP}))"));
    assert_eq!(resource["host.name"], "Some(StringValue(\"box\"))");
    assert_eq!(
        resource["container.id"],
        format!("Some(StringValue(\"{ID}\"))")
    );
    let [scope] = &rp.scope_profiles[..] else {
        panic!("one scope")
    };
    assert_eq!(scope.scope.as_ref().unwrap().name, "wallscope");

    let mut totals = BTreeMap::new();
    for p in &scope.profiles {
        let t = p.sample_type.unwrap();
        let ty = format!("{}/{}", string(t.type_strindex), string(t.unit_strindex));
        assert_eq!(p.time_unix_nano, unix_nanos(window.from));
        assert_eq!(p.duration_nano, 2_000_000_000);
        for s in &p.samples {
            let a = attributes(d, &s.attribute_indices);
            assert!(
                a.contains_key("thread.id") && a.contains_key("thread.name"),
                "{a:?}"
            );
            let state = a.get("wallscope.state").cloned().unwrap_or_default();
            *totals.entry((ty.clone(), state)).or_insert(0) += s.values[0];
            if a["thread.id"] == (APP + 1).to_string() {
                assert_eq!(a["thread.name"], "worker-1");
                assert_eq!(a["wallscope.pool"], "worker-*");
            }
        }
        if ty == "cpu/nanoseconds" {
            let period = p.period_type.expect("a period type");
            assert_eq!(string(period.type_strindex), "cpu");
            assert_eq!(p.period, 100 * MS as i64);
        }
    }
    let want = BTreeMap::from([
        (("cpu/nanoseconds".into(), String::new()), 300 * MS as i64),
        (
            ("off_cpu/nanoseconds".into(), "futex".into()),
            700 * MS as i64,
        ),
        (
            ("off_cpu/nanoseconds".into(), "sleep".into()),
            100 * MS as i64,
        ),
    ]);
    assert_eq!(totals, want);

    // Every location says what kind of frame it is; Python frames keep
    // their file and first line.
    let mut types = Vec::new();
    for l in &d.location_table[1..] {
        let a = attributes(d, &l.attribute_indices);
        types.push(a["profile.frame.type"].clone());
        let f = &d.function_table[l.lines[0].function_index as usize];
        if a["profile.frame.type"] == "cpython" {
            assert_eq!(string(f.name_strindex), "Thread.run");
            assert_eq!(
                (string(f.filename_strindex), f.start_line),
                ("threading.py", 999)
            );
        }
    }
    types.sort_unstable();
    types.dedup();
    assert_eq!(types, ["cpython", "jvm", "kernel", "native"]);
    // `main` is one location, one function, one string for both profiles.
    let mains = d.string_table.iter().filter(|s| *s == "main").count();
    assert_eq!(mains, 1);
}

#[test]
fn many_processes_spread_over_the_senders_with_a_dictionary_each() {
    let end = SystemTime::now();
    let window = Window::between(end - Duration::from_secs(2), end);
    let snapshot = store(end).snapshot();
    let mut otlp = Otlp {
        senders: 2,
        host: None,
    };
    // The same process chosen four times stands for four processes.
    let (requests, _) = otlp.requests(&snapshot, window, &vec![chosen(); 4], 1);
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!((r.profiles, r.batch.requests), (4, 2));
        let decoded = ExportProfilesServiceRequest::decode(&r.body[..]).unwrap();
        check_indices(&decoded);
        assert_eq!(decoded.resource_profiles.len(), 2);
    }
    // A window without samples makes no request.
    let empty = Window::between(end, end + Duration::from_secs(1));
    assert!(otlp.requests(&snapshot, empty, &[chosen()], 2).0.is_empty());
}

#[test]
fn frames_get_the_conventions_types() {
    let f = frame(FrameKind::Kernel, "schedule");
    assert_eq!(
        (f.ty, f.mapping, f.function),
        ("kernel", "[kernel.kallsyms]", "schedule")
    );
    assert_eq!(frame(FrameKind::JavaInlined, "A.b").ty, "jvm");
    assert_eq!(
        frame(FrameKind::Synthetic, "[unattributed]").ty,
        "wallscope"
    );
    let f = frame(FrameKind::Native, "handler (app.py:40)_[py]");
    assert_eq!(
        (f.ty, f.function, f.file, f.line),
        ("cpython", "handler", "app.py", 40)
    );
    // A Python name without its place keeps its name.
    let f = frame(FrameKind::Native, "<module>_[py]");
    assert_eq!((f.ty, f.function, f.line), ("cpython", "<module>", 0));
    assert_eq!(frame(FrameKind::Native, "memcpy").ty, "native");
}

#[test]
fn the_dictionary_keeps_each_entry_once() {
    let mut d = Dictionary::default();
    let a = d.attribute("thread.name", "x");
    assert_eq!(d.attribute("thread.name", "x"), a);
    assert_ne!(d.int_attribute("thread.id", 1), a);
    let f = frame(FrameKind::Native, "main");
    let l = d.location(&f);
    assert_eq!(d.location(&f), l);
    let s = d.stack(vec![l, l]);
    assert_eq!(d.stack(vec![l, l]), s);
    assert_eq!(d.stack(Vec::new()), 0);
    let tables = d.finish();
    assert_eq!(tables.location_table.len(), 2);
    assert_eq!(tables.stack_table.len(), 2);
    assert_eq!(tables.mapping_table.len(), 2);
}

#[test]
fn time_under_a_span_links_to_it_with_its_attributes() {
    use crate::profile::model::spans::{SpanId, SpanRecord, SpanSample, TraceId};
    let end = SystemTime::now();
    let window = Window::between(end - Duration::from_secs(2), end);
    let stack: crate::profile::model::Stack =
        ["main", "lock", "futex_wait_[k]"].map(Arc::from).into();
    let mut slice = Slice::empty(end - Duration::from_secs(1), end);
    slice.samples = vec![Row {
        pid: APP,
        tid: APP + 1,
        state: State::Futex,
        stack: stack.clone(),
        ns: 700 * MS,
        count: 3,
    }];
    let (span, trace) = (SpanId::from_raw(0x1234).unwrap(), TraceId([7; 16]));
    slice.spans.records.push(SpanRecord {
        pid: APP,
        span,
        trace,
        flags: 1,
        attrs: vec![("http_route".into(), "/cart".into())],
        attrs_cut: false,
    });
    slice.spans.samples.push(SpanSample {
        pid: APP,
        tid: APP + 1,
        span,
        state: State::Futex,
        stack,
        ns: 200 * MS,
        count: 1,
    });
    let mut store = Store::new(Duration::from_secs(600));
    store.push(slice);
    let mut otlp = Otlp {
        senders: 1,
        host: None,
    };
    let (requests, _) = otlp.requests(&store.snapshot(), window, &[chosen()], 3);
    let r = ExportProfilesServiceRequest::decode(&requests[0].body[..]).unwrap();
    check_indices(&r);
    let d = r.dictionary.as_ref().unwrap();
    let samples: Vec<&Sample> = (r.resource_profiles.iter())
        .flat_map(|rp| &rp.scope_profiles)
        .flat_map(|sp| &sp.profiles)
        .flat_map(|p| &p.samples)
        .collect();
    let total: i64 = samples.iter().flat_map(|s| &s.values).sum();
    assert_eq!(total, 700 * MS as i64, "no time counted twice");
    let linked: Vec<_> = samples.iter().filter(|s| s.link_index != 0).collect();
    assert_eq!(linked.len(), 1, "{samples:?}");
    assert_eq!(linked[0].values, [200 * MS as i64]);
    let link = &d.link_table[linked[0].link_index as usize];
    assert_eq!(
        (&link.trace_id[..], &link.span_id[..]),
        (&trace.0[..], &span.0[..])
    );
    let attrs = attributes(d, &linked[0].attribute_indices);
    assert_eq!(
        attrs.get("http_route").map(String::as_str),
        Some("/cart"),
        "{attrs:?}"
    );
}
