//! The capability set of `deploy/wallscope.service`, and daemons started
//! under it with `setpriv` (as the unit's `AmbientCapabilities=` does).

use std::{path::Path, process::Command};

/// The unit's `CapabilityBoundingSet=`, e.g. `CAP_BPF`.
pub fn unit_caps() -> Vec<String> {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/wallscope.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet= in the unit");
    line.split_whitespace().map(str::to_string).collect()
}

/// Capability numbers by name, as `capsh --decode` knows them.
fn number(cap: &str) -> u32 {
    let out = Command::new("capsh")
        .arg(format!("--explain={}", cap.to_lowercase()))
        .output();
    if let Some(n) = out.ok().and_then(|o| {
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        text.split(['(', ')'])
            .nth(1)
            .and_then(|n| n.trim().parse().ok())
    }) {
        return n;
    }
    panic!("capsh does not know {cap}")
}

/// Of `caps`, those this process may grant (its bounding set): a sandbox
/// may hold back some (this machine's lacks CAP_SYS_RESOURCE).
pub fn grantable(caps: &[String]) -> (Vec<String>, Vec<String>) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let bnd = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    caps.iter()
        .cloned()
        .partition(|c| bnd & (1 << number(c)) != 0)
}

/// `command` wrapped in `setpriv` so that it runs with exactly `caps`
/// (bounding, inheritable and ambient), no new privileges, still as root.
pub fn under(caps: &[String], command: &Command) -> Command {
    let list = caps
        .iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect::<Vec<_>>()
        .join(",");
    let set = format!("-all,{list}");
    let mut wrapped = Command::new("setpriv");
    wrapped
        .args([
            "--inh-caps",
            &set,
            "--ambient-caps",
            &set,
            "--bounding-set",
            &set,
        ])
        .arg("--no-new-privs")
        .arg(command.get_program())
        .args(command.get_args());
    wrapped
}

/// Whether tests start their daemons under the unit's capabilities
/// (`WALLSCOPE_TEST_UNIT_CAPS=1`, set by the justfile's `test` recipe).
pub fn requested() -> bool {
    std::env::var("WALLSCOPE_TEST_UNIT_CAPS").as_deref() == Ok("1")
}
