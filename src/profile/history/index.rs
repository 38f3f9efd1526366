//! The in-memory index of what the segments hold: per segment, its charged
//! bytes and one small [`Entry`] per block (32 bytes), oldest segment first.

use std::collections::VecDeque;

use super::segment::Header;

/// Where one block is and what time it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub start_ns: u64,
    pub end_ns: u64,
    /// Offset of the record's header in its segment.
    pub offset: u64,
    pub len: u32,
    pub step_s: u32,
}

impl Entry {
    pub fn new(h: &Header, offset: u64) -> Entry {
        Entry {
            start_ns: h.start_ns,
            end_ns: h.end_ns,
            offset,
            len: h.len,
            step_s: h.step_s,
        }
    }

    /// Whether it overlaps `[from, until)`; an instant block counts when it
    /// lies inside.
    pub fn overlaps(&self, from: u64, until: u64) -> bool {
        if self.start_ns == self.end_ns {
            return from <= self.start_ns && self.start_ns < until;
        }
        self.start_ns < until && self.end_ns > from
    }
}

/// One segment's part of the index.
#[derive(Debug)]
pub struct Segment {
    pub id: u64,
    /// Its size as the byte bound charges it (whole disk blocks).
    pub charged: u64,
    pub entries: Vec<Entry>,
}

/// The index: segments in id (write) order.
#[derive(Debug, Default)]
pub struct Index {
    pub segments: VecDeque<Segment>,
    /// Sum of the segments' `charged`.
    pub bytes: u64,
    /// Sum of their entries.
    pub blocks: usize,
    /// Sum of the blocks' durations, ns.
    pub held_ns: u64,
}

/// The span an index covers, for stats.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub oldest_ns: Option<u64>,
    pub newest_ns: Option<u64>,
}

impl Index {
    /// Adds a segment after the others.
    pub fn push_segment(&mut self, seg: Segment) {
        self.bytes += seg.charged;
        self.blocks += seg.entries.len();
        self.held_ns += seg.entries.iter().map(duration).sum::<u64>();
        self.segments.push_back(seg);
    }

    /// Removes the oldest segment; `None` if there is none.
    pub fn pop_oldest(&mut self) -> Option<Segment> {
        let seg = self.segments.pop_front()?;
        self.bytes -= seg.charged;
        self.blocks -= seg.entries.len();
        self.held_ns -= seg.entries.iter().map(duration).sum::<u64>();
        Some(seg)
    }

    /// Records a block appended to segment `id` (the newest), which now
    /// charges `charged` bytes.
    pub fn append(&mut self, id: u64, entry: Entry, charged: u64) {
        let Some(seg) = self.segments.back_mut().filter(|s| s.id == id) else {
            self.push_segment(Segment {
                id,
                charged,
                entries: vec![entry],
            });
            return;
        };
        self.bytes = self.bytes - seg.charged + charged;
        seg.charged = charged;
        seg.entries.push(entry);
        self.blocks += 1;
        self.held_ns += duration(&entry);
    }

    /// Sets the charged size of segment `id` (after a failed write left it
    /// with a size other than expected).
    pub fn set_charged(&mut self, id: u64, charged: u64) {
        if let Some(seg) = self.segments.iter_mut().find(|s| s.id == id) {
            self.bytes = self.bytes - seg.charged + charged;
            seg.charged = charged;
        }
    }

    /// The blocks overlapping `[from, until)`, oldest first.
    pub fn overlapping(&self, from: u64, until: u64) -> Vec<(u64, Entry)> {
        let mut out: Vec<(u64, Entry)> = self
            .segments
            .iter()
            .flat_map(|s| s.entries.iter().map(move |e| (s.id, *e)))
            .filter(|(_, e)| e.overlaps(from, until))
            .collect();
        // Stable: blocks starting together stay in write order.
        out.sort_by_key(|(_, e)| e.start_ns);
        out
    }

    /// The earliest start and the latest end held.
    pub fn span(&self) -> Span {
        let entries = || self.segments.iter().flat_map(|s| s.entries.iter());
        Span {
            oldest_ns: entries().map(|e| e.start_ns).min(),
            newest_ns: entries().map(|e| e.end_ns).max(),
        }
    }
}

fn duration(e: &Entry) -> u64 {
    e.end_ns - e.start_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, end: u64) -> Entry {
        Entry {
            start_ns: start,
            end_ns: end,
            offset: start,
            len: 1,
            step_s: 1,
        }
    }

    #[test]
    fn overlap_is_half_open() {
        let e = entry(10, 20);
        assert!(e.overlaps(0, 11));
        assert!(!e.overlaps(0, 10));
        assert!(e.overlaps(19, 30));
        assert!(!e.overlaps(20, 30));
        let instant = entry(10, 10);
        assert!(instant.overlaps(10, 11));
        assert!(!instant.overlaps(0, 10));
    }

    #[test]
    fn totals_follow_appends_and_pops() {
        let mut ix = Index::default();
        ix.append(1, entry(0, 10), 4096);
        ix.append(1, entry(10, 20), 8192);
        ix.append(2, entry(5, 8), 4096);
        assert_eq!((ix.bytes, ix.blocks, ix.held_ns), (12288, 3, 23));
        let got: Vec<u64> = ix
            .overlapping(6, 12)
            .iter()
            .map(|(_, e)| e.start_ns)
            .collect();
        assert_eq!(got, vec![0, 5, 10]);
        assert_eq!(
            ix.span(),
            Span {
                oldest_ns: Some(0),
                newest_ns: Some(20)
            }
        );
        assert_eq!(ix.pop_oldest().map(|s| s.id), Some(1));
        assert_eq!((ix.bytes, ix.blocks, ix.held_ns), (4096, 1, 3));
        ix.set_charged(2, 0);
        assert_eq!(ix.bytes, 0);
    }
}
