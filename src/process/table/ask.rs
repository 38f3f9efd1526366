//! What stages ask the table about a process: its [`Facts`], read once
//! per image and kept with it, and its threads and their names now. A process
//! the table does not hold is read from `/proc` (and not kept: finding it
//! would read its maps too).

use std::sync::Arc;

use super::{Image, ProcessTable};
use crate::process::{facts::Facts, tasks, ProcKey};

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

    /// Whether process (or thread) `pid` exists now.
    pub fn running(&self, pid: u32) -> bool {
        tasks::exists(pid)
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
}
