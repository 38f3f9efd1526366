//! The messages of Pyroscope's Push API (`api/push/v1/push.proto` and the
//! `LabelPair` of `api/types/v1/types.proto`), as prost structs: no protoc
//! at build time, and prost does the encoding. Field numbers and types
//! follow the .proto files exactly.

/// One `Push` call: profiles grouped by series.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<RawProfileSeries>,
}

/// The profiles of one series: its labels (`__name__`, `service_name`, …)
/// and one or more pprof profiles.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// One profile: a gzip-compressed pprof `Profile` and an optional id.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSample {
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
    #[prost(string, tag = "2")]
    pub id: String,
}

/// A series label.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, prost::Message)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// The (empty) answer to a push.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct PushResponse {}

impl LabelPair {
    /// A label from its name and value.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> LabelPair {
        LabelPair {
            name: name.into(),
            value: value.into(),
        }
    }
}
