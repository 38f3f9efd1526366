//! An interval's OTLP requests: each chosen process's CPU and off-CPU
//! profiles, built as `/pprof` builds them and fitted as Pyroscope's are,
//! turned into OTLP profiles over a dictionary shared by the request.

use std::collections::HashMap;

use prost::Message as _;

use super::{
    dictionary::{Dictionary, Frame},
    proto::{
        any_value::Value, AnyValue, ExportProfilesServiceRequest, InstrumentationScope, KeyValue,
        Profile, Resource, ResourceProfiles, Sample, ScopeProfiles, ValueType,
    },
};
use crate::{
    export::{
        pprof::{self, proto as pp, Detail, FrameKind},
        push::{
            choose::{spread, Chosen},
            fit::{self, Trimmed},
            outbox::Request,
            Encode, Sink, SinkKind, SENDERS,
        },
    },
    profile::model::state::State,
    profile::{
        model::{
            kind::{Group, Kind},
            spans::{SpanId, TraceId},
            store::Snapshot,
            window::{unix_nanos, Window},
        },
        report::query::Filter,
    },
    token::Token,
};

/// Bytes of profiles one request carries at most, as pprof (what the
/// dictionary shares makes the request smaller); a process whose
/// profiles are larger goes alone. The OTel Collector's gRPC receiver
/// takes 4 MiB by default.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// The profiles of a process: CPU, then off CPU.
const KINDS: [Kind; 2] = [Kind::State(State::Cpu), Kind::Offcpu];

/// Turns the chosen processes into OTLP requests.
pub struct Otlp {
    /// Requests sent at once: an interval's processes are spread over
    /// about this many requests.
    pub senders: usize,
    /// `host.name`, when this host has one.
    pub host: Option<String>,
}

impl Otlp {
    /// The OTLP sink: the receiver at `url` (its base, without the
    /// signal's path), with `Authorization: Bearer TOKEN` if given.
    pub fn sink(url: url::Url, token: Option<Token>) -> Sink {
        Sink {
            kind: SinkKind::Otlp,
            url,
            token,
            protocol: super::PROTOCOL,
            encoder: Box::new(Otlp {
                senders: SENDERS,
                host: crate::hostname::this_host_name(),
            }),
        }
    }
}

/// A process's fitted pprof profiles, by kind.
type Part<'a> = (&'a Chosen, Vec<(Kind, pp::Profile)>);

impl Encode for Otlp {
    fn requests(
        &mut self,
        store: &Snapshot,
        window: Window,
        chosen: &[Chosen],
        interval: u64,
    ) -> (Vec<Request>, Trimmed) {
        let mut trimmed = Trimmed::default();
        let parts: Vec<(Part, usize)> = chosen
            .iter()
            .filter_map(|c| {
                let profiles = profiles(store, window, c.pid, &mut trimmed);
                let bytes = profiles.iter().map(|(_, p)| p.encoded_len()).sum();
                (!profiles.is_empty()).then_some(((c, profiles), bytes))
            })
            .collect();
        let packs = spread(parts, chosen.len(), self.senders, MAX_REQUEST_BYTES);
        let out = Request::batch(packs, interval, |pack| {
            let services: Vec<&str> = pack.iter().map(|(c, _)| c.service.as_str()).collect();
            let (request, profiles) = self.request(&pack, window);
            (
                request.encode_to_vec(),
                profiles,
                Request::services(&services),
            )
        });
        (out, trimmed)
    }
}

impl Otlp {
    /// One request of `parts`, and how many profiles it holds.
    fn request(&self, parts: &[Part], window: Window) -> (ExportProfilesServiceRequest, u64) {
        let mut dict = Dictionary::default();
        let mut count = 0;
        let resource_profiles = parts
            .iter()
            .map(|(c, profiles)| {
                let profiles: Vec<Profile> = profiles
                    .iter()
                    .map(|(kind, p)| convert(&mut dict, p, *kind, window))
                    .collect();
                count += profiles.len() as u64;
                ResourceProfiles {
                    resource: Some(Resource {
                        attributes: self.resource(c),
                    }),
                    scope_profiles: vec![ScopeProfiles {
                        scope: Some(InstrumentationScope {
                            name: super::SCOPE.into(),
                            version: env!("CARGO_PKG_VERSION").into(),
                        }),
                        profiles,
                        schema_url: String::new(),
                    }],
                    schema_url: String::new(),
                }
            })
            .collect();
        let request = ExportProfilesServiceRequest {
            resource_profiles,
            dictionary: Some(dict.finish()),
        };
        (request, count)
    }

