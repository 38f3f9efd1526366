//! Cgroup v2 ids <-> paths. A cgroup's id (what BPF's
//! `bpf_get_current_cgroup_id` returns) is the inode number of its directory
//! in the cgroup2 mount, so ids resolve by walking that mount.

use std::{
    collections::HashMap,
    os::unix::fs::{DirEntryExt, MetadataExt},
    path::{Component, Path, PathBuf},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

/// Deepest directory the walk descends into (the root is depth 0).
const MAX_DEPTH: usize = 16;
/// Directories one walk visits at most.
const MAX_DIRS: usize = 10_000;
/// An unknown id triggers a new walk at most this often.
const REWALK_AFTER: Duration = Duration::from_secs(10);

/// Longest cgroup path kept (`PATH_MAX`).
pub const MAX_PATH: usize = 4096;

/// The cgroup v2 path (`/system.slice/x.service`) in a `/proc/PID/cgroup`
/// file's `text`; `None` without one or past [`MAX_PATH`]. The kernel
/// writes the file, not the process.
pub fn v2_path_in(text: &str) -> Option<String> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    (path.starts_with('/') && path.len() <= MAX_PATH).then(|| path.to_string())
}

/// Resolves ids under one cgroup2 mount, caching the last walk.
pub struct Cgroups {
    root: PathBuf,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    paths: HashMap<u64, String>,
    walked: Option<Instant>,
}

impl Cgroups {
    /// A resolver for the cgroup2 hierarchy mounted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Cgroups {
            root: root.into(),
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The directory the hierarchy is mounted on.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of cgroup `id` relative to the mount (`/` for the root,
    /// e.g. `/system.slice/ssh.service`), if it exists.
    pub fn path_of(&self, id: u64) -> Option<String> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(path) = cache.paths.get(&id) {
            return Some(path.clone());
        }
        if cache.walked.is_some_and(|at| at.elapsed() < REWALK_AFTER) {
            return None;
        }
        cache.paths = walk(&self.root);
        cache.walked = Some(Instant::now());
        cache.paths.get(&id).cloned()
    }

    /// The id of the cgroup at `path` (absolute, relative to the mount);
    /// `None` if it is not a directory there or tries to leave the mount.
    pub fn id_of(&self, path: &str) -> Option<u64> {
        let rel = Path::new(path).strip_prefix("/").ok()?;
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return None;
        }
        let meta = std::fs::symlink_metadata(self.root.join(rel)).ok()?;
        meta.is_dir().then(|| meta.ino())
    }
}

/// Most v1 hierarchies kept per process: a host mounts one per
/// controller (or group of them) and a few named ones (`name=systemd`),
/// about a dozen.
pub const MAX_V1_HIERARCHIES: usize = 16;

/// A process's cgroup v1 paths, one per hierarchy: its controllers
/// (`cpu,cpuacct`, `name=systemd`) and its path there (`/docker/x`), as
/// its `/proc/PID/cgroup` lists them. BPF keys cgroups by their cgroup2
/// id, which a v1 directory has none of: a v1 cgroup is its processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V1Paths(Vec<(Box<str>, Box<str>)>);

impl V1Paths {
    /// The v1 lines of a `/proc/PID/cgroup` file's `text` (every line but
    /// the unified `0::`), at most [`MAX_V1_HIERARCHIES`]; a line whose
    /// controllers or path is longer than [`MAX_PATH`] is left out. The
    /// kernel writes the file, not the process.
    pub fn in_file(text: &str) -> V1Paths {
        let lines = text.lines().filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let fits = controllers.len() <= MAX_PATH && path.len() <= MAX_PATH;
            (id != "0" && fits).then(|| (controllers.into(), path.into()))
        });
        V1Paths(lines.take(MAX_V1_HIERARCHIES).collect())
    }

    /// Paths as (controllers, path) pairs, bounded as [`V1Paths::in_file`]
    /// bounds a file's (a decoded block's).
    pub fn of_pairs(pairs: Vec<(Box<str>, Box<str>)>) -> V1Paths {
        let fits = |(c, p): &(Box<str>, Box<str>)| c.len() <= MAX_PATH && p.len() <= MAX_PATH;
        V1Paths(
            pairs
                .into_iter()
                .filter(fits)
                .take(MAX_V1_HIERARCHIES)
                .collect(),
        )
    }

    /// Whether the process is in directory `path` of any v1 hierarchy.
    pub fn contains(&self, path: &str) -> bool {
        self.0.iter().any(|(_, p)| &**p == path)
    }

    /// (controllers, path) of each hierarchy.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(c, p)| (&**c, &**p))
    }

    /// Bytes these paths hold, for the process table's bound.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<V1Paths>()
            + self
                .0
                .iter()
                .map(|(c, p)| std::mem::size_of::<(Box<str>, Box<str>)>() + c.len() + p.len())
                .sum::<usize>()
    }
}

/// `pid`'s cgroup v1 paths now; `None` when it is gone.
pub(super) fn v1_paths_of(pid: u32) -> Option<V1Paths> {
    paths_of(pid).map(|(_, v1)| v1)
}

/// `pid`'s cgroup v2 path and v1 paths now; `None` when it is gone.
pub(super) fn paths_of(pid: u32) -> Option<(Option<String>, V1Paths)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    Some((v2_path_in(&text), V1Paths::in_file(&text)))
}

