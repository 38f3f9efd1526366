//! Which Java methods a pc in a JVM's code cache stands for: the compiled
//! method (nmethod) holding it, found through the code heaps' segment
//! maps, and the chain of methods the JIT inlined at that pc, from the
//! nmethod's pc and scope descriptors (what HotSpot itself reads to
//! deoptimize or print a stack). Read from the JVM's memory at
//! symbolization time, while the nmethod is alive; one that is gone by
//! then leaves the frame to the perf map.

use std::io;

use crate::{
    process::remote::{uint_at, Remote},
    untrusted::refusals::{self, Reason, What},
};

use super::vmstructs::{CodeStart, Layout, MetadataPlace, NmethodData, Vm};

/// Code heaps a JVM has at most (non-profiled, profiled, non-nmethods).
const MAX_HEAPS: u64 = 8;
/// Segment-map bytes read first for one pc: blocks starting up to this
/// many segments back (64 KiB of 64-byte segments) are found in one read.
const SEGMAP_FIRST: u64 = 1024;
/// Segment-map bytes read at most for one pc, in one more read: blocks up
/// to 1 MiB of 64-byte segments (nmethods are at most a few hundred KiB).
/// A map that goes back further (or never reaches a block start, as a
/// forged one may) leaves the pc to the perf map.
const SEGMAP_MAX: u64 = 16 << 10;
/// Largest metadata, pc table or scope data read for one nmethod.
const MAX_DATA: u64 = 1 << 20;
/// Inlining depth followed at most (C2's default limit is 15).
const MAX_SCOPES: usize = 64;

/// How a Java frame ran, as async-profiler marks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// `_[0]`
    Interpreted,
    /// `_[1]`: compiled by C1 (tiers 1-3).
    C1,
    /// `_[j]`: compiled by C2 (or a tier not known).
    Jit,
    /// `_[i]`: inlined into the compiled frame below it.
    Inlined,
}

impl FrameKind {
    /// The suffix FlameGraph palettes colour by.
    pub fn suffix(self) -> &'static str {
        match self {
            FrameKind::Interpreted => "_[0]",
            FrameKind::C1 => "_[1]",
            FrameKind::Jit => "_[j]",
            FrameKind::Inlined => "_[i]",
        }
    }
}

/// One code heap: its address range and segment map.
#[derive(Debug, Clone, Copy)]
pub struct Heap {
    pub(super) low: u64,
    pub(super) high: u64,
    pub(super) segmap: u64,
    pub(super) log2_segment: u32,
}

/// HotSpot's code cache is at most 2 GiB (`ReservedCodeCacheSize`).
const MAX_HEAP_BYTES: u64 = 2 << 30;

impl Heap {
    /// Whether it can be a HotSpot code heap: a range of at most
    /// [`MAX_HEAP_BYTES`] with a segment map, in segments of 16 B to
    /// 64 KiB (`CodeCacheSegmentSize`; a stride of 0 or 1 byte would make
    /// every walk hop through the whole map).
    fn is_plausible(&self) -> bool {
        self.low < self.high
            && self.high - self.low <= MAX_HEAP_BYTES
            && self.segmap != 0
            && (4..=16).contains(&self.log2_segment)
    }
}

/// What one nmethod's frames need, copied out of the JVM.
#[derive(Debug)]
pub struct Nmethod {
    pub compile_id: u32,
    kind: FrameKind,
    method: u64,
    code_begin: u64,
    /// (pc offset from `code_begin`, scope decode offset), by pc offset.
    pcs: Vec<(i64, u64)>,
    scopes: Vec<u8>,
    metadata: Vec<u8>,
}

/// A JVM's code, read through its libjvm's layout.
pub struct JavaCode<'a> {
    pub vm: &'a Vm,
    pub mem: Remote,
}