    /// A process's resource attributes.
    fn resource(&self, c: &Chosen) -> Vec<KeyValue> {
        let text = |key: &str, value: &str| KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(Value::StringValue(value.into())),
            }),
        };
        let mut out = vec![
            text(super::SERVICE_NAME, &c.service),
            KeyValue {
                key: super::PROCESS_PID.into(),
                value: Some(AnyValue {
                    value: Some(Value::IntValue(i64::from(c.pid))),
                }),
            },
        ];
        if let Some(host) = &self.host {
            out.push(text(super::HOST_NAME, host));
        }
        for (label, value) in &c.container {
            let key = match *label {
                "container_id" => super::CONTAINER_ID,
                "namespace" => "k8s.namespace.name",
                "pod" => "k8s.pod.name",
                "container" => "k8s.container.name",
                _ => continue,
            };
            out.push(text(key, value));
        }
        out
    }
}

/// Process `pid`'s profiles over `window` (those with samples), per
/// thread, fitted to Pyroscope's limits (which bounds a request too).
fn profiles(
    store: &Snapshot,
    window: Window,
    pid: u32,
    trimmed: &mut Trimmed,
) -> Vec<(Kind, pp::Profile)> {
    KINDS
        .into_iter()
        .filter_map(|kind| {
            let filter = Filter {
                pid: Some(pid),
                tid: None,
                kind,
                group: Group::Thread,
                window,
                others_hidden: false,
            };
            let mut profile = pprof::build(store, &filter, Detail::Threads);
            if profile.sample.is_empty() {
                return None;
            }
            let t = fit::fit(&mut profile);
            trimmed.samples += t.samples;
            trimmed.ns += t.ns;
            Some((kind, profile))
        })
        .collect()
}

/// The OTLP profile of pprof profile `p` of `kind`: its nanoseconds, its
/// frames and thread labels through `dict`.
fn convert(dict: &mut Dictionary, p: &pp::Profile, kind: Kind, window: Window) -> Profile {
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .map_or("", String::as_str)
    };
    let kinds: HashMap<u64, FrameKind> = p
        .mapping
        .iter()
        .filter_map(|m| Some((m.id, FrameKind::of_mapping(string(m.filename))?)))
        .collect();
    let functions: HashMap<u64, &str> = p.function.iter().map(|f| (f.id, string(f.name))).collect();
    let locations: HashMap<u64, i32> = p
        .location
        .iter()
        .map(|l| {
            let kind = kinds
                .get(&l.mapping_id)
                .copied()
                .unwrap_or(FrameKind::Native);
            let name = l
                .line
                .first()
                .and_then(|line| functions.get(&line.function_id))
                .copied()
                .unwrap_or("");
            (l.id, dict.location(&frame(kind, name)))
        })
        .collect();
    // The nanoseconds: pprof's second value ([`pprof::sample_types`]).
    let ns = p
        .sample_type
        .iter()
        .position(|t| string(t.unit) == "nanoseconds")
        .unwrap_or(1);
    let offcpu = kind != Kind::State(State::Cpu);
    let mut samples: Vec<Sample> = Vec::with_capacity(p.sample.len());
    let mut seen: HashMap<(i32, Vec<i32>, i32), usize> = HashMap::new();
    for s in &p.sample {
        let stack = s
            .location_id
            .iter()
            .filter_map(|id| locations.get(id).copied())
            .collect();
        let stack_index = dict.stack(stack);
        let mut attributes: Vec<i32> = s
            .label
            .iter()
            .filter_map(|l| match string(l.key) {
                "thread_id" => Some(dict.int_attribute(super::THREAD_ID, l.num)),
                "thread_name" => Some(dict.attribute(super::THREAD_NAME, string(l.str))),
                "pool" => Some(dict.attribute(super::POOL, string(l.str))),
                "state" if offcpu => Some(dict.attribute(super::STATE, string(l.str))),
                // A span's attributes under their own names.
                key => (key.strip_prefix("attr.")).map(|name| dict.attribute(name, string(l.str))),
                // pid, comm and the container are the resource's.
            })
            .collect();
        attributes.sort_unstable();
        let link_index = link_of(dict, s, string);
        let value = s.value.get(ns).copied().unwrap_or(0);
        // Samples that differed only by what the resource holds (a pid
        // reused within the window) are one sample here.
        let key = (stack_index, attributes, link_index);
        match seen.get(&key) {
            Some(&at) => samples[at].values[0] += value,
            None => {
                seen.insert(key.clone(), samples.len());
                samples.push(Sample {
                    stack_index,
                    attribute_indices: key.1,
                    link_index,
                    values: vec![value],
                });
            }
        }
    }
    let value_type = |dict: &mut Dictionary, (ty, unit): (&str, &str)| ValueType {
        type_strindex: dict.string(ty),
        unit_strindex: dict.string(unit),
    };
    let sample_type = if offcpu {
        super::OFFCPU_TYPE
    } else {
        super::CPU_TYPE
    };
    // CPU samples are taken every `period` nanoseconds of CPU time;
    // off-CPU time is exact or sampled by interval length, with no period.
    let period = (!offcpu && p.period > 0).then_some(p.period);
    Profile {
        sample_type: Some(value_type(dict, sample_type)),
        samples,
        time_unix_nano: unix_nanos(window.from),
        duration_nano: u64::try_from(window.length().as_nanos()).unwrap_or(u64::MAX),
        period_type: period.map(|_| value_type(dict, super::CPU_TYPE)),
        period: period.unwrap_or(0),
        attribute_indices: Vec::new(),
    }
}

