//! Blocks: a sealed [`Slice`] as compressed columnar bytes, and back,
//! exactly.
//!
//! A block is a small uncompressed header (magic, version, what the block
//! holds, its time span and row counts, its stack table's size) then the
//! body compressed with zstd, then a CRC-32 of everything before it. The
//! body holds the rows section by section, each sorted by its keys and
//! written field by field (pids as runs, tids and peers as deltas, values
//! as varints), which zstd then shrinks further.
//!
//! Stacks are a table of the block's distinct stacks that rows index: ids
//! into the store's interned table for blocks kept in memory ([`encode`]),
//! or frame names and frame indices for blocks written to disk
//! ([`encode_standalone`]), readable without the store.
//!
//! Decoding trusts nothing: every count is checked against the bytes left
//! and a budget of [`MAX_DECODED_BYTES`] before anything is allocated, and
//! a block that is truncated, flipped or of another version is a
//! [`CodecError`].

mod columns;
mod names;
mod packing;
mod rows;
mod stacks;
#[cfg(test)]
mod tests;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use columns::{Budget, Col, Reader};
use names::{count, Strings};

use super::{Slice, Stack};
use crate::profile::model::state::{State, HIST_SLOTS, SLEEP_SLOTS, STAT_COUNTERS};

pub use names::RUNTIMES;

/// Gives each distinct stack an id when encoding a block kept in memory
/// (the store's interned, reference-counted table). Called once per
/// distinct stack allocation of the slice (equal stacks behind two
/// allocations are asked twice and should get one id).
pub trait StackIds {
    fn id_of(&mut self, stack: &Stack) -> u32;
}

/// Resolves ids back when decoding; `None` makes the block corrupt (an
/// error, never a panic).
pub trait StackSource {
    fn stack(&self, id: u32) -> Option<Stack>;
}

/// Why a block could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("not a history block")]
    Magic,
    #[error("block format version {0} is not known")]
    Version(u8),
    #[error("block holds its stacks the other way (ids or standalone)")]
    Mode,
    #[error("block checksum mismatch: torn or corrupt")]
    Checksum,
    #[error("block truncated")]
    Truncated,
    #[error("corrupt block: {0}")]
    Corrupt(&'static str),
    #[error("block has more states or slots than this build")]
    Shape,
    #[error("block too large to decode")]
    TooLarge,
    #[error("block names stack id {0}, which the store does not hold")]
    UnknownStack(u32),
    #[error("block names container runtime {0:?}, not a known one")]
    Runtime(String),
    #[error("block body does not decompress")]
    Compression,
}

/// The four bytes a block starts with.
const MAGIC: [u8; 4] = *b"WSBK";
/// The format written; bumped whenever the layout changes.
const VERSION: u8 = 2;
/// The oldest format still read: version 1 has no section of identities
/// (its processes read without command lines and v1 cgroups).
const OLDEST_VERSION: u8 = 1;
/// Most bytes a body may decompress to.
pub const MAX_RAW_BYTES: usize = 16 << 20;
/// Most bytes decoding a block may allocate for the slice it returns
/// (counted as [`super::size`] counts a slice's rows): far above any block
/// the store makes (its default bound is 32 MiB for everything), far below
/// what a hostile one could otherwise ask for.
pub const MAX_DECODED_BYTES: usize = 64 << 20;

/// How the block's body is stored.
const STORED: u8 = 0;
const ZSTD: u8 = 1;
/// How the block holds its stacks.
const BY_IDS: u8 = 0;
const STANDALONE: u8 = 1;

/// Row counts of a block, by section.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rows {
    pub samples: usize,
    pub wakeups: usize,
    pub threads: usize,
    pub thread_totals: usize,
    pub runq_hists: usize,
    pub processes: usize,
    pub containers: usize,
    pub origins: usize,
    pub kept_off: usize,
    pub sleeps: usize,
}

impl Rows {
    fn of(s: &Slice) -> Rows {
        Rows {
            samples: s.samples.len(),
            wakeups: s.wakeups.len(),
            threads: s.threads.len(),
            thread_totals: s.thread_totals.len(),
            runq_hists: s.runq_hists.len(),
            processes: s.processes.len(),
            containers: s.containers.len(),
            origins: s.origins.len(),
            kept_off: s.kept_off.len(),
            sleeps: s.sleeps.len(),
        }
    }

    fn fields(&mut self) -> [&mut usize; 10] {
        [
            &mut self.samples,
            &mut self.wakeups,
            &mut self.threads,
            &mut self.thread_totals,
            &mut self.runq_hists,
            &mut self.processes,
            &mut self.containers,
            &mut self.origins,
            &mut self.kept_off,
            &mut self.sleeps,
        ]
    }
}