impl<'a> JavaCode<'a> {
    /// The code of JVM `pid`, laid out as `vm` says.
    pub fn new(vm: &'a Vm, pid: u32) -> JavaCode<'a> {
        Self::with_mem(vm, Remote::new(pid))
    }

    /// The code of the JVM `mem` reads (with its budget).
    pub fn with_mem(vm: &'a Vm, mem: Remote) -> JavaCode<'a> {
        JavaCode { vm, mem }
    }

    fn layout(&self) -> &Layout {
        &self.vm.layout
    }

    fn err(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, what.to_string())
    }

    /// The code heaps, as they are now (they only change at start-up).
    pub fn heaps(&self) -> io::Result<Vec<Heap>> {
        let l = self.layout();
        let array = self.mem.u64(self.vm.bias + l.code_heaps)?;
        let len = l.array_len.read(&self.mem, array)?;
        let data = l.array_data.read(&self.mem, array)?;
        if len > MAX_HEAPS {
            return Err(Self::err("too many code heaps"));
        }
        (0..len)
            .map(|i| {
                let heap = self.mem.u64(data + 8 * i)?;
                let memory = heap + l.heap_memory;
                Ok(Heap {
                    low: l.space_low.read(&self.mem, memory)?,
                    high: l.space_high.read(&self.mem, memory)?,
                    segmap: l.space_low.read(&self.mem, heap + l.heap_segmap)?,
                    log2_segment: l.heap_log2_segment.read(&self.mem, heap)? as u32,
                })
            })
            .filter(|h: &io::Result<Heap>| match h {
                Ok(h) if !h.is_plausible() => {
                    // Forged (or torn while read): neither the symbolizer
                    // nor the BPF walk looks into it, and it is counted.
                    refusals::count_for(What::JvmMemory, Reason::Implausible, self.mem.pid());
                    false
                }
                _ => true,
            })
            .collect()
    }

    /// The interpreter's code range.
    pub fn interpreter(&self) -> io::Result<(u64, u64)> {
        let l = self.layout();
        let queue = self.mem.u64(self.vm.bias + l.interpreter_code)?;
        let start = l.queue_buffer.read(&self.mem, queue)?;
        let size = l.queue_limit.read(&self.mem, queue)?;
        if start == 0 || size == 0 || size > 64 << 20 {
            return Err(Self::err("no interpreter yet"));
        }
        Ok((start, start + size))
    }

    /// The start of the code blob holding `pc`, through its heap's segment
    /// map (0xff: free; else how many segments back the block starts),
    /// and the segment map's address and index it was found from (for
    /// caching). The span of the map the walk needs is read in one call
    /// ([`SEGMAP_FIRST`] bytes), a longer one in one more
    /// ([`SEGMAP_MAX`]), and walked here: a pc costs at most two reads
    /// whatever the map holds.
    pub fn blob_at(&self, heaps: &[Heap], pc: u64) -> Option<u64> {
        let (heap, seg) = segment_of(heaps, pc)?;
        for span in [SEGMAP_FIRST, SEGMAP_MAX] {
            let first = seg.saturating_sub(span - 1);
            let map = self
                .mem
                .bytes(heap.segmap.checked_add(first)?, (seg - first + 1) as usize)
                .ok()?;
            match walk_segmap(&map, (seg - first) as usize) {
                Walk::Start(i) => {
                    let block = heap.low + ((first + i as u64) << heap.log2_segment);
                    return Some(block + self.layout().heap_block_size);
                }
                Walk::Free => return None,
                Walk::Before if first == 0 => return None,
                Walk::Before => {}
            }
        }
        None
    }

    /// The nmethod at `blob`, if that blob is one.
    pub fn nmethod(&self, blob: u64) -> io::Result<Nmethod> {
        let l = self.layout();
        let header = self.mem.bytes(blob, l.nm_header as usize)?;
        let name = self.mem.cstr(l.blob_name.get(&header));
        if name.as_deref() != Some("nmethod") {
            return Err(Self::err("not an nmethod"));
        }
        let code_begin = match l.blob_code {
            CodeStart::Pointer(f) => f.get(&header),
            CodeStart::Offset(f) => blob + f.get(&header),
        };
        let (metadata, scopes, pcs) = self.sections(blob, &header)?;
        let kind = match l.nm_comp_level.map(|f| f.get(&header) as i8) {
            Some(1..=3) => FrameKind::C1,
            _ => FrameKind::Jit,
        };
        let size = l.pc_desc_size as usize;
        let mut table: Vec<(i64, u64)> = pcs
            .chunks_exact(size)
            .map(|d| {
                (
                    i64::from(l.pc_offset.get(d) as u32 as i32),
                    l.pc_scope_offset.get(d),
                )
            })
            .collect();
        table.sort_by_key(|p| p.0);
        Ok(Nmethod {
            compile_id: l.nm_compile_id.get(&header) as u32,
            kind,
            method: l.nm_method.get(&header),
            code_begin,
            pcs: table,
            scopes,
            metadata,
        })
    }

    /// Copies of the nmethod's metadata, scope data and pc descriptors.
    fn sections(&self, blob: u64, h: &[u8]) -> io::Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
        let read = |at: u64, end: u64| -> io::Result<Vec<u8>> {
            if end < at || end - at > MAX_DATA {
                return Err(Self::err("implausible nmethod layout"));
            }
            self.mem.bytes(at, (end - at) as usize)
        };
        match self.layout().nm_data {
            NmethodData::InBlob {
                metadata_offset,
                scopes_data_begin,
                scopes_pcs_offset,
                dependencies_offset,
            } => {
                let metadata = blob + metadata_offset.get(h);
                let scopes = scopes_data_begin.get(h);
                let pcs = blob + scopes_pcs_offset.get(h);
                let end = blob + dependencies_offset.get(h);
                Ok((read(metadata, scopes)?, read(scopes, pcs)?, read(pcs, end)?))
            }
            NmethodData::Immutable {
                immutable_data,
                immutable_data_size,
                scopes_pcs_offset,
                scopes_data_offset,
                ref_count_offset,
                metadata,
            } => {
                let base = immutable_data.get(h);
                let mut size = immutable_data_size.get(h);
                if let Some(f) = ref_count_offset {
                    size = size.min(f.get(h));
                }
                let pcs = base + scopes_pcs_offset.get(h);
                let scopes = base + scopes_data_offset.get(h);
                let (meta_at, meta_end) = match metadata {
                    MetadataPlace::AfterCode {
                        data_offset,
                        metadata_offset,
                        size,
                    } => {
                        let at = blob + data_offset.get(h) + metadata_offset.get(h);
                        (at, blob + size.get(h))
                    }
                    MetadataPlace::Mutable {
                        mutable_data,
                        relocation_size,
                        mutable_data_size,
                    } => {
                        let at = mutable_data.get(h) + relocation_size.get(h);
                        (at, mutable_data.get(h) + mutable_data_size.get(h))
                    }
                };
                Ok((
                    read(meta_at, meta_end)?,
                    read(scopes, base + size)?,
                    read(pcs, scopes)?,
                ))
            }
        }
    }
}

