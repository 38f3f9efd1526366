//! The primitives of a block's body: LEB128 varints (zigzag for signed
//! deltas), columns written one per field and read back row by row, runs
//! of a sorted key, and the budget that bounds what decoding allocates.
//!
//! Varints are written by hand: twenty lines whose overflow checks on
//! hostile input we want to see, rather than a crate's.

use std::mem::size_of;

use super::CodecError;

type Result<T> = std::result::Result<T, CodecError>;

/// One column being written.
#[derive(Default)]
pub struct Col(pub Vec<u8>);

impl Col {
    pub fn u64(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    /// A signed delta, zigzag-coded so that small ones of either sign are
    /// one byte.
    pub fn i64(&mut self, v: i64) {
        self.u64(zigzag(v));
    }

    /// `v - prev`, wrapping: any two values, one small varint when close.
    pub fn delta(&mut self, prev: u64, v: u64) {
        self.i64(v.wrapping_sub(prev) as i64);
    }

    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
}

/// A signed value as unsigned, small ones of either sign small.
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Writes the columns of one section: each one's length, then its bytes,
/// so that a reader can walk them side by side.
pub fn put_columns(out: &mut Col, cols: &[Col]) {
    for c in cols {
        out.u64(c.0.len() as u64);
        out.0.extend_from_slice(&c.0);
    }
}

/// A cursor over bytes; every read checks what is left.
#[derive(Clone, Copy)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub fn u8(&mut self) -> Result<u8> {
        let (&b, rest) = self.buf.split_first().ok_or(CodecError::Truncated)?;
        self.buf = rest;
        Ok(b)
    }

    pub fn u64(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            // The tenth byte may carry only the top bit.
            if shift == 63 && b > 1 {
                return Err(CodecError::Corrupt("varint overflows"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(CodecError::Corrupt("varint overflows"))
    }

    pub fn u32(&mut self) -> Result<u32> {
        u32::try_from(self.u64()?).map_err(|_| CodecError::Corrupt("value over u32"))
    }

    pub fn i64(&mut self) -> Result<i64> {
        Ok(unzigzag(self.u64()?))
    }

    /// The value a [`Col::delta`] from `prev` wrote.
    pub fn delta(&mut self, prev: u64) -> Result<u64> {
        Ok(prev.wrapping_add(self.i64()? as u64))
    }

    /// As [`Reader::delta`], for a value that must fit 32 bits.
    pub fn delta32(&mut self, prev: u32) -> Result<u32> {
        u32::try_from(self.delta(u64::from(prev))?)
            .map_err(|_| CodecError::Corrupt("value over u32"))
    }

    /// An index below `len`, as [`Col::u64`] wrote it.
    pub fn index(&mut self, len: usize) -> Result<usize> {
        in_range(self.u64()?, len)
    }

    /// An optional index below `len`, written as index + 1 (0: none).
    pub fn opt_index(&mut self, len: usize) -> Result<Option<usize>> {
        match self.u64()? {
            0 => Ok(None),
            i => in_range(i - 1, len).map(Some),
        }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.buf.len() {
            return Err(CodecError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The `K` columns [`put_columns`] wrote.
    pub fn columns<const K: usize>(&mut self) -> Result<[Reader<'a>; K]> {
        let mut cols = [Reader::new(&[]); K];
        for c in &mut cols {
            let len = usize::try_from(self.u64()?).map_err(|_| CodecError::Truncated)?;
            *c = Reader::new(self.bytes(len)?);
        }
        Ok(cols)
    }

    /// Fails unless every byte was read: a block says exactly what it holds.
    pub fn finish(&self) -> Result<()> {
        match self.buf.is_empty() {
            true => Ok(()),
            false => Err(CodecError::Corrupt("bytes left over")),
        }
    }
}

fn in_range(i: u64, len: usize) -> Result<usize> {
    usize::try_from(i)
        .ok()
        .filter(|&i| i < len)
        .ok_or(CodecError::Corrupt("index out of range"))
}

/// Whether every column of a section was read to its end.
pub fn finish_all(cols: &[Reader]) -> Result<()> {
    cols.iter().try_for_each(Reader::finish)
}

/// Writes a sorted key as runs: (delta from the previous run's value,
/// length). Keys repeat over consecutive rows (a process's threads, a
/// thread's stacks), so a run costs two bytes where rows cost one each.
#[derive(Default)]
pub struct RunsWriter {
    col: Col,
    prev: u64,
    value: u64,
    len: u64,
}

impl RunsWriter {
    pub fn push(&mut self, v: u64) {
        if self.len > 0 && v == self.value {
            self.len += 1;
            return;
        }
        self.flush();
        (self.value, self.len) = (v, 1);
    }

    fn flush(&mut self) {
        if self.len > 0 {
            self.col.delta(self.prev, self.value);
            self.col.u64(self.len);
            self.prev = self.value;
        }
    }

    pub fn finish(mut self) -> Col {
        self.flush();
        self.col
    }
}

/// Reads back what [`RunsWriter`] wrote, one row at a time.
pub struct RunsReader<'a> {
    r: Reader<'a>,
    value: u64,
    left: u64,
}

impl<'a> RunsReader<'a> {
    pub fn new(r: Reader<'a>) -> Self {
        RunsReader {
            r,
            value: 0,
            left: 0,
        }
    }

    pub fn next(&mut self) -> Result<u64> {
        if self.left == 0 {
            self.value = self.r.delta(self.value)?;
            self.left = self.r.u64()?;
            if self.left == 0 {
                return Err(CodecError::Corrupt("empty run"));
            }
        }
        self.left -= 1;
        Ok(self.value)
    }

    pub fn next32(&mut self) -> Result<u32> {
        u32::try_from(self.next()?).map_err(|_| CodecError::Corrupt("value over u32"))
    }

    /// Fails unless the runs covered exactly the rows read.
    pub fn finish(&self) -> Result<()> {
        match self.left {
            0 => self.r.finish(),
            _ => Err(CodecError::Corrupt("run longer than its section")),
        }
    }
}

/// Sorted (pid, tid) keys: pids as runs, each tid as a delta from the
/// previous tid of its process, or from the pid for the first (a main
/// thread's tid is its pid).
#[derive(Default)]
pub struct KeysWriter {
    pids: RunsWriter,
    tids: Col,
    prev: Option<(u32, u32)>,
}

impl KeysWriter {
    pub fn push(&mut self, pid: u32, tid: u32) {
        let base = match self.prev {
            Some((p, t)) if p == pid => t,
            _ => pid,
        };
        self.pids.push(pid.into());
        self.tids.delta(base.into(), tid.into());
        self.prev = Some((pid, tid));
    }

    pub fn finish(self) -> [Col; 2] {
        [self.pids.finish(), self.tids]
    }
}

/// Reads back what [`KeysWriter`] wrote.
pub struct KeysReader<'a> {
    pids: RunsReader<'a>,
    /// One varint per row: the column to check a row count against.
    pub tids: Reader<'a>,
    prev: Option<(u32, u32)>,
}

impl<'a> KeysReader<'a> {
    pub fn new(pids: Reader<'a>, tids: Reader<'a>) -> Self {
        KeysReader {
            pids: RunsReader::new(pids),
            tids,
            prev: None,
        }
    }

    pub fn next(&mut self) -> Result<(u32, u32)> {
        let pid = self.pids.next32()?;
        let base = match self.prev {
            Some((p, t)) if p == pid => t,
            _ => pid,
        };
        let tid = self.tids.delta32(base)?;
        self.prev = Some((pid, tid));
        Ok((pid, tid))
    }

    pub fn finish(&self) -> Result<()> {
        self.pids.finish()?;
        self.tids.finish()
    }
}

/// What decoding may still allocate: each vector, table and name is
/// charged before it is allocated, so a hostile block fails with
/// [`CodecError::TooLarge`] instead of taking memory.
pub struct Budget {
    left: usize,
}

impl Budget {
    pub fn new(bytes: usize) -> Self {
        Budget { left: bytes }
    }

    pub fn charge(&mut self, bytes: usize) -> Result<()> {
        self.left = self.left.checked_sub(bytes).ok_or(CodecError::TooLarge)?;
        Ok(())
    }

    /// A vector of `n` rows, read from `per_row`, a column that spends at
    /// least one byte on each: the count is checked against the input
    /// before anything is allocated.
    pub fn vec<T>(&mut self, n: usize, per_row: &Reader) -> Result<Vec<T>> {
        if n > per_row.remaining() {
            return Err(CodecError::Corrupt("more rows than bytes"));
        }
        self.charge(n.saturating_mul(size_of::<T>()))?;
        Ok(Vec::with_capacity(n))
    }

    /// A hash table of `n` entries (as [`super::super::size`] counts one).
    pub fn map<K, V>(
        &mut self,
        n: usize,
        per_row: &Reader,
    ) -> Result<std::collections::HashMap<K, V>> {
        if n > per_row.remaining() {
            return Err(CodecError::Corrupt("more rows than bytes"));
        }
        self.charge(n.saturating_mul((size_of::<(K, V)>() + 1) * 8 / 7))?;
        Ok(std::collections::HashMap::with_capacity(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_at_the_edges() {
        let values = [
            0,
            1,
            127,
            128,
            300,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ];
        let mut c = Col::default();
        for v in values {
            c.u64(v);
            c.i64(v as i64);
        }
        let mut r = Reader::new(&c.0);
        for v in values {
            assert_eq!(r.u64().unwrap(), v);
            assert_eq!(r.i64().unwrap(), v as i64);
        }
        r.finish().unwrap();
        assert!(Reader::new(&[0xff; 11]).u64().is_err(), "11 bytes");
        assert!(Reader::new(&[0xff; 9]).u64().is_err(), "truncated");
        let mut top = vec![0xff; 9];
        top.push(0x02);
        assert!(Reader::new(&top).u64().is_err(), "over 64 bits");
    }

    #[test]
    fn runs_round_trip_and_check_their_length() {
        let keys = [5u64, 5, 5, 2, 9, 9, u64::MAX, 0];
        let mut w = RunsWriter::default();
        keys.iter().for_each(|&k| w.push(k));
        let col = w.finish();
        assert!(col.0.len() < keys.len() * 2);
        let mut r = RunsReader::new(Reader::new(&col.0));
        let back: Vec<u64> = keys.iter().map(|_| r.next().unwrap()).collect();
        assert_eq!(back, keys);
        r.finish().unwrap();
        let mut short = RunsReader::new(Reader::new(&col.0));
        short.next().unwrap();
        assert!(short.finish().is_err());
    }

    #[test]
    fn the_budget_refuses_before_allocating() {
        let input = [0u8; 10];
        let mut b = Budget::new(100);
        assert!(b.vec::<u64>(11, &Reader::new(&input)).is_err(), "rows");
        assert!(b.vec::<u64>(10, &Reader::new(&input)).is_ok());
        assert!(matches!(
            b.vec::<u64>(10, &Reader::new(&input)),
            Err(CodecError::TooLarge)
        ));
    }
}