/// What a block holds, read without decompressing it ([`peek`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Written by [`encode_standalone`] (else by [`encode`]).
    pub standalone: bool,
    pub start: SystemTime,
    pub end: SystemTime,
    pub rows: Rows,
    /// Distinct stacks in the block's table.
    pub stacks: usize,
    /// Bytes of the body once decompressed.
    pub raw_bytes: usize,
}

/// Lengths of the arrays a block's rows hold, written so that a block
/// from a build with fewer states or slots still reads (as zeros there).
#[derive(Debug, Clone, Copy)]
struct Shape {
    states: usize,
    stats: usize,
    hist_slots: usize,
    sleep_slots: usize,
}

const SHAPE: Shape = Shape {
    states: State::COUNT,
    stats: STAT_COUNTERS,
    hist_slots: HIST_SLOTS,
    sleep_slots: SLEEP_SLOTS,
};

/// For blocks kept in memory: stacks as ids of `ids`.
///
/// Rows decode sorted by their keys (pid, tid, ...), not in the slice's
/// order. A slice decodes as long as its body stays within
/// [`MAX_RAW_BYTES`] and its rows and stacks within [`MAX_DECODED_BYTES`]
/// (as [`super::size`] counts them): a million rows or so, far beyond any
/// slice the store holds.
pub fn encode(slice: &Slice, ids: &mut dyn StackIds) -> Vec<u8> {
    let (table, ids) = stacks::by_ids(slice, ids);
    let mut head = Col::default();
    stacks::put_ids(&ids, &mut head);
    seal(slice, BY_IDS, &table, head, Col::default())
}

/// For blocks written to disk: self-contained, with a block-local
/// dictionary of frame names and stacks as lists of frame indices.
pub fn encode_standalone(slice: &Slice) -> Vec<u8> {
    let mut frames = Strings::default();
    let (table, n, section) = stacks::standalone(slice, &mut frames);
    let (mut head, mut body) = (Col::default(), Col::default());
    head.u64(n as u64);
    frames.put(&mut body);
    body.0.extend_from_slice(&section.0);
    seal(slice, STANDALONE, &table, head, body)
}

/// Which rows a decode makes: all of them, or those concerning one
/// process (its samples, thread totals, blocked intervals, culprit times
/// and histograms, the wakeups it sent or received, and the names of the
/// threads those rows name), for a snapshot narrowed to it. The other
/// rows are read past, checked, but never allocated: on a host of 10,000
/// threads a block is mostly other processes' thread totals and names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    All,
    Process(u32),
}

impl Keep {
    fn pid(self, pid: u32) -> bool {
        match self {
            Keep::All => true,
            Keep::Process(p) => p == pid,
        }
    }

    /// `rows` without the room the rows read past took.
    fn shrink<T>(self, mut rows: Vec<T>) -> Vec<T> {
        if self != Keep::All {
            rows.shrink_to_fit();
        }
        rows
    }
}

/// Decodes a block [`encode`] wrote, its stacks from `stacks`.
pub fn decode(bytes: &[u8], stacks: &dyn StackSource) -> Result<Slice, CodecError> {
    decode_keeping(bytes, stacks, Keep::All)
}

/// Decodes the rows `keep` keeps of a block [`encode`] wrote.
pub fn decode_keeping(
    bytes: &[u8],
    stacks: &dyn StackSource,
    keep: Keep,
) -> Result<Slice, CodecError> {
    let mut b = Budget::new(MAX_DECODED_BYTES);
    let mut p = parse(bytes, Some(BY_IDS))?;
    let ids = stacks::get_ids(&mut p.rest, &mut b)?;
    let table = stacks::resolve(&ids, stacks, &mut b)?;
    let raw = inflate(&p)?;
    let mut r = Reader::new(&raw);
    let stats = rows::get_stats(&mut r, &p.shape)?;
    let names = names::get_strings(&mut r, &mut b)?;
    fill(&p, (stats, &names, &table), r, (&mut b, keep))
}

/// Decodes a block [`encode_standalone`] wrote.
pub fn decode_standalone(bytes: &[u8]) -> Result<Slice, CodecError> {
    decode_standalone_keeping(bytes, Keep::All)
}

/// Decodes the rows `keep` keeps of a block [`encode_standalone`] wrote.
pub fn decode_standalone_keeping(bytes: &[u8], keep: Keep) -> Result<Slice, CodecError> {
    let mut b = Budget::new(MAX_DECODED_BYTES);
    let mut p = parse(bytes, Some(STANDALONE))?;
    let n = count(p.rest.u64()?)?;
    let raw = inflate(&p)?;
    let mut r = Reader::new(&raw);
    let stats = rows::get_stats(&mut r, &p.shape)?;
    let names = names::get_strings(&mut r, &mut b)?;
    let frames = names::get_strings(&mut r, &mut b)?;
    let table = stacks::get_standalone(&mut r, n, &frames, &mut b)?;
    fill(&p, (stats, &names, &table), r, (&mut b, keep))
}

