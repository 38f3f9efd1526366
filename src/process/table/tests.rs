//! The process table's unit tests.

use super::*;
use crate::bpf::abi::{proc_event, ProcEvent};
use crate::process::ChangeKind;

fn event(kind: u32, pid: u32, parent: u32, start_ns: u64, name: &str) -> ProcEvent {
    let mut comm = [0u8; COMM_LEN];
    comm[..name.len()].copy_from_slice(name.as_bytes());
    ProcEvent {
        kind,
        pid,
        parent,
        start_ns,
        comm,
        ..ProcEvent::default()
    }
}

/// A pid that cannot exist, so that no lookup finds it in `/proc`.
const PID: u32 = u32::MAX - 7;

#[test]
fn exec_and_rename_are_followed_and_the_old_image_kept_for_its_samples() {
    let table = ProcessTable::default();
    let t0 = Instant::now();
    table.apply(&event(proc_event::FORK, PID, 1, 5, "sh"), t0);
    let t1 = t0 + Duration::from_secs(2);
    // As the kernel sends them: the exec's rename, then the exec.
    table.apply(&event(proc_event::RENAME, PID, 0, 5, "server"), t1);
    table.apply(&event(proc_event::EXEC, PID, 0, 5, "server"), t1);
    // Samples of the batch that saw both: each by its thread's name.
    let since = t1 - Duration::from_secs(1);
    assert_eq!(table.lookup(PID, "sh", since).unwrap().name, "sh");
    assert_eq!(table.lookup(PID, "server", since).unwrap().name, "server");
    // Later batches: only the new program.
    let later = t1 + Duration::from_millis(1);
    assert_eq!(table.lookup(PID, "sh", later).unwrap().name, "server");
    table.apply(&event(proc_event::RENAME, PID, 0, 5, "worker-main"), later);
    assert_eq!(table.lookup(PID, "x", later).unwrap().name, "worker-main");
    assert_eq!(table.stats().processes, 1);
    assert_eq!(table.stats().images, 2);
}

#[test]
fn a_reused_pid_never_gets_the_previous_process() {
    let table = ProcessTable::default();
    let t0 = Instant::now();
    table.apply(&event(proc_event::FORK, PID, 1, 5, "old"), t0);
    table.apply(
        &event(proc_event::EXIT, PID, 0, 5, "old"),
        t0 + Duration::from_secs(1),
    );
    let t2 = t0 + Duration::from_secs(3);
    table.apply(&event(proc_event::FORK, PID, 1, 9, "new"), t2);
    let image = table.lookup(PID, "old", t2).unwrap();
    assert_eq!((image.name.as_str(), image.start_ns), ("new", 9));
    // After KEEP_ENDED the old one is gone for good.
    table.expire(t0 + Duration::from_secs(1) + KEEP_ENDED + Duration::from_secs(1));
    assert_eq!(table.stats().images, 1);
}

#[test]
fn a_forked_child_shares_its_parents_maps() {
    let table = ProcessTable::default();
    let me = std::process::id();
    let parent = table.lookup(me, "", Instant::now()).unwrap();
    assert!(!parent.maps.is_empty(), "our own maps");
    table.apply(
        &event(proc_event::FORK, PID, me, 5, "child"),
        Instant::now(),
    );
    let child = table.lookup(PID, "child", Instant::now()).unwrap();
    assert!(Arc::ptr_eq(&child.maps, &parent.maps));
    assert!(
        table.due_reads(Instant::now() + SETTLE).is_empty(),
        "nothing to read"
    );
}

#[test]
fn images_are_bounded() {
    let table = ProcessTable::default();
    let t0 = Instant::now();
    for k in 0..(MAX_IMAGES as u32 + 10) {
        table.apply(&event(proc_event::EXEC, 1_000_000 + k, 0, 1, "p"), t0);
    }
    let stats = table.stats();
    assert_eq!(stats.images, MAX_IMAGES as u64);
    assert_eq!(stats.evicted, 10);
    // Per pid too.
    let table = ProcessTable::default();
    for _ in 0..10 {
        table.apply(&event(proc_event::EXEC, PID, 0, 1, "p"), t0);
    }
    assert_eq!(table.lock().pids[&PID].len(), IMAGES_PER_PID);
}

#[test]
fn names_match_as_the_kernel_cuts_them() {
    assert!(same_name("a-very-long-process-name", "a-very-long-pro"));
    assert!(!same_name("java", "javac"));
}

#[test]
fn a_process_gone_before_its_maps_were_due_is_not_read() {
    let table = ProcessTable::default();
    let t0 = Instant::now();
    table.apply(&event(proc_event::EXEC, PID, 0, 5, "true"), t0);
    table.apply(&event(proc_event::EXIT, PID, 0, 5, "true"), t0);
    for (pid, start) in table.due_reads(t0 + SECOND_LOOK) {
        assert!(table.read_maps(pid, start).is_none());
    }
    let stats = table.stats();
    assert_eq!((stats.maps_reads, stats.maps_reads_skipped), (0, 2));
}

#[test]
fn an_exec_is_a_new_program_and_ends_the_old_ones_key() {
    let table = Arc::new(ProcessTable::default());
    let mut changes = table.subscribe();
    let t0 = Instant::now();
    table.apply(&event(proc_event::FORK, PID, 1, 5, "sh"), t0);
    table.apply(&event(proc_event::EXEC, PID, 0, 5, "server"), t0);
    let kinds: Vec<(ChangeKind, u32)> = changes
        .poll(t0)
        .changes
        .iter()
        .map(|c| (c.kind, c.key.exec))
        .collect();
    assert_eq!(
        kinds,
        [
            (ChangeKind::New, 0),
            (ChangeKind::Exit, 0),
            (ChangeKind::Exec, 1)
        ]
    );
    let sh = ProcKey {
        pid: PID,
        start_ns: 5,
        exec: 0,
    };
    assert!(table.knows(sh), "kept for its last samples");
    assert_eq!(table.newest(PID).map(|k| k.exec), Some(1));
    assert_eq!(changes.poll(t0 + KEEP_ENDED).forget, [sh]);
}

#[test]
fn images_are_bounded_by_their_bytes() {
    // 1,000 executable mappings of 1,000-byte paths: about 1 MiB an image.
    let path = format!("/{}", "p".repeat(999));
    let maps: String = (0..1000u64)
        .map(|k| {
            let start = 0x7f00_0000_0000 + k * 0x1000;
            format!(
                "{start:x}-{:x} r-xp 00000000 08:01 {k} {path}\n",
                start + 0x1000
            )
        })
        .collect();
    let table = ProcessTable::default();
    let t0 = Instant::now();
    let max = bytes::max_bytes();
    let images = max / (1 << 20) + 8;
    let mut inner = table.lock();
    for k in 0..images as u32 {
        let image = Image::new(PID - 1 - k, 1, "p".into(), t0);
        inner.push(image.with_maps(ProcMaps::parse(&maps), t0), t0);
        assert!(inner.bytes <= max, "{} > {max}", inner.bytes);
    }
    assert!(inner.stats.evicted >= 8, "{}", inner.stats.evicted);
    assert!(inner.images < images);
    drop(inner);
    let _ = table.stats();
    assert!(table.lock().bytes <= max);
}
