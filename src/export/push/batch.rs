//! Pyroscope's requests of an interval: for each chosen process, its CPU
//! and off-CPU profiles of the window, fitted to Pyroscope's limits, as
//! series of `PushRequest`s (several processes each: Pyroscope takes many
//! series per call, and answers each call only after its ~500 ms flush).

use prost::Message;

use super::{
    choose::{spread, Chosen},
    fit::{self, Trimmed},
    labels::SeriesLabels,
    outbox::Request,
    proto::{PushRequest, RawProfileSeries, RawSample},
    Encode,
};
use crate::{
    export::pprof::{self, Detail},
    profile::model::state::State,
    profile::{
        model::{
            kind::{Group, Kind},
            store::Snapshot,
            window::Window,
        },
        report::query::Filter,
    },
};

/// The series of CPU time: Alloy's eBPF profiler's name, so that Grafana
/// shows both side by side.
pub const CPU_SERIES: &str = "process_cpu";
/// The series of off-CPU time (runqueue, throttled, futex, io, sleep),
/// each sample labelled with its `state`.
pub const OFFCPU_SERIES: &str = "wallscope_offcpu";

/// The series pushed for a process, and the kind each profiles.
const SERIES: [(&str, Kind); 2] = [
    (CPU_SERIES, Kind::State(State::Cpu)),
    (OFFCPU_SERIES, Kind::Offcpu),
];

/// Bytes of series one request carries at most (Pyroscope refuses
/// profiles over 4 MiB; a request of several stays well under what its
/// HTTP server reads).
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// What it takes to turn the chosen processes into Pyroscope requests.
pub struct Batcher {
    pub labels: SeriesLabels,
    /// Requests sent at once: an interval's processes are spread over
    /// about this many requests, so that they all go out together.
    pub senders: usize,
}

impl Encode for Batcher {
    /// The chosen processes' series spread over about
    /// [`Batcher::senders`] requests of at most [`MAX_REQUEST_BYTES`].
    fn requests(
        &mut self,
        store: &Snapshot,
        window: Window,
        chosen: &[Chosen],
        interval: u64,
    ) -> (Vec<Request>, Trimmed) {
        let mut trimmed = Trimmed::default();
        let parts: Vec<_> = chosen
            .iter()
            .filter_map(|c| {
                let series = self.series(store, window, c, &mut trimmed);
                let bytes: usize = series.iter().map(|s| s.encoded_len()).sum();
                (!series.is_empty()).then_some(((c.service.as_str(), series), bytes))
            })
            .collect();
        let packs = spread(parts, chosen.len(), self.senders, MAX_REQUEST_BYTES);
        let out = Request::batch(packs, interval, |pack| {
            let (services, series): (Vec<&str>, Vec<Vec<RawProfileSeries>>) =
                pack.into_iter().unzip();
            let series: Vec<RawProfileSeries> = series.into_iter().flatten().collect();
            let profiles = series.len() as u64;
            let body = PushRequest { series }.encode_to_vec();
            (body, profiles, Request::services(&services))
        });
        (out, trimmed)
    }
}

impl Batcher {
    /// Process `c`'s series over `window` (those with samples).
    fn series(
        &self,
        store: &Snapshot,
        window: Window,
        c: &Chosen,
        trimmed: &mut Trimmed,
    ) -> Vec<RawProfileSeries> {
        let mut series = Vec::new();
        for (name, kind) in SERIES {
            let filter = Filter {
                pid: Some(c.pid),
                tid: None,
                kind,
                group: Group::Process,
                window,
                others_hidden: false,
            };
            // No sample label but `state`: each distinct set of sample
            // labels is a series to Pyroscope, and thread ids would make
            // thousands. The profile's time and duration are the window's,
            // so a reader can ask `/pprof` for the same one.
            let mut profile = pprof::build(store, &filter, Detail::Series);
            if profile.sample.is_empty() {
                continue;
            }
            let t = fit::fit(&mut profile);
            trimmed.samples += t.samples;
            trimmed.ns += t.ns;
            series.push(RawProfileSeries {
                labels: self.labels.series(name, &c.service, &c.container),
                samples: vec![RawSample {
                    raw_profile: pprof::encode_gzip(&profile),
                    id: String::new(),
                }],
            });
        }
        series
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::{BTreeMap, HashMap},
        io::Read as _,
        sync::Arc,
        time::{Duration, SystemTime},
    };

