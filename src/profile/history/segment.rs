//! A segment file's layout and the scan that rebuilds its index.
//!
//! A segment is [`SEGMENT_MAGIC`] and then records, each a fixed
//! [`HEADER_LEN`]-byte header and its payload:
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | [`RECORD_MAGIC`] |
//! | 4 | payload length (≤ [`MAX_PAYLOAD`]) |
//! | 8 | start, ns since the Unix epoch |
//! | 8 | end, ns since the Unix epoch |
//! | 4 | step, seconds |
//! | 4 | CRC-32 of the payload |
//! | 4 | CRC-32 of the 32 bytes above |
//!
//! All little-endian. The header's own checksum makes its length
//! trustworthy before anything is allocated or skipped by it; the payload's
//! catches a torn or flipped body. A header that fails its checks is
//! resynchronized past by searching for the next valid one.

use std::{
    fs::File,
    io::{self, BufReader, Read, Seek},
    os::unix::fs::FileExt,
};

use super::index::Entry;

/// The first bytes of every segment (the format's version is its last two).
pub const SEGMENT_MAGIC: [u8; 8] = *b"WSHSEG01";
/// The first bytes of every record header ("WSB1").
pub const RECORD_MAGIC: [u8; 4] = *b"WSB1";
/// Bytes of a record header.
pub const HEADER_LEN: usize = 36;
/// Largest payload a record may hold: a length above it is corrupt, so a
/// reader never allocates more on a header's word.
pub const MAX_PAYLOAD: u32 = 16 << 20;
/// Chunk the resynchronizing search reads at a time.
const RESYNC_CHUNK: usize = 64 << 10;

/// A record's header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub step_s: u32,
    pub crc: u32,
}

impl Header {
    /// The header of `payload` (whose length the caller bounded).
    pub fn of(payload: &[u8], start_ns: u64, end_ns: u64, step_s: u32) -> Header {
        Header {
            len: payload.len() as u32,
            start_ns,
            end_ns,
            step_s,
            crc: crc32fast::hash(payload),
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&RECORD_MAGIC);
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.start_ns.to_le_bytes());
        b[16..24].copy_from_slice(&self.end_ns.to_le_bytes());
        b[24..28].copy_from_slice(&self.step_s.to_le_bytes());
        b[28..32].copy_from_slice(&self.crc.to_le_bytes());
        let own = crc32fast::hash(&b[..32]);
        b[32..36].copy_from_slice(&own.to_le_bytes());
        b
    }

    /// `None` unless the magic, the header's checksum, the length bound and
    /// the time order all hold.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Option<Header> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| (u64::from(u32_at(i + 4)) << 32) | u64::from(u32_at(i));
        if b[0..4] != RECORD_MAGIC || crc32fast::hash(&b[..32]) != u32_at(32) {
            return None;
        }
        let h = Header {
            len: u32_at(4),
            start_ns: u64_at(8),
            end_ns: u64_at(16),
            step_s: u32_at(24),
            crc: u32_at(28),
        };
        (h.len <= MAX_PAYLOAD && h.start_ns <= h.end_ns).then_some(h)
    }

    /// Bytes of the whole record.
    pub fn record_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.len)
    }
}

/// What a scan found in one segment.
#[derive(Debug, Default)]
pub struct Scan {
    /// The valid records, in file order.
    pub entries: Vec<Entry>,
    /// Torn or corrupt stretches skipped (each counted once).
    pub torn: u64,
    /// Where the last valid record ends (the segment header's end if none):
    /// anything after it is a torn tail.
    pub valid_end: u64,
}

