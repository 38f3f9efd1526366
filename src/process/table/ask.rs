//! What stages ask the table about a process: its [`Facts`], read once
//! per image and kept with it, its threads and their names now, and which
//! processes a cgroup v1 directory holds. A process
//! the table does not hold is read from `/proc` (and not kept: finding it
//! would read its maps too).

use std::{collections::HashMap, sync::Arc};

use rustc_hash::FxHashMap;

use super::{Image, ProcessTable};
use crate::process::{cgroups, cpu_cgroup, facts::Facts, tasks, ProcKey};

impl ProcessTable {
    /// The facts of process `key`: read when first asked for while it
    /// lives, then kept with its image; `None` when it ended before they
    /// were read, or is gone.
    pub fn facts(&self, key: ProcKey) -> Option<Arc<Facts>> {
        let image = self
            .lock()
            .pids
            .get(&key.pid)
            .and_then(|images| images.iter().find(|i| i.key() == key).cloned());
        match image {
            Some(image) => self.facts_in(&image),
            None => Facts::read(key.pid, false).map(Arc::new),
        }
    }

    /// The facts of the process `pid` names now (see
    /// [`ProcessTable::facts`]); `None` when every process of `pid` the
    /// table holds has ended (it exited), or it is gone.
    pub fn facts_of(&self, pid: u32) -> Option<Arc<Facts>> {
        let (live, held) = {
            let inner = self.lock();
            (inner.live(pid).cloned(), inner.pids.contains_key(&pid))
        };
        match live {
            Some(image) => self.facts_in(&image),
            None if held => None,
            None => Facts::read(pid, false).map(Arc::new),
        }
    }

    /// The effective user `pid` runs as (see [`ProcessTable::facts_of`]).
    pub fn user_of(&self, pid: u32) -> Option<u32> {
        self.facts_of(pid).map(|f| f.euid)
    }

    /// Whether `pid` is a kernel thread (or the idle task, pid 0); false
    /// when it is gone.
    pub fn is_kernel_thread(&self, pid: u32) -> bool {
        pid == 0 || self.facts_of(pid).is_some_and(|f| f.kernel_thread)
    }

    /// The name of `pid`'s thread `tid` now (of the process: `None`).
    pub fn thread_name(&self, pid: u32, tid: Option<u32>) -> Option<String> {
        tasks::comm(pid, tid)
    }

    /// The tids of `pid`'s threads now, at most `tasks::MAX_LISTED`,
    /// unordered (threads come and go without events of the table's).
    pub fn threads(&self, pid: u32) -> Vec<u32> {
        tasks::tids(pid)
    }

    /// `pid`'s host tids by their tids in its own pid namespace, when it
    /// runs in another one (a container): the ids the process itself
    /// writes down for its threads. `None` in the host's namespace.
    pub fn host_tids_in_container(&self, pid: u32) -> Option<HashMap<u32, u32>> {
        let facts = self.facts_of(pid)?;
        (facts.ns_pid != pid).then(|| tasks::host_tids_by_ns_tid(pid))
    }

    /// Whether process (or thread) `pid` exists now.
    pub fn running(&self, pid: u32) -> bool {
        tasks::exists(pid)
    }

    /// The processes now in the cgroup v1 directory `path` (as
    /// `/proc/PID/cgroup` shows it) of any v1 hierarchy, at most
    /// [`tasks::MAX_PROCESSES`]. A process the table holds is answered
    /// from its image: its cgroups as read with its maps (after its exec,
    /// and again when they are refreshed), so one moved to another cgroup
    /// without exec'ing is seen there once its maps are read again. One
    /// it does not hold yet (running since before the daemon and never
    /// looked up, or forked by such a one and not settled) is read from
    /// `/proc`, and not kept, as [`ProcessTable::facts`] does.
    pub fn cgroup_v1_members(&self, path: &str) -> Vec<u32> {
        // Whether each live image is in `path`, under one short lock.
        let known: FxHashMap<u32, bool> = {
            let inner = self.lock();
            let live = inner.pids.keys().filter_map(|&pid| inner.live(pid));
            live.filter_map(|i| Some((i.pid, i.cgroups_v1.as_ref()?.contains(path))))
                .collect()
        };
        tasks::pids()
            .into_iter()
            .filter(|pid| match known.get(pid) {
                Some(&member) => member,
                None => cgroups::v1_paths_of(*pid).is_some_and(|v1| v1.contains(path)),
            })
            .collect()
    }

