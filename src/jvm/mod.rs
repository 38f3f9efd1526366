//! JVM support: getting HotSpot JVMs to write their perf maps, full Java
//! thread names, and what we know about each JVM for the reports.
//!
//! The symbolizer tells the [`agent`] which JVMs it saw (and whether it
//! missed JIT code or thread names); the agent talks to those JVMs through
//! the attach mechanism on its own thread, so a slow JVM never delays a
//! drain, and publishes names and status in [`Jvms`].

pub mod agent;
pub mod attach;
pub mod code;
mod code_frames;
pub mod flags;
pub mod jobs;
pub mod leftover;
pub mod methods;
pub mod output;
pub mod runtime;
pub mod turns;
pub mod vmstructs;
mod vmtables;
pub mod walk_code;
pub mod workers;

use crate::process::ProcKey;
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, RwLock,
    },
};

use serde::Serialize;

/// Where Java frames come from (`--jvm-frames`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum JvmFrames {
    /// The JVM's own structures: inlined methods (`_[i]`), interpreted
    /// methods (`_[0]`), C1 (`_[1]`) and C2 (`_[j]`) frames; the perf map
    /// for the rest.
    #[default]
    Full,
    /// Perf maps only: one frame per compiled method, interpreted code as
    /// `Interpreter` (wallscope before 0.x; for comparison).
    PerfMap,
}

/// Where attaching to a JVM stands, named as the reports show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum AttachStatus {
    /// Not looked at yet (shown as an empty string).
    #[default]
    #[serde(rename = "")]
    #[strum(serialize = "")]
    Unknown,
    /// Seen; the attach has not finished yet.
    Pending,
    Attached,
    Refused,
    /// `--jvm=off`.
    Off,
}

impl std::fmt::Display for AttachStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.into())
    }
}

/// What the reports say about one JVM.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct JvmReport {
    /// `pending`, `attached`, `refused` or `off` (`--jvm=off`).
    pub attach: AttachStatus,
    /// Why the JVM could not be attached, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Times wallscope had the JVM write its perf map.
    pub perf_map_writes: u64,
    /// Whether the JVM runs with `-XX:+PreserveFramePointer` (unknown
    /// until attached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preserve_frame_pointer: Option<bool>,
    /// Where Java frames come from: `vm_structures` (inlined and
    /// interpreted methods named, read from the JVM's own tables) or
    /// `perf_map: WHY` (one frame per compiled method, interpreted code
    /// as `Interpreter`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<String>,
    /// Whether C2 records inlining at every pc (`-XX:+DebugNonSafepoints`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug_non_safepoints: Option<flags::DebugNonSafepoints>,
    /// What the user should know, e.g. that stacks stop at JIT frames.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

impl JvmReport {
    /// One line for text reports.
    pub fn describe(&self) -> String {
        let mut s = format!("JVM: attach {}", self.attach);
        if let Some(v) = &self.version {
            s += &format!(" ({v})");
        }
        s += &format!(", perf map written {} times", self.perf_map_writes);
        match self.preserve_frame_pointer {
            Some(true) => s += ", -XX:+PreserveFramePointer",
            Some(false) => s += ", no -XX:+PreserveFramePointer",
            None => {}
        }
        if let Some(frames) = &self.frames {
            s += &format!(", frames from {frames}");
        }
        if let Some(d) = self.debug_non_safepoints {
            s += &format!(", DebugNonSafepoints {d:?}");
        }
        for extra in [&self.error, &self.warning].into_iter().flatten() {
            s += &format!("\n  {extra}");
        }
        s
    }
}

/// The warning for JVMs without frame pointers in JIT code whose code
/// wallscope cannot read (its frames from the perf map alone): only there
/// do stacks stop at the first compiled frame.
pub const NO_FRAME_POINTER_WARNING: &str = "running without -XX:+PreserveFramePointer and its code tables unreadable: stacks stop at the first JIT-compiled frame; restart the JVM with that flag for complete Java stacks";

/// The warning a JVM's report carries, from what is known of it.
fn frame_pointer_warning(
    preserve_frame_pointer: Option<bool>,
    frames: Option<&str>,
) -> Option<String> {
    let code_read = frames.is_some_and(|f| f.starts_with("vm_structures"));
    (preserve_frame_pointer == Some(false) && !code_read)
        .then(|| NO_FRAME_POINTER_WARNING.to_string())
}

