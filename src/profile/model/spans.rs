//! Request context: what a slice holds of the OpenTelemetry spans its
//! threads ran under (OTEP 4947 thread context), apart from the stack
//! rows, so that many spans never multiply the store's rows. A span is
//! known by its process and its 8-byte id; its trace id and attributes
//! come with its record, read once per thread and span.

use std::sync::Arc;

use super::{state::State, Stack};

/// A span id: its 8 bytes as the record holds them (W3C Trace Context
/// order). Never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(pub [u8; 8]);

/// A trace id: its 16 bytes as the record holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TraceId(pub [u8; 16]);

impl SpanId {
    /// The id the BPF programs carry as a u64 (its bytes in memory order);
    /// `None` for 0, no span.
    pub fn from_raw(raw: u64) -> Option<SpanId> {
        (raw != 0).then(|| SpanId(raw.to_ne_bytes()))
    }

    /// Lowercase hex, as W3C Trace Context writes it.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// From 16 lowercase or uppercase hex digits; `None` otherwise or
    /// for all zeros.
    pub fn parse(s: &str) -> Option<SpanId> {
        let mut b = [0u8; 8];
        unhex(s, &mut b)?;
        (b != [0; 8]).then_some(SpanId(b))
    }
}

impl TraceId {
    /// Lowercase hex, as W3C Trace Context writes it.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// From 32 hex digits; `None` otherwise or for all zeros.
    pub fn parse(s: &str) -> Option<TraceId> {
        let mut b = [0u8; 16];
        unhex(s, &mut b)?;
        (b != [0; 16]).then_some(TraceId(b))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str, out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 || !s.is_ascii() {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(())
}

/// A span as its record says: trace, flags and attributes (names resolved
/// through the process's `threadlocal.attribute_key_map`; an index the map
/// does not have is dropped, as the spec says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanRecord {
    pub pid: u32,
    pub span: SpanId,
    pub trace: TraceId,
    pub flags: u8,
    /// Name and value, cleaned and bounded; the last of a repeated key.
    pub attrs: Vec<(Arc<str>, Arc<str>)>,
    /// The record's attribute bytes were more than were kept.
    pub attrs_cut: bool,
}

/// One thread's exact time under one span in a slice, by state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanTime {
    pub pid: u32,
    pub tid: u32,
    pub span: SpanId,
    pub ns: [u64; State::COUNT],
    /// When the thread's time under the span began and last ended, in
    /// the slice's clock (ns since boot, as the BPF programs stamp it).
    pub first_ns: u64,
    pub last_ns: u64,
}

/// Time one thread spent in one state with one stack under one span (the
/// stack rows of a slice that had a span).
#[derive(Debug, Clone)]
pub struct SpanSample {
    pub pid: u32,
    pub tid: u32,
    pub span: SpanId,
    pub state: State,
    pub stack: Stack,
    pub ns: u64,
    pub count: u64,
}

/// What a slice holds of spans.
#[derive(Debug, Clone, Default)]
pub struct SpanSlice {
    /// Records of the spans first seen in the slice.
    pub records: Vec<SpanRecord>,
    /// Exact time per thread and span.
    pub times: Vec<SpanTime>,
    /// Stack rows under a span.
    pub samples: Vec<SpanSample>,
}

impl SpanSlice {
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.times.is_empty() && self.samples.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_and_write_as_w3c_hex() {
        let s = SpanId::parse("00f067aa0ba902b7").unwrap();
        assert_eq!(s.hex(), "00f067aa0ba902b7");
        assert_eq!(SpanId::from_raw(u64::from_ne_bytes(s.0)), Some(s));
        assert_eq!(SpanId::from_raw(0), None);
        assert!(SpanId::parse("0000000000000000").is_none());
        assert!(SpanId::parse("00f067aa0ba902b").is_none());
        assert!(SpanId::parse("00f067aa0ba902bz").is_none());
        let t = TraceId::parse("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        assert_eq!(t.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(TraceId::parse("é0f067aa0ba902b74bf92f3577b34da").is_none());
    }
}