    /// `pid`'s path in the `cpu` controller's hierarchy (see
    /// [`cpu_cgroup`]): from its image's cgroups when the table holds it
    /// live, else from `/proc` now; `None` when it is gone.
    pub fn cpu_cgroup_of(&self, pid: u32) -> Option<String> {
        let hierarchy = cpu_cgroup::system();
        let live = self.lock().live(pid).cloned();
        match live {
            Some(image) if image.cgroup.is_some() || image.cgroups_v1.is_some() => {
                hierarchy.path_in(image.cgroup.as_deref(), image.cgroups_v1.as_deref())
            }
            _ => {
                let (v2, v1) = cgroups::paths_of(pid)?;
                hierarchy.path_in(v2.as_deref(), Some(&v1))
            }
        }
    }

    /// `image`'s facts, read now and kept if it lives and has none.
    fn facts_in(&self, image: &Arc<Image>) -> Option<Arc<Facts>> {
        if let Some(facts) = &image.facts {
            return Some(facts.clone());
        }
        if image.ended.is_some() {
            return None;
        }
        // Read without the lock, like the maps.
        let facts = Arc::new(Facts::read(image.pid, image.jvm)?);
        let mut inner = self.lock();
        let key = image.key();
        if let Some(slot) = inner
            .live_mut(image.pid)
            .filter(|i| i.key() == key && i.facts.is_none())
        {
            *slot = Arc::new(Image {
                facts: Some(facts.clone()),
                ..(**slot).clone()
            });
            inner.bytes += facts.bytes();
        }
        Some(facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::abi::{proc_event, ProcEvent};
    use crate::process::cgroups::V1Paths;
    use std::time::Instant;

    #[test]
    fn facts_are_read_once_per_image_and_kept() {
        let table = ProcessTable::default();
        let me = std::process::id();
        let image = table.live(me).unwrap();
        assert!(image.facts.is_none());
        let facts = table.facts(image.key()).unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(facts.euid, unsafe { libc::geteuid() });
        // Kept: the same facts, not a second read.
        let kept = table.live(me).unwrap().facts.clone().unwrap();
        assert!(Arc::ptr_eq(&kept, &facts));
        assert!(Arc::ptr_eq(&table.facts_of(me).unwrap(), &facts));
        assert_eq!(table.user_of(me), Some(facts.euid));
        assert!(!table.is_kernel_thread(me) && table.is_kernel_thread(0));
        // Once it exits, what was read stays with the ended image; the pid
        // names no live process.
        let exit = ProcEvent {
            kind: proc_event::EXIT,
            pid: me,
            ..ProcEvent::default()
        };
        table.apply(&exit, Instant::now());
        assert!(Arc::ptr_eq(&table.facts(image.key()).unwrap(), &facts));
        assert_eq!(table.facts_of(me), None);
        // A process the table does not hold is read, not kept.
        let other = ProcessTable::default();
        assert_eq!(other.facts_of(me).map(|f| f.euid), Some(facts.euid));
        assert!(other.newest(me).is_none());
        assert_eq!(other.facts_of(u32::MAX), None);
    }

    #[test]
    fn cgroup_v1_members_are_the_tables_and_carried_across_fork_and_exec() {
        let table = ProcessTable::default();
        let me = std::process::id();
        let own = table.live(me).unwrap().cgroups_v1.clone().unwrap();
        // A process the table does not hold is read from `/proc`, not kept.
        let other = ProcessTable::default();
        for (_, path) in own.iter() {
            assert!(other.cgroup_v1_members(path).contains(&me), "{path}");
        }
        assert!(other.newest(me).is_none());
        // One it holds is answered from its image, not from `/proc`.
        let planted = Arc::new(V1Paths::in_file("3:pids:/ws-planted\n"));
        {
            let mut inner = table.lock();
            let slot = inner.live_mut(me).unwrap();
            *slot = Arc::new(Image {
                cgroups_v1: Some(planted.clone()),
                ..(**slot).clone()
            });
        }
        assert_eq!(table.cgroup_v1_members("/ws-planted"), [me]);
        for (_, path) in own.iter() {
            assert!(!table.cgroup_v1_members(path).contains(&me), "{path}");
        }
        assert!(other.cgroup_v1_members("/ws-planted").is_empty());
        // A child inherits them at fork and keeps them across its exec.
        const CHILD: u32 = u32::MAX - 7;
        let event = |kind, parent| ProcEvent {
            kind,
            pid: CHILD,
            parent,
            start_ns: 5,
            ..ProcEvent::default()
        };
        table.apply(&event(proc_event::FORK, me), Instant::now());
        table.apply(&event(proc_event::EXEC, 0), Instant::now());
        let inner = table.lock();
        let images = &inner.pids[&CHILD];
        assert_eq!(images.len(), 2, "the fork's image and the exec's");
        for image in images {
            assert!(Arc::ptr_eq(image.cgroups_v1.as_ref().unwrap(), &planted));
        }
    }
}
