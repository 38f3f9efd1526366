//! The command line's side of the API: one GET to a running daemon (its
//! answer as text), for `wallscope explain`.

use std::time::Duration;

/// How long the daemon may take to answer: a query waits for its turn
/// and reads the window on a blocking thread.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The most of an answer read (a host-wide answer is a few KiB).
const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// Why a question to the daemon got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon refused the question (4xx): a bad parameter, an unknown
    /// process, a reader who may not ask.
    #[error("{0}")]
    Refused(String),
    /// No daemon, or it failed (5xx, a broken answer).
    #[error("{0}")]
    Failed(String),
}

/// What `wallscope explain` asks (its command-line arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Question {
    /// The process to explain; without it, the processes that lost the
    /// most time waiting.
    #[arg(long)]
    pub pid: Option<u32>,
    /// The window: the last this many seconds.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Without --pid: how many processes to list.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Print the JSON answer rather than text.
    #[arg(long)]
    pub json: bool,
}

/// The `/explain` answer of the daemon at `base` to `asked`.
pub fn explain(base: &str, asked: &Question) -> Result<String, ClientError> {
    let mut query = format!("/explain?seconds={}", asked.seconds);
    if let Some(pid) = asked.pid {
        query.push_str(&format!("&pid={pid}"));
    }
    if let Some(limit) = asked.limit {
        query.push_str(&format!("&limit={limit}"));
    }
    if !asked.json {
        query.push_str("&format=text");
    }
    get(base, &query)
}

/// The daemon at `base` (`http://127.0.0.1:7070`) answering `path_query`.
pub fn get(base: &str, path_query: &str) -> Result<String, ClientError> {
    let url = format!("{}{path_query}", base.trim_end_matches('/'));
    let agent = ureq::AgentBuilder::new().timeout(TIMEOUT).build();
    match agent.get(&url).call() {
        Ok(answer) => read(answer).map_err(|e| ClientError::Failed(format!("reading {url}: {e}"))),
        Err(ureq::Error::Status(code, answer)) => {
            let body = read(answer).unwrap_or_default();
            // Errors come as `{"error": "..."}`.
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(body);
            let message = format!("{url}: {code}: {}", message.trim());
            Err(if (400..500).contains(&code) {
                ClientError::Refused(message)
            } else {
                ClientError::Failed(message)
            })
        }
        Err(e) => Err(ClientError::Failed(format!(
            "no answer from {base} (is `wallscope serve` running?): {e}"
        ))),
    }
}

fn read(answer: ureq::Response) -> std::io::Result<String> {
    let mut body = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(answer.into_reader(), MAX_ANSWER_BYTES),
        &mut body,
    )?;
    Ok(body)
}
