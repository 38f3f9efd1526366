//! HotSpot as a [`Runtime`]. Its walk half writes what BPF's walk needs of
//! a JVM's code ([`super::walk_code`]), reading it again while a young
//! JVM's code heaps are not there yet. Its naming half names compiled and
//! interpreted frames from the JVM's own structures
//! ([`super::code_frames`]), falls back to the JVM's perf map (named the
//! Java way), names threads from what the JVM agent read ([`Jvms`]), and
//! tells the agent which JVMs ran and what they lacked.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{SyncSender, TrySendError},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap;

use super::{
    agent::Sighting,
    code_frames::{nmethod_budget_bytes, JavaFrames},
    walk_code::code_for_walks,
    JvmFrames, Jvms,
};
use crate::{
    bpf::abi::{is_merged_tid, JAVA_METHOD_TAG},
    held::{set, Holder},
    perfmap::{
        names::{frame_name, NOT_IN_PERF_MAP},
        PerfMaps,
    },
    process::{Image, ProcKey, ProcessTable},
    profile::model::{Frame, ThreadInfo},
    runtime::{AnonCode, Attach, FrameNames, Frames, Named, Runtime, WalkEntry},
};

/// A JVM registered before its interpreter and code heaps could be read
/// (a JVM seen in its first moments; on a busy host, seconds) is looked
/// at again this often, for this long after it was first registered.
const RETRY_EVERY: Duration = Duration::from_secs(1);
const RETRY_FOR: Duration = Duration::from_secs(120);

/// Where the symbolizer reports the JVMs it sees and reads their thread
/// names from: the JVM agent.
pub struct JvmLink {
    /// Bounded: a JVM agent busy with a slow JVM must not hold up drains.
    pub sightings: SyncSender<Sighting>,
    /// Sightings dropped because the agent's queue was full.
    pub dropped: Arc<AtomicU64>,
}

/// The naming half's state.
struct Naming {
    frames: JavaFrames,
    /// JVMs of the current batch, and whether perf map lookups missed in
    /// them.
    seen: FxHashMap<ProcKey, bool>,
}

/// HotSpot JVMs, read from their memory.
pub struct Java {
    /// Whether the walk steps through JVMs' code (`--jvm-frames full`).
    walks: bool,
    /// JVMs whose code could not be read yet: their key, when to read it
    /// again and until when (the unwind thread's).
    retry: Mutex<HashMap<u32, (ProcKey, Instant, Instant)>>,
    naming: Mutex<Naming>,
    /// What is known of the JVMs (their layouts; the agent's thread
    /// names).
    jvms: Arc<Jvms>,
    link: Option<JvmLink>,
    perf_maps: PerfMaps,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Java {
    /// JVMs of `table` (what is known of them in `jvms`), read as
    /// `frames` says (perf maps only: no JVM memory read, no walk entry),
    /// their perf maps read through `perf_maps`; `link` (if any) is the
    /// JVM agent.
    pub fn new(
        table: Arc<ProcessTable>,
        jvms: Arc<Jvms>,
        frames: JvmFrames,
        perf_maps: PerfMaps,
        link: Option<JvmLink>,
    ) -> Java {
        let mut java = JavaFrames::new(table, jvms.clone());
        java.disabled = frames == JvmFrames::PerfMap;
        Java {
            walks: frames == JvmFrames::Full,
            retry: Mutex::new(HashMap::new()),
            naming: Mutex::new(Naming {
                frames: java,
                seen: FxHashMap::default(),
            }),
            jvms,
            link,
            perf_maps,
        }
    }

    /// Sightings dropped so far because the agent's queue was full.
    pub fn sightings_dropped(&self) -> Option<Arc<AtomicU64>> {
        Some(self.link.as_ref()?.dropped.clone())
    }
}

impl Runtime for Java {
    fn name(&self) -> &'static str {
        "java"
    }

    fn runs_in(&self, image: &Image) -> bool {
        image.jvm
    }

    fn walk_entry(&self, proc: &Attach<'_>, entry: &mut WalkEntry) {
        if !self.walks {
            return;
        }
        let (pid, now) = (proc.pid, proc.now);
        let java = code_for_walks(self.jvms.layouts(), pid, proc.mappings);
        // A JVM whose code could not be read yet (no interpreter, no code
        // heaps) is read again; one that has none by then walks without.
        let incomplete = proc.image.maps.is_hotspot() && java.is_none_or(|j| j.heap_count == 0);
        let mut retry = locked(&self.retry);
        let until = match retry.get(&pid) {
            Some((key, _, until)) if *key == proc.key => *until,
            _ => now + RETRY_FOR,
        };
        if incomplete && now < until {
            retry.insert(pid, (proc.key, now + RETRY_EVERY, until));
        } else {
            retry.remove(&pid);
        }
        if let Some(java) = java {
            entry.java = java;
        }
    }

