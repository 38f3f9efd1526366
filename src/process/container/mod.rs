//! Which container (and Kubernetes pod) a process runs in, from its
//! `/proc/PID/cgroup` and, for pod and container names, the kubelet's log
//! directories.
//!
//! Container ids are the 64-hex-digit ids runtimes put in cgroup names:
//! `cri-containerd-ID.scope` (containerd), `crio-ID.scope` (CRI-O),
//! `docker-ID.scope` or `/docker/ID` (Docker), `libpod-ID.scope` (Podman),
//! or a bare `ID` directory under `kubepods` (kubelet's cgroupfs driver).
//! The innermost one wins (Docker in Docker, a pod's init scope). The pod's
//! uid comes from the `pod<uid>` component (`_` for `-` in the systemd
//! form); its namespace and name from `<pod logs>/<namespace>_<pod>_<uid>/`,
//! and the container's name from that directory's one subdirectory or, with
//! several, from `<pod logs>/../containers/<pod>_<namespace>_<name>-<id>.log`.
//!
//! A cgroup directory can be delegated to a user (systemd's `user@UID`
//! service, rootless runtimes), who may then create children named like
//! any runtime's: a container is believed only if every directory above
//! its own is root's (see [`of_cgroup_file`]).

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use serde::Serialize;

/// A process's container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Container {
    /// The runtime's id (64 hex digits).
    pub id: String,
    /// `containerd`, `cri-o`, `docker`, `podman`, or `kubelet` (a bare id
    /// under `kubepods`: containerd or CRI-O with the cgroupfs driver).
    pub runtime: &'static str,
    /// The container's cgroup, as `/proc/PID/cgroup` shows it.
    pub cgroup: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The container's name in its pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl Container {
    /// Label pairs for pprof, pushed series and metrics: `container_id`,
    /// and `namespace`, `pod`, `container` where known.
    pub fn labels(&self) -> Vec<(&'static str, String)> {
        let mut labels = vec![("container_id", self.id.clone())];
        for (key, value) in [
            ("namespace", &self.namespace),
            ("pod", &self.pod),
            ("container", &self.container),
        ] {
            if let Some(v) = value {
                labels.push((key, v.clone()));
            }
        }
        labels
    }

    /// `namespace/pod/container` where known, else the runtime and the id's
    /// first 12 digits (`docker:0123456789ab`).
    pub fn describe(&self) -> String {
        match (&self.namespace, &self.pod, &self.container) {
            (Some(ns), Some(pod), Some(c)) => format!("{ns}/{pod}/{c}"),
            _ => format!("{}:{}", self.runtime, &self.id[..self.id.len().min(12)]),
        }
    }

    /// Whether `query` names this container: its id, an id prefix of at
    /// least 12 digits (Docker's short ids), or `namespace/pod/container`.
    pub fn is_named(&self, query: &str) -> bool {
        let by_id = query.len() >= 12 && self.id.starts_with(query);
        let by_name = match (&self.namespace, &self.pod, &self.container) {
            (Some(ns), Some(pod), Some(c)) => query == format!("{ns}/{pod}/{c}"),
            _ => false,
        };
        by_id || by_name
    }
}

/// The container of a process whose `/proc/PID/cgroup` reads `text`, with
/// pod names looked up in `pods` (see [`PodLogs`]); `None` outside any.
/// Every cgroup directory is taken as root's: see [`parse_owned`].
pub fn parse(text: &str, pods: Option<&PodLogs>) -> Option<Container> {
    parse_owned(text, pods, &|_, _| true)
}

