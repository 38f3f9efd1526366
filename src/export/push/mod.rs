//! Pushing profiles to servers, each a [`Sink`]: Grafana Pyroscope
//! (`--push-url`), as its Push API takes them (every interval, for each of
//! the busiest processes, a `process_cpu` and a `wallscope_offcpu` profile
//! of that interval, gzip'd pprof in a protobuf `PushRequest`,
//! `POST /push.v1.PusherService/Push`), and OpenTelemetry profiles over
//! OTLP/HTTP (`--otlp-url`, [`crate::export::otlp`]).
//!
//! Threads of its own, so that nothing else waits on a server: one takes
//! a snapshot of the store every interval (the store's lock is held to
//! copy its list of slices), chooses the processes once ([`Chooser`]), so
//! that every sink gets the same ones over the same window, and has each
//! sink encode its requests ([`Encode`]) into its own
//! [`outbox::Outbox`]; [`SENDERS`] others per sink send them (blocking
//! HTTP, [`send`]), retrying with backoff. Pyroscope answers a push only
//! after its ~500 ms flush, so an interval's processes go in a few
//! requests of many series, sent at once. A hung server holds only its
//! sink's senders.
//!
//! On shutdown ([`Pusher::stop`]) the interval in progress is built and
//! sent with what is queued, within a grace (`--push-grace`).

pub mod batch;
pub mod choose;
pub mod fit;
pub mod labels;
pub mod outbox;
pub mod proto;
pub mod send;
pub mod service;
pub mod squat;

use std::{
    sync::{Arc, OnceLock},
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime},
};

use url::Url;

use batch::Batcher;
pub use batch::{CPU_SERIES, OFFCPU_SERIES};
pub use choose::{Chooser, Chosen, DEFAULT_TOP};
use fit::Trimmed;
pub use labels::SeriesLabels;
use outbox::{Backoff, Outbox, Request};
use send::{Client, Protocol};
use service::ServiceNames;

use crate::{
    priority::raise,
    profile::model::{store::Snapshot, window::Window},
    state::{push::PushStats, Shared},
    token::Token,
};

/// Requests in flight at once, per sink.
pub const SENDERS: usize = 4;
/// Default `--push-grace`: how long shutdown waits to send the last
/// interval and what is queued.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// Longest `--push-grace`: a service manager kills after its own timeout
/// (systemd's default is 90 s).
pub const MAX_GRACE: Duration = Duration::from_secs(60);

/// Shortest and longest `--push-interval`.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_INTERVAL: Duration = Duration::from_secs(600);

/// Turns an interval's chosen processes into one sink's requests.
pub trait Encode: Send {
    /// The requests of interval number `interval` over `window` for the
    /// `chosen` processes (those with samples), and what fitting them to
    /// the server's limits trimmed.
    fn requests(
        &mut self,
        store: &Snapshot,
        window: Window,
        chosen: &[Chosen],
        interval: u64,
    ) -> (Vec<Request>, Trimmed);
}

/// The kinds of server profiles go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// Grafana Pyroscope's Push API (`--push-url`).
    Pyroscope,
    /// OpenTelemetry profiles over OTLP/HTTP (`--otlp-url`).
    Otlp,
}

impl SinkKind {
    /// Its key in `/healthz`, the prefix of its `/metrics`
    /// (`wallscope_NAME_*`) and its threads' names.
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Pyroscope => "push",
            SinkKind::Otlp => "otlp",
        }
    }

    /// Where its counters are published.
    fn slot(self, shared: &Shared) -> &OnceLock<Arc<PushStats>> {
        match self {
            SinkKind::Pyroscope => &shared.push,
            SinkKind::Otlp => &shared.otlp,
        }
    }
}

/// One destination of the profiles: its server, how requests are encoded
/// and sent there.
pub struct Sink {
    pub kind: SinkKind,
    /// The server (`http` or `https`, no password).
    pub url: Url,
    pub token: Option<Token>,
    pub protocol: Protocol,
    pub encoder: Box<dyn Encode>,
}

impl Sink {
    /// Pyroscope at `url`, its series labelled with `labels`.
    pub fn pyroscope(url: Url, labels: SeriesLabels, token: Option<Token>) -> Sink {
        Sink {
            kind: SinkKind::Pyroscope,
            url,
            token,
            protocol: send::PYROSCOPE,
            encoder: Box::new(Batcher {
                labels,
                senders: SENDERS,
            }),
        }
    }
}