/// A block's header, checksum checked, without decompressing its body.
pub fn peek(bytes: &[u8]) -> Result<Header, CodecError> {
    let mut p = parse(bytes, None)?;
    p.header.stacks = count(p.rest.u64()?)?;
    Ok(p.header)
}

/// The store ids an in-memory block holds, each once (what releasing the
/// block releases), without decompressing its body.
pub fn stack_ids(bytes: &[u8]) -> Result<Vec<u32>, CodecError> {
    let mut p = parse(bytes, Some(BY_IDS))?;
    stacks::get_ids(&mut p.rest, &mut Budget::new(MAX_DECODED_BYTES))
}

fn seal(
    slice: &Slice,
    mode: u8,
    table: &stacks::Table,
    stack_head: Col,
    stack_body: Col,
) -> Vec<u8> {
    let mut names = Strings::default();
    let mut sections = Col::default();
    rows::put_samples(slice, table, &mut sections);
    rows::put_wakeups(slice, table, &mut sections);
    names::put_threads(slice, &mut names, &mut sections);
    rows::put_totals(slice, &mut names, &mut sections);
    rows::put_hists(slice, &mut sections);
    names::put_processes(slice, &mut names, &mut sections);
    names::put_containers(slice, &mut names, &mut sections);
    rows::put_kept_off(slice, &mut sections);
    rows::put_sleeps(slice, &mut sections);
    names::put_identities(slice, &mut names, &mut sections);
    // The names first: sections index them.
    let mut body = Col::default();
    rows::put_stats(slice, &mut body);
    names.put(&mut body);
    body.0.extend_from_slice(&stack_body.0);
    body.0.extend_from_slice(&sections.0);

    let (how, payload) = match packing::compress(&body.0) {
        Some(z) if z.len() < body.0.len() => (ZSTD, z),
        _ => (STORED, body.0.clone()),
    };
    let mut out = Col(Vec::with_capacity(payload.len() + stack_head.0.len() + 64));
    let times = (slice.start, slice.end);
    put_header(&mut out, (mode, how), times, Rows::of(slice), body.0.len());
    out.0.extend_from_slice(&stack_head.0);
    out.0.extend_from_slice(&payload);
    let crc = crc32fast::hash(&out.0);
    out.0.extend_from_slice(&crc.to_le_bytes());
    out.0
}

/// The header's fields, up to the stack table's head.
fn put_header(
    out: &mut Col,
    (mode, how): (u8, u8),
    (start, end): (SystemTime, SystemTime),
    mut rows: Rows,
    raw_bytes: usize,
) {
    out.0.extend_from_slice(&MAGIC);
    out.0.extend_from_slice(&[VERSION, mode, how]);
    let shape = [SHAPE.states, SHAPE.stats, SHAPE.hist_slots];
    for v in shape.into_iter().chain([SHAPE.sleep_slots]) {
        out.u64(v as u64);
    }
    put_time(out, start);
    put_time(out, end);
    for n in rows.fields() {
        out.u64(*n as u64);
    }
    out.u64(raw_bytes as u64);
}

/// Checks the checksum, magic, version and (when given) the mode, and
/// reads the header. `stacks` is left 0: its count opens the rest (the
/// stack table's head, then the body).
fn parse(bytes: &[u8], mode: Option<u8>) -> Result<Parsed<'_>, CodecError> {
    let Some((data, crc)) = bytes.split_last_chunk::<4>() else {
        return Err(CodecError::Truncated);
    };
    if !data.starts_with(&MAGIC) {
        return Err(CodecError::Magic);
    }
    if crc32fast::hash(data) != u32::from_le_bytes(*crc) {
        return Err(CodecError::Checksum);
    }
    let mut r = Reader::new(&data[MAGIC.len()..]);
    let version = r.u8()?;
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(CodecError::Version(version));
    }
    let (block_mode, how) = (r.u8()?, r.u8()?);
    if block_mode > STANDALONE || how > ZSTD || mode.is_some_and(|m| m != block_mode) {
        return Err(CodecError::Mode);
    }
    let mut dims = [0usize; 4];
    for d in &mut dims {
        *d = count(r.u64()?)?;
    }
    let shape = Shape {
        states: dims[0],
        stats: dims[1],
        hist_slots: dims[2],
        sleep_slots: dims[3],
    };
    if shape.states > SHAPE.states
        || shape.stats > SHAPE.stats
        || shape.hist_slots > SHAPE.hist_slots
        || shape.sleep_slots > SHAPE.sleep_slots
    {
        return Err(CodecError::Shape);
    }
    let (start, end) = (get_time(&mut r)?, get_time(&mut r)?);
    let mut rows = Rows::default();
    for n in rows.fields() {
        *n = count(r.u64()?)?;
    }
    let raw_bytes = count(r.u64()?)?;
    if raw_bytes > MAX_RAW_BYTES {
        return Err(CodecError::TooLarge);
    }
    let header = Header {
        standalone: block_mode == STANDALONE,
        start,
        end,
        rows,
        stacks: 0,
        raw_bytes,
    };
    Ok(Parsed {
        header,
        version,
        shape,
        zstd: how == ZSTD,
        rest: r,
    })
}

