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

/// Most processes [`v1_members`] looks at.
const MAX_PROCESSES: usize = 100_000;

/// The processes now in the cgroup v1 directory `path` (as
/// `/proc/PID/cgroup` shows it) of any v1 hierarchy. BPF keys cgroups by
/// their cgroup2 id, which a v1 directory has none of: a v1 cgroup is its
/// processes.
pub fn v1_members(path: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .take(MAX_PROCESSES)
        .filter(|pid| {
            // Written by the kernel: no checks needed beyond reading it.
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|text| {
                text.lines().any(|l| {
                    let mut parts = l.splitn(3, ':');
                    let id = parts.next().unwrap_or("0");
                    id != "0" && parts.nth(1) == Some(path)
                })
            })
        })
        .collect()
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