/// How often and how much to push, and where.
pub struct PushOptions {
    pub interval: Duration,
    /// Processes per interval.
    pub top: usize,
    /// How long shutdown goes on sending ([`Pusher::stop`]).
    pub grace: Duration,
    /// Every sink gets the same processes' profiles of the same windows.
    pub sinks: Vec<Sink>,
}

/// Checks a `--push-url` or `--otlp-url`: http or https, a host, no
/// password in it (it would show in `ps` and `/healthz`: use
/// `--push-token-file`).
pub fn parse_url(arg: &str) -> Result<Url, String> {
    let url = Url::parse(arg).map_err(|e| format!("`{arg}`: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("`{arg}`: only http and https URLs are pushed to"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{arg}` names no host"));
    }
    if url.password().is_some() {
        return Err(
            "the URL holds a password: give the user in the URL and the password with \
             --push-token-file (--otlp-token-file for --otlp-url)"
                .into(),
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "`{arg}`: give the server's URL, without `?` or `#`"
        ));
    }
    Ok(url)
}

/// Parses a `--push-grace` (`5s`, `0s` for none), at most [`MAX_GRACE`].
pub fn parse_grace(arg: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(arg).map_err(|e| format!("`{arg}`: {e}"))?;
    if d > MAX_GRACE {
        return Err(format!("`{arg}`: give at most 60s"));
    }
    Ok(d)
}

/// Parses a `--push-interval` (`15s`, `1m`), between [`MIN_INTERVAL`] and
/// [`MAX_INTERVAL`].
pub fn parse_interval(arg: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(arg).map_err(|e| format!("`{arg}`: {e}"))?;
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(format!("`{arg}`: give 1s to 10m"));
    }
    Ok(d)
}

/// A sink's queue and counters.
struct Running {
    outbox: Arc<Outbox>,
    stats: Arc<PushStats>,
    server: &'static str,
}

/// The running pusher.
pub struct Pusher {
    sinks: Vec<Running>,
    threads: Vec<JoinHandle<()>>,
}

fn spawn(name: &str, f: Box<dyn FnOnce() + Send>) -> Result<JoinHandle<()>, String> {
    thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| format!("starting the {name} thread: {e}"))
}

impl Pusher {
    /// Starts pushing what `shared`'s store records from now on to every
    /// sink. Each sink's counters go in `shared.push` or `shared.otlp`.
    pub fn start(shared: Arc<Shared>, opts: PushOptions) -> Result<Pusher, String> {
        let mut pusher = Pusher {
            sinks: Vec::new(),
            threads: Vec::new(),
        };
        let mut building = Vec::new();
        for sink in opts.sinks {
            let client = Arc::new(Client::new(&sink.url, sink.token.as_ref(), sink.protocol));
            let mut shown = sink.url.clone();
            let _ = shown.set_username("");
            let name = sink.kind.name();
            let stats = Arc::new(PushStats::new(
                name,
                shown.to_string(),
                opts.interval.as_secs_f64(),
                SENDERS as u64,
            ));
            let _ = sink.kind.slot(&shared).set(stats.clone());
            let outbox = Arc::new(Outbox::default());
            pusher.sinks.push(Running {
                outbox: outbox.clone(),
                stats: stats.clone(),
                server: sink.protocol.server,
            });
            for n in 0..SENDERS {
                let (client, out, counts) = (client.clone(), outbox.clone(), stats.clone());
                let mut backoff = Backoff::new(opts.interval);
                let sender = spawn(
                    &format!("ws-{name}-send{n}"),
                    Box::new(move || send::run(&client, &out, &counts, &mut backoff)),
                );
                match sender {
                    Ok(s) => pusher.threads.push(s),
                    Err(e) => {
                        pusher.abandon();
                        return Err(e);
                    }
                }
            }
            tracing::info!(url = %shown, interval = ?opts.interval, "pushing profiles to {}", sink.protocol.server);
            building.push(Building {
                encoder: sink.encoder,
                outbox,
                stats,
            });
        }
        let chooser = Chooser {
            top: opts.top,
            services: ServiceNames::new(&shared.processes),
            user_of: {
                let table = shared.processes.clone();
                Box::new(move |pid| table.user_of(pid))
            },
        };
        let interval = opts.interval;
        let builder = spawn(
            "ws-push-build",
            Box::new(move || build_loop(&shared, chooser, building, interval)),
        );
        match builder {
            Ok(b) => pusher.threads.push(b),
            Err(e) => {
                pusher.abandon();
                return Err(e);
            }
        }
        Ok(pusher)
    }

