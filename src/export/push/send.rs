//! Sending encoded requests over HTTP as the server's [`Protocol`] says
//! (Pyroscope's connect-go unary call, or OTLP/HTTP protobuf), with
//! timeouts, and the threads that empty an [`Outbox`].

use std::{io::Read, time::Duration};

use base64::Engine as _;
use url::Url;

use super::outbox::{Backoff, Outbox, Request};
use crate::{
    state::push::{Failure, IntervalSent, PushStats},
    token::Token,
};

/// The Push API's path below the server's URL.
pub const PUSH_PATH: &str = "push.v1.PusherService/Push";

/// How a kind of server takes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocol {
    /// The server's kind, for log lines (`pushing to NAME fails`).
    pub server: &'static str,
    /// The path below the server's URL.
    pub path: &'static str,
    /// Headers every request carries (the content type among them).
    pub headers: &'static [(&'static str, &'static str)],
}

/// Pyroscope's Push API: a connect-go unary call, binary protobuf.
pub const PYROSCOPE: Protocol = Protocol {
    server: "Pyroscope",
    path: PUSH_PATH,
    headers: &[
        ("Content-Type", "application/proto"),
        ("Connect-Protocol-Version", "1"),
    ],
};
/// Longest a request may take in all (connecting, sending, answer); also
/// the bound on connecting and on each read and write.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of an error answer kept for the report.
const MAX_ERROR_BYTES: u64 = 512;
/// Bytes of a successful answer read (an empty `PushResponse` is 0).
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// Why a request was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendError {
    pub failure: Failure,
    /// The HTTP status, when there was an answer.
    pub status: Option<u16>,
    pub message: String,
}

impl SendError {
    /// Whether trying again later may work: not for a 4xx other than 429
    /// (too many requests), which says the profiles themselves are wrong.
    pub fn retry(&self) -> bool {
        self.failure != Failure::Http4xx || self.status == Some(429)
    }
}

/// An HTTP client for one server.
pub struct Client {
    agent: ureq::Agent,
    protocol: Protocol,
    endpoint: String,
    authorization: Option<String>,
}

impl Client {
    /// A client for the server at `base` (its path, if any, kept as a
    /// prefix). With `token`: `Authorization: Bearer TOKEN`, or, when the
    /// URL names a user (`https://USER@host`), basic auth with the token as
    /// the password (as Grafana Cloud wants).
    pub fn new(base: &Url, token: Option<&Token>, protocol: Protocol) -> Client {
        let user = base.username().to_string();
        let mut plain = base.clone();
        // The user goes in the header; the URL (shown in /healthz) has none.
        let _ = plain.set_username("");
        let endpoint = format!("{}/{}", plain.as_str().trim_end_matches('/'), protocol.path);
        let authorization = match (token, user.is_empty()) {
            (Some(t), true) => Some(format!("Bearer {}", t.text())),
            (Some(t), false) => Some(basic(&user, t.text())),
            (None, false) => Some(basic(&user, "")),
            (None, true) => None,
        };
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(TIMEOUT)
            .timeout_read(TIMEOUT)
            .timeout_write(TIMEOUT)
            .timeout(TIMEOUT)
            .redirects(0)
            .build();
        Client {
            agent,
            protocol,
            endpoint,
            authorization,
        }
    }

    /// Where requests go.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The kind of server it talks to.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Posts one encoded request.
    pub fn send(&self, body: &[u8]) -> Result<(), SendError> {
        let mut request = self.agent.post(&self.endpoint);
        for (name, value) in self.protocol.headers {
            request = request.set(name, value);
        }
        if let Some(auth) = &self.authorization {
            request = request.set("Authorization", auth);
        }
        let answer = request.send_bytes(body).map_err(classify)?;
        let status = answer.status();
        // Read to the end (bounded): the connection then goes back to the
        // agent's pool.
        let _ = std::io::copy(
            &mut answer.into_reader().take(MAX_ANSWER_BYTES),
            &mut std::io::sink(),
        );
        if !(200..300).contains(&status) {
            // Redirects are not followed (the body would not be sent
            // again): the URL needs fixing, trying again will not help.
            return Err(SendError {
                failure: Failure::Http4xx,
                status: Some(status),
                message: format!("HTTP {status}: redirects are not followed; give the final URL"),
            });
        }
        Ok(())
    }
}

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// What went wrong, in words that never hold the URL's credentials (the
/// URL is left out: the report names it once).
fn classify(e: ureq::Error) -> SendError {
    match e {
        ureq::Error::Status(code, answer) => {
            let mut text = String::new();
            let _ = answer
                .into_reader()
                .take(MAX_ERROR_BYTES)
                .read_to_string(&mut text);
            SendError {
                failure: if code < 500 {
                    Failure::Http4xx
                } else {
                    Failure::Http5xx
                },
                status: Some(code),
                message: format!("HTTP {code}: {}", text.trim()),
            }
        }
        ureq::Error::Transport(t) => {
            let io = std::error::Error::source(&t).and_then(|s| s.downcast_ref::<std::io::Error>());
            let timed_out = io.is_some_and(|e| {
                matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                )
            });
            let mut message = t.kind().to_string();
            if let Some(m) = t.message() {
                message = format!("{message}: {m}");
            }
            if let Some(io) = io {
                message = format!("{message}: {io}");
            }
            SendError {
                failure: if timed_out {
                    Failure::Timeout
                } else {
                    Failure::Refused
                },
                status: None,
                message,
            }
        }
    }
}

