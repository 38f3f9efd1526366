//! The OpenTelemetry process context (OTEP 4719) of one process: the
//! `OTEL_CTX` mapping's header, its protobuf payload, and what wallscope
//! keeps of it (the thread-context schema, the attribute key map, a few
//! resource attributes).
//!
//! Everything here is the target's to choose: the payload size is
//! refused past [`MAX_PAYLOAD`], the read is retried at most
//! [`MAX_ATTEMPTS`] times when `published_at_ns` moves under it, and every
//! name and value kept is cut to a bound and cleaned of control
//! characters.

use std::sync::Arc;

use prost::Message;

use crate::process::remote::Remote;

/// Bytes of the header: signature, version, payload size, published at,
/// payload pointer.
pub const HEADER_BYTES: usize = 32;
/// Largest payload read (a real one is a few hundred bytes).
pub const MAX_PAYLOAD: u32 = 64 << 10;
/// Reads of header + payload tried while the writer keeps publishing.
pub const MAX_ATTEMPTS: usize = 3;
/// Attribute names kept in the key map (an index is a `u8`).
pub const MAX_KEYS: usize = 256;
/// Bytes kept of a key name or a resource attribute's value.
pub const MAX_NAME_BYTES: usize = 128;
/// Resource attributes kept for display.
pub const RESOURCE_KEYS: &[&str] = &[
    "service.name",
    "service.namespace",
    "service.version",
    "service.instance.id",
    "deployment.environment.name",
    "telemetry.sdk.language",
    "telemetry.sdk.name",
];

/// The names the mapping may show under in `/proc/PID/maps`.
pub const MAPPING_NAMES: &[&str] = &[
    "/memfd:OTEL_CTX",
    "[anon_shmem:OTEL_CTX]",
    "[anon:OTEL_CTX]",
];

/// The header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub payload_size: u32,
    pub published_at_ns: u64,
    pub payload: u64,
}

/// Why a process context was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The mapping could not be read.
    Unreadable,
    /// No `OTEL_CTX` signature, or a version other than 1 or 2.
    Signature,
    /// Being written (`published_at_ns` is 0).
    Unpublished,
    /// A payload larger than [`MAX_PAYLOAD`].
    TooBig,
    /// `published_at_ns` changed under every attempt.
    Unstable,
    /// The payload is not a protobuf `ProcessContext`.
    Malformed,
}

impl Header {
    /// Parses and checks a header: signature, version 1 (development) or 2,
    /// published, payload bounded.
    pub fn parse(b: &[u8; HEADER_BYTES]) -> Result<Header, Refused> {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut w = [0; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let h = Header {
            version: u32_at(8),
            payload_size: u32_at(12),
            published_at_ns: u64_at(16),
            payload: u64_at(24),
        };
        if &b[..8] != b"OTEL_CTX" || !matches!(h.version, 1 | 2) {
            return Err(Refused::Signature);
        }
        if h.published_at_ns == 0 {
            return Err(Refused::Unpublished);
        }
        if h.payload_size > MAX_PAYLOAD {
            return Err(Refused::TooBig);
        }
        Ok(h)
    }
}

/// What wallscope keeps of a process context.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessContext {
    /// When it was published (ns since the epoch): read again when it
    /// changes.
    pub published_at_ns: u64,
    /// `threadlocal.schema_version` (e.g. `tlsdesc_v1_dev`).
    pub schema: Option<Arc<str>>,
    /// `threadlocal.attribute_key_map`: a record's key index to its name.
    pub key_names: Arc<[Arc<str>]>,
    /// The resource attributes of [`RESOURCE_KEYS`] it has.
    pub resource: Vec<(Arc<str>, Arc<str>)>,
}

impl ProcessContext {
    /// Bytes it holds (names and values, and their handles).
    pub fn bytes(&self) -> usize {
        let handle = std::mem::size_of::<Arc<str>>();
        let names = self
            .key_names
            .iter()
            .map(|n| n.len() + handle)
            .sum::<usize>();
        let resource = self.resource.iter();
        let resource = resource
            .map(|(k, v)| k.len() + v.len() + 2 * handle)
            .sum::<usize>();
        std::mem::size_of::<ProcessContext>()
            + names
            + resource
            + self.schema.as_ref().map_or(0, |s| s.len())
    }
}