impl Nmethod {
    /// Bytes it holds, for the symbolizer's budget.
    pub fn bytes(&self) -> usize {
        self.scopes.len() + self.metadata.len() + self.pcs.len() * 16 + 96
    }

    /// The methods running at `pc` in this nmethod, outermost first, with
    /// their kinds: the nmethod's own method, then each one inlined into
    /// it down to the one the pc is in. `leaf`: the pc was interrupted,
    /// not a return address, so it is not exactly at a recorded pc.
    pub fn frames_at(&self, pc: u64, leaf: bool, excluded: u8) -> Vec<(u64, FrameKind)> {
        let offset = pc.wrapping_sub(self.code_begin) as i64 + i64::from(leaf);
        // As HotSpot's pc_desc_near: the first descriptor at or after it.
        let i = self.pcs.partition_point(|p| p.0 < offset);
        let mut scope = self.pcs.get(i).map_or(0, |p| p.1);
        let mut chain = Vec::new();
        let mut limit = self.scopes.len() as u64;
        while scope != 0 && scope < limit && chain.len() < MAX_SCOPES {
            limit = scope;
            let mut r = Unsigned5 {
                data: &self.scopes[scope as usize..],
                excluded,
            };
            let (Some(sender), Some(index)) = (r.next(), r.next()) else {
                break;
            };
            if index > 0 {
                let method = uint_at(&self.metadata, 8 * (index as usize - 1), 8);
                if method != 0 {
                    chain.push(method);
                }
            }
            scope = sender;
        }
        if chain.is_empty() {
            chain.push(self.method);
        }
        chain
            .into_iter()
            .rev()
            .enumerate()
            .map(|(i, m)| {
                (
                    m,
                    if i == 0 {
                        self.kind
                    } else {
                        FrameKind::Inlined
                    },
                )
            })
            .collect()
    }
}

