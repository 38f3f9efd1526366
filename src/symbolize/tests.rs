//! The frame cache as the symbolizer uses it: stacks of this very process,
//! in libc (a file small enough to be symbolized whatever the budget).

use std::{
    os::fd::AsRawFd,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::Symbolizer;
use crate::{
    collect::{RawBatch, RawRecord, RawStack, RecordKind},
    profile::model::state::{State, STAT_COUNTERS},
};

/// A batch of one on-CPU record of this process with `stack`.
fn batch(stack: &[u64]) -> RawBatch {
    let stack: RawStack = Arc::from(stack);
    RawBatch {
        end: SystemTime::now(),
        interval: Duration::from_secs(1),
        records: vec![RawRecord {
            pid: std::process::id(),
            tid: std::process::id(),
            kind: RecordKind::Time(State::Cpu),
            comm: "test".into(),
            syscall: None,
            user_stack: Some(stack),
            kernel_stack: None,
            ns: 1_000,
            count: 1,
            span: None,
        }],
        threads: Vec::new(),
        runq_hists: Vec::new(),
        kept_off: Vec::new(),
        sleeps: Vec::new(),
        live: Vec::new(),
        span_times: Vec::new(),
        span_records: Vec::new(),
        stats: [0; STAT_COUNTERS],
        missing_stacks: 0,
        drain_time: Duration::ZERO,
    }
}

/// The frames `stack` is named with, outermost first.
fn names(s: &mut Symbolizer, stack: &[u64]) -> Vec<String> {
    let named = s.symbolize(batch(stack));
    named.slice.samples[0]
        .stack
        .iter()
        .map(|f| f.to_string())
        .collect()
}

/// The mapping of this process holding `addr`: its start, file offset
/// and path.
fn mapping_of(addr: u64) -> (u64, u64, PathBuf) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (start, end) = fields[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        if (start..end).contains(&addr) && fields.len() >= 6 {
            let offset = u64::from_str_radix(fields[2], 16).unwrap();
            return (start, offset, PathBuf::from(fields[5]));
        }
    }
    panic!("{addr:#x} is in no file mapping");
}

/// Callers' frames hold return addresses (looked up less one).
fn libc_stack() -> Vec<u64> {
    let leaf = libc::getpid as *const () as u64;
    let callers = [
        libc::write as *const () as u64,
        libc::read as *const () as u64,
    ];
    let (_, _, path) = mapping_of(leaf);
    assert!(path.to_string_lossy().contains("libc"), "{path:?}");
    std::iter::once(leaf)
        .chain(callers.iter().map(|a| a + 1))
        .collect()
}

#[test]
fn a_second_batch_of_the_same_stacks_asks_no_file() {
    let stack = libc_stack();
    let mut s = Symbolizer::new();
    let first = names(&mut s, &stack);
    let after_first = s.cache_stats();
    assert!(first.last().unwrap().ends_with("getpid"), "{first:?}");
    assert!(first.iter().any(|f| f.contains("write")), "{first:?}");
    assert!(after_first.elf_lookups > 0 && after_first.misses >= 3);
    for _ in 0..3 {
        // A new batch, new records, the same addresses.
        assert_eq!(names(&mut s, &stack), first);
    }
    let after = s.cache_stats();
    assert_eq!(
        (after.elf_parses, after.elf_lookups, after.misses),
        (
            after_first.elf_parses,
            after_first.elf_lookups,
            after_first.misses
        ),
        "no file looked up again"
    );
    assert_eq!(after.hits, after_first.hits + 3 * 3);
    assert!(after.bytes > 0 && after.bytes <= after.max_bytes);
}

#[test]
fn a_file_rewritten_in_place_is_not_served_its_old_names() {
    let getpid = libc::getpid as *const () as u64;
    let (start, offset, libc_path) = mapping_of(getpid);
    let in_file = getpid - start + offset;
    // Next to the test binary: /tmp may not allow executable mappings.
    let exe = std::env::current_exe().unwrap();
    let dir = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
    let copy = dir.path().join("libcopy.so");
    std::fs::copy(&libc_path, &copy).unwrap();
    let len = std::fs::metadata(&copy).unwrap().len() as usize;
    let file = std::fs::File::open(&copy).unwrap();
    // SAFETY: a fresh private mapping of a file, never executed, unmapped
    // below; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let stack = [base as u64 + in_file];
    let mut s = Symbolizer::new();
    let before = names(&mut s, &stack);
    assert!(before[0].ends_with("getpid"), "{before:?}");
    assert_eq!(names(&mut s, &stack), before, "served from the cache");
    let hits = s.cache_stats().hits;
    // The same inode, other contents (and size): no ELF any more.
    std::fs::write(&copy, vec![0u8; len + 1]).unwrap();
    let after = names(&mut s, &stack);
    // SAFETY: the mapping made above, of `len` bytes.
    unsafe { libc::munmap(base, len) };
    assert!(after[0].starts_with("libcopy.so+0x"), "{after:?}");
    let stats = s.cache_stats();
    assert_eq!(stats.hits, hits, "the old name was not served");
    assert!(stats.invalidated >= 1, "{stats:?}");
}

/// Key names of one process, for the span test.
struct Names(u32);

impl crate::collect::spans::SpanKeyNames for Names {
    fn names(&self, pid: u32) -> Option<Arc<[Arc<str>]>> {
        (pid == self.0).then(|| Arc::from(vec![Arc::<str>::from("http.route")]))
    }
}

/// A row under a span is a sample as ever and the span's sample too, with
/// the same stack; times pass as they are; records get their names.
#[test]
fn rows_under_a_span_are_also_the_spans() {
    use crate::collect::spans::RawSpanRecord;
    use crate::profile::model::spans::{SpanId, SpanTime, TraceId};

    let pid = std::process::id();
    let span = SpanId::from_raw(0x1122).unwrap();
    let mut b = batch(&libc_stack());
    let mut other = b.records[0].clone();
    b.records[0].span = Some(span);
    other.kind = RecordKind::Time(State::Futex);
    b.records.push(other);
    let time = SpanTime {
        pid,
        tid: pid,
        span,
        ns: [1, 2, 3, 4, 5, 6],
        first_ns: 7,
        last_ns: 8,
    };
    b.span_times.push(time.clone());
    let record = |pid| RawSpanRecord {
        pid,
        span,
        trace: TraceId([3; 16]),
        flags: 1,
        attrs_size: 3,
        attrs: vec![0, 1, b'/'],
    };
    b.span_records = vec![record(pid), record(pid + 1)];
    let mut s = Symbolizer::new();
    s.set_span_key_names(Arc::new(Names(pid)));
    let slice = s.symbolize(b).slice;
    assert_eq!(slice.samples.len(), 2);
    let spans = &slice.spans;
    assert_eq!(spans.samples.len(), 1);
    let (row, under) = (&slice.samples[0], &spans.samples[0]);
    assert_eq!((under.pid, under.tid, under.span), (row.pid, row.tid, span));
    assert_eq!(
        (under.state, under.ns, under.count),
        (row.state, row.ns, row.count)
    );
    assert_eq!(under.stack, row.stack);
    assert_eq!(spans.times, vec![time]);
    let attrs: Vec<_> = spans.records.iter().map(|r| r.attrs.clone()).collect();
    assert_eq!(attrs[0], vec![("http.route".into(), "/".into())]);
    assert_eq!(attrs[1], vec![("#0".into(), "/".into())]);
}
