//! What a block costs: sizes against the slice's estimate, bytes per row,
//! zstd levels, encode and decode times. Run with
//! `cargo test --lib block::tests::measure -- --ignored --nocapture`
//! (figures from an optimized build mean more: see the report).

use std::time::{Duration, Instant};

use super::{
    super::{decode, decode_standalone, encode, encode_standalone, peek},
    slices::{busy, Ids},
    with_body,
};
use crate::{
    profile::model::state::State,
    profile::model::{size, Slice},
};

/// Median time of `f` over `runs` runs.
fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn rows(s: &Slice) -> usize {
    s.samples.len()
        + s.wakeups.len()
        + s.thread_totals.len()
        + s.threads.len()
        + s.kept_off.len()
        + s.sleeps.len()
        + s.runq_hists.len()
}

fn report(label: &str, s: &Slice) {
    let raw = size::slice_bytes(s);
    let mut ids = Ids::default();
    let (by_ids, standalone) = (encode(s, &mut ids), encode_standalone(s));
    let mut distinct = std::collections::HashSet::new();
    let stacks: usize = s
        .samples
        .iter()
        .map(|r| &r.stack)
        .chain(s.wakeups.iter().map(|r| &r.stack))
        .filter(|st| distinct.insert(std::sync::Arc::as_ptr(st) as *const u8 as usize))
        .map(size::stack_bytes)
        .sum();
    let n = rows(s);
    println!(
        "{label}: {n} rows ({} samples, {} wakeups, {} totals), {} distinct stacks",
        s.samples.len(),
        s.wakeups.len(),
        s.thread_totals.len(),
        distinct.len()
    );
    println!("  size::slice_bytes {raw} B (+ {stacks} B of stack arrays in the table)");
    for (kind, block) in [("by ids", &by_ids), ("standalone", &standalone)] {
        let h = peek(block).unwrap();
        println!(
            "  {kind}: {} B ({:.2} B/row, {:.1}x smaller than slice_bytes), body {} B before zstd",
            block.len(),
            block.len() as f64 / n as f64,
            raw as f64 / block.len() as f64,
            h.raw_bytes
        );
    }
    let enc = median(21, || drop(encode(s, &mut ids)));
    let dec = median(21, || drop(decode(&by_ids, &ids).unwrap()));
    let enc_sa = median(21, || drop(encode_standalone(s)));
    let dec_sa = median(21, || drop(decode_standalone(&standalone).unwrap()));
    println!("  by ids: encode {enc:?}, decode {dec:?}; standalone: encode {enc_sa:?}, decode {dec_sa:?}");
    for (kind, block) in [("by ids", &by_ids), ("standalone", &standalone)] {
        let mut body = Vec::new();
        with_body(block, |b| body = b.clone());
        let levels: Vec<String> = [1, 3, 6, 9, 19]
            .iter()
            .map(|&level| {
                let mut z = Vec::new();
                let t = median(5, || z = zstd::bulk::compress(&body, level).unwrap());
                format!("{level}: {} B {t:?}", z.len())
            })
            .collect();
        println!(
            "  zstd levels ({kind}, body {} B): {}",
            body.len(),
            levels.join(", ")
        );
    }
}

/// Bytes of each part of a slice, as a standalone block of that part
/// alone less an empty block's.
fn by_part(s: &Slice) {
    let empty = Slice::empty(s.start, s.end);
    let size = |part: Slice| encode_standalone(&part).len() - encode_standalone(&empty).len();
    let parts = [
        (
            "samples",
            Slice {
                samples: s.samples.clone(),
                ..empty.clone()
            },
        ),
        (
            "wakeups",
            Slice {
                wakeups: s.wakeups.clone(),
                ..empty.clone()
            },
        ),
        (
            "totals",
            Slice {
                thread_totals: s.thread_totals.clone(),
                ..empty.clone()
            },
        ),
        (
            "threads",
            Slice {
                threads: s.threads.clone(),
                ..empty.clone()
            },
        ),
        (
            "hists",
            Slice {
                runq_hists: s.runq_hists.clone(),
                ..empty.clone()
            },
        ),
        (
            "kept_off+sleeps",
            Slice {
                kept_off: s.kept_off.clone(),
                sleeps: s.sleeps.clone(),
                ..empty.clone()
            },
        ),
        (
            "processes+origins+containers",
            Slice {
                processes: s.processes.clone(),
                origins: s.origins.clone(),
                containers: s.containers.clone(),
                ..empty.clone()
            },
        ),
    ];
    let sizes: Vec<String> = parts
        .into_iter()
        .map(|(name, part)| format!("{name} {} B", size(part)))
        .collect();
    println!(
        "  standalone by part: empty {} B, {}",
        encode_standalone(&empty).len(),
        sizes.join(", ")
    );
}

#[test]
#[ignore = "a measurement: prints figures, checks nothing"]
fn measure_block_costs() {
    report("busy 1-s slice", &busy(42));
    by_part(&busy(42));
    // Idle: the same 300 threads asleep the whole second, nothing else.
    let mut idle = busy(42);
    idle.samples.clear();
    idle.wakeups.clear();
    idle.kept_off.clear();
    idle.sleeps.clear();
    idle.runq_hists.clear();
    for t in &mut idle.thread_totals {
        t.counters = Default::default();
        t.counters.ns[State::Futex as usize] = 1_000_000_000 + u64::from(t.tid % 7) * 1000;
    }
    idle.samples.shrink_to_fit();
    idle.wakeups.shrink_to_fit();
    idle.kept_off.shrink_to_fit();
    idle.sleeps.shrink_to_fit();
    idle.runq_hists.shrink_to_fit();
    report("idle 1-s slice", &idle);
}