    use super::*;
    use crate::export::push::{choose::Chooser, service::ServiceNames};
    use crate::process::ProcessTable;
    use crate::profile::model::counters::{RawThread, ThreadCounters};
    use crate::{
        export::pprof::proto::Profile,
        profile::model::window::unix_nanos,
        profile::model::{store::Store, Sample, Slice},
    };

    /// A pid no process has: not a kernel thread, and its own name.
    const APP: u32 = 4_194_300;
    const MS: u64 = 1_000_000;

    fn thread(pid: u32, tid: u32, state: State, ns: u64) -> RawThread {
        let mut all = [0; State::COUNT];
        all[state as usize] = ns;
        RawThread {
            tid,
            pid,
            comm: String::new(),
            counters: ThreadCounters {
                ns: all,
                switches_voluntary: 0,
                switches_involuntary: 0,
                wakeups_sent: 0,
                wakeups_received: 0,
            },
        }
    }

    /// A kernel thread of this host, if this pid namespace shows any.
    fn kernel_thread() -> Option<u32> {
        let table = ProcessTable::default();
        (1..=4096).find(|pid| table.is_kernel_thread(*pid))
    }

    /// One second of the app (cpu 300 ms, futex 700 ms on another thread),
    /// of process `k` asleep for `k_wall` and of a quiet third process.
    fn store(end: SystemTime, k: u32, k_wall: u64) -> Store {
        let sample = |pid, tid, state, frames: &[&str], ns| Sample {
            pid,
            tid,
            state,
            stack: frames.iter().map(|f| Arc::<str>::from(*f)).collect(),
            ns,
            count: 1,
        };
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        slice.samples = vec![
            sample(APP, APP, State::Cpu, &["main", "work"], 300 * MS),
            sample(APP, APP + 1, State::Futex, &["main", "lock"], 700 * MS),
            sample(k, k, State::Sleep, &["kthreadd"], k_wall),
        ];
        slice.thread_totals = vec![
            thread(APP, APP, State::Cpu, 300 * MS),
            thread(APP, APP + 1, State::Futex, 700 * MS),
            thread(k, k, State::Sleep, k_wall),
            thread(APP + 10, APP + 10, State::Sleep, 10 * MS),
        ];
        slice.processes = HashMap::from([
            (APP, Arc::from("app")),
            (k, Arc::from("kthreadd")),
            (APP + 10, Arc::from("quiet")),
        ]);
        let mut store = Store::new(Duration::from_secs(600));
        store.push(slice);
        store
    }

    fn decode(raw: &[u8]) -> Profile {
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(raw)
            .read_to_end(&mut bytes)
            .unwrap();
        Profile::decode(&bytes[..]).unwrap()
    }