/// A header read by [`parse`], and the bytes after it.
struct Parsed<'a> {
    header: Header,
    version: u8,
    shape: Shape,
    /// Whether the body is compressed (else stored as is).
    zstd: bool,
    rest: Reader<'a>,
}

/// The body of a parsed block, of exactly the bytes its header declares
/// (at most [`MAX_RAW_BYTES`], checked by [`parse`]).
fn inflate(p: &Parsed) -> Result<Vec<u8>, CodecError> {
    let payload = p.rest.rest();
    match (p.zstd, payload.len() == p.header.raw_bytes) {
        (true, _) => packing::decompress(payload, p.header.raw_bytes),
        (false, true) => Ok(payload.to_vec()),
        (false, false) => Err(CodecError::Corrupt("stored body length")),
    }
}

/// The rest of a slice: its sections, in the order [`seal`] wrote them.
fn fill(
    p: &Parsed,
    (stats, names, stacks): (crate::profile::model::StatDeltas, &names::Names, &[Stack]),
    mut r: Reader,
    (b, keep): (&mut Budget, Keep),
) -> Result<Slice, CodecError> {
    let (h, shape) = (&p.header, &p.shape);
    let n = h.rows;
    let samples = rows::get_samples(&mut r, n.samples, stacks, (b, keep))?;
    let wakeups = rows::get_wakeups(&mut r, n.wakeups, stacks, (b, keep))?;
    // The threads named: the process's own, and the other side of its
    // wakeups.
    let peers: rustc_hash::FxHashSet<u32> = match keep {
        Keep::All => Default::default(),
        Keep::Process(_) => wakeups.iter().flat_map(|w| [w.tid, w.peer_tid]).collect(),
    };
    let named = |pid, tid| keep.pid(pid) || peers.contains(&tid);
    let threads = names::get_threads(&mut r, n.threads, names, b, named)?;
    let span = rows::span_ns(&Slice::empty(h.start, h.end));
    let thread_totals = rows::get_totals(&mut r, (n.thread_totals, shape, span), names, (b, keep))?;
    let runq_hists = rows::get_hists(&mut r, (n.runq_hists, shape), (b, keep))?;
    let (processes, origins) = names::get_processes(&mut r, (n.processes, n.origins), names, b)?;
    let containers = names::get_containers(&mut r, n.containers, names, b)?;
    let kept_off = rows::get_kept_off(&mut r, n.kept_off, (b, keep))?;
    let sleeps = rows::get_sleeps(&mut r, (n.sleeps, shape), (b, keep))?;
    let mut origins = origins;
    if p.version >= 2 {
        names::get_identities(&mut r, &mut origins, names, b)?;
    }
    r.finish()?;
    Ok(Slice {
        start: h.start,
        end: h.end,
        samples,
        wakeups,
        threads,
        thread_totals,
        runq_hists,
        processes,
        containers,
        origins,
        kept_off,
        sleeps,
        stats,
        // History blocks do not hold spans: they live in memory only.
        spans: Default::default(),
    })
}

/// A time as signed seconds since the epoch (zigzag) and nanoseconds.
fn put_time(out: &mut Col, t: SystemTime) {
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        // Before the epoch: floor seconds and a positive remainder.
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n),
            }
        }
    };
    out.i64(secs);
    out.u64(nanos.into());
}

fn get_time(r: &mut Reader) -> Result<SystemTime, CodecError> {
    let (secs, nanos) = (r.i64()?, r.u32()?);
    if nanos >= 1_000_000_000 {
        return Err(CodecError::Corrupt("nanoseconds"));
    }
    let whole = Duration::from_secs(secs.unsigned_abs());
    let t = match secs >= 0 {
        true => UNIX_EPOCH.checked_add(whole),
        false => UNIX_EPOCH.checked_sub(whole),
    };
    t.and_then(|t| t.checked_add(Duration::from_nanos(nanos.into())))
        .ok_or(CodecError::Corrupt("time out of range"))
}
