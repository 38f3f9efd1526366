//! The real daemon's HTTP server under a connection flood (root + eBPF):
//! thousands of idle sockets and slowloris clients must not stop `/healthz`
//! or profiling, must be closed after the idle timeout, and must not hold
//! the daemon at SIGTERM.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::support::*;
use wallscope::api::server::IDLE_TIMEOUT;

/// Idle connections the test holds (never sending a byte).
const IDLE: usize = 5000;
/// Slowloris connections: a request line, then one header byte a second.
const SLOWLORIS: usize = 50;
/// `/healthz` probes while the flood is held.
const PROBES: usize = 10;
/// Slack after the idle timeout: the server checks twice a second, and the
/// flood took a moment to open.
const CLOSE_MARGIN: Duration = Duration::from_secs(3);

/// Raises this process's soft fd limit to its hard limit: the flood needs
/// more than the usual 1024.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only access the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(
        lim.rlim_cur as usize > IDLE + SLOWLORIS + 1000,
        "hard fd limit {} too low for the test",
        lim.rlim_max
    );
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, Duration::from_secs(5))
}

/// `n` connections that never send anything; errors are counted, not
/// fatal, so one refused connect does not hide the rest of the results.
fn open_idle(addr: SocketAddr, n: usize, failures: &mut Vec<String>) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(n);
    let mut errors = 0;
    for _ in 0..n {
        match connect(addr) {
            Ok(s) => conns.push(s),
            Err(_) => errors += 1,
        }
    }
    if errors > 0 {
        failures.push(format!("{errors} of {n} idle connects failed"));
    }
    conns
}

/// Slowloris clients: each sent a request line, and a thread sends each
/// one more header byte every second until dropped.
struct Slowloris {
    conns: Vec<TcpStream>,
    stop: Arc<AtomicBool>,
    writer: Option<JoinHandle<()>>,
}

impl Slowloris {
    fn open(addr: SocketAddr, n: usize) -> Slowloris {
        let conns: Vec<TcpStream> = (0..n)
            .map(|_| {
                let mut s = connect(addr).expect("slowloris connect");
                s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
                s
            })
            .collect();
        let mut writers: Vec<TcpStream> = conns.iter().map(|s| s.try_clone().unwrap()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for s in &mut writers {
                        // Fails once the server closed it: that is the point.
                        let _ = s.write_all(b"a");
                    }
                    thread::sleep(Duration::from_secs(1));
                }
            })
        };
        Slowloris {
            conns,
            stop,
            writer: Some(writer),
        }
    }
}

impl Drop for Slowloris {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// One GET of `path` on a fresh connection: status and time to the full
/// response (0 if there was none).
fn probe(addr: SocketAddr, path: &str) -> (u16, Duration, String) {
    let started = Instant::now();
    let answer = (|| -> std::io::Result<String> {
        let mut s = connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })();
    let elapsed = started.elapsed();
    match answer {
        Ok(text) => {
            let status = text
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = text.split_once("\r\n\r\n").map(|b| b.1).unwrap_or("");
            (status, elapsed, body.to_string())
        }
        Err(e) => (0, elapsed, e.to_string()),
    }
}

/// Sends GET `path` on an open keep-alive connection and reads one
/// response: its status (0 if the connection failed).
fn keep_alive_get(s: &mut TcpStream, addr: SocketAddr, path: &str) -> u16 {
    let mut answer = || -> std::io::Result<u16> {
        write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n")?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte)?;
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        s.read_exact(&mut vec![0; length])?;
        Ok(head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0))
    };
    answer().unwrap_or(0)
}

