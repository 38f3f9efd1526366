//! Container and pod labels end to end (root; under CI=true these fail
//! rather than skip): workloads started in cgroups named as containerd,
//! CRI-O and Docker name theirs, with a pod log directory the test makes,
//! show their container in `/processes`, `/threads`, `/metrics`, pprof
//! labels and `/runqueue?container=`.

use std::{
    fs,
    io::Read as _,
    path::Path,
    time::{Duration, Instant},
};

use crate::support::{cgroup::*, *};
use flate2::read::GzDecoder;
use prost::Message as _;
use serde_json::Value;
use wallscope::export::pprof::proto::Profile;

const UID: &str = "6b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e";
const UID2: &str = "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d";

/// The pod a case's container should be found in: uid, namespace, pod,
/// container.
type Pod = Option<(&'static str, &'static str, &'static str, &'static str)>;

fn hex_id(seed: u8) -> String {
    (0..32)
        .map(|i| format!("{:02x}", seed.wrapping_mul(31).wrapping_add(i)))
        .collect()
}

fn json(url: &str) -> Value {
    let (status, body) = get(url);
    assert_eq!(status, 200, "{url}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// `pprof` string labels of the samples of `pid`, `key=value`.
fn pprof_labels(url: &str) -> Vec<String> {
    let mut body = Vec::new();
    ureq::get(url)
        .timeout(Duration::from_secs(60))
        .call()
        .unwrap()
        .into_reader()
        .read_to_end(&mut body)
        .unwrap();
    let mut raw = Vec::new();
    GzDecoder::new(&body[..]).read_to_end(&mut raw).unwrap();
    let p = Profile::decode(&raw[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].clone();
    let mut labels: Vec<String> = p
        .sample
        .iter()
        .flat_map(|x| &x.label)
        .filter(|l| l.str != 0)
        .map(|l| format!("{}={}", s(l.key), s(l.str)))
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

#[test]
fn processes_in_containers_carry_their_container_and_pod() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let (v2, v1) = mounts();
    let pods = tempfile::tempdir().unwrap();
    let pod_logs = pods.path().join("pods");
    fs::create_dir_all(pod_logs.join(format!("shop_cart-5d8f9_{UID}/app"))).unwrap();
    fs::create_dir_all(pod_logs.join(format!("web_front-x2k4_{UID2}/nginx"))).unwrap();
    let d = Daemon::start(&["--pod-logs-dir", pod_logs.to_str().unwrap()]);
    settle(&d.url);

    let uid_ = UID.replace('-', "_");
    let (containerd, crio, docker) = (hex_id(1), hex_id(2), hex_id(3));
    let kube = format!("ws-test-kubepods.slice/ws-test-kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice");
    let mut cases: Vec<(Cgroup, String, &str, Pod)> = vec![
        (
            Cgroup::create(&v2, &format!("{kube}/cri-containerd-{containerd}.scope")),
            containerd.clone(),
            "containerd",
            Some((UID, "shop", "cart-5d8f9", "app")),
        ),
        (
            Cgroup::create(
                &v2,
                &format!("ws-test-kubepods/burstable/pod{UID2}/crio-{crio}"),
            ),
            crio.clone(),
            "cri-o",
            Some((UID2, "web", "front-x2k4", "nginx")),
        ),
    ];
    // Docker's cgroupfs names, in a v1 hierarchy where the host has one
    // (the v2 line then says `0::/`), else in the v2 one.
    let docker_root = v1.clone().unwrap_or_else(|| v2.clone());
    let docker_path = if v1.is_some() {
        format!("docker/{docker}")
    } else {
        format!("system.slice/docker-{docker}.scope")
    };
    cases.push((
        Cgroup::create(&docker_root, &docker_path),
        docker.clone(),
        "docker",
        None,
    ));
    let workloads: Vec<Workload> = cases.iter().map(|(cg, ..)| start_in(cg)).collect();
    // Runnable threads outnumber the CPUs: each has runqueue waits.
    thread_sleep(Duration::from_secs(4));
    settle(&d.url);

    let rows = json(&format!("{}/processes?seconds=60", d.url));
    for ((_, id, runtime, pod), w) in cases.iter().zip(&workloads) {
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["pid"] == w.pid)
            .unwrap_or_else(|| panic!("pid {} not in /processes: {rows}", w.pid));
        let c = &row["container"];
        assert_eq!(c["id"], id.as_str(), "{row}");
        assert_eq!(c["runtime"], *runtime, "{row}");
        if let Some((uid, namespace, name, container)) = pod {
            assert_eq!(c["pod_uid"], *uid, "{row}");
            assert_eq!(c["namespace"], *namespace, "{row}");
            assert_eq!(c["pod"], *name, "{row}");
            assert_eq!(c["container"], *container, "{row}");
        } else {
            assert!(c.get("pod").is_none(), "{row}");
        }
        let threads = json(&format!("{}/threads?pid={}&seconds=60", d.url, w.pid));
        assert_eq!(threads["container"]["id"], id.as_str());

        let labels = pprof_labels(&format!("{}/pprof?pid={}&seconds=60", d.url, w.pid));
        assert!(labels.contains(&format!("container_id={id}")), "{labels:?}");
        let pod_labels = pod.map(|(_, ns, name, c)| {
            [
                format!("namespace={ns}"),
                format!("pod={name}"),
                format!("container={c}"),
            ]
        });
        match pod_labels {
            Some(want) => assert!(want.iter().all(|l| labels.contains(l)), "{labels:?}"),
            None => assert!(!labels.iter().any(|l| l.starts_with("pod=")), "{labels:?}"),
        }
    }

    // /metrics: the workloads are among the busiest (4 runnable threads
    // each), and their series carry the labels.
    let (status, metrics) = get(&format!("{}/metrics", d.url));
    assert_eq!(status, 200);
    for ((_, id, _, pod), w) in cases.iter().zip(&workloads) {
        let series: Vec<&str> = metrics
            .lines()
            .filter(|l| l.contains(&format!("pid=\"{}\"", w.pid)))
            .collect();
        assert!(
            !series.is_empty(),
            "pid {} has no series:\n{metrics}",
            w.pid
        );
        for s in &series {
            assert!(s.contains(&format!("container_id=\"{id}\"")), "{s}");
            let pod_label = pod.map(|(_, _, name, _)| format!("pod=\"{name}\""));
            assert_eq!(
                pod_label.is_some_and(|l| s.contains(&l)),
                pod.is_some(),
                "{s}"
            );
        }
    }

    // The runqueue of the containerd container, by id prefix and by name.
    let prefix = &containerd[..12];
    let report = json(&format!("{}/runqueue?container={prefix}&seconds=60", d.url));
    assert!(report["count"].as_u64().unwrap() > 0, "{report}");
    let by_name = json(&format!(
        "{}/runqueue?container=shop/cart-5d8f9/app&seconds=60",
        d.url
    ));
    assert!(by_name["count"].as_u64().is_some(), "{by_name}");
    for (query, status) in [("abc", 400), ("0123456789abcdef", 404)] {
        let (got, body) = get(&format!("{}/runqueue?container={query}", d.url));
        assert_eq!(got, status, "{query}: {body}");
    }
    drop(workloads);
}

fn thread_sleep(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn runqueue_takes_a_cgroup_v1_path() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let (_, v1) = mounts();
    let Some(v1) = v1 else {
        // A pure cgroup v2 host: v2 paths are tested in tests/e2e/api.rs.
        assert!(
            std::env::var("CI").as_deref() != Ok("true")
                || !Path::new("/sys/fs/cgroup/pids").exists(),
            "a v1 hierarchy exists but was not found"
        );
        return;
    };
    let d = Daemon::start(&[]);
    settle(&d.url);
    let cgroup = Cgroup::create(&v1, "ws-test-render");
    // Four runnable threads on fewer CPUs: runqueue waits.
    let w = start_in(&cgroup);
    thread_sleep(Duration::from_secs(3));
    settle(&d.url);
    // One pinned window for both answers compared below.
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let window = format!("from={}&until={until}", until - 60);
    let report = json(&format!(
        "{}/runqueue?cgroup=/ws-test-render&{window}",
        d.url
    ));
    assert_eq!(report["owner"]["cgroup_v1"], "/ws-test-render", "{report}");
    assert_eq!(report["owner"]["processes"], 1, "{report}");
    assert!(report["count"].as_u64().unwrap() > 0, "{report}");
    // Its waits are its process's.
    let by_pid = json(&format!("{}/runqueue?pid={}&{window}", d.url, w.pid));
    assert_eq!(report["count"], by_pid["count"], "{report}\n{by_pid}");
    drop(w);
    let (status, body) = get(&format!("{}/runqueue?cgroup=/ws-test-nothing-here", d.url));
    assert_eq!(status, 404, "{body}");
}