    fn retry_due(&self, pid: u32, now: Instant) -> bool {
        locked(&self.retry)
            .get(&pid)
            .is_some_and(|(_, next, _)| now >= *next)
    }

    fn detach(&self, pid: u32) {
        locked(&self.retry).remove(&pid);
    }

    fn begin_batch(&self) {
        locked(&self.naming).frames.begin_batch();
    }

    fn forget(&self, key: ProcKey) {
        locked(&self.naming).frames.forget(key);
    }

    fn retain(&self, keep: &dyn Fn(ProcKey) -> bool) {
        locked(&self.naming).frames.retain(keep);
    }

    fn owns_entry(&self, entry: u64) -> bool {
        entry & JAVA_METHOD_TAG != 0
    }

    fn tagged(&self, proc: &Named, entry: u64, names: &mut dyn FrameNames) -> Option<Frames> {
        if !proc.runs(self) || entry & JAVA_METHOD_TAG == 0 {
            return None;
        }
        let method = entry & !JAVA_METHOD_TAG;
        let frame = locked(&self.naming)
            .frames
            .interpreted(proc.key, method, names);
        Some(Frames::One(frame))
    }

    /// A JVM's anonymous code is its own: a compiled method read from the
    /// JVM, else the JVM's perf map (named the Java way), else
    /// [`NOT_IN_PERF_MAP`] (reported to the agent, which has the map
    /// written again).
    fn anonymous(
        &self,
        proc: &Named,
        code: &[AnonCode],
        named: &mut [Option<Frames>],
        names: &mut dyn FrameNames,
    ) {
        if !proc.runs(self) {
            return;
        }
        let key = proc.key;
        let mut naming = locked(&self.naming);
        for (c, slot) in code.iter().zip(named).filter(|(_, s)| s.is_none()) {
            // The nmethod's pc descriptors are keyed by return address.
            let pc = if c.leaf { c.addr } else { c.addr + 1 };
            if let Some(frames) = naming.frames.compiled(key, pc, c.leaf, names) {
                *slot = Some(Frames::Inlined(frames));
                continue;
            }
            let found = self.perf_maps.find(key, c.addr, |name| {
                names.get_for(key.pid, &frame_name(name, true))
            });
            *slot = Some(Frames::One(found.unwrap_or_else(|| {
                naming.seen.insert(key, true);
                names.get(NOT_IN_PERF_MAP)
            })));
        }
    }

    fn saw(&self, proc: &Named) {
        if proc.runs(self) {
            locked(&self.naming).seen.entry(proc.key).or_insert(false);
        }
    }

    fn thread_name(&self, proc: &Named, tid: u32, _names: &mut dyn FrameNames) -> Option<Frame> {
        self.jvms.thread_name(proc.key, tid)
    }

    /// Tells the JVM agent which JVMs ran, whether their perf maps missed
    /// code, and which of their threads still lack a Java name.
    fn end_batch(&self, threads: &HashMap<u32, ThreadInfo>) {
        let mut naming = locked(&self.naming);
        let seen = std::mem::take(&mut naming.seen);
        let Some(link) = &self.link else {
            return;
        };
        for (key, jit_misses) in seen {
            let pid = key.pid;
            if let Some(frames) = naming.frames.status(key) {
                self.jvms.set_frames(pid, frames);
            }
            let unnamed_tids = threads
                .iter()
                .filter(|(tid, t)| {
                    t.pid == pid && !is_merged_tid(**tid) && !self.jvms.knows_thread(key, **tid)
                })
                .map(|(tid, _)| *tid)
                .collect();
            let sighting = Sighting {
                key,
                jit_misses,
                unnamed_tids,
            };
            if let Err(TrySendError::Full(_)) = link.sightings.try_send(sighting) {
                link.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn held(&self) -> usize {
        let bytes = locked(&self.naming).frames.bytes();
        set(
            Holder::JvmCode,
            bytes as u64,
            Some(nmethod_budget_bytes() as u64),
        );
        0
    }
}