/// Scans a segment of `len` bytes. With `verify`, each payload is read and
/// checked (the newest segment, which a crash may have left half-written);
/// without, only headers are read (older segments were synced whole before
/// the next one began; their payloads are checked when read). At most
/// `max_entries` are kept: the rest of the segment is not looked at.
pub fn scan(file: &File, len: u64, verify: bool, max_entries: usize) -> io::Result<Scan> {
    let mut out = Scan::default();
    let mut magic = [0u8; SEGMENT_MAGIC.len()];
    if len < SEGMENT_MAGIC.len() as u64 {
        out.torn = u64::from(len > 0);
        return Ok(out);
    }
    file.read_exact_at(&mut magic, 0)?;
    if magic != SEGMENT_MAGIC {
        out.torn = 1;
        return Ok(out);
    }
    let mut pos = SEGMENT_MAGIC.len() as u64;
    out.valid_end = pos;
    let mut reader = BufReader::with_capacity(RESYNC_CHUNK, file);
    reader.seek(io::SeekFrom::Start(pos))?;
    let mut payload = Vec::new();
    while pos < len && out.entries.len() < max_entries {
        let header = if len - pos >= HEADER_LEN as u64 {
            let mut b = [0u8; HEADER_LEN];
            reader.read_exact(&mut b)?;
            Header::decode(&b)
        } else {
            None
        };
        let Some(h) = header.filter(|h| pos + h.record_len() <= len) else {
            // A torn tail or a corrupt header: count it, look for the next
            // valid header after it.
            out.torn += 1;
            match resync(file, pos + 1, len)? {
                Some(next) => {
                    pos = next;
                    reader.seek(io::SeekFrom::Start(pos))?;
                    continue;
                }
                None => break,
            }
        };
        let body = pos + HEADER_LEN as u64;
        if verify {
            payload.resize(h.len as usize, 0);
            reader.read_exact(&mut payload)?;
            if crc32fast::hash(&payload) != h.crc {
                out.torn += 1;
                pos = body + u64::from(h.len);
                continue;
            }
        } else {
            reader.seek_relative(i64::from(h.len))?;
        }
        out.entries.push(Entry::new(&h, pos));
        pos = body + u64::from(h.len);
        out.valid_end = pos;
    }
    Ok(out)
}

/// The offset of the next header at or after `from` that decodes and fits
/// in the file, if any.
fn resync(file: &File, mut from: u64, len: u64) -> io::Result<Option<u64>> {
    let mut buf = vec![0u8; RESYNC_CHUNK];
    while from + HEADER_LEN as u64 <= len {
        let n = (len - from).min(RESYNC_CHUNK as u64) as usize;
        file.read_exact_at(&mut buf[..n], from)?;
        for i in 0..=n - HEADER_LEN {
            if buf[i..i + 4] != RECORD_MAGIC {
                continue;
            }
            let mut b = [0u8; HEADER_LEN];
            b.copy_from_slice(&buf[i..i + HEADER_LEN]);
            let at = from + i as u64;
            if Header::decode(&b).is_some_and(|h| at + h.record_len() <= len) {
                return Ok(Some(at));
            }
        }
        // Overlap by a header less one byte so none straddling is missed.
        from += (n - HEADER_LEN + 1) as u64;
    }
    Ok(None)
}

/// Reads and checks the record `entry` points at; `Err` says why not.
/// The entry's length came from a header that passed its checks (so it is
/// at most [`MAX_PAYLOAD`]); header and payload are read in one call.
pub fn read_record(file: &File, entry: &Entry) -> Result<Vec<u8>, String> {
    let mut record = vec![0u8; HEADER_LEN + entry.len.min(MAX_PAYLOAD) as usize];
    file.read_exact_at(&mut record, entry.offset)
        .map_err(|e| format!("reading: {e}"))?;
    let mut b = [0u8; HEADER_LEN];
    b.copy_from_slice(&record[..HEADER_LEN]);
    let h = Header::decode(&b).ok_or("corrupt header")?;
    if h.len != entry.len || h.start_ns != entry.start_ns || h.end_ns != entry.end_ns {
        return Err("header does not match the index".into());
    }
    record.drain(..HEADER_LEN);
    if crc32fast::hash(&record) != h.crc {
        return Err("payload checksum mismatch".into());
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let h = Header::of(b"hello", 5, 9, 1);
        let b = h.encode();
        assert_eq!(Header::decode(&b), Some(h));
        for i in 0..HEADER_LEN {
            for bit in 0..8 {
                let mut d = b;
                d[i] ^= 1 << bit;
                assert_eq!(Header::decode(&d), None, "byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn header_bounds_length_and_time_order() {
        let mut h = Header::of(b"", 5, 9, 1);
        h.len = MAX_PAYLOAD + 1;
        assert_eq!(Header::decode(&h.encode()), None);
        h.len = MAX_PAYLOAD;
        assert!(Header::decode(&h.encode()).is_some());
        let backwards = Header::of(b"", 9, 5, 1);
        assert_eq!(Header::decode(&backwards.encode()), None);
    }
}
