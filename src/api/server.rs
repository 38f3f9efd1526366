//! The HTTP server: our own accept loop over hyper HTTP/1.1 connections,
//! serving the API router.
//!
//! `axum::serve` keeps every connection for as long as the client wants:
//! 20,000 idle connections filled the fd table and `/healthz` stopped
//! answering, and a slowloris client (one header byte a second) held its
//! socket forever. Here connections are capped, a connection waiting for a
//! request is closed after [`IDLE_TIMEOUT`] however many bytes it trickles,
//! and when the cap is reached the connection that has waited longest makes
//! room for the new one. Requests being served are never cut by these rules.

mod connections;

use std::{
    convert::Infallible,
    future::Future,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    body::{Body, Bytes},
    Router,
};
use connections::{Admitted, Connections, InFlight};
use hyper::{
    body::{Frame, Incoming, SizeHint},
    server::conn::http1,
    service::{service_fn, Service as _},
    Request,
};
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use serde::Serialize;

use super::peer::Client;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinSet,
};

/// Most connections open at once. The API's clients (a browser, a
/// Prometheus scraper, curl during an incident) need a handful; 512 leaves
/// plenty of room at an fd and a few KiB each.
pub const MAX_CONNECTIONS: usize = 512;

/// File descriptors kept for the rest of the daemon (`/proc/PID/maps` and
/// ELF files of the processes it symbolizes, BPF maps and programs, one
/// perf event per CPU, JVM attach sockets): connections never take them, so
/// a flood of connections cannot make profiling fail.
pub const FD_RESERVE: u64 = 256;

/// Fewest connections allowed even under an fd limit too small for
/// [`FD_RESERVE`]: with none, the API could not answer at all.
pub const MIN_CONNECTIONS: usize = 16;

/// How long a connection may wait for a request: from its accept until its
/// first complete request header, or from the end of a response until the
/// next request header. Counted from when the wait started, not from the
/// last byte received, so a slowloris client sending one header byte a
/// second is closed too. Long enough for an interactive client's keep-alive
/// between clicks, short enough that idle sockets do not pile up.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// How often waiting connections are checked against [`IDLE_TIMEOUT`]: they
/// are closed at most this much after their deadline.
pub const REAP_INTERVAL: Duration = Duration::from_millis(500);

/// After ctrl-c or SIGTERM, how long requests in progress may finish before
/// every connection is dropped: under a second, so that the daemon stops
/// promptly whatever its clients do.
pub const SHUTDOWN_GRACE: Duration = Duration::from_millis(800);

/// Buffer size past which hyper stops reading a request header and answers
/// 431 (its default is about 400 KiB; the last read may take it up to twice
/// this). The API's requests are GETs with a few small headers; at the
/// connection cap this bounds header memory to some 64 MiB, not 400.
const MAX_HEADER_BUFFER: usize = 64 * 1024;

/// Pause after an accept that failed for lack of resources (no fd left,
/// no memory): retrying at once would spin a CPU.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Minimum time between two warnings about failed accepts, so that a flood
/// does not flood the log too.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

/// The HTTP server's counters since start, for `/healthz` and `/metrics`.
#[derive(Debug)]
pub struct Stats {
    connections_open: AtomicU64,
    connection_limit: AtomicU64,
    connections_accepted: AtomicU64,
    closed_idle_timeout: AtomicU64,
    closed_evicted: AtomicU64,
    refused_full: AtomicU64,
    rejected_host: AtomicU64,
    rejected_token: AtomicU64,
}

/// The counters of the one server of this process. A static rather than
/// router state: the access middleware and the accept loop count into it
/// without being handed anything.
pub static STATS: Stats = Stats {
    connections_open: AtomicU64::new(0),
    connection_limit: AtomicU64::new(0),
    connections_accepted: AtomicU64::new(0),
    closed_idle_timeout: AtomicU64::new(0),
    closed_evicted: AtomicU64::new(0),
    refused_full: AtomicU64::new(0),
    rejected_host: AtomicU64::new(0),
    rejected_token: AtomicU64::new(0),
};

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Snapshot {
    /// Connections open now.
    pub connections_open: u64,
    /// The connection cap in force (0 before the server started).
    pub connection_limit: u64,
    pub connections_accepted: u64,
    /// Closed after waiting for a request longer than [`IDLE_TIMEOUT`].
    pub closed_idle_timeout: u64,
    /// Closed, while waiting for a request, to make room for a new one.
    pub closed_evicted: u64,
    /// New connections closed at once: at the cap, every one busy.
    pub refused_full: u64,
    /// Requests refused for their `Host` (421).
    pub rejected_host: u64,
    /// Requests refused for a missing or wrong token (401).
    pub rejected_token: u64,
}

