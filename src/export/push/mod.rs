//! Pushing profiles to Grafana Pyroscope (`--push-url`), as its Push API
//! takes them: every interval, for each of the busiest processes, a
//! `process_cpu` and a `wallscope_offcpu` profile of that interval, gzip'd
//! pprof in a protobuf `PushRequest`, `POST /push.v1.PusherService/Push`.
//!
//! Threads of its own, so that nothing else waits on the server: one takes
//! a snapshot of the store every interval (the store's lock is held to
//! copy its list of slices), builds the profiles and queues them in an
//! [`outbox::Outbox`]; [`SENDERS`] others send them (blocking HTTP,
//! [`send`]), retrying with backoff. Pyroscope answers a push only after
//! its ~500 ms flush, so an interval's processes go in a few requests of
//! many series, sent at once. A hung server holds only the senders.
//!
//! On shutdown ([`Pusher::stop`]) the interval in progress is built and
//! sent with what is queued, within a grace (`--push-grace`).

pub mod batch;
pub mod fit;
pub mod labels;
pub mod outbox;
pub mod proto;
pub mod send;
pub mod service;
pub mod stats;

use std::{
    sync::Arc,
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime},
};

use url::Url;

use batch::Batcher;
pub use batch::{CPU_SERIES, DEFAULT_TOP, OFFCPU_SERIES};
pub use labels::SeriesLabels;
use outbox::{Backoff, Outbox};
use send::Client;
use service::ServiceNames;
pub use stats::{PushReport, PushStats};

use crate::{pipeline::priority, profile::window::Window, state::Shared, token::Token};

/// Requests in flight at once.
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

/// How and where to push.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// The server (`http` or `https`, no password).
    pub url: Url,
    pub interval: Duration,
    /// The series labels, `--push-label`s included.
    pub labels: SeriesLabels,
    pub token: Option<Token>,
    /// Processes per interval.
    pub top: usize,
    /// How long shutdown goes on sending ([`Pusher::stop`]).
    pub grace: Duration,
}

/// Checks a `--push-url`: http or https, a host, no password in it (it
/// would show in `ps` and `/healthz`: use `--push-token-file`).
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
             --push-token-file"
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

/// The running pusher.
pub struct Pusher {
    outbox: Arc<Outbox>,
    stats: Arc<PushStats>,
    threads: Vec<JoinHandle<()>>,
}

impl Pusher {
    /// Starts pushing what `shared`'s store records from now on. Its
    /// counters go in `shared.push`.
    pub fn start(shared: Arc<Shared>, opts: PushOptions) -> Result<Pusher, String> {
        let client = Client::new(&opts.url, opts.token.as_ref());
        let mut shown = opts.url.clone();
        let _ = shown.set_username("");
        let stats = Arc::new(PushStats::new(
            shown.to_string(),
            opts.interval.as_secs_f64(),
            SENDERS as u64,
        ));
        let _ = shared.push.set(stats.clone());
        let outbox = Arc::new(Outbox::default());
        let batcher = Batcher {
            labels: opts.labels,
            top: opts.top,
            services: ServiceNames::new(&shared.processes),
            user_of: crate::profile::fair::user_of,
            senders: SENDERS,
        };
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| format!("starting the {name} thread: {e}"))
        };
        let builder = {
            let (outbox, stats, interval) = (outbox.clone(), stats.clone(), opts.interval);
            spawn(
                "ws-push-build",
                Box::new(move || build_loop(&shared, batcher, &outbox, &stats, interval)),
            )?
        };
        let mut threads = vec![builder];
        let client = Arc::new(client);
        for n in 0..SENDERS {
            let (client, out, counts) = (client.clone(), outbox.clone(), stats.clone());
            let mut backoff = Backoff::new(opts.interval);
            let sender = spawn(
                &format!("ws-push-send{n}"),
                Box::new(move || send::run(&client, &out, &counts, &mut backoff)),
            );
            match sender {
                Ok(s) => threads.push(s),
                Err(e) => {
                    outbox.stop(&stats);
                    return Err(e);
                }
            }
        }
        tracing::info!(url = %shown, interval = ?opts.interval, "pushing profiles to Pyroscope");
        Ok(Pusher {
            outbox,
            stats,
            threads,
        })
    }

    /// Stops pushing: the interval in progress is built and sent with
    /// what is queued, for at most `grace`; then the threads are told to
    /// end. A request to a hung server is not waited for (its thread ends
    /// with the process); what was not sent is counted as dropped.
    pub fn stop(self, grace: Duration) {
        let deadline = Instant::now() + grace;
        self.outbox.close(deadline);
        let done = |threads: &[JoinHandle<()>]| threads.iter().all(|t| t.is_finished());
        while Instant::now() < deadline && !done(&self.threads) {
            thread::sleep(Duration::from_millis(10));
        }
        self.outbox.stop(&self.stats);
        let r = self.stats.report();
        if r.dropped_profiles > 0 || !done(&self.threads) {
            tracing::warn!(
                dropped_profiles = r.dropped_profiles,
                "pushing stopped after {grace:?} with profiles unsent"
            );
        } else {
            tracing::info!(sent_requests = r.sent_requests, "pushed the last interval");
        }
        for t in self.threads.into_iter().filter(|t| t.is_finished()) {
            let _ = t.join();
        }
    }
}

/// Every `interval`: the window from the end of the last one to the end
/// of the newest slice (every slice that ends in it is in the store by
/// then, so windows tile time and none is pushed twice or missed),
/// turned into requests and queued.
fn build_loop(
    shared: &Shared,
    mut batcher: Batcher,
    outbox: &Outbox,
    stats: &PushStats,
    interval: Duration,
) {
    // Building profiles is a query over the store, but one that must keep
    // pace with the interval on a saturated host (see PUSH_NICE).
    priority::raise_worker(priority::PUSH_NICE);
    let mut from = SystemTime::now();
    let mut next = Instant::now() + interval;
    let mut number = 0;
    loop {
        let running = outbox.pause(next.saturating_duration_since(Instant::now()));
        if !running && !outbox.closing() {
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
        if let Some(until) = store.all().map(|s| s.end).max().filter(|u| *u > from) {
            let started = Instant::now();
            number += 1;
            let (requests, trimmed) =
                batcher.requests(&store, Window::between(from, until), number);
            from = until;
            {
                let mut r = stats.lock();
                r.intervals += 1;
                r.trimmed_samples += trimmed.samples;
                r.trimmed_ns += trimmed.ns;
                r.last_build_s = started.elapsed().as_secs_f64();
            }
            outbox.add(requests, stats);
        }
        drop(store);
        if !running {
            outbox.complete();
            return;
        }
    }
}
