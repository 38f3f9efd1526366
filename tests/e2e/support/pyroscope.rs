//! A Pyroscope stand-in for the push tests: it speaks the Push API
//! (`POST /push.v1.PusherService/Push`, protobuf `PushRequest` of gzip'd
//! pprof), checks what it gets as Pyroscope's distributor does
//! (`pkg/validation`), answers 400 with the reason when a check fails, and
//! keeps what it accepted. It can be told to answer 400 or 503, to hang,
//! or to be down (port closed) for a while.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex, MutexGuard},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use prost::Message;
use wallscope::export::{
    pprof::proto::Profile,
    push::proto::{PushRequest, PushResponse},
};

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Checks and keeps what it gets: 200, or 400 with the reason.
    Ok,
    /// 400 to everything, as to invalid profiles.
    BadRequest,
    /// 503, as an overloaded server.
    Unavailable,
    /// Reads the request and never answers (until the mode changes).
    Hang,
    /// The port is closed: connections are refused.
    Down,
}

/// Pyroscope's default limits.
pub const MAX_LABELS: usize = 30;
pub const MAX_LABEL_LENGTH: usize = 1024;
pub const MAX_SAMPLES: usize = 16_000;
pub const MAX_PROFILE_BYTES: usize = 4 << 20;

/// A profile the server accepted, with its series labels.
#[derive(Debug, Clone)]
pub struct Received {
    pub labels: BTreeMap<String, String>,
    pub profile: Profile,
}

impl Received {
    /// A series label (panics if missing).
    pub fn label(&self, name: &str) -> &str {
        self.labels
            .get(name)
            .unwrap_or_else(|| panic!("no label {name} in {:?}", self.labels))
    }

    /// The string a string-table index points at.
    pub fn string(&self, i: i64) -> &str {
        &self.profile.string_table[i as usize]
    }

    /// The sum of the value of sample type `ty` (e.g. `cpu`).
    pub fn total(&self, ty: &str) -> i64 {
        let at = self
            .profile
            .sample_type
            .iter()
            .position(|t| self.string(t.r#type) == ty)
            .unwrap_or_else(|| panic!("no sample type {ty}"));
        self.profile.sample.iter().map(|s| s.value[at]).sum()
    }

    /// The window it covers: `(from, until)` in Unix nanoseconds.
    pub fn window(&self) -> (i64, i64) {
        let from = self.profile.time_nanos;
        (from, from + self.profile.duration_nanos)
    }
}

#[derive(Default)]
struct State {
    mode: Option<Mode>,
    received: Vec<Received>,
    /// Requests refused by the checks, with the reason.
    invalid: Vec<String>,
    /// Requests that reached the server, by the mode it was in.
    requests: BTreeMap<String, u64>,
    /// How long an accepted request waits for its answer (a real
    /// Pyroscope answers after its ~500 ms flush).
    delay: Duration,
    /// Requests being answered now, and the most at once.
    in_flight: u64,
    max_in_flight: u64,
}

/// What the server saw of the requests' pace.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    pub requests: u64,
    pub in_flight: u64,
    pub max_in_flight: u64,
}

/// The running server; stopped when dropped.
pub struct Pyroscope {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Pyroscope {
    /// Starts a server on a free loopback port, in [`Mode::Ok`].
    pub fn start() -> Pyroscope {
        Pyroscope::with_delay(Duration::ZERO)
    }

