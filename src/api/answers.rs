//! The answer budget: the bytes of answers being written (from the
//! handler's end until hyper has queued the last chunk, gzip state
//! included) are counted against one global budget, with a share per
//! client, so that clients that read slowly or not at all cannot make the
//! daemon hold more than [`ANSWER_BUDGET_BYTES`] of answers.
//!
//! A client is its local uid where the socket lookup found one (every
//! connection of one user is one client), else its IP address. Root may use
//! the whole budget; other clients together only what is left beside
//! [`Limits::root_reserve`], and each at most [`Limits::share`] (one answer
//! of any size when it holds none). Answers of at most [`SMALL_ANSWER`]
//! (`/healthz`, errors) are never refused: the connection cap bounds them.
//! Past its share or the budget, a request gets 503 with `Retry-After`,
//! before its query runs when the client already holds its share, else in
//! place of the computed answer (which is dropped at once); counted in
//! `/healthz` (`answers`, `refused.answers.budget`) and `/metrics`.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    task::{Context, Poll},
};

use axum::{
    body::{Body, Bytes},
    extract::Request,
    http::{header, HeaderMap},
    middleware::Next,
    response::{IntoResponse, Response},
};
use hyper::body::{Body as _, Frame, SizeHint};
use serde::Serialize;

use super::{error::ApiError, peer::Client};
use crate::untrusted::refusals::{self, Reason, What};

/// Bytes of answers held at once, all clients together, until the daemon
/// sets the total from its memory budget's `answers` part at start
/// ([`AnswerBudget::set_total`]; about 30 MiB at the default budget): two
/// clients reading the largest answers (8 MiB of folded stacks, gzip
/// state) at a time each, and root's reserve.
pub const ANSWER_BUDGET_BYTES: u64 = 64 << 20;

/// Answers this small are never refused (`/healthz`, error answers): the
/// connection cap bounds what they hold.
pub const SMALL_ANSWER: u64 = 64 << 10;

/// What gzip holds besides the answer while compressing it: deflate's
/// window, hash chains and pending output at the default level, rounded up.
pub const GZIP_STATE_BYTES: u64 = 320 << 10;

/// Answers smaller than this are not compressed (the compression layer's
/// predicate), so hold no gzip state.
pub const COMPRESS_ABOVE: u64 = 1024;

/// The path answered however full the budget is: it is small, and it is
/// how an operator sees what the budget is doing.
const CHEAP_PATH: &str = "/healthz";

/// The budget of this process's API. A static (like the server's
/// counters): the middleware and the reports reach it without state.
pub static BUDGET: AnswerBudget = AnswerBudget::new(ANSWER_BUDGET_BYTES);

/// Who an answer is held for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Holder {
    /// A router called in-process (tests, no socket): no client to share
    /// among.
    InProcess,
    /// A local user, root included.
    Uid(u32),
    /// A client whose uid is unknown (remote, or the lookup failed).
    Addr(IpAddr),
}

impl Holder {
    fn of(client: Option<&Client>) -> Holder {
        match client {
            None => Holder::InProcess,
            Some(Client { uid: Some(uid), .. }) => Holder::Uid(*uid),
            Some(c) => Holder::Addr(c.addr.ip().to_canonical()),
        }
    }

    /// Root (and in-process callers) may use the whole budget.
    fn privileged(self) -> bool {
        matches!(self, Holder::InProcess | Holder::Uid(0))
    }
}

/// The bounds derived from one total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// The whole budget.
    pub total: u64,
    /// Most one unprivileged client holds (past its first answer).
    pub share: u64,
    /// Kept for root: unprivileged clients together hold at most
    /// `total - root_reserve`.
    pub root_reserve: u64,
}

impl Limits {
    pub fn of(total: u64) -> Limits {
        Limits {
            total,
            share: total / 4,
            root_reserve: total / 4,
        }
    }

    /// Why `holder`, holding `own` of the `sum` held now, may not be given
    /// `bytes` more (`None`: it may); `bytes` `None` asks whether a request
    /// may start at all.
    fn refusal(&self, holder: Holder, own: u64, sum: u64, bytes: Option<u64>) -> Option<String> {
        if bytes.is_some_and(|b| b <= SMALL_ANSWER) {
            return None;
        }
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1 << 20));
        // Past `limit` once `bytes` are added; a request yet to run, at it.
        let past = |held: u64, limit: u64| match bytes {
            Some(b) => held + b > limit,
            None => held >= limit,
        };
        if holder.privileged() {
            // Into an empty budget, root's answer goes whatever its size.
            let first = bytes.is_some() && sum == 0;
            return (past(sum, self.total) && !first).then(|| {
                format!(
                    "answers being written hold {} of the {} answer budget: retry later",
                    mib(sum),
                    mib(self.total)
                )
            });
        }
        // A client holding nothing may have one answer past its share.
        if own > 0 && past(own, self.share) {
            return Some(format!(
                "your answers not yet read hold {} (a client's share is {}): \
                 read them or close their connections, then retry",
                mib(own),
                mib(self.share)
            ));
        }
        let room = self.total - self.root_reserve;
        past(sum, room).then(|| {
            format!(
                "answers being written hold {} of the {} unprivileged clients may use: \
                 retry later",
                mib(sum),
                mib(room)
            )
        })
    }
}

