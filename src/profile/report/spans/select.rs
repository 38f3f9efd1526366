//! Which spans a query asks about: `span_id=`, `trace_id=` and
//! `attr.NAME=VALUE` (all must hold).

use crate::profile::model::spans::{SpanId, SpanRecord, TraceId};

/// Most `attr.NAME=VALUE` filters one query may give.
pub const MAX_ATTR_FILTERS: usize = 16;

/// The spans a query keeps; the default keeps every span.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpanMatch {
    pub span: Option<SpanId>,
    pub trace: Option<TraceId>,
    /// Attribute names and the values they must have.
    pub attrs: Vec<(String, String)>,
}

impl SpanMatch {
    /// Whether it keeps every span (and time under none).
    pub fn is_any(&self) -> bool {
        self.span.is_none() && self.trace.is_none() && self.attrs.is_empty()
    }

    /// Whether span `span`, whose record is `record` when known, is kept.
    /// A span without a record has no trace or attribute to match.
    pub fn keeps(&self, span: SpanId, record: Option<&SpanRecord>) -> bool {
        if self.span.is_some_and(|s| s != span) {
            return false;
        }
        if self.trace.is_none() && self.attrs.is_empty() {
            return true;
        }
        let Some(record) = record else {
            return false;
        };
        self.trace.is_none_or(|t| t == record.trace)
            && (self.attrs.iter()).all(|(name, value)| attr(record, name) == Some(value.as_str()))
    }
}

/// The value `record` gives attribute `name`.
pub fn attr<'a>(record: &'a SpanRecord, name: &str) -> Option<&'a str> {
    (record.attrs.iter())
        .rev()
        .find(|(n, _)| &**n == name)
        .map(|(_, v)| &**v)
}
