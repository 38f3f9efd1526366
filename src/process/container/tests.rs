use super::*;

const ID: &str = "4f0e0c3a9b1d2e3f4a5b6c7d8e9f00112233445566778899aabbccddeeff0011";
const INNER: &str = "99887766554433221100ffeeddccbbaa99887766554433221100ffeeddccbbaa";
const UID: &str = "0d7c5c2e-1f3a-4b5c-9d8e-7f6a5b4c3d2e";
const UID_: &str = "0d7c5c2e_1f3a_4b5c_9d8e_7f6a5b4c3d2e";

fn of(text: &str) -> Option<Container> {
    parse(text, None)
}

fn id_and_runtime(text: &str) -> Option<(String, &'static str)> {
    of(text).map(|c| (c.id, c.runtime))
}

#[test]
fn containerd_and_crio_under_the_kubelet_both_drivers() {
    let systemd = format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope\n"
    );
    let c = of(&systemd).unwrap();
    assert_eq!((c.id.as_str(), c.runtime), (ID, "containerd"));
    assert_eq!(c.pod_uid.as_deref(), Some(UID));
    assert!(c.cgroup.ends_with(&format!("cri-containerd-{ID}.scope")));
    let guaranteed = format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{ID}.scope\n");
    let c = of(&guaranteed).unwrap();
    assert_eq!((c.runtime, c.pod_uid.as_deref()), ("cri-o", Some(UID)));
    let besteffort = format!("0::/kubepods/besteffort/pod{UID}/{ID}\n");
    let c = of(&besteffort).unwrap();
    assert_eq!((c.id.as_str(), c.runtime), (ID, "kubelet"));
    assert_eq!(c.pod_uid.as_deref(), Some(UID));
    // CRI-O's monitor is not the container.
    let conmon = format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope\n");
    assert_eq!(of(&conmon), None);
}

#[test]
fn docker_and_podman_v1_and_v2() {
    let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
    assert_eq!(id_and_runtime(&v2), Some((ID.into(), "docker")));
    let v1 = format!(
        "12:pids:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n"
    );
    let c = of(&v1).unwrap();
    assert_eq!((c.id.as_str(), c.runtime), (ID, "docker"));
    assert_eq!(c.cgroup, format!("/docker/{ID}"));
    assert_eq!(c.pod_uid, None);
    let podman = format!("0::/machine.slice/libpod-{ID}.scope/container\n");
    assert_eq!(id_and_runtime(&podman), Some((ID.into(), "podman")));
}

#[test]
fn plain_systemd_units_and_odd_ids_are_no_container() {
    for text in [
        "0::/system.slice/ssh.service\n",
        "0::/user.slice/user-0.slice/session-3.scope\n",
        "0::/\n",
        "12:pids:/user.slice\n0::/init.scope\n",
        // Not 64 lowercase hex digits.
        "0::/system.slice/docker-4F0E.scope\n",
        &format!("0::/system.slice/docker-{}.scope\n", ID.to_uppercase()),
        // A bare id outside docker and kubepods is just a directory.
        &format!("0::/srv/{ID}\n"),
        "",
        "garbage",
    ] {
        assert_eq!(of(text), None, "{text}");
    }
}

#[test]
fn the_innermost_container_wins() {
    let dind = format!("0::/docker/{ID}/docker/{INNER}\n");
    assert_eq!(id_and_runtime(&dind), Some((INNER.into(), "docker")));
    let init = format!(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope/init.scope\n"
    );
    let c = of(&init).unwrap();
    assert_eq!(c.id, ID);
    assert!(c.cgroup.ends_with(".scope") && !c.cgroup.ends_with("init.scope"));
}