/// The bytes held, by holder.
#[derive(Debug, Default)]
struct Held {
    by: BTreeMap<Holder, u64>,
    sum: u64,
    peak: u64,
}

/// A global budget of answer bytes with per-client shares.
#[derive(Debug)]
pub struct AnswerBudget {
    total: AtomicU64,
    held: Mutex<Held>,
    answers: AtomicU64,
    refused: AtomicU64,
}

/// What `/healthz` (`answers`) and `/metrics` show of the budget.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AnswerStats {
    #[serde(flatten)]
    pub limits: Limits,
    /// Bytes of answers being written now.
    pub held: u64,
    /// The most held at once since start.
    pub peak: u64,
    /// Clients holding answers now.
    pub clients: usize,
    /// Answers charged since start.
    pub answers: u64,
    /// Requests refused with 503 since start.
    pub refused: u64,
}

/// Bytes charged to a holder, given back when dropped (when hyper drops
/// the answer's body: written, or its connection gone).
#[derive(Debug)]
pub struct Charge {
    budget: &'static AnswerBudget,
    holder: Holder,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut held = self.budget.held();
        held.sum = held.sum.saturating_sub(self.bytes);
        if let Some(own) = held.by.get_mut(&self.holder) {
            *own = own.saturating_sub(self.bytes);
            if *own == 0 {
                held.by.remove(&self.holder);
            }
        }
    }
}

impl AnswerBudget {
    pub const fn new(total: u64) -> AnswerBudget {
        AnswerBudget {
            total: AtomicU64::new(total),
            held: Mutex::new(Held {
                by: BTreeMap::new(),
                sum: 0,
                peak: 0,
            }),
            answers: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Sets the total (e.g. derived from a memory budget at start).
    pub fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    pub fn limits(&self) -> Limits {
        Limits::of(self.total.load(Ordering::Relaxed))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `holder` may start a request now (it is under its share,
    /// and the budget is not spent).
    fn admit(&self, holder: Holder) -> Result<(), ApiError> {
        let held = self.held();
        let own = held.by.get(&holder).copied().unwrap_or(0);
        match self.limits().refusal(holder, own, held.sum, None) {
            None => Ok(()),
            Some(why) => Err(self.refuse(why)),
        }
    }

    /// Charges `bytes` to `holder`, or refuses.
    fn take(&'static self, holder: Holder, bytes: u64) -> Result<Charge, ApiError> {
        let mut held = self.held();
        let own = held.by.get(&holder).copied().unwrap_or(0);
        if let Some(why) = self.limits().refusal(holder, own, held.sum, Some(bytes)) {
            drop(held);
            return Err(self.refuse(why));
        }
        *held.by.entry(holder).or_default() += bytes;
        held.sum += bytes;
        held.peak = held.peak.max(held.sum);
        self.answers.fetch_add(1, Ordering::Relaxed);
        Ok(Charge {
            budget: self,
            holder,
            bytes,
        })
    }

    fn refuse(&self, why: String) -> ApiError {
        self.refused.fetch_add(1, Ordering::Relaxed);
        refusals::count(What::Answers, Reason::Budget);
        ApiError::Busy(why)
    }

    pub fn stats(&self) -> AnswerStats {
        let held = self.held();
        AnswerStats {
            limits: self.limits(),
            held: held.sum,
            peak: held.peak,
            clients: held.by.len(),
            answers: self.answers.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// An answer's body holding its [`Charge`]; everything else is the
/// body's own (its exact size above all: hyper sends it as the
/// `Content-Length`, and the compression layer decides by it).
struct Charged {
    body: Body,
    _charge: Charge,
}

impl hyper::body::Body for Charged {
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

/// Whether the request accepts gzip (and its answer may then be
/// compressed, holding gzip state).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("gzip"))
}

/// The middleware: refuses a client already holding its share before its
/// handler runs, then charges the answer (as the handler made it, before
/// compression) until hyper drops its body.
pub async fn charge(req: Request, next: Next) -> Response {
    let holder = Holder::of(req.extensions().get::<Client>());
    if req.uri().path() != CHEAP_PATH {
        if let Err(refused) = BUDGET.admit(holder) {
            return refused.into_response();
        }
    }
    let gzip = accepts_gzip(req.headers());
    let response = next.run(req).await;
    let hint = response.body().size_hint();
    let mut bytes = hint.upper().unwrap_or(hint.lower());
    if gzip && bytes > COMPRESS_ABOVE {
        bytes += GZIP_STATE_BYTES;
    }
    match BUDGET.take(holder, bytes) {
        Ok(charge) => response.map(|body| {
            Body::new(Charged {
                body,
                _charge: charge,
            })
        }),
        Err(refused) => refused.into_response(),
    }
}

#[cfg(test)]
#[path = "answers_tests.rs"]
mod tests;
