//! What the table holds of one process between two execs: its
//! [`Image`], as read from `/proc` once it settled and carried across
//! fork and exec.

use std::{sync::Arc, time::Instant};

use crate::process::{
    cgroups::V1Paths,
    changes::ProcKey,
    container::{self, Container},
    facts::Facts,
    maps::ProcMaps,
};

/// What one process runs between two execs, as last read.
#[derive(Debug, Clone)]
pub struct Image {
    pub pid: u32,
    /// The process's start, ns since boot (0 when found without an event):
    /// with the pid, the process's identity.
    pub start_ns: u64,
    /// Execs the table saw the process make before this program: with the
    /// pid and start, the program's identity ([`ProcKey`]).
    pub exec: u32,
    /// The process's name (its main thread's), following exec and prctl.
    pub name: String,
    /// Executable mappings; shared with the parent after a fork.
    pub maps: Arc<ProcMaps>,
    /// A HotSpot JVM, as its maps tell.
    pub jvm: bool,
    /// Its container, read with the maps (runtimes place a process in its
    /// container's cgroup before it execs).
    pub container: Option<Arc<Container>>,
    /// Its parent's pid (0: not known), from its fork event or `/proc`.
    pub parent: u32,
    /// Its cgroup (v2 path), inherited at fork and read with the maps.
    pub cgroup: Option<Arc<str>>,
    /// Its cgroup v1 paths, one per hierarchy, from the same read as
    /// `cgroup` and kept like it (`None`: not read yet, nor inherited).
    pub cgroups_v1: Option<Arc<V1Paths>>,
    /// Its facts, read when first asked for ([`crate::process::ProcessTable::facts`]).
    pub facts: Option<Arc<Facts>>,
    /// When the maps were read from `/proc` (`None`: not yet, or inherited
    /// from the parent at fork and not re-read).
    pub maps_read: Option<Instant>,
    /// When this image began (exec, fork, or first seen).
    pub began: Instant,
    /// When the process exited or exec'd another program.
    pub ended: Option<Instant>,
    /// The name before the last rename: an exec renames the process just
    /// before its exec event, and the old image keeps its old name.
    pub(super) renamed_from: Option<String>,
}

impl Image {
    pub(super) fn new(pid: u32, start_ns: u64, name: String, now: Instant) -> Image {
        Image {
            pid,
            start_ns,
            exec: 0,
            name,
            maps: Arc::default(),
            jvm: false,
            container: None,
            parent: 0,
            cgroup: None,
            cgroups_v1: None,
            facts: None,
            maps_read: None,
            began: now,
            ended: None,
            renamed_from: None,
        }
    }

    pub(super) fn with_maps(&self, maps: ProcMaps, now: Instant) -> Image {
        // One read for the container and the cgroups.
        let cgroup_file = std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid)).ok();
        let cgroup_file = cgroup_file.as_deref();
        Image {
            jvm: maps.is_hotspot(),
            container: cgroup_file
                .and_then(container::of_cgroup_file)
                .map(Arc::new),
            cgroup: cgroup_file
                .and_then(crate::process::cgroups::v2_path_in)
                .map(Arc::from)
                .or_else(|| self.cgroup.clone()),
            cgroups_v1: cgroup_file
                .map(|text| Arc::new(V1Paths::in_file(text)))
                .or_else(|| self.cgroups_v1.clone()),
            parent: match self.parent {
                0 => crate::process::status::parent_pid(self.pid).unwrap_or(0),
                known => known,
            },
            maps: Arc::new(maps),
            maps_read: Some(now),
            // Read again when next asked for (privileges may have changed).
            facts: None,
            ..self.clone()
        }
    }

    /// The process's identity.
    pub fn key(&self) -> ProcKey {
        ProcKey {
            pid: self.pid,
            start_ns: self.start_ns,
            exec: self.exec,
        }
    }

    /// Whether it existed at some time since `since`.
    pub(super) fn alive_since(&self, since: Instant) -> bool {
        self.ended.is_none_or(|end| end >= since)
    }
}
