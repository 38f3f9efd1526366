//! A process's threads, from `/proc/PID/task` (the kernel's files).

use std::{collections::HashMap, fs};

/// Most threads listed of one process.
pub const MAX_LISTED: usize = 100_000;

/// Whether process (or thread) `pid` exists now.
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Most processes [`pids`] lists.
pub const MAX_PROCESSES: usize = 100_000;

/// The pids of the processes now (`/proc`'s numeric entries), at most
/// [`MAX_PROCESSES`], unordered.
pub fn pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .take(MAX_PROCESSES)
        .collect()
}

/// The name (`comm`) of process `pid`, or of its thread `tid`.
pub fn comm(pid: u32, tid: Option<u32>) -> Option<String> {
    let path = match tid {
        Some(tid) => format!("/proc/{pid}/task/{tid}/comm"),
        None => format!("/proc/{pid}/comm"),
    };
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// The tids of `pid`'s threads now, at most [`MAX_LISTED`], unordered.
pub fn tids(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .take(MAX_LISTED)
        .collect()
}

/// Host tids of `pid`'s threads by their tid in the process's own pid
/// namespace (`NSpid`: the `nid` of a JVM's thread dumps).
pub fn host_tids_by_ns_tid(pid: u32) -> HashMap<u32, u32> {
    tids(pid)
        .into_iter()
        .filter_map(|tid| {
            let status = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
            Some((ns_tid_in(&status)?, tid))
        })
        .collect()
}

/// The innermost pid of a status text's `NSpid:` line.
pub(super) fn ns_tid_in(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_threads() {
        let me = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel::<()>();
        let other = std::thread::Builder::new()
            .name("tasks-test".into())
            .spawn(move || {
                // Named by now: the name is set as the thread starts.
                ready_tx.send(()).unwrap();
                rx.recv()
            })
            .unwrap();
        ready.recv().unwrap();
        let tids = tids(me);
        assert!(tids.contains(&me) && tids.len() >= 2);
        let by_ns = host_tids_by_ns_tid(me);
        assert_eq!(by_ns.get(&me), Some(&me), "one pid namespace here");
        let named = tids
            .iter()
            .any(|t| comm(me, Some(*t)).as_deref() == Some("tasks-test"));
        assert!(named);
        assert!(exists(me) && !exists(u32::MAX));
        assert_eq!(ns_tid_in("NSpid:\t4242\t7\n"), Some(7));
        tx.send(()).unwrap();
        other.join().unwrap().unwrap();
    }
}
