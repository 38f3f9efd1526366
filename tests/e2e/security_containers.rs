//! A container cannot be faked from a delegated cgroup: `nobody`, owning a
//! cgroup directory (as systemd's `user@UID` service delegates one), makes
//! children named like another pod's container and runs a process in the
//! innermost. That process gets no container or pod labels; the real
//! container, outside the delegated tree, keeps its own and
//! `/runqueue?container=namespace/pod/container` still answers for it.
//! Needs root.

use std::{fs, path::PathBuf};

use crate::support::{
    cgroup::*,
    users::{self, NOBODY},
    *,
};
use serde_json::Value;

const POD_UID: &str = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a";

fn hex_id(seed: u8) -> String {
    (0..32)
        .map(|i| format!("{:02x}", seed.wrapping_mul(37).wrapping_add(i)))
        .collect()
}

fn json(url: &str) -> Value {
    let (status, body) = get(url);
    assert_eq!(status, 200, "{url}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// `cpu_shares` where `nobody` can run it.
fn shared_workload() -> PathBuf {
    users::runnable_copy("cpu_shares", &users::shared_dir("cg", 0o755))
}

#[test]
fn a_delegated_cgroup_cannot_pose_as_another_pods_container() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let (v2, _) = mounts();
    let pods = tempfile::tempdir().unwrap();
    let pod_logs = pods.path().join("pods");
    fs::create_dir_all(pod_logs.join(format!("shop_cart-7f2a1_{POD_UID}/app"))).unwrap();
    let d = Daemon::start(&["--pod-logs-dir", pod_logs.to_str().unwrap()]);
    settle(&d.url);

    let (real_id, fake_id) = (hex_id(5), hex_id(6));
    let pod_path = format!("kubepods/besteffort/pod{POD_UID}");
    let real = Cgroup::create(&v2, &format!("ws-sec-real/{pod_path}/{real_id}"));
    // The delegated directory: root makes it and hands it to nobody, who
    // makes the lookalike tree inside.
    let delegated = Cgroup::create(&v2, "ws-sec-user/user@65534.service");
    std::os::unix::fs::chown(&delegated.leaf, Some(NOBODY), Some(NOBODY)).unwrap();
    let fake_rel = format!("{pod_path}/{fake_id}");
    let made = users::as_nobody("mkdir")
        .arg("-p")
        .arg(delegated.leaf.join(&fake_rel))
        .status()
        .unwrap();
    assert!(made.success(), "nobody could not make its cgroups");
    let fake = Cgroup::create(&v2, &format!("ws-sec-user/user@65534.service/{fake_rel}"));
    let bin = shared_workload();
    let real_w = start_in(&real);
    let fake_w = start_command_in(
        &fake,
        &format!(
            "setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups -- '{}' 20 4",
            bin.display()
        ),
    );
    let seen = rows::within(CATCH_UP, || {
        let rows = json(&format!("{}/processes?seconds=60", d.url));
        let row = |pid: u32| {
            rows.as_array()
                .unwrap()
                .iter()
                .find(|r| r["pid"] == pid)
                .cloned()
        };
        Some((row(real_w.pid)?, row(fake_w.pid)?))
    });
    let (real_row, fake_row) = seen.expect("both workloads in /processes");
    let c = &real_row["container"];
    assert_eq!(c["id"], real_id.as_str(), "{real_row}");
    assert_eq!(c["pod"], "cart-7f2a1", "{real_row}");
    assert_eq!(c["container"], "app", "{real_row}");
    assert!(
        fake_row.get("container").is_none_or(Value::is_null),
        "nobody's process posed as a container: {fake_row}"
    );
    let threads = json(&format!("{}/threads?pid={}&seconds=60", d.url, fake_w.pid));
    assert!(
        threads.get("container").is_none_or(Value::is_null),
        "{threads}"
    );
    // The real container is the only one of that name.
    let report = json(&format!(
        "{}/runqueue?container=shop/cart-7f2a1/app&seconds=60",
        d.url
    ));
    assert!(report["count"].as_u64().is_some(), "{report}");
    let (status, body) = get(&format!(
        "{}/runqueue?container={}&seconds=60",
        d.url,
        &fake_id[..12]
    ));
    assert_eq!(status, 404, "{body}");
    drop((real_w, fake_w));
    let _ = fs::remove_dir_all(bin.parent().unwrap());
}
