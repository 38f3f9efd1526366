//! One interval's requests: for each of the busiest processes, its CPU
//! and off-CPU profiles of the window, fitted to Pyroscope's limits, as
//! series of `PushRequest`s (several processes each: Pyroscope takes many
//! series per call, and answers each call only after its ~500 ms flush).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Instant, SystemTime},
};

use prost::Message;

use super::{
    fit::{self, Trimmed},
    labels::SeriesLabels,
    outbox::{Batch, Request},
    proto::{PushRequest, RawProfileSeries, RawSample},
    service::ServiceNames,
};
use crate::{
    bpf::abi::State,
    export::pprof::{self, Detail},
    profile::{
        fair,
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
/// Processes pushed per interval by default, busiest (time on or waiting
/// for a CPU, then wall time, in the interval) first, a fair share per
/// user; kernel threads are left out.
pub const DEFAULT_TOP: usize = 32;

/// The series pushed for a process, and the kind each profiles.
const SERIES: [(&str, Kind); 2] = [
    (CPU_SERIES, Kind::State(State::Cpu)),
    (OFFCPU_SERIES, Kind::Offcpu),
];

/// Bytes of series one request carries at most (Pyroscope refuses
/// profiles over 4 MiB; a request of several stays well under what its
/// HTTP server reads).
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// A process pushed for an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub pid: u32,
    pub service: String,
    /// Its container's labels (none outside a container).
    pub container: Vec<(&'static str, String)>,
}

/// What it takes to turn a window into requests.
pub struct Batcher {
    pub labels: SeriesLabels,
    /// Processes per interval.
    pub top: usize,
    pub services: ServiceNames,
    /// The user a process runs as ([`fair::user_of`]; tests give others).
    pub user_of: fn(u32) -> Option<u32>,
    /// Requests sent at once: an interval's processes are spread over
    /// about this many requests, so that they all go out together.
    pub senders: usize,
}

impl Batcher {
    /// The processes pushed for `window`: the busiest, kernel threads
    /// left out, a fair share per user, each with its service name.
    pub fn choose(&mut self, store: &Snapshot, window: Window) -> Vec<Chosen> {
        let names = Names::of(store.within(window));
        self.services.forget_ended();
        // The window's start on the monotonic clock the process table keeps.
        let ago = SystemTime::now()
            .duration_since(window.from)
            .unwrap_or_default();
        let since = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
        let mut looked_at = Vec::new();
        let mut services = HashMap::new();
        for pid in query::busiest(store, window, fair::MAX_LOOKED_AT) {
            looked_at.push(pid);
            if let Some(service) = self.services.get(pid, names.process(pid), since) {
                services.insert(pid, service);
            }
        }
        let pushable: Vec<u32> = looked_at
            .iter()
            .copied()
            .filter(|pid| services.contains_key(pid))
            .collect();
        fair::top(&pushable, self.top, &mut self.user_of)
            .into_iter()
            .filter_map(|pid| {
                Some(Chosen {
                    pid,
                    service: services.remove(&pid)?,
                    container: names.container(pid).map(|c| c.labels()).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// The requests of interval number `interval` over `window`: the
    /// chosen processes' series spread over about [`Batcher::senders`]
    /// requests of at most [`MAX_REQUEST_BYTES`], and what fitting them
    /// trimmed.
    pub fn requests(
        &mut self,
        store: &Snapshot,
        window: Window,
        interval: u64,
    ) -> (Vec<Request>, Trimmed) {
        let chosen = self.choose(store, window);
        let mut trimmed = Trimmed::default();
        let per_request = chosen.len().div_ceil(self.senders.max(1)).max(1);
        let mut packs: Vec<Pack> = Vec::new();
        for c in &chosen {
            let series = self.series(store, window, c, &mut trimmed);
            if series.is_empty() {
                continue;
            }
            let bytes: usize = series.iter().map(|s| s.encoded_len()).sum();
            let fits = packs
                .last()
                .is_some_and(|p| p.processes < per_request && p.bytes + bytes <= MAX_REQUEST_BYTES);
            if !fits {
                packs.push(Pack::default());
            }
            if let Some(p) = packs.last_mut() {
                p.add(&c.service, series, bytes);
            }
        }
        let batch = Batch::new(packs.len());
        let out = packs
            .into_iter()
            .map(|p| p.request(interval, batch.clone()))
            .collect();
        (out, trimmed)
    }

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

/// The series of the processes one request carries.
#[derive(Default)]
struct Pack {
    series: Vec<RawProfileSeries>,
    services: Vec<String>,
    processes: usize,
    bytes: usize,
}

impl Pack {
    fn add(&mut self, service: &str, series: Vec<RawProfileSeries>, bytes: usize) {
        self.series.extend(series);
        self.services.push(service.to_string());
        self.processes += 1;
        self.bytes += bytes;
    }

    fn request(self, interval: u64, batch: Arc<Batch>) -> Request {
        let service = match self.services.as_slice() {
            [one] => one.clone(),
            [first, rest @ ..] => format!("{first} and {} more", rest.len()),
            [] => String::new(),
        };
        Request {
            profiles: self.series.len() as u64,
            body: PushRequest {
                series: self.series,
            }
            .encode_to_vec(),
            interval,
            service,
            batch,
        }
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
    use crate::profile::model::ThreadCounters;
    use crate::{
        collect::RawThread,
        export::pprof::proto::Profile,
        profile::window::unix_nanos,
        profile::{store::Store, Sample, Slice},
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
        (1..=4096).find(|pid| crate::process::status::is_kernel_thread(*pid))
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
        let mut batcher = Batcher {
            labels: SeriesLabels::new(vec![("env".into(), "dev".into())], "box".into()).unwrap(),
            top: 1,
            services: ServiceNames::new(&Arc::default()),
            user_of: fair::user_of,
            senders: 4,
        };
        // A kernel thread with more wall time than the app; without one
        // in sight (a container), a process with less.
        let (k, k_wall) = kernel_thread().map_or((APP + 20, 5 * MS), |k| (k, 3000 * MS));
        let snapshot = store(end, k, k_wall).snapshot();
        let (requests, trimmed) = batcher.requests(&snapshot, window, 7);
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
        assert!(batcher.requests(&snapshot, empty, 9).0.is_empty());
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
        let mut batcher = Batcher {
            labels: SeriesLabels::new(vec![], "box".into()).unwrap(),
            top: 20,
            services: ServiceNames::new(&Arc::default()),
            user_of: |pid| Some(if pid >= CROWD { 65534 } else { 0 }),
            senders: 4,
        };
        let chosen = batcher.choose(&store.snapshot(), window);
        let services: Vec<&str> = chosen.iter().map(|c| c.service.as_str()).collect();
        assert_eq!(services.len(), 20);
        assert!(
            services.contains(&format!("p{APP}").as_str()),
            "{services:?}"
        );
        // Twenty processes over four senders: four requests of five
        // processes' series each, every process once.
        let (requests, _) = batcher.requests(&store.snapshot(), window, 1);
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
