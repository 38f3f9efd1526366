//! Round trips of both kinds of block, what they share after decoding,
//! and what they refuse. Slices are compared through a canonical, sorted
//! form ([`canon`]): the codec writes rows sorted, not in their order.

mod fuzz;
mod measure;
pub mod slices;

use std::sync::Arc;

use super::*;
use crate::profile::model::{Frame, HistOwner, Slice};
use slices::{busy, edges, Ids};

/// Every field of a slice, rows sorted, stacks as their frames' names.
pub fn canon(s: &Slice) -> String {
    fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
        v.sort();
        v
    }
    let frames = |st: &Stack| st.iter().map(|f| f.to_string()).collect::<Vec<_>>();
    let samples = sorted(
        s.samples
            .iter()
            .map(|r| (r.pid, r.tid, r.state, frames(&r.stack), r.ns, r.count))
            .collect(),
    );
    let wakeups = sorted(
        s.wakeups
            .iter()
            .map(|r| {
                let irq = format!("{:?}", r.interrupt);
                (
                    r.pid,
                    r.tid,
                    irq,
                    r.peer_pid,
                    r.peer_tid,
                    frames(&r.stack),
                    r.ns,
                    r.count,
                )
            })
            .collect(),
    );
    let threads = sorted(
        s.threads
            .iter()
            .map(|(k, t)| (*k, t.pid, t.name.to_string()))
            .collect(),
    );
    let totals = sorted(
        s.thread_totals
            .iter()
            .map(|t| (t.pid, t.tid, t.comm.clone(), format!("{:?}", t.counters)))
            .collect(),
    );
    let hists = sorted(
        s.runq_hists
            .iter()
            .map(|(o, h)| (*o, format!("{h:?}")))
            .collect(),
    );
    let by_key = |m: Vec<(u32, String)>| sorted(m);
    let processes = by_key(
        s.processes
            .iter()
            .map(|(k, v)| (*k, v.to_string()))
            .collect(),
    );
    let containers = by_key(
        s.containers
            .iter()
            .map(|(k, v)| (*k, format!("{v:?}")))
            .collect(),
    );
    let origins = by_key(
        s.origins
            .iter()
            .map(|(k, v)| (*k, format!("{v:?}")))
            .collect(),
    );
    let kept = sorted(
        s.kept_off
            .iter()
            .map(|k| (k.pid, k.tid, k.by, k.ns))
            .collect(),
    );
    let sleeps = sorted(s.sleeps.iter().map(|k| (k.pid, k.tid, k.slots)).collect());
    format!(
        "{:?}",
        (
            (s.start, s.end, s.stats),
            (samples, wakeups, threads, totals, hists),
            (processes, containers, origins, kept, sleeps),
        )
    )
}

fn round_trips(s: &Slice) {
    let mut ids = Ids::default();
    let block = encode(s, &mut ids);
    let back = decode(&block, &ids).unwrap();
    assert_eq!(canon(&back), canon(s), "by ids");
    let back = decode_standalone(&encode_standalone(s)).unwrap();
    assert_eq!(canon(&back), canon(s), "standalone");
}

/// `s` as a decode keeping `pid`'s rows gives it back.
fn kept_of(s: &Slice, pid: u32) -> Slice {
    let mut want = s.clone();
    want.samples.retain(|r| r.pid == pid);
    want.wakeups.retain(|w| w.pid == pid || w.peer_pid == pid);
    let peers: Vec<u32> = want
        .wakeups
        .iter()
        .flat_map(|w| [w.tid, w.peer_tid])
        .collect();
    want.threads
        .retain(|tid, t| t.pid == pid || peers.contains(tid));
    want.thread_totals.retain(|t| t.pid == pid);
    want.runq_hists.retain(
        |(o, _)| matches!(o, HistOwner::Process(p) | HistOwner::ProcessThrottled(p) if *p == pid),
    );
    want.kept_off.retain(|k| k.pid == pid);
    want.sleeps.retain(|k| k.pid == pid);
    want
}

#[test]
fn a_decode_keeping_one_process_reads_past_the_others_rows() {
    for s in [busy(7), edges()] {
        let mut ids = Ids::default();
        let block = encode(&s, &mut ids);
        let standalone = encode_standalone(&s);
        let mut pids: Vec<u32> = s.samples.iter().map(|r| r.pid).collect();
        pids.extend(s.thread_totals.iter().map(|t| t.pid));
        pids.extend(s.wakeups.iter().map(|w| w.peer_pid));
        pids.sort_unstable();
        pids.dedup();
        assert!(pids.len() >= 2, "{pids:?}");
        for pid in pids {
            let want = canon(&kept_of(&s, pid));
            let got = decode_keeping(&block, &ids, Keep::Process(pid)).unwrap();
            assert_eq!(canon(&got), want, "pid {pid}, by ids");
            let got = decode_standalone_keeping(&standalone, Keep::Process(pid)).unwrap();
            assert_eq!(canon(&got), want, "pid {pid}, standalone");
        }
    }
}