/// [`parse`], believing a container only where `root_owned(hierarchy,
/// path)` says every directory above its own is root's, not delegated to
/// a user who could have named it. `hierarchy` is the line's controllers
/// (empty for cgroup v2), `path` a directory's components.
pub fn parse_owned(
    text: &str,
    pods: Option<&PodLogs>,
    root_owned: &dyn Fn(&str, &[&str]) -> bool,
) -> Option<Container> {
    // The unified hierarchy's line (`0::/path`) first, then v1's.
    let mut paths: Vec<(bool, &str, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((id != "0", controllers, path))
        })
        .collect();
    paths.sort_by_key(|(v1, ..)| *v1);
    paths.into_iter().find_map(|(_, controllers, path)| {
        in_path(path, pods, &|dir: &[&str]| root_owned(controllers, dir))
    })
}

/// The innermost container in `path` whose ancestors are all root's.
fn in_path(
    path: &str,
    pods: Option<&PodLogs>,
    root_owned: &dyn Fn(&[&str]) -> bool,
) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (at, id, runtime) = parts
        .iter()
        .enumerate()
        .rev()
        .filter_map(|(i, part)| container_id(part, &parts[..i]).map(|(id, rt)| (i, id, rt)))
        .find(|(at, ..)| (1..=*at).all(|depth| root_owned(&parts[..depth])))?;
    let cgroup = format!("/{}", parts[..=at].join("/"));
    let pod_uid = parts[..at].iter().rev().find_map(|p| pod_uid(p));
    let mut c = Container {
        id: id.to_string(),
        runtime,
        cgroup,
        pod_uid,
        namespace: None,
        pod: None,
        container: None,
    };
    if let (Some(uid), Some(pods)) = (&c.pod_uid, pods) {
        if let Some(names) = pods.lookup(uid, &c.id) {
            (c.namespace, c.pod, c.container) = (Some(names.0), Some(names.1), names.2);
        }
    }
    Some(c)
}

/// The container id and runtime a cgroup path component names, given the
/// components above it.
fn container_id<'a>(part: &'a str, above: &[&str]) -> Option<(&'a str, &'static str)> {
    let scope = part.strip_suffix(".scope").unwrap_or(part);
    for (prefix, runtime) in [
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("docker-", "docker"),
        ("libpod-", "podman"),
    ] {
        if let Some(id) = scope.strip_prefix(prefix).filter(|id| is_id(id)) {
            return Some((id, runtime));
        }
    }
    if !is_id(part) {
        return None;
    }
    let runtime = match above.last() {
        Some(&"docker") => "docker",
        _ if above.iter().any(|p| p.starts_with("kubepods")) => "kubelet",
        _ => return None,
    };
    Some((part, runtime))
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The pod uid in `pod<uid>` (cgroupfs) or `kubepods[-QOS]-pod<uid>.slice`
/// (systemd, `_` for `-`).
fn pod_uid(part: &str) -> Option<String> {
    let part = part.strip_suffix(".slice").unwrap_or(part);
    let uid = part
        .strip_prefix("pod")
        .or_else(|| part.rsplit_once("-pod").map(|(_, u)| u))?;
    let uid = uid.replace('_', "-");
    let ok = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    ok.then_some(uid)
}

/// One scan of the pod logs directory: when, and namespace and pod name
/// by pod uid.
type Scan = (Instant, HashMap<String, (String, String)>);

/// Most pod directories read from the pod logs directory in one scan.
const MAX_POD_DIRS: usize = 4096;
/// Most containers listed per pod, and entries read from `containers/`.
const MAX_ENTRIES: usize = 4096;
/// A pod not found is looked for again after this long.
const RESCAN_AFTER: Duration = Duration::from_secs(10);

/// The kubelet's pod log directories (`/var/log/pods` by default,
/// `--pod-logs-dir`), read for pod and container names. Only names are
/// read: no file is opened, no link followed. Bound: one scan result of at
/// most [`MAX_POD_DIRS`] pods, replaced by the next scan, which happens
/// only when a uid is not in it and the last scan is [`RESCAN_AFTER`] old.
pub struct PodLogs {
    dir: PathBuf,
    scan: Mutex<Option<Scan>>,
}

impl PodLogs {
    /// Names from `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> PodLogs {
        PodLogs {
            dir: dir.into(),
            scan: Mutex::new(None),
        }
    }

    /// The namespace, pod and (when it can tell) container name of
    /// container `id` of pod `uid`.
    fn lookup(&self, uid: &str, id: &str) -> Option<(String, String, Option<String>)> {
        let (ns, pod) = self.pod(uid)?;
        let pod_dir = self.dir.join(format!("{ns}_{pod}_{uid}"));
        let names = dir_names(&pod_dir, true);
        let container = match names.as_slice() {
            [one] => Some(one.clone()),
            _ => {
                let logs = self.dir.parent().map(|p| p.join("containers"));
                let suffix = format!("-{id}.log");
                let prefix = format!("{pod}_{ns}_");
                logs.map(|l| dir_names(&l, false))
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|n| {
                        let name = n.strip_prefix(&prefix)?.strip_suffix(&suffix)?;
                        names.iter().any(|c| c == name).then(|| name.to_string())
                    })
            }
        };
        Some((ns, pod, container))
    }

    fn pod(&self, uid: &str) -> Option<(String, String)> {
        let mut scan = self.scan.lock().unwrap_or_else(|e| e.into_inner());
        let found = |s: &Option<Scan>| s.as_ref().and_then(|(_, pods)| pods.get(uid).cloned());
        if let Some(names) = found(&scan) {
            return Some(names);
        }
        if scan
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < RESCAN_AFTER)
        {
            return None;
        }
        let pods = dir_names(&self.dir, true)
            .into_iter()
            .take(MAX_POD_DIRS)
            .filter_map(|name| {
                // Namespaces and pod names cannot hold `_`.
                let mut parts = name.splitn(3, '_');
                let (ns, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
                Some((uid.to_string(), (ns.to_string(), pod.to_string())))
            })
            .collect();
        *scan = Some((Instant::now(), pods));
        found(&scan)
    }
}

