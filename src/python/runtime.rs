//! CPython as a [`Runtime`]: its walk half registers interpreters and
//! their threads for the BPF walk ([`PythonThreads`]), its naming half
//! names the code objects the walk appended after a stack's native frames
//! and the threads Python named ([`PythonFrames`]); they meet in
//! [`Pythons`], the interpreters found.

use std::{
    collections::HashSet,
    sync::{Mutex, MutexGuard},
    time::Instant,
};

use super::{
    frames::{is_python, PythonFrames},
    registry::{PythonThreads, Pythons},
};
use crate::{
    process::ProcKey,
    profile::model::Frame,
    runtime::{Appended, Attach, FrameNames, Named, Runtime, RuntimeStats, WalkEntry},
};

/// CPython, read from its processes' memory.
pub struct Python {
    /// The walk half (`None`: Python frames are not walked, `--python
    /// off` or no `python_threads` map); the unwind thread's.
    walk: Mutex<Option<PythonThreads>>,
    /// The naming half; the symbolizer's.
    frames: Mutex<PythonFrames>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Python {
    /// Names the frames of the interpreters in `pythons`, which `walk`
    /// (if any) finds and registers.
    pub fn new(pythons: Pythons, walk: Option<PythonThreads>) -> Python {
        Python {
            walk: Mutex::new(walk),
            frames: Mutex::new(PythonFrames::new(pythons)),
        }
    }
}

impl Runtime for Python {
    fn name(&self) -> &'static str {
        "python"
    }

    fn walk_entry(&self, proc: &Attach<'_>, entry: &mut WalkEntry) {
        let mut walk = locked(&self.walk);
        let Some(walk) = walk.as_mut() else {
            return;
        };
        if let Some(layout) = walk.register(proc.pid, proc.key, proc.uid, proc.mappings, proc.now) {
            entry.python = layout;
        }
    }

    fn retry_due(&self, pid: u32, now: Instant) -> bool {
        locked(&self.walk)
            .as_ref()
            .is_some_and(|w| w.retry_due(pid, now))
    }

    fn synchronize(&self, pids: &HashSet<u32>, now: Instant, deadline: Instant) -> Vec<u32> {
        locked(&self.walk)
            .as_mut()
            .map_or_else(Vec::new, |w| w.scan(pids, now, deadline))
    }

    fn detach(&self, pid: u32) {
        if let Some(w) = locked(&self.walk).as_mut() {
            w.ended(pid);
        }
    }

    fn walk_stats(&self, stats: &mut RuntimeStats) {
        stats.python = locked(&self.walk).as_ref().map(PythonThreads::stats);
    }

    fn begin_batch(&self) {
        locked(&self.frames).start_batch();
    }

    fn forget(&self, key: ProcKey) {
        locked(&self.frames).forget(key);
    }

    fn appends(&self, entry: u64) -> bool {
        is_python(entry)
    }

    fn appended(&self, pid: u32, entries: &[u64], names: &mut dyn FrameNames) -> Appended {
        locked(&self.frames).part(pid, entries, names)
    }

    fn thread_name(&self, proc: &Named, tid: u32, names: &mut dyn FrameNames) -> Option<Frame> {
        let pid = proc.key.pid;
        let interp = locked(&self.frames).process(pid)?;
        let name = interp.names.get(&tid)?;
        Some(names.get_for(pid, name))
    }

    fn clear_names(&self) {
        locked(&self.frames).clear_names();
    }

    fn held(&self) -> usize {
        locked(&self.frames).held_bytes()
    }
}