/// The heap holding `pc` and the index of its segment there: all pcs of
/// one segment lie in the same code blob.
pub fn segment_of(heaps: &[Heap], pc: u64) -> Option<(&Heap, u64)> {
    let heap = heaps.iter().find(|h| h.low <= pc && pc < h.high)?;
    Some((heap, (pc - heap.low) >> heap.log2_segment))
}

impl Heap {
    /// Where its segment map is (names the heap).
    pub fn segmap(&self) -> u64 {
        self.segmap
    }
}

/// Where a segment-map walk ended.
#[derive(Debug, PartialEq, Eq)]
enum Walk {
    /// At the block's first segment (index in the span read).
    Start(usize),
    /// In free space.
    Free,
    /// Before the span read.
    Before,
}

/// Walks the segment map `map` back from index `at`: each step goes back
/// at least one segment, so it ends within `at + 1` steps.
fn walk_segmap(map: &[u8], mut at: usize) -> Walk {
    loop {
        match map.get(at) {
            Some(0) => return Walk::Start(at),
            Some(0xff) | None => return Walk::Free,
            Some(&back) => match at.checked_sub(usize::from(back)) {
                Some(i) => at = i,
                None => return Walk::Before,
            },
        }
    }
}

/// HotSpot's compressed stream of unsigned integers (Pack200's UNSIGNED5:
/// bytes below 192 end a number; JDK 20+ excludes the zero byte).
struct Unsigned5<'a> {
    data: &'a [u8],
    excluded: u8,
}

