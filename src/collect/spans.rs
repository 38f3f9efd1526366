//! What a drain holds of OpenTelemetry spans: each thread's exact time per
//! span, and the records of spans first seen (trace id, flags and the
//! attribute bytes BPF copied from the traced process, parsed here as
//! OTEP 4947 lays them out: untrusted, bounded, never trusted to be
//! well-formed).

use std::sync::Arc;

use crate::bpf::abi::{
    SpanKey, SpanRecord as BpfRecord, SpanRecordKey, SpanTimes, SPAN_ATTR_BYTES,
};
use crate::profile::model::spans::{SpanId, SpanRecord, SpanTime, TraceId};
use crate::untrusted::text::clean_to;

/// Bytes kept of an attribute's value (a record's own bound: 255).
const MAX_VALUE_BYTES: usize = 256;
/// Bytes kept of an attribute's name from the process's key map.
const MAX_NAME_BYTES: usize = 128;

/// Names of a process's attribute keys, by index: its process context's
/// `threadlocal.attribute_key_map` (OTEP 4719). A port: discovery, which
/// reads process contexts, implements it.
pub trait SpanKeyNames: Send + Sync {
    /// The key map of process `pid`, `None` when unknown.
    fn names(&self, pid: u32) -> Option<Arc<[Arc<str>]>>;
}

/// Knows no names: every attribute keeps its index as its name (`#3`), so
/// that nothing is lost before discovery has read the key map.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoKeyNames;

impl SpanKeyNames for NoKeyNames {
    fn names(&self, _pid: u32) -> Option<Arc<[Arc<str>]>> {
        None
    }
}

/// A span's record as a drain took it, attributes still raw.
#[derive(Debug, Clone)]
pub struct RawSpanRecord {
    pub pid: u32,
    pub span: SpanId,
    pub trace: TraceId,
    pub flags: u8,
    /// Attribute bytes as the record said it had.
    pub attrs_size: u16,
    /// The bytes BPF kept (at most [`SPAN_ATTR_BYTES`]).
    pub attrs: Vec<u8>,
}

impl RawSpanRecord {
    /// From a `span_records` row; `None` for a row without a span.
    pub fn from_bpf(key: &SpanRecordKey, r: &BpfRecord) -> Option<RawSpanRecord> {
        let kept = usize::from(r.attrs_len).min(SPAN_ATTR_BYTES);
        Some(RawSpanRecord {
            pid: key.pid,
            span: SpanId::from_raw(key.span)?,
            trace: TraceId(r.trace_id),
            flags: r.flags,
            attrs_size: r.attrs_size,
            attrs: r.attrs[..kept].to_vec(),
        })
    }

    /// The record with its attributes parsed, names from `names` (the
    /// process's key map: an index it lacks is dropped, as the spec says;
    /// without a map every attribute is kept as `#index`).
    pub fn parse(&self, names: Option<&[Arc<str>]>) -> SpanRecord {
        let (attrs, truncated) = parse_attrs(&self.attrs, names);
        SpanRecord {
            pid: self.pid,
            span: self.span,
            trace: self.trace,
            flags: self.flags,
            attrs,
            attrs_cut: truncated || usize::from(self.attrs_size) > self.attrs.len(),
        }
    }
}

/// An attribute's name and value.
pub type Attr = (Arc<str>, Arc<str>);

/// The attributes in `bytes` (entries of key index u8, length u8, value):
/// stops at an entry the bytes cannot hold whole (then `true`), keeps the
/// last value of a repeated key, in the order keys first appeared; with a
/// key map, drops indexes outside it.
pub fn parse_attrs(bytes: &[u8], names: Option<&[Arc<str>]>) -> (Vec<Attr>, bool) {
    let mut found: Vec<(u8, &[u8])> = Vec::new();
    let mut rest = bytes;
    let truncated = loop {
        let [key, len, tail @ ..] = rest else {
            break !rest.is_empty();
        };
        let Some((value, after)) = tail.split_at_checked(usize::from(*len)) else {
            break true;
        };
        match found.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => found.push((*key, value)),
        }
        rest = after;
    };
    let attrs = found
        .into_iter()
        .filter_map(|(key, value)| {
            let name: Arc<str> = match names {
                Some(names) => clean_to(names.get(usize::from(key))?, MAX_NAME_BYTES).into(),
                None => format!("#{key}").into(),
            };
            let value = String::from_utf8_lossy(value);
            Some((name, clean_to(&value, MAX_VALUE_BYTES).into()))
        })
        .collect();
    (attrs, truncated)
}

/// A `span_times_N` row as the model's; `None` for a row without a span.
pub fn span_time(key: &SpanKey, t: &SpanTimes) -> Option<SpanTime> {
    Some(SpanTime {
        pid: key.pid,
        tid: key.tid,
        span: SpanId::from_raw(key.span)?,
        ns: t.ns,
        first_ns: t.first_ns,
        last_ns: t.last_ns,
    })
}

#[cfg(test)]
mod tests;