/// Reads the process context whose header is at `at` in `remote`, per the
/// reading protocol: header, payload, header again, retried while
/// `published_at_ns` moves.
pub fn read(remote: &Remote, at: u64) -> Result<ProcessContext, Refused> {
    let header = |r: &Remote| -> Result<Header, Refused> {
        let mut b = [0; HEADER_BYTES];
        r.read(at, &mut b).map_err(|_| Refused::Unreadable)?;
        Header::parse(&b)
    };
    let mut last = Refused::Unstable;
    for _ in 0..MAX_ATTEMPTS {
        let h = match header(remote) {
            Ok(h) => h,
            Err(Refused::Unpublished) => {
                last = Refused::Unpublished;
                continue;
            }
            Err(e) => return Err(e),
        };
        let payload = remote
            .bytes(h.payload, h.payload_size as usize)
            .map_err(|_| Refused::Unreadable)?;
        if header(remote).map(|again| again.published_at_ns) != Ok(h.published_at_ns) {
            last = Refused::Unstable;
            continue;
        }
        return decode(&payload, h.published_at_ns);
    }
    Err(last)
}

/// The payload's messages, as far as wallscope reads them (OTLP's
/// `ProcessContext`: a resource, then attributes of no resource, where
/// writers put the `threadlocal.*` keys).
#[derive(Clone, PartialEq, prost::Message)]
struct Payload {
    #[prost(message, optional, tag = "1")]
    resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    extra: Vec<KeyValue>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct Resource {
    #[prost(message, repeated, tag = "1")]
    attributes: Vec<KeyValue>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct KeyValue {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<AnyValue>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct AnyValue {
    #[prost(string, optional, tag = "1")]
    string: Option<String>,
    #[prost(message, optional, tag = "5")]
    array: Option<ArrayValue>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    values: Vec<AnyValue>,
}

/// Decodes a payload (at most [`MAX_PAYLOAD`] bytes, so the decoded
/// messages are bounded by it too).
pub fn decode(payload: &[u8], published_at_ns: u64) -> Result<ProcessContext, Refused> {
    let p = Payload::decode(payload).map_err(|_| Refused::Malformed)?;
    let all = p
        .resource
        .iter()
        .flat_map(|r| &r.attributes)
        .chain(&p.extra);
    let mut ctx = ProcessContext {
        published_at_ns,
        ..ProcessContext::default()
    };
    for kv in all {
        let value = kv.value.as_ref();
        let text = value.and_then(|v| v.string.as_deref());
        match kv.key.as_str() {
            "threadlocal.schema_version" => ctx.schema = text.map(clean),
            "threadlocal.attribute_key_map" => {
                let names = value.and_then(|v| v.array.as_ref());
                ctx.key_names = names
                    .iter()
                    .flat_map(|a| &a.values)
                    .take(MAX_KEYS)
                    .map(|v| clean(v.string.as_deref().unwrap_or("")))
                    .collect();
            }
            key if RESOURCE_KEYS.contains(&key) => {
                if let Some(t) = text {
                    ctx.resource.push((clean(key), clean(t)));
                }
            }
            _ => {}
        }
    }
    Ok(ctx)
}

/// `text` cut to [`MAX_NAME_BYTES`] (at a character boundary), control
/// characters replaced: names end up in reports and terminals.
pub fn clean(text: &str) -> Arc<str> {
    let mut out = String::with_capacity(text.len().min(MAX_NAME_BYTES));
    for c in text.chars() {
        if out.len() + c.len_utf8() > MAX_NAME_BYTES {
            break;
        }
        out.push(if c.is_control() { '?' } else { c });
    }
    out.into()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A header as a writer lays it out.
    pub fn header(sig: &[u8; 8], version: u32, size: u32, at: u64, ptr: u64) -> [u8; 32] {
        let mut b = [0; 32];
        b[..8].copy_from_slice(sig);
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[12..16].copy_from_slice(&size.to_le_bytes());
        b[16..24].copy_from_slice(&at.to_le_bytes());
        b[24..32].copy_from_slice(&ptr.to_le_bytes());
        b
    }

    fn kv(key: &str, value: AnyValue) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(value),
        }
    }
    fn text(s: &str) -> AnyValue {
        AnyValue {
            string: Some(s.into()),
            array: None,
        }
    }
    pub fn payload(names: &[&str]) -> Vec<u8> {
        Payload {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", text("shop\x1b[31m")),
                    kv("host.name", text("h")),
                ],
            }),
            extra: vec![
                kv("threadlocal.schema_version", text("tlsdesc_v1_dev")),
                kv(
                    "threadlocal.attribute_key_map",
                    AnyValue {
                        string: None,
                        array: Some(ArrayValue {
                            values: names.iter().map(|n| text(n)).collect(),
                        }),
                    },
                ),
            ],
        }
        .encode_to_vec()
    }

    #[test]
    fn headers_are_checked_before_anything_is_read() {
        let ok = Header::parse(&header(b"OTEL_CTX", 2, 300, 5, 0x1000)).unwrap();
        assert_eq!((ok.payload_size, ok.payload), (300, 0x1000));
        assert!(Header::parse(&header(b"OTEL_CTX", 1, 300, 5, 0x1000)).is_ok());
        let refused = |h| Header::parse(&h).unwrap_err();
        assert_eq!(refused(header(b"OTEL_CTy", 2, 3, 5, 1)), Refused::Signature);
        assert_eq!(refused(header(b"OTEL_CTX", 3, 3, 5, 1)), Refused::Signature);
        assert_eq!(
            refused(header(b"OTEL_CTX", 2, 3, 0, 1)),
            Refused::Unpublished
        );
        let huge = header(b"OTEL_CTX", 2, u32::MAX, 5, 1);
        assert_eq!(refused(huge), Refused::TooBig);
    }

    #[test]
    fn the_key_map_schema_and_resource_come_out_cleaned() {
        let ctx = decode(&payload(&["http_route", "http_method"]), 9).unwrap();
        assert_eq!(ctx.schema.as_deref(), Some("tlsdesc_v1_dev"));
        let names: Vec<&str> = ctx.key_names.iter().map(|n| &**n).collect();
        assert_eq!(names, ["http_route", "http_method"]);
        assert_eq!(ctx.resource.len(), 1, "host.name is not kept");
        assert_eq!(&*ctx.resource[0].1, "shop?[31m");
        assert!(decode(b"\xff\xff\xff", 1).is_err());
    }

    #[test]
    fn a_hostile_key_map_is_bounded() {
        let long = "x".repeat(10_000);
        let many: Vec<&str> = (0..1000).map(|_| long.as_str()).collect();
        let ctx = decode(&payload(&many), 1).unwrap();
        assert_eq!(ctx.key_names.len(), MAX_KEYS);
        assert!(
            ctx.bytes() > MAX_KEYS * MAX_NAME_BYTES && ctx.bytes() < 2 * MAX_KEYS * MAX_NAME_BYTES
        );
        assert!(ctx.key_names.iter().all(|n| n.len() == MAX_NAME_BYTES));
        assert_eq!(clean("é".repeat(100).as_str()).len(), MAX_NAME_BYTES);
    }

    #[test]
    fn reads_a_context_published_in_this_process() {
        let body = payload(&["http_route"]);
        let mut mapping = header(b"OTEL_CTX", 2, body.len() as u32, 77, body.as_ptr() as u64);
        let me = Remote::new(std::process::id());
        let ctx = read(&me, mapping.as_ptr() as u64).unwrap();
        assert_eq!((ctx.published_at_ns, ctx.key_names.len()), (77, 1));
        // A payload pointer into nowhere.
        mapping[24..32].copy_from_slice(&8u64.to_le_bytes());
        assert_eq!(read(&me, mapping.as_ptr() as u64), Err(Refused::Unreadable));
    }
}