/// The link of a sample labelled with a span (`span_id`, `trace_id`:
/// [`pprof`]'s span labels), 0 (none) otherwise.
fn link_of<'a>(dict: &mut Dictionary, s: &pp::Sample, string: impl Fn(i64) -> &'a str) -> i32 {
    let label = |key: &str| {
        (s.label.iter())
            .find(|l| string(l.key) == key)
            .map(|l| string(l.str))
    };
    let Some(span) = label("span_id").and_then(SpanId::parse) else {
        return 0;
    };
    let trace = label("trace_id")
        .and_then(TraceId::parse)
        .unwrap_or_default();
    dict.link(trace.0, span.0)
}

/// The location of a frame of `kind` named `name` (pprof's function name,
/// its kind's suffix gone): Python frames (`qualname (file:line)_[py]`,
/// which pprof keeps as native) get their file and first line.
pub fn frame(kind: FrameKind, name: &str) -> Frame<'_> {
    let (ty, mapping) = match kind {
        FrameKind::Kernel => ("kernel", kind.mapping_name()),
        FrameKind::Native => ("native", kind.mapping_name()),
        FrameKind::JavaInterpreted
        | FrameKind::JavaC1
        | FrameKind::JavaJit
        | FrameKind::JavaInlined => ("jvm", kind.mapping_name()),
        // `[unattributed]`, `[irq]`, `[trimmed]`: no code of any kind; a
        // custom value, as the convention allows.
        FrameKind::Synthetic => ("wallscope", kind.mapping_name()),
    };
    let plain = Frame {
        ty,
        mapping,
        function: name,
        file: "",
        line: 0,
    };
    let Some(python) = name
        .strip_suffix("_[py]")
        .filter(|_| kind == FrameKind::Native)
    else {
        return plain;
    };
    let at = python
        .strip_suffix(')')
        .and_then(|rest| rest.rsplit_once(" ("))
        .and_then(|(function, place)| {
            let (file, line) = place.rsplit_once(':')?;
            Some((function, file, line.parse().ok()?))
        });
    let (function, file, line) = at.unwrap_or((python, "", 0));
    Frame {
        ty: "cpython",
        mapping: "[python]",
        function,
        file,
        line,
    }
}