impl Snapshot {
    /// The event counters by name, as `/metrics` labels them.
    pub fn events(&self) -> [(&'static str, u64); 6] {
        [
            ("connections_accepted", self.connections_accepted),
            ("closed_idle_timeout", self.closed_idle_timeout),
            ("closed_evicted", self.closed_evicted),
            ("refused_full", self.refused_full),
            ("rejected_host", self.rejected_host),
            ("rejected_token", self.rejected_token),
        ]
    }
}

impl Stats {
    /// All counters now.
    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            connections_open: get(&self.connections_open),
            connection_limit: get(&self.connection_limit),
            connections_accepted: get(&self.connections_accepted),
            closed_idle_timeout: get(&self.closed_idle_timeout),
            closed_evicted: get(&self.closed_evicted),
            refused_full: get(&self.refused_full),
            rejected_host: get(&self.rejected_host),
            rejected_token: get(&self.rejected_token),
        }
    }

    /// Counts a request refused for its `Host`.
    pub fn count_rejected_host(&self) {
        bump(&self.rejected_host);
    }

    /// Counts a request refused for its token.
    pub fn count_rejected_token(&self) {
        bump(&self.rejected_token);
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (capped by
/// `fs.nr_open`, which the kernel will not exceed) and returns the soft
/// limit in force. The default soft limit of 1024 would let a few hundred
/// connections starve the profiler of fds.
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        let err = io::Error::last_os_error();
        tracing::warn!("cannot read the fd limit: {err}; assuming 1024");
        return 1024;
    }
    let nr_open = crate::process::own::nr_open().unwrap_or(lim.rlim_max);
    let target = lim.rlim_max.min(nr_open);
    if lim.rlim_cur < target {
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = target;
        } else {
            let err = io::Error::last_os_error();
            tracing::warn!(
                soft = lim.rlim_cur,
                "cannot raise the fd limit to {target}: {err}"
            );
        }
    }
    tracing::info!(
        soft = lim.rlim_cur,
        hard = lim.rlim_max,
        "fd limit (RLIMIT_NOFILE)"
    );
    lim.rlim_cur
}

/// The connection cap under an fd limit: [`MAX_CONNECTIONS`], lowered to
/// leave [`FD_RESERVE`] fds to the rest of the daemon.
pub fn connection_cap(fd_limit: u64) -> usize {
    let room = fd_limit.saturating_sub(FD_RESERVE);
    usize::try_from(room)
        .unwrap_or(usize::MAX)
        .clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

/// A response body that ends its request's [`InFlight`] when dropped:
/// hyper drops the body once its last byte is written (or the connection
/// is gone), which is when the connection starts waiting again.
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then lets
/// requests in progress finish for at most [`SHUTDOWN_GRACE`] and drops
/// every connection. Raises the process's fd limit first
/// ([`raise_fd_limit`]) and caps connections under it.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let fd_limit = raise_fd_limit();
    let cap = connection_cap(fd_limit);
    STATS.connection_limit.store(cap as u64, Ordering::Relaxed);
    tracing::info!(
        max_connections = cap,
        idle_timeout_s = IDLE_TIMEOUT.as_secs(),
        fd_reserve = FD_RESERVE,
        "HTTP connection limits"
    );
    let connections = Arc::new(Connections::new(cap));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut reap = tokio::time::interval(REAP_INTERVAL);
    reap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_accept_warning: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            _ = reap.tick() => connections.close_idle(Instant::now()),
            Some(_) = tasks.join_next() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match connections.admit(Instant::now()) {
                    Some(admitted) => {
                        tasks.spawn(run_connection(stream, admitted, router.clone(), stop_rx.clone()));
                    }
                    // Dropping the stream closes it.
                    None => bump(&STATS.refused_full),
                },
                Err(e) => {
                    if last_accept_warning.is_none_or(|t| t.elapsed() >= ACCEPT_WARN_EVERY) {
                        tracing::warn!("accepting a connection failed: {e}");
                        last_accept_warning = Some(Instant::now());
                    }
                    if is_resource_exhaustion(&e) {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            connections = tasks.len(),
            "dropping connections still busy after the shutdown grace"
        );
    }
    tasks.shutdown().await;
    Ok(())
}

/// Whether an accept failed for lack of fds or memory (worth a pause), not
/// because of one client (a connection reset before it was accepted).
fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Serves one connection until the client closes it, it is chosen to be
/// closed (idle, evicted), or the server stops.
async fn run_connection(
    stream: TcpStream,
    admitted: Admitted,
    router: Router,
    mut stop: watch::Receiver<bool>,
) {
    // Responses are written whole; Nagle would only delay the last segment.
    let _ = stream.set_nodelay(true);
    // Who the client is, found once per connection and while our end is
    // open (see `super::peer`).
    let client = match (stream.peer_addr(), stream.local_addr()) {
        (Ok(peer), Ok(local)) => Some(Client::of(peer, local)),
        _ => None,
    };
    let admitted = Arc::new(admitted);
    let service = {
        let admitted = admitted.clone();
        let router = TowerToHyperService::new(router);
        service_fn(move |req: Request<Incoming>| {
            // Marked busy as soon as hyper has a complete request header,
            // before the handler runs.
            let in_flight = admitted.request_started();
            let mut req = req;
            if let Some(client) = client {
                req.extensions_mut().insert(client);
            }
            let response = router.call(req);
            async move {
                let response = response.await?;
                Ok::<_, Infallible>(response.map(|body| TrackedBody {
                    body,
                    _in_flight: in_flight,
                }))
            }
        })
    };
    let http = http1::Builder::new()
        .max_buf_size(MAX_HEADER_BUFFER)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(http);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = http.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("HTTP connection ended: {e}");
                }
                break;
            }
            () = admitted.conn.close.notified() => break,
            _ = stop.changed(), if !stopping => {
                stopping = true;
                if admitted.close_if_waiting() {
                    break;
                }
                // Finish the request in progress, then close.
                http.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_leaves_the_fd_reserve() {
        assert_eq!(connection_cap(1024), 512);
        assert_eq!(connection_cap(600), 600 - 256);
        assert_eq!(connection_cap(100), MIN_CONNECTIONS);
        assert_eq!(connection_cap(u64::MAX), MAX_CONNECTIONS);
    }
}
