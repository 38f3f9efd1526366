//! The HTTP server: our own accept loop over hyper HTTP/1.1 connections,
//! serving the API router.
//!
//! `axum::serve` keeps every connection for as long as the client wants:
//! 20,000 idle connections filled the fd table and `/healthz` stopped
//! answering, and a slowloris client (one header byte a second) held its
//! socket forever. Here connections are capped, a connection waiting for a
//! request is closed after [`IDLE_TIMEOUT`] however many bytes it trickles,
//! and when the cap is reached room is made among the connections of
//! whoever (a local uid, else a remote address) holds the most, so that one
//! user's flood of connections never closes another user's, root's
//! `/healthz` probe among them (a CI run saw root's fresh connection, the
//! longest waiting, closed for a flooder's).
//!
//! A client that asks for a big answer and stops reading held it (7.5 MB
//! each) for ever: 34 of them got the daemon OOM-killed. Answers are handed
//! to hyper in chunks ([`body`]), so the client's reading is seen, and an
//! answer that stops moving for [`WRITE_STALL`], or takes longer than
//! [`WRITE_DEADLINE`], closes its connection; at the cap, one stalled for
//! [`EVICTABLE_STALL`] makes room. Handlers still computing are never cut.

mod body;
mod connections;
pub mod stats;

use std::{
    convert::Infallible,
    future::Future,
    io,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use axum::Router;
use body::TrackedBody;
use connections::{Admitted, Connections, Owner};
use hyper::{
    body::Incoming,
    server::conn::http1,
    service::{service_fn, Service as _},
    Request,
};
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use stats::{bump, STATS};

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

/// Longest an answer may go without its client taking any of it: the
/// client stopped reading (or reads a few bytes a minute), and the answer's
/// bytes must not be held for it. A browser or curl on a slow link takes a
/// chunk far more often.
pub const WRITE_STALL: Duration = Duration::from_secs(10);

/// Longest one answer may take to write however it trickles: the answers
/// are at most megabytes, minutes even at a modem's pace.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(120);

/// At the connection cap, an answer that has not moved for this long may be
/// closed to make room: a crowd of stalled readers must not keep root's
/// `/healthz` out until [`WRITE_STALL`]. Short: attackers that reconnect
/// at once kept every slot younger than a second (root's `/healthz` was
/// refused at the cap); a reader taking nothing for a quarter second while
/// the server is full is the one to go.
pub const EVICTABLE_STALL: Duration = Duration::from_millis(250);

/// After ctrl-c or SIGTERM, how long requests in progress may finish before
/// every connection is dropped: short, since the whole exit (this, the
/// pipeline's last drain, detaching the programs) must take under a second
/// whatever the clients do.
pub const SHUTDOWN_GRACE: Duration = Duration::from_millis(300);

/// Buffer size past which hyper stops reading a request header and answers
/// 431 (its default is about 400 KiB; the last read may take it up to twice
/// this). The API's requests are GETs with a few small headers; at the
/// connection cap this bounds header memory to some 64 MiB, not 400.
const MAX_HEADER_BUFFER: usize = 64 * 1024;

/// Send buffer of each connection (the kernel doubles it): what the kernel
/// holds of an answer its client does not read. Room for 128 KiB in flight
/// still fills a LAN, and a 50 ms path at some 2.5 MB/s.
const SEND_BUFFER: usize = 64 * 1024;

/// Pause after an accept that failed for lack of resources (no fd left,
/// no memory): retrying at once would spin a CPU.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Minimum time between two warnings about failed accepts, so that a flood
/// does not flood the log too.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

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
        write_stall_s = WRITE_STALL.as_secs(),
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
            _ = reap.tick() => {
                let now = Instant::now();
                connections.close_idle(now);
                connections.close_stuck_writers(now);
            }
            Some(_) = tasks.join_next() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Who the client is, found once per connection and
                    // while our end is open (see `super::peer`): the cap
                    // makes room among the connections of whoever holds
                    // the most.
                    let client = stream.local_addr().ok().map(|local| Client::of(peer, local));
                    let owner = client.as_ref().map_or(Owner::Address(peer.ip()), Owner::of);
                    match connections.admit(Instant::now(), owner) {
                    Some(admitted) => {
                        tasks.spawn(run_connection(stream, client, admitted, router.clone(), stop_rx.clone()));
                    }
                    // Dropping the stream closes it.
                    None => bump(&STATS.refused_full),
                    }
                }
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
    client: Option<Client>,
    admitted: Admitted,
    router: Router,
    mut stop: watch::Receiver<bool>,
) {
    // Responses are written whole; Nagle would only delay the last segment.
    let _ = stream.set_nodelay(true);
    // Autotuned, the kernel queued 3 MB of answer for a client that reads
    // nothing, charged to the daemon's memory cgroup.
    let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER);
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
                in_flight.writing(Instant::now());
                Ok::<_, Infallible>(response.map(|body| TrackedBody::new(body, in_flight)))
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