/// The host's cgroup2 hierarchy: `/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid (v1 + v2) systems.
pub fn system() -> &'static Cgroups {
    static SYSTEM: OnceLock<Cgroups> = OnceLock::new();
    SYSTEM.get_or_init(|| {
        let base = Path::new("/sys/fs/cgroup");
        let unified = base.join("unified");
        let hybrid = !base.join("cgroup.controllers").exists()
            && unified.join("cgroup.controllers").exists();
        Cgroups::new(if hybrid { unified } else { base.to_path_buf() })
    })
}

/// Inode -> path of every directory under `root`, breadth first, bounded by
/// [`MAX_DEPTH`] and [`MAX_DIRS`]. Symlinks are not followed.
fn walk(root: &Path) -> HashMap<u64, String> {
    let mut paths = HashMap::new();
    let Ok(meta) = std::fs::symlink_metadata(root) else {
        return paths;
    };
    paths.insert(meta.ino(), "/".to_string());
    let mut queue = std::collections::VecDeque::from([(root.to_path_buf(), String::new(), 0)]);
    let mut visited = 0;
    while let Some((dir, rel, depth)) = queue.pop_front() {
        visited += 1;
        if visited > MAX_DIRS {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            // file_type() does not follow symlinks.
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let path = format!("{rel}/{name}");
            paths.insert(entry.ino(), path.clone());
            if depth + 1 < MAX_DEPTH {
                queue.push_back((entry.path(), path, depth + 1));
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ino(p: &Path) -> u64 {
        std::fs::symlink_metadata(p).unwrap().ino()
    }

    #[test]
    fn v2_paths_come_from_the_unified_line_only() {
        let v1_and_v2 = "12:pids:/docker/x\n0::/system.slice/a.service\n";
        assert_eq!(
            v2_path_in(v1_and_v2).as_deref(),
            Some("/system.slice/a.service")
        );
        assert_eq!(v2_path_in("12:pids:/docker/x\n"), None);
        let long = format!("0::/{}\n", "a".repeat(MAX_PATH));
        assert_eq!(v2_path_in(&long), None);
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert!(v2_path_in(&own).is_some_and(|p| p.starts_with('/')));
    }

    #[test]
    fn v1_paths_come_from_every_line_but_the_unified_one() {
        let file = "12:pids:/docker/x\n4:cpu,cpuacct:/docker/x:y\n\
                    1:name=systemd:/system.slice/a.service\n0::/system.slice/a.service\n";
        let v1 = V1Paths::in_file(file);
        assert_eq!(
            v1.iter().collect::<Vec<_>>(),
            [
                ("pids", "/docker/x"),
                ("cpu,cpuacct", "/docker/x:y"),
                ("name=systemd", "/system.slice/a.service"),
            ]
        );
        assert!(v1.contains("/docker/x") && v1.contains("/system.slice/a.service"));
        assert!(!v1.contains("/docker") && !v1.contains("/"));
        assert!(v1.bytes() > "/docker/x".len());
        // A pure v2 host: no v1 hierarchy.
        assert_eq!(
            V1Paths::in_file("0::/system.slice/a.service\n"),
            V1Paths::default()
        );
        // Bounded: hierarchies and each path.
        let many: String = (1..100).map(|i| format!("{i}:c{i}:/p\n")).collect();
        assert_eq!(V1Paths::in_file(&many).iter().count(), MAX_V1_HIERARCHIES);
        let long = format!("3:pids:/{}\n", "a".repeat(MAX_PATH));
        assert_eq!(V1Paths::in_file(&long), V1Paths::default());
        assert!(v1_paths_of(std::process::id()).is_some());
        assert_eq!(v1_paths_of(u32::MAX), None);
    }

    #[test]
    fn resolves_ids_and_paths_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("system.slice/ssh.service")).unwrap();
        std::fs::write(root.join("cgroup.procs"), "").unwrap();
        std::os::unix::fs::symlink(root.join("system.slice"), root.join("link")).unwrap();
        let cg = Cgroups::new(root);
        let ssh = ino(&root.join("system.slice/ssh.service"));
        assert_eq!(
            cg.path_of(ssh).as_deref(),
            Some("/system.slice/ssh.service")
        );
        assert_eq!(cg.path_of(ino(root)).as_deref(), Some("/"));
        assert_eq!(cg.id_of("/system.slice/ssh.service"), Some(ssh));
        assert_eq!(cg.id_of("/"), Some(ino(root)));
        assert_eq!(cg.id_of("/link"), None, "a symlink is no cgroup");
        assert_eq!(cg.id_of("/cgroup.procs"), None, "a file is no cgroup");
        assert_eq!(cg.id_of("/system.slice/../system.slice"), None);
        assert_eq!(cg.id_of("system.slice"), None, "paths are absolute");
        assert_eq!(cg.path_of(u64::MAX), None);

        // A cgroup created after the walk resolves once the cache may renew.
        std::fs::create_dir(root.join("late")).unwrap();
        let late = ino(&root.join("late"));
        assert_eq!(
            cg.path_of(late),
            None,
            "within REWALK_AFTER of the last walk"
        );
        cg.cache.lock().unwrap().walked = None;
        assert_eq!(cg.path_of(late).as_deref(), Some("/late"));
    }
}
