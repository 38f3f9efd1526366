//! Running test programs as another user (`nobody` by default): the
//! attackers of the security tests, and clients whose uid matters.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use super::workload;

/// The unprivileged user the attackers run as.
pub const NOBODY: u32 = 65534;

/// `program` to be run as `uid` (its group too, no supplementary groups).
pub fn as_user(uid: u32, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid",
        &uid.to_string(),
        "--regid",
        &uid.to_string(),
        "--clear-groups",
        "--",
    ])
    .arg(program);
    cmd
}

/// `program` to be run as `nobody`.
pub fn as_nobody(program: impl AsRef<std::ffi::OsStr>) -> Command {
    as_user(NOBODY, program)
}

/// A directory every user can enter (`mode`, e.g. 0o755 or 0o777), named
/// for `what` and this test process.
pub fn shared_dir(what: &str, mode: u32) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_stale_dirs);
    let dir = PathBuf::from(format!("/var/tmp/wallscope-{what}-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// Removes the shared directories of test processes that are gone: they
/// live for the whole test process (statics are never dropped), so each
/// run clears those of runs before it.
fn sweep_stale_dirs() {
    let Ok(entries) = fs::read_dir("/var/tmp") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("wallscope-")
            .and_then(|rest| rest.rsplit('-').find_map(|part| part.parse::<u32>().ok()));
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// A copy of workload `name` in `dir` that every user can run (the
/// build's own copy sits under root's home).
pub fn runnable_copy(name: &str, dir: &Path) -> PathBuf {
    let bin = dir.join(name);
    if !bin.exists() {
        fs::copy(workload(name), &bin).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

/// `GET url` with curl, as `nobody` or as ourselves (root): status, body.
pub fn curl(url: &str, nobody: bool) -> (u16, String) {
    let mut cmd = if nobody {
        as_nobody("curl")
    } else {
        Command::new("curl")
    };
    let out = cmd
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}", url])
        .output()
        .expect("running curl");
    assert!(out.status.success(), "curl {url}: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap(), body.to_string())
}