#[test]
fn pod_names_come_from_the_kubelets_log_directories() {
    let root = tempfile::tempdir().unwrap();
    let pods = root.path().join("pods");
    let one = pods.join(format!("shop_cart-7d9f_{UID}/app"));
    std::fs::create_dir_all(&one).unwrap();
    let logs = PodLogs::new(&pods);
    let text = format!("0::/kubepods/burstable/pod{UID}/{ID}\n");
    let c = parse(&text, Some(&logs)).unwrap();
    assert_eq!(c.namespace.as_deref(), Some("shop"));
    assert_eq!(c.pod.as_deref(), Some("cart-7d9f"));
    assert_eq!(c.container.as_deref(), Some("app"));
    assert_eq!(
        c.labels(),
        [
            ("container_id", ID.to_string()),
            ("namespace", "shop".into()),
            ("pod", "cart-7d9f".into()),
            ("container", "app".into())
        ]
    );
    assert!(c.is_named(&ID[..12]) && c.is_named("shop/cart-7d9f/app"));
    assert!(!c.is_named(&ID[..11]) && !c.is_named("shop/cart-7d9f"));

    // Two containers: the kubelet's containers/ links tell them apart.
    std::fs::create_dir_all(pods.join(format!("shop_cart-7d9f_{UID}/sidecar"))).unwrap();
    let containers = root.path().join("containers");
    std::fs::create_dir_all(&containers).unwrap();
    for (name, id) in [("app", INNER), ("sidecar", ID)] {
        let link = containers.join(format!("cart-7d9f_shop_{name}-{id}.log"));
        std::os::unix::fs::symlink("/nonexistent", link).unwrap();
    }
    let c = parse(&text, Some(&logs)).unwrap();
    assert_eq!(c.container.as_deref(), Some("sidecar"));

    // An unknown pod: the container without names.
    let other = "11111111-2222-3333-4444-555555555555";
    let c = parse(&format!("0::/kubepods/pod{other}/{ID}\n"), Some(&logs)).unwrap();
    assert_eq!((c.pod_uid.as_deref(), c.pod), (Some(other), None));
}

#[test]
fn a_linked_pod_logs_directory_is_not_read() {
    let root = tempfile::tempdir().unwrap();
    let real = root.path().join("real");
    std::fs::create_dir_all(real.join(format!("shop_cart_{UID}/app"))).unwrap();
    let link = root.path().join("pods");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let text = format!("0::/kubepods/pod{UID}/{ID}\n");
    let c = parse(&text, Some(&PodLogs::new(&link))).unwrap();
    assert_eq!(c.pod, None);
}

#[test]
fn a_container_under_a_users_cgroup_is_not_believed() {
    // nobody's delegated cgroup holds children named like a pod's
    // container: the real one, outside it, is still found.
    let real = format!("kubepods/besteffort/pod{UID}/{ID}");
    let spoof = format!("0::/user.slice/user@65534.service/kubepods/besteffort/pod{UID}/{INNER}\n");
    let delegated = |_: &str, dir: &[&str]| !dir.contains(&"user@65534.service");
    assert_eq!(parse_owned(&spoof, None, &delegated), None);
    let c = parse_owned(&format!("0::/{real}\n"), None, &delegated).unwrap();
    assert_eq!(c.id, ID);
    // A spoof nested in a real container whose own directory is delegated
    // to it (systemd in a container): the real, outer one is believed.
    let nested = format!("0::/{real}/init.scope/docker-{INNER}.scope\n");
    let container_owned = |_: &str, dir: &[&str]| !dir.contains(&ID);
    let c = parse_owned(&nested, None, &container_owned).unwrap();
    assert_eq!((c.id.as_str(), c.runtime), (ID, "kubelet"));
    // v1 lines name their hierarchy.
    let v1 = format!("4:pids:/docker/{ID}\n0::/\n");
    let seen = std::sync::Mutex::new(Vec::new());
    let record = |h: &str, dir: &[&str]| {
        seen.lock().unwrap().push((h.to_string(), dir.join("/")));
        true
    };
    assert!(parse_owned(&v1, None, &record).is_some());
    assert_eq!(
        seen.into_inner().unwrap(),
        [("pids".to_string(), "docker".to_string())]
    );
    // This host's root cgroup is root's; a made-up one is not.
    assert!(cgroup_dir_is_roots("", &[]));
    assert!(!cgroup_dir_is_roots("", &["ws-no-such-cgroup"]));
    assert!(!cgroup_dir_is_roots("../etc", &[]));
}