    /// Stops the sinks' senders at once (a thread could not start).
    fn abandon(&self) {
        for s in &self.sinks {
            s.outbox.stop(&s.stats);
        }
    }

    /// Stops pushing: the interval in progress is built and sent with
    /// what is queued, for at most `grace`; then the threads are told to
    /// end. A request to a hung server is not waited for (its thread ends
    /// with the process); what was not sent is counted as dropped.
    pub fn stop(self, grace: Duration) {
        let deadline = Instant::now() + grace;
        // Drops before the shutdown (an outage) are not its doing.
        let dropped_before: Vec<u64> = self
            .sinks
            .iter()
            .map(|s| s.stats.report().dropped_profiles)
            .collect();
        for s in &self.sinks {
            s.outbox.close(deadline);
        }
        let done = |threads: &[JoinHandle<()>]| threads.iter().all(|t| t.is_finished());
        while Instant::now() < deadline && !done(&self.threads) {
            thread::sleep(Duration::from_millis(10));
        }
        for (s, before) in self.sinks.iter().zip(dropped_before) {
            s.outbox.stop(&s.stats);
            let r = s.stats.report();
            if r.dropped_profiles > before || !done(&self.threads) {
                tracing::warn!(
                    dropped_profiles = r.dropped_profiles - before,
                    "pushing to {} stopped after {grace:?} with profiles unsent",
                    s.server
                );
            } else {
                tracing::info!(
                    sent_requests = r.sent_requests,
                    "pushed the last interval to {}",
                    s.server
                );
            }
        }
        for t in self.threads.into_iter().filter(|t| t.is_finished()) {
            let _ = t.join();
        }
    }
}

/// A sink as the builder sees it.
struct Building {
    encoder: Box<dyn Encode>,
    outbox: Arc<Outbox>,
    stats: Arc<PushStats>,
}

/// Every `interval`: the window from the end of the last one to the end
/// of the newest slice (every slice that ends in it is in the store by
/// then, so windows tile time and none is pushed twice or missed),
/// turned into requests and queued.
fn build_loop(shared: &Shared, mut chooser: Chooser, mut sinks: Vec<Building>, interval: Duration) {
    // Building profiles is a query over the store, but one that must keep
    // pace with the interval on a saturated host (see PUSH_NICE).
    raise::worker(raise::PUSH_NICE);
    // Every sink's outbox closes at once (Pusher::stop): the first one's
    // pause stands for all.
    let Some(first) = sinks.first().map(|s| s.outbox.clone()) else {
        return;
    };
    let mut from = SystemTime::now();
    let mut next = Instant::now() + interval;
    let mut number = 0;
    loop {
        let running = first.pause(next.saturating_duration_since(Instant::now()));
        if !running && !first.closing() {
            return;
        }
        let now = Instant::now();
        // Ticks missed (a slow build) are skipped, not made up.
        while next <= now {
            next += interval;
        }
        // Closing: the interval in progress, up to the pipeline's last
        // drain, is the last one.
        let store = shared
            .store
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot();
        if let Some(until) = store
            .spans()
            .map(|(_, end)| end)
            .max()
            .filter(|u| *u > from)
        {
            let started = Instant::now();
            number += 1;
            let window = Window::between(from, until);
            // Read once per process pushed: decoded once.
            let store = store.decoded(window);
            let chosen = chooser.choose(&store, window);
            let chose = started.elapsed();
            from = until;
            for sink in &mut sinks {
                let built = Instant::now();
                let (requests, trimmed) = sink.encoder.requests(&store, window, &chosen, number);
                {
                    let mut r = sink.stats.lock();
                    r.intervals += 1;
                    r.trimmed_samples += trimmed.samples;
                    r.trimmed_ns += trimmed.ns;
                    r.last_build_s = (chose + built.elapsed()).as_secs_f64();
                }
                sink.outbox.add(requests, &sink.stats);
            }
        }
        drop(store);
        if !running {
            for sink in &sinks {
                sink.outbox.complete();
            }
            return;
        }
    }
}
