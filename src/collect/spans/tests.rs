use super::*;

use crate::bpf::abi::{SpanRecord as BpfRecord, SpanRecordKey, SpanTimes};

fn entry(key: u8, value: &[u8]) -> Vec<u8> {
    let mut e = vec![key, value.len() as u8];
    e.extend_from_slice(value);
    e
}

fn names(list: &[&str]) -> Arc<[Arc<str>]> {
    list.iter().map(|n| Arc::<str>::from(*n)).collect()
}

fn pairs(attrs: &[(Arc<str>, Arc<str>)]) -> Vec<(String, String)> {
    attrs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_truncated_entry_ends_the_attributes() {
    let mut bytes = entry(0, b"GET /users");
    let whole = bytes.len();
    bytes.extend(entry(1, b"eu-west"));
    // Cut in the second entry's value, then after its key byte only.
    for cut in [bytes.len() - 3, whole + 1] {
        let (attrs, truncated) = parse_attrs(&bytes[..cut], Some(&names(&["route", "region"])));
        assert_eq!(pairs(&attrs), [("route".into(), "GET /users".into())]);
        assert!(truncated, "cut at {cut}");
    }
    let (attrs, truncated) = parse_attrs(&bytes, Some(&names(&["route", "region"])));
    assert_eq!(attrs.len(), 2);
    assert!(!truncated);
}

#[test]
fn unknown_indexes_are_dropped_with_a_key_map_and_numbered_without() {
    let mut bytes = entry(0, b"a");
    bytes.extend(entry(7, b"b"));
    let (attrs, _) = parse_attrs(&bytes, Some(&names(&["route"])));
    assert_eq!(pairs(&attrs), [("route".into(), "a".into())]);
    let (attrs, _) = parse_attrs(&bytes, None);
    assert_eq!(
        pairs(&attrs),
        [("#0".into(), "a".into()), ("#7".into(), "b".into())]
    );
}

#[test]
fn a_repeated_key_keeps_its_last_value() {
    let mut bytes = entry(1, b"first");
    bytes.extend(entry(0, b"x"));
    bytes.extend(entry(1, b"last"));
    let (attrs, truncated) = parse_attrs(&bytes, Some(&names(&["a", "b"])));
    assert_eq!(
        pairs(&attrs),
        [("b".into(), "last".into()), ("a".into(), "x".into())]
    );
    assert!(!truncated);
}

#[test]
fn values_and_names_are_cleaned() {
    let bytes = entry(0, b"a;b\nc\xff");
    let (attrs, _) = parse_attrs(&bytes, Some(&names(&["ro;ute"])));
    let (name, value) = &attrs[0];
    assert!(!name.contains(';'));
    assert!(!value.contains(';') && !value.contains('\n'));
}

/// 255 attributes of `len` bytes as BPF keeps them: the first
/// WS_SPAN_ATTR_BYTES bytes.
fn huge(len: usize) -> (SpanRecordKey, BpfRecord) {
    let mut all = Vec::new();
    for key in 0..255u8 {
        all.extend(entry(key, &vec![b'v'; len]));
    }
    let mut rec = BpfRecord {
        flags: 1,
        attrs_size: u16::MAX,
        attrs_len: SPAN_ATTR_BYTES as u16,
        trace_id: [7; 16],
        ..Default::default()
    };
    rec.attrs.copy_from_slice(&all[..SPAN_ATTR_BYTES]);
    let key = SpanRecordKey {
        pid: 42,
        span: u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8]),
        ..Default::default()
    };
    (key, rec)
}

/// 255 attributes of 255 bytes (65 KiB): not one whole attribute fits the
/// bound (2 + 255 bytes); the record says it was cut.
#[test]
fn a_huge_record_is_cut_at_the_bound() {
    let (key, mut rec) = huge(255);
    let raw = RawSpanRecord::from_bpf(&key, &rec).unwrap();
    assert_eq!(raw.attrs.len(), SPAN_ATTR_BYTES);
    let parsed = raw.parse(None);
    assert!(parsed.attrs.is_empty());
    assert!(parsed.attrs_cut);
    assert_eq!(parsed.span.hex(), "0102030405060708");
    assert_eq!(parsed.trace.0, [7; 16]);
    assert_eq!((parsed.pid, parsed.flags), (42, 1));
    // A kept length past the buffer (a corrupt row) reads only the buffer.
    rec.attrs_len = u16::MAX;
    assert_eq!(
        RawSpanRecord::from_bpf(&key, &rec).unwrap().attrs.len(),
        SPAN_ATTR_BYTES
    );
}

/// Shorter values: the whole ones that fit are kept, the rest cut.
#[test]
fn the_attributes_that_fit_the_bound_are_kept() {
    let (key, rec) = huge(100);
    let parsed = RawSpanRecord::from_bpf(&key, &rec).unwrap().parse(None);
    let fit = SPAN_ATTR_BYTES / 102;
    assert_eq!(parsed.attrs.len(), fit);
    assert!(parsed.attrs.iter().all(|(_, v)| v.len() == 100));
    assert!(parsed.attrs_cut);
}

#[test]
fn a_whole_record_is_not_cut() {
    let bytes = entry(0, b"GET /");
    let mut rec = BpfRecord {
        attrs_size: bytes.len() as u16,
        attrs_len: bytes.len() as u16,
        ..Default::default()
    };
    rec.attrs[..bytes.len()].copy_from_slice(&bytes);
    let key = SpanRecordKey {
        pid: 1,
        span: 9,
        ..Default::default()
    };
    let parsed = RawSpanRecord::from_bpf(&key, &rec).unwrap().parse(None);
    assert!(!parsed.attrs_cut);
    assert_eq!(pairs(&parsed.attrs), [("#0".into(), "GET /".into())]);
}

#[test]
fn rows_without_a_span_are_none() {
    let key = SpanRecordKey::default();
    assert!(RawSpanRecord::from_bpf(&key, &BpfRecord::default()).is_none());
    assert!(span_time(&SpanKey::default(), &SpanTimes::default()).is_none());
}

#[test]
fn span_times_convert_as_they_are() {
    let key = SpanKey {
        pid: 3,
        tid: 4,
        span: 0xabcd,
    };
    let t = SpanTimes {
        ns: [1, 2, 3, 4, 5, 6],
        first_ns: 10,
        last_ns: 20,
    };
    let s = span_time(&key, &t).unwrap();
    assert_eq!(
        (s.pid, s.tid, s.ns, s.first_ns, s.last_ns),
        (3, 4, [1, 2, 3, 4, 5, 6], 10, 20)
    );
    assert_eq!(s.span, SpanId::from_raw(0xabcd).unwrap());
}