/// A keep-alive client that sends a request every `gap` (shorter than the
/// idle timeout) on one connection, `n` times: the statuses it got. Its
/// waits add up to more than the idle timeout, but each starts at the end
/// of a response, so none may be closed.
fn keep_alive_client(addr: SocketAddr, gap: Duration, n: usize) -> JoinHandle<Vec<u16>> {
    thread::spawn(move || {
        let mut s = connect(addr).expect("keep-alive connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (0..n)
            .map(|i| {
                if i > 0 {
                    thread::sleep(gap);
                }
                keep_alive_get(&mut s, addr, "/healthz")
            })
            .collect()
    })
}

/// Whether the server closed `s`: a read gives EOF or a reset rather than
/// blocking.
fn closed_by_server(mut s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

/// How many of `conns` are still open, after retrying until `deadline`.
fn still_open(conns: &[TcpStream], deadline: Instant) -> usize {
    loop {
        let open = conns.iter().filter(|s| !closed_by_server(s)).count();
        if open == 0 || Instant::now() >= deadline {
            return open;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

fn healthz_http(url: &str) -> serde_json::Value {
    let (status, body) = get(&format!("{url}/healthz"));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["http"].clone()
}

#[test]
fn floods_of_idle_and_slowloris_connections_are_survived_and_closed() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    raise_fd_limit();
    let mut daemon = Daemon::start(&[]);
    let addr: SocketAddr = daemon.url.trim_start_matches("http://").parse().unwrap();
    let mut failures = Vec::new();

    let started = Instant::now();
    let idle = open_idle(addr, IDLE, &mut failures);
    let slow = Slowloris::open(addr, SLOWLORIS);
    let held_since = Instant::now();
    eprintln!(
        "opened {} idle and {} slowloris connections in {:?}",
        idle.len(),
        slow.conns.len(),
        held_since - started
    );

    let keep_alive = keep_alive_client(addr, IDLE_TIMEOUT * 2 / 3, 3);

    // Profiling goes on while the flood is held.
    // Runs until its stacks are named: a busy host may delay the daemon's
    // reading of its maps past a short life.
    let workload = Workload::start(&workload("cpu_shares"), &["600"]);
    let pid = workload.pid;

    let mut latencies = Vec::new();
    for i in 0..PROBES {
        let (status, latency, body) = probe(addr, "/healthz");
        eprintln!(
            "healthz probe {i}: {status} in {:.1} ms",
            latency.as_secs_f64() * 1e3
        );
        if status != 200 {
            failures.push(format!("healthz probe {i} answered {status}: {body}"));
        }
        latencies.push(latency);
        thread::sleep(Duration::from_millis(200));
    }
    latencies.sort();
    let median = (latencies[PROBES / 2 - 1] + latencies[PROBES / 2]) / 2;
    eprintln!(
        "healthz median latency {:.1} ms",
        median.as_secs_f64() * 1e3
    );
    if median >= Duration::from_millis(100) {
        failures.push(format!("healthz median latency {median:?} >= 100 ms"));
    }

    let asked = Instant::now();
    let (status, body, symbolized) = loop {
        let (status, _, body) = probe(addr, &format!("/folded?pid={pid}&seconds=300"));
        let symbolized = body
            .lines()
            .any(|l| l.contains(";main;") && l.contains(";heavy"));
        if symbolized || asked.elapsed() > CATCH_UP {
            break (status, body, symbolized);
        }
        thread::sleep(Duration::from_secs(1));
    };
    drop(workload);
    if status != 200 || !symbolized {
        failures.push(format!(
            "the workload's stacks under the flood: {status}, no main;...;heavy stack:\n{body}"
        ));
    }
    eprintln!(
        "workload stacks answered at {:?} into the hold",
        held_since.elapsed()
    );

    // Every held socket is closed by the server once the idle timeout passed.
    thread::sleep(
        (held_since + IDLE_TIMEOUT + CLOSE_MARGIN).saturating_duration_since(Instant::now()),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let idle_open = still_open(&idle, deadline);
    let slow_open = still_open(&slow.conns, deadline);
    eprintln!(
        "{:?} after the flood: {idle_open} idle and {slow_open} slowloris sockets still open",
        held_since.elapsed()
    );
    if idle_open > 0 || slow_open > 0 {
        failures.push(format!(
            "{:?} after opening them, {idle_open} of {} idle and {slow_open} of {} slowloris \
             connections are still open (idle timeout {IDLE_TIMEOUT:?})",
            held_since.elapsed(),
            idle.len(),
            slow.conns.len()
        ));
    }
    drop(slow);
    drop(idle);
    let statuses = keep_alive.join().unwrap();
    eprintln!(
        "keep-alive requests {:?} apart: {statuses:?}",
        IDLE_TIMEOUT * 2 / 3
    );
    if statuses != [200; 3] {
        failures.push(format!(
            "a keep-alive connection with requests {:?} apart was cut: {statuses:?}",
            IDLE_TIMEOUT * 2 / 3
        ));
    }

    let http = healthz_http(&daemon.url);
    eprintln!("healthz http: {http}");
    let counter = |name: &str| http[name].as_u64().unwrap_or(0);
    let cap = counter("connection_limit") as usize;
    if counter("closed_evicted") < (IDLE + SLOWLORIS).saturating_sub(cap) as u64
        || counter("closed_idle_timeout") == 0
        || cap == 0
    {
        failures.push(format!(
            "counters do not show the evictions and timeouts: {http}"
        ));
    }

    // SIGTERM with a fresh flood held: the daemon still exits promptly.
    let held = open_idle(addr, 1000, &mut failures);
    let slow = Slowloris::open(addr, SLOWLORIS);
    thread::sleep(Duration::from_secs(2));
    match daemon.terminate(Duration::from_secs(2)) {
        Some((took, status)) => {
            eprintln!("daemon exited {took:?} after SIGTERM: {status}");
            if !status.success() {
                failures.push(format!("daemon exited with {status} after SIGTERM"));
            }
        }
        None => failures.push("daemon still running 2 s after SIGTERM".into()),
    }
    drop((held, slow));

    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