/// Sends what the outbox holds, oldest first, until it is stopped (or,
/// closing, emptied). Several run at once, each with its own backoff: a
/// request that may go through later goes back in front and that sender
/// waits ([`Backoff`]); one the server refused as invalid is dropped. The
/// log says when pushing starts failing and when it works again, not
/// every failed request.
pub fn run(client: &Client, outbox: &Outbox, stats: &PushStats, backoff: &mut Backoff) {
    let mut failing = false;
    let server = client.protocol().server;
    while let Some(request) = outbox.take(stats) {
        let e = match client.send(&request.body) {
            Ok(()) => {
                stats.sent(request.profiles, request.body.len() as u64);
                settled(&request, stats);
                backoff.reset();
                if std::mem::take(&mut failing) {
                    tracing::info!("pushing to {server} works again");
                }
                continue;
            }
            Err(e) => e,
        };
        let retry = e.retry();
        let rejected = if retry { 0 } else { request.profiles };
        stats.failed(e.failure, e.message.clone(), rejected);
        if !std::mem::replace(&mut failing, true) {
            tracing::warn!(
                service = %request.service,
                error = %e.message,
                "pushing to {server} fails; {} (counted in /healthz {})",
                if retry { "retrying with backoff" } else { "the refused profiles are dropped" },
                stats.report().sink,
            );
        }
        if !retry {
            settled(&request, stats);
            continue;
        }
        outbox.put_back(request, stats);
        // Closing: no waiting out a failing server (the grace is short);
        // what is left is counted as dropped when the pusher stops.
        if !outbox.pause(backoff.failed()) {
            return;
        }
    }
}

/// Times the interval once its last request settled.
fn settled(request: &Request, stats: &PushStats) {
    if request.batch.settle() {
        stats.lock().last_interval = Some(IntervalSent {
            requests: request.batch.requests as u64,
            send_s: request.batch.queued.elapsed().as_secs_f64(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_credentials() {
        let token = Token::new("s3cret").unwrap();
        let url = |u: &str| Url::parse(u).unwrap();
        let c = Client::new(&url("http://localhost:4040"), Some(&token), PYROSCOPE);
        assert_eq!(
            c.endpoint(),
            "http://localhost:4040/push.v1.PusherService/Push"
        );
        assert_eq!(c.authorization.as_deref(), Some("Bearer s3cret"));
        let c = Client::new(
            &url("https://1234@p.example.net/prefix/"),
            Some(&token),
            PYROSCOPE,
        );
        assert_eq!(
            c.endpoint(),
            "https://p.example.net/prefix/push.v1.PusherService/Push"
        );
        // base64("1234:s3cret")
        assert_eq!(c.authorization.as_deref(), Some("Basic MTIzNDpzM2NyZXQ="));
        assert!(Client::new(&url("http://h/"), None, PYROSCOPE)
            .authorization
            .is_none());
    }

    #[test]
    fn failures_are_told_apart() {
        let status = |code| SendError {
            failure: if code < 500 {
                Failure::Http4xx
            } else {
                Failure::Http5xx
            },
            status: Some(code),
            message: format!("HTTP {code}: x"),
        };
        assert!(!status(400).retry());
        assert!(status(429).retry() && status(503).retry());
        // Nothing listens on port 1 of loopback: refused at once.
        let c = Client::new(&Url::parse("http://127.0.0.1:1").unwrap(), None, PYROSCOPE);
        let e = c.send(b"").unwrap_err();
        assert_eq!(e.failure, Failure::Refused, "{e:?}");
        assert!(e.retry());
    }
}