    /// Like [`Pyroscope::start`], answering each accepted request only
    /// after `delay`, as a real Pyroscope answers after its flush.
    pub fn with_delay(delay: Duration) -> Pyroscope {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            mode: Some(Mode::Ok),
            delay,
            ..State::default()
        }));
        let shared = state.clone();
        thread::spawn(move || accept(Some(listener), addr, &shared));
        Pyroscope { addr, state }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The URL to give `--push-url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A daemon of its own pushing here every 2 s, `extra` flags added.
    /// Ranking is by wall time, so processes with many idle threads (a
    /// browser, a JVM) can outrank a test's workload on a busy host: it
    /// pushes the top 256, and tests are about what is sent, not the
    /// ranking (unit-tested).
    pub fn daemon(&self, extra: &[&str]) -> super::Daemon {
        let url = self.url();
        let mut args = vec![
            "--push-url",
            &url,
            "--push-interval",
            "2s",
            "--push-top",
            "256",
        ];
        args.extend_from_slice(extra);
        super::Daemon::start(&args)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.lock().mode = Some(mode);
    }

    /// Everything accepted so far.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// The reasons of every refusal by the checks so far.
    pub fn invalid(&self) -> Vec<String> {
        self.lock().invalid.clone()
    }

    /// The requests so far and the most answered at once.
    pub fn pace(&self) -> Pace {
        let s = self.lock();
        Pace {
            requests: s.requests.values().sum(),
            in_flight: s.in_flight,
            max_in_flight: s.max_in_flight,
        }
    }

    /// Requests that reached the server in `mode` so far.
    pub fn requests_in(&self, mode: Mode) -> u64 {
        let key = format!("{mode:?}");
        self.lock().requests.get(&key).copied().unwrap_or(0)
    }
}

impl Drop for Pyroscope {
    fn drop(&mut self) {
        self.lock().mode = None;
    }
}

/// Accepts connections while the server runs; closes the port while
/// down and opens it again after.
fn accept(mut listener: Option<TcpListener>, addr: SocketAddr, state: &Arc<Mutex<State>>) {
    loop {
        let mode = state.lock().unwrap().mode;
        match (mode, &listener) {
            (None, _) => return,
            (Some(Mode::Down), Some(_)) => listener = None,
            (Some(Mode::Down), None) => {}
            (Some(_), None) => {
                // std sets SO_REUSEADDR: the port is ours again at once.
                listener = TcpListener::bind(addr).ok();
                if let Some(l) = &listener {
                    l.set_nonblocking(true).unwrap();
                }
            }
            (Some(_), Some(l)) => {
                l.set_nonblocking(true).unwrap();
                if let Ok((conn, _)) = l.accept() {
                    let state = state.clone();
                    thread::spawn(move || serve(conn, &state));
                    continue;
                }
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// One request per connection (`Connection: close`): a mode change then
/// applies to the next request.
fn serve(conn: TcpStream, state: &Mutex<State>) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let Some((request_line, headers, body)) = read_request(&mut reader) else {
        return;
    };
    let mode = {
        let mut s = state.lock().unwrap();
        let Some(mode) = s.mode else { return };
        *s.requests.entry(format!("{mode:?}")).or_default() += 1;
        mode
    };
    let (status, text) = match mode {
        Mode::Ok => match check(&request_line, &headers, &body) {
            Ok(accepted) => {
                let delay = {
                    let mut s = state.lock().unwrap();
                    s.in_flight += 1;
                    s.max_in_flight = s.max_in_flight.max(s.in_flight);
                    s.delay
                };
                thread::sleep(delay);
                let mut s = state.lock().unwrap();
                s.in_flight -= 1;
                s.received.extend(accepted);
                (200, String::new())
            }
            Err(reason) => {
                state.lock().unwrap().invalid.push(reason.clone());
                (400, reason)
            }
        },
        Mode::BadRequest => (400, "invalid_argument: told to refuse".into()),
        Mode::Unavailable => (503, "unavailable: told to be".into()),
        Mode::Hang | Mode::Down => {
            // Hold the connection, unanswered, while hanging.
            while state.lock().unwrap().mode == Some(Mode::Hang) {
                thread::sleep(Duration::from_millis(20));
            }
            return;
        }
    };
    let body = if status == 200 {
        PushResponse {}.encode_to_vec()
    } else {
        text.into_bytes()
    };
    let content_type = if status == 200 {
        "application/proto"
    } else {
        "text/plain"
    };
    let mut conn = conn;
    let _ = write!(
        conn,
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(&body);
}

/// The request line, headers (names lowercased) and body.
pub fn read_request(
    reader: &mut BufReader<TcpStream>,
) -> Option<(String, BTreeMap<String, String>, Vec<u8>)> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let request_line = line.trim().to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let len: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some((request_line, headers, body))
}

/// Pyroscope's checks on one request; the accepted profiles.
fn check(
    request_line: &str,
    headers: &BTreeMap<String, String>,
    body: &[u8],
) -> Result<Vec<Received>, String> {
    if request_line != "POST /push.v1.PusherService/Push HTTP/1.1" {
        return Err(format!("unexpected request {request_line}"));
    }
    let content_type = headers.get("content-type").map(String::as_str);
    if content_type != Some("application/proto") {
        return Err(format!("content type {content_type:?}"));
    }
    // prost refuses strings that are not UTF-8, as Go's protobuf does.
    let request = PushRequest::decode(body).map_err(|e| format!("decoding PushRequest: {e}"))?;
    let mut out = Vec::new();
    for series in request.series {
        let mut labels = BTreeMap::new();
        for l in &series.labels {
            check_label(&l.name, &l.value)?;
            if labels.insert(l.name.clone(), l.value.clone()).is_some() {
                return Err(format!("duplicate label {}", l.name));
            }
        }
        if labels.len() > MAX_LABELS {
            return Err(format!("{} labels, over {MAX_LABELS}", labels.len()));
        }
        let name = labels.get("__name__").ok_or("no __name__")?;
        if !is_metric_name(name) {
            return Err(format!("invalid __name__ {name}"));
        }
        if labels.get("service_name").is_none_or(|s| s.is_empty()) {
            return Err("service_name is required".into());
        }
        for sample in series.samples {
            let profile = check_profile(&sample.raw_profile)?;
            out.push(Received {
                labels: labels.clone(),
                profile,
            });
        }
    }
    Ok(out)
}

fn check_label(name: &str, value: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("invalid label name {name:?}"));
    }
    if name.chars().count() > MAX_LABEL_LENGTH || value.chars().count() > MAX_LABEL_LENGTH {
        return Err(format!("label {name} too long"));
    }
    Ok(())
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Gunzips and decodes a profile and checks its size, samples, sample
/// types and time.
fn check_profile(raw: &[u8]) -> Result<Profile, String> {
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Err("raw_profile is not gzip'd".into());
    }
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(raw)
        .take(MAX_PROFILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("gunzip: {e}"))?;
    if bytes.len() > MAX_PROFILE_BYTES {
        return Err(format!("profile over {MAX_PROFILE_BYTES} bytes"));
    }
    let p = Profile::decode(&bytes[..]).map_err(|e| format!("decoding pprof: {e}"))?;
    if p.sample.len() > MAX_SAMPLES {
        return Err(format!("{} samples, over {MAX_SAMPLES}", p.sample.len()));
    }
    if p.string_table.first().map(String::as_str) != Some("") {
        return Err("string table does not start with \"\"".into());
    }
    let string = |i: i64| {
        p.string_table
            .get(i as usize)
            .ok_or_else(|| format!("string index {i} out of range"))
    };
    if p.sample_type.is_empty() {
        return Err("no sample types".into());
    }
    for t in &p.sample_type {
        let (ty, unit) = (string(t.r#type)?, string(t.unit)?);
        if ty.contains('-') || unit.contains('-') || ty.is_empty() {
            return Err(format!("invalid sample type {ty}/{unit}"));
        }
    }
    for s in &p.sample {
        if s.value.len() != p.sample_type.len() {
            return Err("sample values do not match sample types".into());
        }
        for l in &s.label {
            string(l.key)?;
            string(l.str)?;
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let (hour, ten_min) = (3_600_000_000_000, 600_000_000_000);
    if p.time_nanos < now - hour || p.time_nanos > now + ten_min {
        return Err(format!("profile time {} too far from now", p.time_nanos));
    }
    Ok(p)
}

/// Waits until `f` gives something, at most `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "no {what} within {limit:?}");
        thread::sleep(Duration::from_millis(100));
    }
}
