//! One interval's requests: for each of the busiest processes, its CPU
//! and off-CPU profiles of the window, fitted to Pyroscope's limits, in
//! one `PushRequest`.

use std::sync::Arc;

use prost::Message;

use super::{
    fit::{self, Trimmed},
    labels::SeriesLabels,
    outbox::Request,
    proto::{PushRequest, RawProfileSeries, RawSample},
    service::ServiceNames,
};
use crate::{
    bpf::abi::State,
    export::pprof::{self, Detail},
    jvm::Jvms,
    profile::{
        kind::{Group, Kind},
        query::{self, Filter},
        rows::Names,
        store::Snapshot,
        window::Window,
    },
};

/// The series of CPU time: Alloy's eBPF profiler's name, so that Grafana
/// shows both side by side.
pub const CPU_SERIES: &str = "process_cpu";
/// The series of off-CPU time (runqueue, throttled, futex, io, sleep),
/// each sample labelled with its `state`.
pub const OFFCPU_SERIES: &str = "wallscope_offcpu";
/// Processes pushed per interval by default, busiest (by wall time in
/// the interval) first.
pub const DEFAULT_TOP: usize = 32;

/// The series pushed for a process, and the kind each profiles.
const SERIES: [(&str, Kind); 2] = [
    (CPU_SERIES, Kind::State(State::Cpu)),
    (OFFCPU_SERIES, Kind::Offcpu),
];

/// What it takes to turn a window into requests.
pub struct Batcher {
    pub labels: SeriesLabels,
    pub jvms: Arc<Jvms>,
    /// Processes per interval.
    pub top: usize,
    pub services: ServiceNames,
}

impl Batcher {
    /// The requests of interval number `interval` over `window`, one per
    /// process with samples, and what fitting them trimmed.
    pub fn requests(
        &mut self,
        store: &Snapshot,
        window: Window,
        interval: u64,
    ) -> (Vec<Request>, Trimmed) {
        let pids = query::busiest(store, window, self.top);
        let names = Names::of(store.within(window));
        let mut trimmed = Trimmed::default();
        let mut out = Vec::new();
        for &pid in &pids {
            let comm = names.process(pid);
            let service = self
                .services
                .get(pid, comm, self.jvms.report(pid).is_some());
            let container = container_labels(store, pid);
            let mut series = Vec::new();
            for (name, kind) in SERIES {
                let filter = Filter {
                    pid: Some(pid),
                    tid: None,
                    kind,
                    group: Group::Process,
                    window,
                };
                // No sample label but `state`: each distinct set of sample
                // labels is a series to Pyroscope, and thread ids would
                // make thousands. The profile's time and duration are the
                // window's, so a reader can ask `/pprof` for the same one.
                let mut profile = pprof::build(store, &filter, Detail::Series);
                if profile.sample.is_empty() {
                    continue;
                }
                let (raw_profile, t) = fit::fit(&mut profile, pprof::encode_gzip);
                trimmed.samples += t.samples;
                trimmed.ns += t.ns;
                series.push(RawProfileSeries {
                    labels: self.labels.series(name, &service, &container),
                    samples: vec![RawSample {
                        raw_profile,
                        id: String::new(),
                    }],
                });
            }
            if !series.is_empty() {
                out.push(Request {
                    profiles: series.len() as u64,
                    body: PushRequest { series }.encode_to_vec(),
                    interval,
                    service,
                });
            }
        }
        self.services.keep_only(&pids);
        (out, trimmed)
    }
}

/// The labels of `pid`'s container (`container_id`, pod, namespace, …):
/// none until the store records containers.
fn container_labels(_store: &Snapshot, _pid: u32) -> Vec<(&'static str, String)> {
    Vec::new()
}
