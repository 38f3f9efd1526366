//! Pushing profiles to Grafana Pyroscope (`--push-url`), as its Push API
//! takes them: every interval, for each of the busiest processes, a
//! `process_cpu` and a `wallscope_offcpu` profile of that interval, gzip'd
//! pprof in a protobuf `PushRequest`, `POST /push.v1.PusherService/Push`.
//!
//! Two threads of its own, so that nothing else waits on the server: one
//! takes a snapshot of the store every interval (the store's lock is held
//! to copy its list of slices), builds the profiles and queues them in an
//! [`outbox::Outbox`]; the other sends them (blocking HTTP, [`send`]),
//! retrying with backoff. A hung server holds only the sender.

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

use crate::{
    nice::{Nice, QUERY_NICE},
    profile::window::Window,
    state::Shared,
    token::Token,
};

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
        ));
        let _ = shared.push.set(stats.clone());
        let outbox = Arc::new(Outbox::default());
        let batcher = Batcher {
            labels: opts.labels,
            top: opts.top,
            services: ServiceNames::new(&shared.processes),
            user_of: crate::profile::fair::user_of,
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
        let sender = {
            let (outbox, stats) = (outbox.clone(), stats.clone());
            let mut backoff = Backoff::new(opts.interval);
            spawn(
                "ws-push-send",
                Box::new(move || send::run(&client, &outbox, &stats, &mut backoff)),
            )
        };
        let sender = match sender {
            Ok(s) => s,
            Err(e) => {
                outbox.stop();
                return Err(e);
            }
        };
        tracing::info!(url = %shown, interval = ?opts.interval, "pushing profiles to Pyroscope");
        Ok(Pusher {
            outbox,
            threads: vec![builder, sender],
        })
    }

    /// Stops both threads, waiting at most `within`: a request to a hung
    /// server is not waited for (the thread ends with the process).
    pub fn stop(self, within: Duration) {
        self.outbox.stop();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline && !self.threads.iter().all(|t| t.is_finished()) {
            thread::sleep(Duration::from_millis(10));
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
    // Building profiles is a query over the store: it yields to the
    // workloads and the pipeline as the API's queries do.
    let _nice = Nice::set(QUERY_NICE);
    let mut from = SystemTime::now();
    let mut next = Instant::now() + interval;
    let mut number = 0;
    while outbox.pause(next.saturating_duration_since(Instant::now())) {
        let now = Instant::now();
        // Ticks missed (a slow build) are skipped, not made up.
        while next <= now {
            next += interval;
        }
        let store = shared
            .store
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot();
        let Some(until) = store.all().map(|s| s.end).max().filter(|u| *u > from) else {
            continue;
        };
        number += 1;
        let (requests, trimmed) = batcher.requests(&store, Window::between(from, until), number);
        drop(store);
        from = until;
        {
            let mut r = stats.lock();
            r.intervals += 1;
            r.trimmed_samples += trimmed.samples;
            r.trimmed_ns += trimmed.ns;
        }
        outbox.add(requests, stats);
    }
}