#[test]
fn an_empty_slice_round_trips() {
    let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
    round_trips(&Slice::empty(t, t + Duration::from_nanos(999_999_999)));
}

#[test]
fn every_field_and_variant_round_trips() {
    round_trips(&edges());
}

#[test]
fn a_busy_slice_round_trips() {
    round_trips(&busy(7));
}

#[test]
fn times_before_the_epoch_and_far_ahead_round_trip() {
    for (start, end) in [
        (
            UNIX_EPOCH - Duration::new(5, 1),
            UNIX_EPOCH + Duration::new(0, 1),
        ),
        (UNIX_EPOCH - Duration::new(5, 0), UNIX_EPOCH),
        (
            UNIX_EPOCH + Duration::new(1 << 40, 999_999_999),
            UNIX_EPOCH + Duration::new(1 << 41, 0),
        ),
    ] {
        let back = decode_standalone(&encode_standalone(&Slice::empty(start, end))).unwrap();
        assert_eq!((back.start, back.end), (start, end));
    }
}

#[test]
fn equal_names_share_one_allocation_after_decoding() {
    let s = edges();
    for back in [decode_standalone(&encode_standalone(&s)).unwrap(), {
        let mut ids = Ids::default();
        decode(&encode(&s, &mut ids), &ids).unwrap()
    }] {
        let name = |pid| back.processes[&pid].clone();
        let thread = back.threads.values().find(|t| *t.name == *name(1)).unwrap();
        assert!(
            Arc::ptr_eq(&thread.name, &name(1)),
            "a thread named like its process"
        );
        let (a, b) = (&back.containers[&1], &back.containers[&2]);
        assert!(Arc::ptr_eq(a, b), "one container, two processes");
        let stacks: Vec<&Stack> = back.samples.iter().map(|r| &r.stack).collect();
        let mains: Vec<&Frame> = stacks
            .iter()
            .filter_map(|st| st.first())
            .filter(|f| ***f == *"main")
            .collect();
        assert!(mains.len() > 1 && mains.windows(2).all(|w| Arc::ptr_eq(w[0], w[1])));
    }
}

#[test]
fn ids_are_asked_once_per_stack_and_listed_in_the_header() {
    let s = busy(3);
    let mut ids = Ids::default();
    let block = encode(&s, &mut ids);
    let distinct: std::collections::HashSet<usize> = s
        .samples
        .iter()
        .map(|r| &r.stack)
        .chain(s.wakeups.iter().map(|r| &r.stack))
        .map(|st| Arc::as_ptr(st) as *const Frame as usize)
        .collect();
    assert_eq!(ids.calls, distinct.len());
    let mut listed = stack_ids(&block).unwrap();
    assert!(listed.windows(2).all(|w| w[0] < w[1]));
    listed.sort_unstable();
    let mut given: Vec<u32> = ids.by_content.values().copied().collect();
    given.sort_unstable();
    assert_eq!(listed, given);
    let h = peek(&block).unwrap();
    assert_eq!(
        (h.stacks, h.rows, h.standalone),
        (listed.len(), Rows::of(&s), false)
    );
    assert_eq!((h.start, h.end), (s.start, s.end));
}

#[test]
fn a_stack_the_store_lost_is_an_error() {
    let s = busy(1);
    let mut ids = Ids::default();
    let block = encode(&s, &mut ids);
    let lost = *ids.by_content.values().max().unwrap();
    ids.by_id.remove(&lost);
    assert_eq!(
        decode(&block, &ids).unwrap_err(),
        CodecError::UnknownStack(lost)
    );
}

#[test]
fn blocks_refuse_the_other_mode_a_version_and_a_runtime_they_do_not_know() {
    let s = edges();
    let mut ids = Ids::default();
    let (by_ids, standalone) = (encode(&s, &mut ids), encode_standalone(&s));
    assert_eq!(decode_standalone(&by_ids).unwrap_err(), CodecError::Mode);
    assert_eq!(decode(&standalone, &ids).unwrap_err(), CodecError::Mode);
    assert!(peek(&standalone).unwrap().standalone);

    let mut next = standalone.clone();
    next[MAGIC.len()] = VERSION + 1;
    assert_eq!(
        decode_standalone(&reseal(next)).unwrap_err(),
        CodecError::Version(VERSION + 1)
    );
    let mut other = standalone.clone();
    other[0] = b'X';
    assert_eq!(decode_standalone(&other).unwrap_err(), CodecError::Magic);
    let mut flipped = standalone.clone();
    flipped[20] ^= 4;
    assert_eq!(
        decode_standalone(&flipped).unwrap_err(),
        CodecError::Checksum
    );

    let mut odd = slices::edges();
    let c = Arc::make_mut(odd.containers.get_mut(&7).unwrap());
    c.runtime = "lxc";
    let err = decode_standalone(&encode_standalone(&odd)).unwrap_err();
    assert_eq!(err, CodecError::Runtime("lxc".into()));
}