    #[test]
    fn a_request_per_busy_process_with_both_series() {
        let end = SystemTime::now();
        let window = Window::between(end - Duration::from_secs(2), end);
        let table: Arc<ProcessTable> = Arc::default();
        let mut chooser = Chooser {
            top: 1,
            services: ServiceNames::new(&table),
            user_of: Box::new(move |pid| table.user_of(pid)),
        };
        let mut batcher = Batcher {
            labels: SeriesLabels::new(vec![("env".into(), "dev".into())], "box".into()).unwrap(),
            senders: 4,
        };
        // A kernel thread with more wall time than the app; without one
        // in sight (a container), a process with less.
        let (k, k_wall) = kernel_thread().map_or((APP + 20, 5 * MS), |k| (k, 3000 * MS));
        let snapshot = store(end, k, k_wall).snapshot();
        let chosen = chooser.choose(&snapshot, window);
        let (requests, trimmed) = batcher.requests(&snapshot, window, &chosen, 7);
        assert_eq!(trimmed, Trimmed::default());
        // Kernel threads are not pushed; top 1 leaves the others out.
        assert_eq!(requests.len(), 1);
        let r = &requests[0];
        assert_eq!((r.interval, r.profiles, r.service.as_str()), (7, 2, "app"));
        let push = PushRequest::decode(&r.body[..]).unwrap();
        let mut totals = BTreeMap::new();
        for series in &push.series {
            let labels: BTreeMap<&str, &str> = series
                .labels
                .iter()
                .map(|l| (l.name.as_str(), l.value.as_str()))
                .collect();
            assert_eq!(labels["service_name"], "app");
            assert_eq!((labels["env"], labels["hostname"]), ("dev", "box"));
            let p = decode(&series.samples[0].raw_profile);
            assert_eq!(p.time_nanos as u64, unix_nanos(window.from));
            assert_eq!(p.duration_nanos, 2_000_000_000);
            for s in &p.sample {
                let keys: Vec<&str> = s
                    .label
                    .iter()
                    .map(|l| p.string_table[l.key as usize].as_str())
                    .collect();
                assert_eq!(keys, ["state"]);
                let state = p.string_table[s.label[0].str as usize].clone();
                *totals
                    .entry((labels["__name__"].to_string(), state))
                    .or_default() += s.value[1];
            }
        }
        let want = BTreeMap::from([
            ((CPU_SERIES.to_string(), "cpu".to_string()), 300 * MS as i64),
            (
                (OFFCPU_SERIES.to_string(), "futex".to_string()),
                700 * MS as i64,
            ),
        ]);
        assert_eq!(totals, want);
        // A window with nothing in it makes no requests.
        let empty = Window::between(end, end + Duration::from_secs(1));
        let chosen = chooser.choose(&snapshot, empty);
        assert!(batcher.requests(&snapshot, empty, &chosen, 9).0.is_empty());
    }

    #[test]
    fn one_users_many_busy_processes_leave_another_users_one_its_share() {
        // 21 processes of one user on CPU, and one of another user less so.
        const CROWD: u32 = APP + 100;
        let end = SystemTime::now();
        let window = Window::between(end - Duration::from_secs(1), end);
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        for pid in (CROWD..CROWD + 21).chain([APP]) {
            let ns = if pid == APP { 100 * MS } else { 900 * MS };
            slice.samples.push(Sample {
                pid,
                tid: pid,
                state: State::Cpu,
                stack: vec![Arc::from("spin")].into(),
                ns,
                count: 1,
            });
            slice.thread_totals.push(thread(pid, pid, State::Cpu, ns));
            slice
                .processes
                .insert(pid, Arc::from(format!("p{pid}").as_str()));
        }
        let mut store = Store::new(Duration::from_secs(600));
        store.push(slice);
        let mut chooser = Chooser {
            top: 20,
            services: ServiceNames::new(&Arc::default()),
            user_of: Box::new(|pid| Some(if pid >= CROWD { 65534 } else { 0 })),
        };
        let mut batcher = Batcher {
            labels: SeriesLabels::new(vec![], "box".into()).unwrap(),
            senders: 4,
        };
        let chosen = chooser.choose(&store.snapshot(), window);
        let services: Vec<&str> = chosen.iter().map(|c| c.service.as_str()).collect();
        assert_eq!(services.len(), 20);
        assert!(
            services.contains(&format!("p{APP}").as_str()),
            "{services:?}"
        );
        // Twenty processes over four senders: four requests of five
        // processes' series each, every process once.
        let (requests, _) = batcher.requests(&store.snapshot(), window, &chosen, 1);
        assert_eq!(requests.len(), 4);
        let mut pushed = Vec::new();
        for r in &requests {
            assert_eq!((r.profiles, r.batch.requests), (5, 4));
            for series in PushRequest::decode(&r.body[..]).unwrap().series {
                let name = series.labels.iter().find(|l| l.name == "service_name");
                pushed.push(name.unwrap().value.clone());
            }
        }
        pushed.sort_unstable();
        let mut want: Vec<String> = services.iter().map(|s| s.to_string()).collect();
        want.sort_unstable();
        assert_eq!(pushed, want);
    }
}