#[derive(Debug, Default)]
struct JvmEntry {
    /// The JVM process: names never outlive it into a reused pid.
    key: ProcKey,
    report: JvmReport,
    /// Full Java thread names by host tid.
    names: HashMap<u32, Arc<str>>,
}

/// What is known about the JVMs seen, shared by the agent (writer), the
/// symbolizer and the API (readers).
#[derive(Debug, Default)]
pub struct Jvms {
    entries: RwLock<HashMap<u32, JvmEntry>>,
    /// Their layouts, parsed once per process for every reader.
    layouts: vmstructs::Layouts,
    /// What was read of their libjvm files, for the flag writer.
    libjvm_facts: flags::LibjvmFacts,
    /// Whether [`flags::prepare`] may write into JVMs (off by default).
    flag_writes: AtomicBool,
}

impl Jvms {
    /// The JVMs' layouts (see [`vmstructs::Layouts`]).
    pub fn layouts(&self) -> &vmstructs::Layouts {
        &self.layouts
    }

    /// What was read of the JVMs' libjvm files.
    pub(crate) fn libjvm_facts(&self) -> &flags::LibjvmFacts {
        &self.libjvm_facts
    }

    /// Lets [`flags::prepare`] turn `DebugNonSafepoints` on: only with
    /// `--jvm=auto --jvm-frames full`, the one mode that uses it.
    pub fn allow_flag_writes(&self) {
        self.flag_writes.store(true, Ordering::Relaxed);
    }

    /// Whether flag writes are allowed.
    pub fn flag_writes_allowed(&self) -> bool {
        self.flag_writes.load(Ordering::Relaxed)
    }

    /// The full Java name of thread `tid` of JVM `jvm`, if known.
    pub fn thread_name(&self, jvm: ProcKey, tid: u32) -> Option<Arc<str>> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let entry = entries.get(&jvm.pid).filter(|e| e.key == jvm)?;
        entry.names.get(&tid).cloned()
    }

    /// Whether any name is known for JVM `jvm`'s thread `tid`.
    pub fn knows_thread(&self, jvm: ProcKey, tid: u32) -> bool {
        self.thread_name(jvm, tid).is_some()
    }

    /// Starts an entry for `jvm`, dropping what is known of another
    /// process with its pid.
    fn track(&self, jvm: ProcKey) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let entry = entries.entry(jvm.pid).or_default();
        if entry.key != jvm {
            *entry = JvmEntry {
                key: jvm,
                ..JvmEntry::default()
            };
        }
    }

    /// The report for `pid`, if it is a JVM that was seen.
    pub fn report(&self, pid: u32) -> Option<JvmReport> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.get(&pid).map(|e| e.report.clone())
    }

    /// The report for process `jvm`, if it is a JVM that was seen.
    pub fn report_of(&self, jvm: ProcKey) -> Option<JvmReport> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let entry = entries.get(&jvm.pid).filter(|e| e.key == jvm)?;
        Some(entry.report.clone())
    }

    fn update(&self, pid: u32, f: impl FnOnce(&mut JvmEntry)) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        f(entries.entry(pid).or_default());
    }

    /// Records where JVM `pid`'s Java frames come from (see
    /// [`JvmReport::frames`]).
    pub fn set_frames(&self, pid: u32, frames: String) {
        self.update(pid, |e| {
            if e.report.frames.as_ref() != Some(&frames) {
                e.report.warning =
                    frame_pointer_warning(e.report.preserve_frame_pointer, Some(&frames));
                e.report.frames = Some(frames);
            }
        });
    }

    fn set_names(&self, pid: u32, names: HashMap<u32, Arc<str>>) {
        self.update(pid, |e| e.names = names);
    }

    fn forget(&self, jvm: ProcKey) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if entries.get(&jvm.pid).is_some_and(|e| e.key == jvm) {
            entries.remove(&jvm.pid);
        }
    }
}

#[cfg(test)]
mod attach_status_tests {
    use super::AttachStatus;

    #[test]
    fn attach_statuses_keep_their_report_names() {
        let names = [
            (AttachStatus::Unknown, ""),
            (AttachStatus::Pending, "pending"),
            (AttachStatus::Attached, "attached"),
            (AttachStatus::Refused, "refused"),
            (AttachStatus::Off, "off"),
        ];
        for (status, name) in names {
            assert_eq!(serde_json::to_value(status).unwrap(), name);
            assert_eq!(status.to_string(), name);
        }
    }
}