impl Unsigned5<'_> {
    fn next(&mut self) -> Option<u64> {
        const L: u8 = 192;
        let mut sum = 0u64;
        let mut shift = 0;
        for i in 0..5 {
            let b = *self.data.get(i)?;
            let v = b.checked_sub(self.excluded)?;
            sum += u64::from(v) << shift;
            if v < L || i == 4 {
                self.data = &self.data[i + 1..];
                return Some(sum);
            }
            shift += 6;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_heaps_hotspot_can_have_are_plausible() {
        let ok = Heap {
            low: 0x7f00_0000_0000,
            high: 0x7f00_0000_0000 + (240 << 20),
            segmap: 0x5500_0000,
            log2_segment: 6,
        };
        assert!(ok.is_plausible());
        for bad in [
            Heap {
                log2_segment: 0,
                ..ok
            },
            Heap {
                log2_segment: 17,
                ..ok
            },
            Heap { segmap: 0, ..ok },
            Heap { high: ok.low, ..ok },
            Heap {
                high: ok.low + (3 << 30),
                ..ok
            },
        ] {
            assert!(!bad.is_plausible(), "{bad:?}");
        }
    }

    #[test]
    fn unsigned5_reads_both_encodings() {
        // 5, then 300 = 192 + 108 + 64 * 1 ... as HotSpot writes them.
        let enc = |v: u64, x: u8| -> Vec<u8> {
            let mut out = Vec::new();
            let mut v = v;
            for i in 0..5 {
                if v < 192 || i == 4 {
                    out.push(v as u8 + x);
                    return out;
                }
                let b = 192 + (v - 192) % 64;
                out.push(b as u8 + x);
                v = (v - b) >> 6;
            }
            out
        };
        for x in [0, 1] {
            let mut bytes = Vec::new();
            for v in [0, 5, 191, 192, 300, 70_000, 1 << 30] {
                bytes.extend(enc(v, x));
            }
            let mut r = Unsigned5 {
                data: &bytes,
                excluded: x,
            };
            let got: Vec<u64> = std::iter::from_fn(|| r.next()).collect();
            assert_eq!(got, [0, 5, 191, 192, 300, 70_000, 1 << 30], "x={x}");
        }
    }

    /// A heap of `segments` 64-byte segments at a made-up address, whose
    /// segment map is `map`, in this process's memory.
    fn fake_heap(map: &[u8]) -> Heap {
        Heap {
            low: 0x7000_0000_0000,
            high: 0x7000_0000_0000 + ((map.len() as u64) << 6),
            segmap: map.as_ptr() as u64,
            log2_segment: 6,
        }
    }

    fn fake_vm() -> Vm {
        let t = crate::jvm::vmstructs::tests::layout_for_tests();
        Vm {
            layout: std::sync::Arc::new(t),
            bias: 0,
        }
    }

    #[test]
    fn a_segment_map_walk_is_one_read_and_finds_the_block() {
        use crate::process::remote::Budget;
        // Block 0: segments 0-299 (the map goes back in hops of up to 254,
        // as HotSpot writes it); block 1 from 300; free from 400.
        let mut map = vec![0xffu8; 512];
        for (start, end) in [(0, 300), (300, 400)] {
            for k in 0..end - start {
                map[start + k] = if k == 0 { 0 } else { ((k - 1) % 254 + 1) as u8 };
            }
        }
        let heap = fake_heap(&map);
        let vm = fake_vm();
        let budget = Budget::new(1, 1 << 20);
        let code = JavaCode::with_mem(&vm, Remote::with_budget(std::process::id(), budget.clone()));
        let hb = vm.layout.heap_block_size;
        assert_eq!(
            code.blob_at(&[heap], heap.low + 299 * 64 + 5),
            Some(heap.low + hb)
        );
        assert!(!budget.exhausted(), "one read was enough");
        let code = JavaCode::with_mem(
            &vm,
            Remote::with_budget(std::process::id(), Budget::new(1, 1 << 20)),
        );
        assert_eq!(
            code.blob_at(&[heap], heap.low + 350 * 64),
            Some(heap.low + 300 * 64 + hb)
        );
        let code = JavaCode::new(&vm, std::process::id());
        assert_eq!(code.blob_at(&[heap], heap.low + 450 * 64), None, "free");
    }

    #[test]
    fn a_forged_segment_map_costs_two_reads_at_most() {
        use crate::process::remote::Budget;
        // All 0x01: every segment says "one back", for 1 MiB of map.
        let map = vec![1u8; 1 << 20];
        let heap = fake_heap(&map);
        let vm = fake_vm();
        for seg in [10u64, 5_000, 900_000] {
            let budget = Budget::new(2, 1 << 20);
            let code =
                JavaCode::with_mem(&vm, Remote::with_budget(std::process::id(), budget.clone()));
            assert_eq!(code.blob_at(&[heap], heap.low + (seg << 6)), None);
            assert!(!budget.exhausted(), "segment {seg}: at most two reads");
        }
        // One read only: a long walk gives up rather than read again.
        let budget = Budget::new(1, 1 << 20);
        let code = JavaCode::with_mem(&vm, Remote::with_budget(std::process::id(), budget.clone()));
        assert_eq!(code.blob_at(&[heap], heap.low + (5_000 << 6)), None);
        assert!(budget.exhausted());
    }

    #[test]
    fn scopes_chain_outermost_first_with_inlined_kinds() {
        // Scope at 1: sender 0, method 1 (root). Scope at 3: sender 1,
        // method 2 (inlined). pc 0x10 records scope 3.
        let nm = Nmethod {
            compile_id: 7,
            kind: FrameKind::Jit,
            method: 0xaaa,
            code_begin: 0x1000,
            pcs: vec![(-1, 0), (0x10, 3), (0x20, 1)],
            scopes: vec![0, 0, 1, 1, 2, 0],
            metadata: [0xaaau64, 0xbbb]
                .iter()
                .flat_map(|m| m.to_le_bytes())
                .collect(),
        };
        assert_eq!(
            nm.frames_at(0x1010, false, 0),
            [(0xaaa, FrameKind::Jit), (0xbbb, FrameKind::Inlined)]
        );
        // A leaf pc just before a recorded one takes that one.
        assert_eq!(nm.frames_at(0x100f, true, 0).len(), 2);
        assert_eq!(nm.frames_at(0x1018, true, 0), [(0xaaa, FrameKind::Jit)]);
        // Past the last descriptor: the nmethod's own method.
        assert_eq!(nm.frames_at(0x1100, true, 0), [(0xaaa, FrameKind::Jit)]);
    }
}
