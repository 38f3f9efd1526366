//! The parameters that choose spans: `span_id=` (16 lowercase hex
//! digits), `trace_id=` (32), and `attr.NAME=VALUE` (repeatable, one per
//! name), split off the query before [`Params::parse`], which takes only
//! names it knows.

use super::{error::ApiError, params::Params};
use crate::profile::{
    model::spans::{SpanId, TraceId},
    report::spans::select::{SpanMatch, MAX_ATTR_FILTERS},
};

/// The parameters [`span_match`] reads from [`Params`].
pub(super) const SPAN_PARAMS: [&str; 2] = ["span_id", "trace_id"];

/// What an `attr.` filter's name may be (OTel attribute names: letters,
/// digits, `_`, `.`, `-`).
const MAX_ATTR_NAME: usize = 64;
/// Bytes an `attr.` filter's value may have (a record's attribute value
/// holds at most 255).
const MAX_ATTR_VALUE: usize = 255;

/// The query without its `attr.` pairs, and those pairs (names without
/// `attr.`), checked.
pub(super) fn split_attrs(raw: Option<&str>) -> Result<(String, Vec<(String, String)>), ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.unwrap_or(""))
        .map_err(|e| ApiError::bad("query", format!("malformed query string: {e}")))?;
    let (attrs, rest): (Vec<_>, Vec<_>) =
        pairs.into_iter().partition(|(n, _)| n.starts_with("attr."));
    let mut out: Vec<(String, String)> = Vec::new();
    for (param, value) in attrs {
        let name = &param["attr.".len()..];
        if !attr_name_ok(name) {
            return Err(ApiError::bad(
                &param,
                format!(
                    "an attribute name is 1 to {MAX_ATTR_NAME} letters, digits, `_`, `.` or `-`"
                ),
            ));
        }
        if value.len() > MAX_ATTR_VALUE {
            return Err(ApiError::bad(
                &param,
                format!("longer than {MAX_ATTR_VALUE} bytes"),
            ));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(ApiError::bad(&param, "given more than once"));
        }
        if out.len() == MAX_ATTR_FILTERS {
            return Err(ApiError::bad(
                &param,
                format!("at most {MAX_ATTR_FILTERS} `attr.` filters"),
            ));
        }
        out.push((name.to_string(), value));
    }
    let rest = serde_urlencoded::to_string(rest)
        .map_err(|e| ApiError::bad("query", format!("malformed query string: {e}")))?;
    Ok((rest, out))
}

/// `group=attr.NAME` taken out of a query (`/folded`, `/flamegraph`):
/// the query without it, and `NAME`. Other `group=` values stay.
pub(super) fn split_group_attr(query: &str) -> Result<(String, Option<String>), ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|e| ApiError::bad("query", format!("malformed query string: {e}")))?;
    let (by_attr, rest): (Vec<_>, Vec<_>) =
        (pairs.into_iter()).partition(|(n, v)| n == "group" && v.starts_with("attr."));
    let name = match by_attr.as_slice() {
        [] => None,
        [(_, value)] => {
            let name = &value["attr.".len()..];
            if !attr_name_ok(name) {
                return Err(ApiError::bad("group", format!("`attr.` and an attribute name of 1 to {MAX_ATTR_NAME} letters, digits, `_`, `.` or `-`")));
            }
            Some(name.to_string())
        }
        _ => return Err(ApiError::bad("group", "given more than once")),
    };
    let rest = serde_urlencoded::to_string(rest)
        .map_err(|e| ApiError::bad("query", format!("malformed query string: {e}")))?;
    Ok((rest, name))
}

/// `group=attr.NAME` is for one process: its rows are re-rooted in one
/// slice, never the whole host's.
pub(super) fn group_attr_needs_pid(
    by_attr: Option<&str>,
    pid: Option<u32>,
) -> Result<(), ApiError> {
    match (by_attr, pid) {
        (Some(_), None) => Err(ApiError::bad("group", "`group=attr.NAME` needs `pid=`")),
        _ => Ok(()),
    }
}

fn attr_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ATTR_NAME
        && (name.bytes()).all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Lowercase hex of `len` digits, as W3C Trace Context writes ids.
fn lower_hex(raw: &str, len: usize) -> bool {
    raw.len() == len && (raw.bytes()).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The spans `p` and the `attr.` pairs ask for.
pub(super) fn span_match(p: &Params, attrs: Vec<(String, String)>) -> Result<SpanMatch, ApiError> {
    let span = match p.text("span_id") {
        None => None,
        Some(raw) => Some(
            SpanId::parse(raw)
                .filter(|_| lower_hex(raw, 16))
                .ok_or_else(|| {
                    ApiError::bad(
                        "span_id",
                        "expected 16 lowercase hex digits, not all zero (W3C Trace Context)",
                    )
                })?,
        ),
    };
    let trace = match p.text("trace_id") {
        None => None,
        Some(raw) => Some(
            TraceId::parse(raw)
                .filter(|_| lower_hex(raw, 32))
                .ok_or_else(|| {
                    ApiError::bad(
                        "trace_id",
                        "expected 32 lowercase hex digits, not all zero (W3C Trace Context)",
                    )
                })?,
        ),
    };
    Ok(SpanMatch { span, trace, attrs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(q: &str) -> Result<SpanMatch, ApiError> {
        let (rest, attrs) = split_attrs(Some(q))?;
        let p = Params::parse(Some(&rest), &[&SPAN_PARAMS[..], &["pid"]].concat())?;
        span_match(&p, attrs)
    }

    fn param_of(e: ApiError) -> String {
        match e {
            ApiError::BadParam { param, .. } => param,
            other => panic!("not a bad parameter: {other:?}"),
        }
    }

    #[test]
    fn ids_and_attributes_parse_and_bad_ones_name_their_parameter() {
        let m =
            parsed("pid=4&span_id=00f067aa0ba902b7&attr.http_route=%2Fcart&attr.env=prod").unwrap();
        assert_eq!(m.span.unwrap().hex(), "00f067aa0ba902b7");
        assert_eq!(
            m.attrs,
            [
                ("http_route".into(), "/cart".into()),
                ("env".into(), "prod".into())
            ]
        );
        let t = parsed("trace_id=4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        assert_eq!(t.trace.unwrap().hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        for (q, param) in [
            ("span_id=00F067AA0BA902B7", "span_id"),
            ("span_id=0000000000000000", "span_id"),
            ("span_id=00f067aa0ba902b", "span_id"),
            ("trace_id=4bf92f3577b34da6a3ce929d0e0e473", "trace_id"),
            ("trace_id=zz", "trace_id"),
            ("attr.=x", "attr."),
            ("attr.a%20b=x", "attr.a b"),
            ("attr.a=1&attr.a=2", "attr.a"),
            ("pdi=3", "pdi"),
        ] {
            assert_eq!(param_of(parsed(q).unwrap_err()), param, "{q}");
        }
        let long = format!("attr.a={}", "v".repeat(MAX_ATTR_VALUE + 1));
        assert_eq!(param_of(parsed(&long).unwrap_err()), "attr.a");
        let many: Vec<String> = (0..=MAX_ATTR_FILTERS)
            .map(|i| format!("attr.a{i}=x"))
            .collect();
        assert!(parsed(&many.join("&")).is_err());
    }
}