#[test]
fn every_truncation_is_an_error() {
    let s = edges();
    let mut ids = Ids::default();
    for block in [encode(&s, &mut ids), encode_standalone(&s)] {
        for len in 0..block.len() {
            let cut = &block[..len];
            assert!(decode(cut, &ids).is_err() && decode_standalone(cut).is_err());
            // Past the checksum too: the parser sees the block end early.
            let resealed = reseal(cut.to_vec());
            assert!(decode(&resealed, &ids).is_err() && decode_standalone(&resealed).is_err());
        }
    }
}

/// The block with its header's row counts changed by `change`.
fn with_rows(block: &[u8], change: impl FnOnce(&mut Rows)) -> Vec<u8> {
    let p = parse(block, None).unwrap();
    let mut rows = p.header.rows;
    change(&mut rows);
    let mut out = Col::default();
    let (mode, how) = (block[MAGIC.len() + 1], block[MAGIC.len() + 2]);
    let times = (p.header.start, p.header.end);
    put_header(&mut out, (mode, how), times, rows, p.header.raw_bytes);
    out.0.extend_from_slice(p.rest.rest());
    out.0.extend_from_slice(&[0; 4]);
    reseal(out.0)
}

#[test]
fn a_block_claiming_more_rows_than_it_holds_is_refused_before_allocating() {
    let block = encode_standalone(&busy(2));
    let same = with_rows(&block, |_| {});
    assert_eq!(canon(&decode_standalone(&same).unwrap()), canon(&busy(2)));
    for change in [
        (|r: &mut Rows| r.samples = 1 << 40) as fn(&mut Rows),
        |r| r.wakeups = usize::MAX,
        |r| r.threads = 1 << 30,
        |r| r.thread_totals += 1,
        |r| r.sleeps -= 1,
        |r| r.containers = 1 << 50,
    ] {
        let err = decode_standalone(&with_rows(&block, change)).unwrap_err();
        assert!(
            matches!(
                err,
                CodecError::Corrupt(_) | CodecError::TooLarge | CodecError::Truncated
            ),
            "{err:?}"
        );
    }
}

/// `bytes` (a block without a valid checksum, or its start) with the
/// checksum recomputed, so that decoding goes past it.
pub fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() >= 4 {
        bytes.truncate(bytes.len() - 4);
    }
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// The block with its body decompressed, changed by `change` and stored
/// as is: what a decoder meets past zstd.
pub fn with_body(block: &[u8], change: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut p = parse(block, None).unwrap();
    let n = p.rest.u64().unwrap();
    if !p.header.standalone {
        for _ in 0..n {
            p.rest.u64().unwrap();
        }
    }
    let mut body = inflate(&p).unwrap();
    let head_len = block.len() - 4 - p.rest.remaining();
    change(&mut body);
    let mut out = block[..head_len].to_vec();
    out[MAGIC.len() + 2] = STORED;
    // Same length or not, the header must say the body's length: rewrite
    // it only when the change kept it (else the decoder refuses anyway).
    out.extend_from_slice(&body);
    out.extend_from_slice(&[0; 4]);
    reseal(out)
}

#[test]
fn a_stored_body_round_trips() {
    let s = edges();
    let back = decode_standalone(&with_body(&encode_standalone(&s), |_| {})).unwrap();
    assert_eq!(canon(&back), canon(&s));
}

/// A block of format 1 (no section of identities) still decodes: a
/// format-2 block of a slice whose origins have none, rewritten as format
/// 1 would have written it (its body stored, without the last section).
#[test]
fn a_version_1_block_still_decodes_without_identities() {
    let mut s = busy(1);
    for o in s.origins.values_mut() {
        o.identity = None;
        o.cgroups_v1 = None;
    }
    let n = s.origins.len();
    assert!(n > 0 && n < 128, "one-byte column lengths: {n}");
    let v2 = encode_standalone(&s);
    let data = &v2[..v2.len() - 4];
    let mut p = parse(&v2, Some(STANDALONE)).unwrap();
    let stacks = p.rest.u64().unwrap();
    let body = inflate(&p).unwrap();
    // Five columns of one byte per origin, two empty ones.
    let section = 5 * (1 + n) + 2;
    let v1_body = &body[..body.len() - section];
    let head_len = data.len() - p.rest.remaining() - {
        let mut c = columns::Col::default();
        c.u64(stacks);
        c.0.len()
    };
    let raw_bytes_len = {
        let mut c = columns::Col::default();
        c.u64(p.header.raw_bytes as u64);
        c.0.len()
    };
    let mut out = columns::Col(data[..head_len - raw_bytes_len].to_vec());
    out.0[MAGIC.len()] = 1;
    out.0[MAGIC.len() + 2] = STORED;
    out.u64(v1_body.len() as u64);
    out.u64(stacks);
    out.0.extend_from_slice(v1_body);
    let v1 = reseal_with_crc(out.0);
    assert_eq!(canon(&decode_standalone(&v1).unwrap()), canon(&s));
    // The same bytes claiming format 2 lack their last section.
    let mut claimed = v1.clone();
    claimed[MAGIC.len()] = VERSION;
    assert!(decode_standalone(&reseal(claimed)).is_err());
}

/// `bytes` with their CRC-32 appended.
fn reseal_with_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}