/// Names in `dir` (directories only when `dirs`), at most [`MAX_ENTRIES`];
/// none if `dir` is a link or not a directory.
fn dir_names(dir: &Path, dirs: bool) -> Vec<String> {
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .take(MAX_ENTRIES)
        .filter_map(Result::ok)
        .filter(|e| !dirs || e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

static POD_LOGS: OnceLock<PodLogs> = OnceLock::new();

/// Sets where pod names are read (`--pod-logs-dir`); the first call wins.
pub fn set_pod_logs_dir(dir: &Path) {
    let _ = POD_LOGS.set(PodLogs::new(dir));
}

/// The container of a process whose `/proc/PID/cgroup` (written by the
/// kernel, not the process: no checks needed) reads `text`; `None` outside
/// one, or one whose parent cgroups are not all root's.
pub fn of_cgroup_file(text: &str) -> Option<Container> {
    let pods = POD_LOGS.get_or_init(|| PodLogs::new("/var/log/pods"));
    parse_owned(text, Some(pods), &cgroup_dir_is_roots)
}

/// Whether the cgroup directory `path` of the hierarchy of `controllers`
/// (empty: cgroup v2) is a directory owned by root, looked up without
/// following links. Unknown (no such mount, gone) counts as not.
fn cgroup_dir_is_roots(controllers: &str, path: &[&str]) -> bool {
    let base = if controllers.is_empty() {
        crate::process::cgroups::system().root().to_path_buf()
    } else {
        // `name=systemd` is mounted as `systemd`, `cpu,cpuacct` as itself.
        let name = controllers.strip_prefix("name=").unwrap_or(controllers);
        if name.contains('/') || name.starts_with('.') {
            return false;
        }
        Path::new("/sys/fs/cgroup").join(name)
    };
    if path.iter().any(|p| *p == ".." || *p == ".") {
        return false;
    }
    let dir = path.iter().fold(base, |dir, p| dir.join(p));
    std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == 0)
}

#[cfg(test)]
mod tests;
