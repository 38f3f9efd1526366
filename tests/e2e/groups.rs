//! `/processes?group=` (issue #28): a script forking short-lived CPU-bound
//! children, none of which lives long enough to stand out, adds up under
//! its parent to what the kernel says the children cost.

use serde_json::Value;

use crate::support::{rows::json_at, run_with_output, Fixture};

#[test]
fn a_forking_scripts_children_add_up_under_their_parent() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    // 25 children a second for 4 s, 30 ms of CPU each.
    let (pid, out) = run_with_output("spawner", &["25", "4", "30"]);
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("children_cpu_us "))
        .unwrap_or_else(|| panic!("no children account in {out}"));
    let fields: Vec<f64> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let (kernel_us, children) = (fields[0], fields[1]);
    let url = crate::support::daemon();
    let groups = json_at(url, "/processes?group=parent&sort=cpu&seconds=300");
    let group = groups
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["parent_pid"] == pid)
        .unwrap_or_else(|| panic!("no group for parent {pid}: {groups}"));
    let daemon_us = group["time"]["cpu_us"].as_f64().unwrap();
    assert_eq!(
        group["processes"].as_f64(),
        Some(children),
        "every child is a member: {group}"
    );
    assert!(
        (daemon_us - kernel_us).abs() <= 0.05 * kernel_us,
        "children's CPU under their parent {daemon_us} us, kernel {kernel_us} us: {group}"
    );
    assert!(
        group["group"]
            .as_str()
            .unwrap()
            .starts_with("spawner (pid "),
        "{group}"
    );
    // Each process is in one group: the groups add up to the processes.
    // One pinned minute, ended two seconds ago (drained by then on a busy
    // host): the two answers differ only where the store merged a block
    // its start cuts between them (a cut through a 10 s block is pro rata).
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 2;
    let window = format!("from={}&until={until}", until - 60);
    let all = json_at(url, &format!("/processes?{window}"));
    let cpu = |rows: &Value, field: &dyn Fn(&Value) -> f64| {
        rows.as_array().unwrap().iter().map(field).sum::<f64>()
    };
    let by_comm = json_at(url, &format!("/processes?group=comm&{window}"));
    let processes = cpu(&all, &|p| p["time"]["cpu_us"].as_f64().unwrap());
    let grouped = cpu(&by_comm, &|g| g["time"]["cpu_us"].as_f64().unwrap());
    let count = cpu(&by_comm, &|g| g["processes"].as_f64().unwrap());
    assert!(
        (processes - grouped).abs() <= 2e6,
        "{processes} us by process, {grouped} us by name"
    );
    assert!(
        (count - all.as_array().unwrap().len() as f64).abs() <= 20.0,
        "{count} members, {} processes",
        all.as_array().unwrap().len()
    );
    let (status, body) = crate::support::get(&format!("{url}/processes?group=uid"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("group"), "{body}");
}
