//! Unit tests of `perfmap`.

use super::*;

#[test]
fn parses_with_and_without_0x_and_later_lines_win() {
    let map = PerfMap::parse(
        "0x00007f76bcec71c0 0x0000000000000270 java.lang.String::hashCode\n\
         7f76bcec8000 100 Interpreter\n\
         garbage\n\
         7f76bcec9000 0 empty\n\
         7f76bcec71c0 10 LFoo;::bar (reused)\n",
    );
    assert_eq!(map.find(0x7f76bcec71c5), Some("LFoo;::bar (reused)"));
    assert_eq!(map.find(0x7f76bcec8050), Some("Interpreter"));
    assert_eq!(map.find(0x7f76bcec8100), None, "end is exclusive");
    assert_eq!(
        map.find(0x7f76bcec71c0 + 0x100),
        None,
        "the reused range replaced the old one"
    );
    assert_eq!(map.entries.len(), 2);
}

#[test]
fn long_lines_are_skipped_without_being_held() {
    let before = untrusted::refusals::get(What::PerfMap, Reason::LongLine);
    let mut text = String::from("1000 10 a\n");
    text.push_str(&format!("2000 10 {}\n", "x".repeat(10 << 20)));
    text.push_str("3000 10 c");
    let map = PerfMap::from_reader(io::Cursor::new(text)).unwrap();
    assert_eq!(map.find(0x1001), Some("a"));
    assert_eq!(map.find(0x2001), None);
    assert_eq!(map.find(0x3001), Some("c"), "a last line without newline");
    assert!(untrusted::refusals::get(What::PerfMap, Reason::LongLine) > before);
    assert!(map.name_bytes() < 10);
}

#[test]
fn our_own_perf_map_is_read_checked_and_refused_when_unsafe() {
    // One test for every variant: they share our pid's file name.
    let me = std::process::id();
    let path = std::path::PathBuf::from(format!("/tmp/perf-{me}.map"));
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, "1000 10 a\n").unwrap();
    let map = PerfMap::read(me, me).unwrap();
    assert_eq!(map.find(0x1008), Some("a"));
    assert_eq!(stamp(me, me), map.read_stamp());
    std::fs::write(&path, "1000 10 a\n2000 10 b\n").unwrap();
    assert_ne!(stamp(me, me), map.read_stamp());

    // Appended: only the new lines are read, and later lines win.
    let read = |map: &mut PerfMap| match map
        .update(ProcKey::of_pid(me), me, MAX_BYTES, true)
        .unwrap()
    {
        Progress::Read { bytes, done } => {
            assert!(done);
            bytes
        }
        Progress::Rewritten => panic!("restarts"),
    };
    let mut map = PerfMap::read(me, me).unwrap();
    let mut f = std::fs::File::options().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, b"3000 10 c\n1000 10 a2\n").unwrap();
    assert_eq!(read(&mut map), 21, "the appended lines only");
    assert_eq!(map.find(0x1001), Some("a2"));
    assert_eq!(map.find(0x2001), Some("b"));
    assert_eq!(map.find(0x3001), Some("c"));
    // A half-written line is taken, and read again once whole.
    std::io::Write::write_all(&mut f, b"4000 10 d").unwrap();
    assert_eq!(read(&mut map), 0);
    assert_eq!(map.find(0x4001), Some("d"));
    std::io::Write::write_all(&mut f, b"dd\n").unwrap();
    assert_eq!(read(&mut map), 12);
    assert_eq!((map.find(0x4001), map.entry_count()), (Some("ddd"), 4));
    drop(f);
    // Rewritten (what was read changed): read again whole, in steps
    // when asked to.
    std::fs::write(&path, "1000 10 x\n2000 10 y\n3000 10 z\n5000 10 w\n").unwrap();
    assert_eq!(
        map.update(ProcKey::of_pid(me), me, 8, false).unwrap(),
        Progress::Rewritten
    );
    let mut next = PerfMap::default();
    let step = next.update(ProcKey::of_pid(me), me, 15, true).unwrap();
    assert_eq!(
        step,
        Progress::Read {
            bytes: 20,
            done: false
        }
    );
    assert_eq!((next.find(0x2001), next.find(0x3001)), (Some("y"), None));
    assert_eq!(next.read_stamp(), None, "not up to date yet");
    let step = next.update(ProcKey::of_pid(me), me, 15, true).unwrap();
    assert_eq!(
        step,
        Progress::Read {
            bytes: 20,
            done: true
        }
    );
    assert_eq!(next.read_stamp(), stamp(me, me));
    assert_eq!(next.find(0x5001), Some("w"));
    assert_eq!(read(&mut map), 40);
    assert_eq!((map.find(0x1001), map.find(0x4001)), (Some("x"), None));
    std::fs::write(&path, "1000 10 a\n2000 10 b\n").unwrap();

    // Older than the process: an earlier process's with our pid.
    let old = std::fs::File::options().write(true).open(&path).unwrap();
    old.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
        .unwrap();
    drop(old);
    let reason = |r: Result<PerfMap, OpenError>| r.err().and_then(|e| e.reason());
    assert_eq!(reason(PerfMap::read(me, me)), Some(Reason::Stale));

    std::fs::remove_file(&path).unwrap();
    let target = std::path::PathBuf::from(format!("/tmp/perf-target-{me}"));
    std::fs::write(&target, "1000 10 secret\n").unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    assert_eq!(reason(PerfMap::read(me, me)), Some(Reason::Symlink));
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&target).unwrap();

    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert_eq!(reason(PerfMap::read(me, me)), Some(Reason::WrongType));
    std::fs::remove_file(&path).unwrap();

    std::fs::File::create(&path)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    assert_eq!(reason(PerfMap::read(me, me)), Some(Reason::TooBig));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(PerfMap::read(me, me), Err(OpenError::Io(_))));
}
