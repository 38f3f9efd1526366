//! JIT code named by perf maps (`/tmp/perf-PID.map`), the convention JIT
//! compilers share (Node.js `--perf-basic-prof`, .NET, LuaJIT, a JVM's
//! agent): the runtime of last resort for code in anonymous executable
//! memory. The JVM runtime reads a JVM's map through [`PerfMaps::find`]
//! too, naming its entries the Java way.

mod maps;
pub mod names;
mod parse;

use std::sync::{Arc, Mutex, MutexGuard};

use maps::JitMaps;
pub use maps::{budget_bytes, READ_STEP_BYTES};

use crate::{
    held::{set, Holder},
    process::{ProcKey, ProcessTable},
    profile::model::Frame,
    runtime::{AnonCode, FrameNames, Frames, Named, Runtime},
};

/// Every process's perf map, read on the symbolizer's thread (shared with
/// the JVM runtime, which asks it first for JVMs).
#[derive(Clone)]
pub struct PerfMaps(Arc<Mutex<JitMaps>>);

impl PerfMaps {
    /// No maps yet, of the processes of `table`.
    pub fn new(table: Arc<ProcessTable>) -> PerfMaps {
        PerfMaps(Arc::new(Mutex::new(JitMaps::new(table))))
    }

    fn maps(&self) -> MutexGuard<'_, JitMaps> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The frame for `addr` in process `key`, if its perf map names it;
    /// `make` turns an entry's name into its frame (once per entry and map
    /// read).
    pub fn find(&self, key: ProcKey, addr: u64, make: impl FnOnce(&str) -> Frame) -> Option<Frame> {
        self.maps().find(key, addr, make)
    }
}

impl Runtime for PerfMaps {
    fn name(&self) -> &'static str {
        "perf-map"
    }

    fn begin_batch(&self) {
        self.maps().begin_batch();
    }

    fn forget(&self, key: ProcKey) {
        self.maps().forget(key);
    }

    fn retain(&self, keep: &dyn Fn(ProcKey) -> bool) {
        self.maps().retain(keep);
    }

    fn anonymous(
        &self,
        proc: &Named,
        code: &[AnonCode],
        named: &mut [Option<Frames>],
        frame_names: &mut dyn FrameNames,
    ) {
        let (key, pid) = (proc.key, proc.key.pid);
        let mut maps = self.maps();
        for (c, slot) in code.iter().zip(named).filter(|(_, s)| s.is_none()) {
            let frame = maps.find(key, c.addr, |name| {
                frame_names.get_for(pid, &names::frame_name(name, false))
            });
            *slot = frame.map(Frames::One);
        }
    }

    fn clear_names(&self) {
        self.maps().clear_frames();
    }

    fn held(&self) -> usize {
        let bytes = self.maps().bytes();
        set(
            Holder::PerfMapNames,
            bytes as u64,
            Some(budget_bytes() as u64),
        );
        0
    }
}
