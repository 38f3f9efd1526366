//! A headless `chromium` driven over the DevTools protocol, for the web UI
//! tests and benchmark. A small client of our own over `tungstenite`: the
//! crates that wrap the whole protocol pull in far more than these five
//! commands need, and Node.js is not on a host that has only Rust.
#![allow(dead_code)]

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use base64::Engine as _;
use serde_json::{json, Value};
use tungstenite::{stream::MaybeTlsStream, Message, WebSocket};

/// Longest wait for one command's answer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// A running headless chromium with one page.
pub struct Browser {
    child: Child,
    profile: PathBuf,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    errors: Vec<String>,
    loads: u64,
}

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

impl Browser {
    /// Starts chromium, or `None` (with a note) when it is not installed
    /// and `CI` is not `true`; under CI its absence fails the test.
    pub fn launch_or_skip() -> Option<Browser> {
        if chromium().is_none() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "chromium is not installed (scripts/deps.sh installs it)"
            );
            eprintln!("skipped: chromium is not installed (scripts/deps.sh installs it)");
            return None;
        }
        Some(Browser::launch())
    }

    /// Starts chromium headless with a fresh profile and attaches to its
    /// page (Runtime, Page and Log events on).
    pub fn launch() -> Browser {
        let exe = chromium().expect("chromium is not installed (scripts/deps.sh installs it)");
        let profile = std::env::temp_dir().join(format!(
            "wallscope-chromium-{}-{:?}",
            std::process::id(),
            Instant::now()
        ));
        let _ = std::fs::create_dir_all(&profile);
        let child = Command::new(exe)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        let port = wait_for_port(&profile.join("DevToolsActivePort"));
        let url = page_socket_url(port);
        let (socket, _) = tungstenite::connect(url.as_str()).expect("connect to the page");
        if let MaybeTlsStream::Plain(s) = socket.get_ref() {
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
        }
        let mut b = Browser {
            child,
            profile,
            socket,
            next_id: 0,
            errors: Vec::new(),
            loads: 0,
        };
        for domain in ["Runtime", "Page", "Log"] {
            b.call(&format!("{domain}.enable"), json!({}));
        }
        b
    }

    /// Opens `url` and waits for its load event.
    pub fn goto(&mut self, url: &str) {
        let loads = self.loads;
        self.call("Page.navigate", json!({ "url": url }));
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while self.loads == loads {
            assert!(Instant::now() < deadline, "{url} did not load");
            self.pump();
        }
    }

    /// The value of `js` (promises awaited); panics with the exception.
    pub fn eval(&mut self, js: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": js, "awaitPromise": true, "returnByValue": true }),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{js}\nthrew: {}", exception_text(e));
        }
        r["result"]["value"].clone()
    }

    /// Evaluates `js` every 100 ms until it is truthy, and returns it.
    pub fn wait_for(&mut self, what: &str, js: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(js);
            let truthy =
                !matches!(&v, Value::Null | Value::Bool(false)) && v != json!(0) && v != json!("");
            if truthy {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "waited {timeout:?} for {what}: last {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Saves a PNG of the page to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let r = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap_or(""))
            .expect("screenshot data");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// Every console error and uncaught exception seen so far.
    pub fn console_errors(&self) -> Vec<String> {
        self.errors.clone()
    }

    /// Sends one command and returns its result, keeping the events that
    /// arrive meanwhile.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({ "id": id, "method": method, "params": params });
        self.socket
            .send(Message::text(msg.to_string()))
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            assert!(
                Instant::now() < deadline,
                "{method}: no answer in {COMMAND_TIMEOUT:?}"
            );
            let Some(m) = self.pump() else { continue };
            if m["id"] == id {
                if let Some(e) = m.get("error") {
                    panic!("{method}: {e}");
                }
                return m["result"].clone();
            }
        }
    }

    /// Reads one message (None after a quiet read timeout); events are
    /// recorded, answers returned.
    fn pump(&mut self) -> Option<Value> {
        let msg = match self.socket.read() {
            Ok(Message::Text(t)) => serde_json::from_str::<Value>(t.as_str()).ok()?,
            Ok(_) => return None,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                return None
            }
            Err(e) => panic!("DevTools connection: {e}"),
        };
        match msg["method"].as_str() {
            Some("Page.loadEventFired") => self.loads += 1,
            Some("Runtime.exceptionThrown") => self
                .errors
                .push(exception_text(&msg["params"]["exceptionDetails"])),
            Some("Runtime.consoleAPICalled")
                if matches!(msg["params"]["type"].as_str(), Some("error" | "assert")) =>
            {
                let args: Vec<String> = msg["params"]["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| {
                        a["value"]
                            .as_str()
                            .map_or_else(|| a["description"].to_string(), str::to_string)
                    })
                    .collect();
                self.errors
                    .push(format!("console.error: {}", args.join(" ")));
            }
            Some("Log.entryAdded") if msg["params"]["entry"]["level"] == "error" => {
                let e = &msg["params"]["entry"];
                self.errors
                    .push(format!("{}: {} ({})", e["source"], e["text"], e["url"]));
            }
            _ => {}
        }
        Some(msg)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn exception_text(e: &Value) -> String {
    let what = e["exception"]["description"]
        .as_str()
        .or(e["text"].as_str())
        .unwrap_or("exception");
    format!(
        "{what} at {}:{}",
        e["url"].as_str().unwrap_or("?"),
        e["lineNumber"]
    )
}

/// The DevTools port chromium writes into its profile once it listens.
fn wait_for_port(file: &Path) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(port) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse().ok())
        {
            return port;
        }
        assert!(
            Instant::now() < deadline,
            "chromium did not open its DevTools port"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The WebSocket of chromium's first page (from `/json/list`; the port
/// file may come before the page, so asked until it is there).
fn page_socket_url(port: u16) -> String {
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    loop {
        let body = targets(port).unwrap_or_default();
        let json = body.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let found = serde_json::from_str::<Value>(json)
            .ok()
            .and_then(|targets| {
                let page = targets.as_array()?.iter().find(|t| t["type"] == "page")?;
                Some(page["webSocketDebuggerUrl"].as_str()?.to_string())
            });
        if let Some(url) = found {
            return url;
        }
        assert!(Instant::now() < deadline, "no page from chromium: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn targets(port: u16) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(COMMAND_TIMEOUT))?;
    write!(
        s,
        "GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    // The DevTools server keeps the connection open: read what
    // Content-Length says.
    let mut got = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        let n = s.read(&mut buf)?;
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or(usize::MAX);
            if body.len() >= length || n == 0 {
                return Ok(text);
            }
        }
        if n == 0 {
            return Ok(text);
        }
    }
}
