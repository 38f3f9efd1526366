//! What each of the pusher's sinks reports in `/healthz` (`push` for
//! Pyroscope, `otlp`) and `/metrics` (`wallscope_push_*`,
//! `wallscope_otlp_*`).

use std::{
    sync::{Mutex, MutexGuard},
    time::{SystemTime, UNIX_EPOCH},
};

use serde::Serialize;

/// Why a push failed; its name is the one in `/healthz` and the `reason`
/// label in `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Failure {
    /// No answer in time (connecting, sending or waiting for it).
    Timeout,
    /// No connection: refused, unreachable, name not found, or broken.
    Refused,
    /// A 4xx answer: 429 (rate limited) is retried, the others mean the
    /// profiles are invalid and are dropped (`rejected_profiles`).
    #[strum(serialize = "http_4xx")]
    Http4xx,
    /// A 5xx answer (server overloaded or down): retried.
    #[strum(serialize = "http_5xx")]
    Http5xx,
}

impl Failure {
    /// Every failure, in report order.
    pub const ALL: &'static [Failure] = <Failure as strum::VariantArray>::VARIANTS;

    /// The name in `/healthz` and the `reason` label in `/metrics`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Failed requests by [`Failure`].
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Failed {
    pub timeout: u64,
    pub refused: u64,
    pub http_4xx: u64,
    pub http_5xx: u64,
}

impl Failed {
    /// The count for `f`.
    pub fn get(&self, f: Failure) -> u64 {
        match f {
            Failure::Timeout => self.timeout,
            Failure::Refused => self.refused,
            Failure::Http4xx => self.http_4xx,
            Failure::Http5xx => self.http_5xx,
        }
    }

    fn count(&mut self, f: Failure) {
        *match f {
            Failure::Timeout => &mut self.timeout,
            Failure::Refused => &mut self.refused,
            Failure::Http4xx => &mut self.http_4xx,
            Failure::Http5xx => &mut self.http_5xx,
        } += 1;
    }
}

/// The pusher's counters since start.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PushReport {
    /// The sink's name in `/healthz` and `/metrics` (`push`, `otlp`).
    #[serde(skip)]
    pub sink: &'static str,
    /// Where profiles go (without credentials).
    pub url: String,
    pub interval_s: f64,
    /// Intervals turned into profiles, and the seconds the last took to
    /// build.
    pub intervals: u64,
    pub last_build_s: f64,
    /// Requests (one per process and interval) and profiles delivered.
    pub sent_requests: u64,
    pub sent_profiles: u64,
    pub sent_bytes: u64,
    /// Failed attempts by reason; all but non-429 4xx are retried.
    pub failed: Failed,
    /// Profiles the server refused as invalid (4xx other than 429): not
    /// sent again.
    pub rejected_profiles: u64,
    /// Profiles dropped unsent, oldest first, to keep the queue within its
    /// bound during an outage.
    pub dropped_profiles: u64,
    /// Requests waiting to be sent, and their bytes; the most queued at
    /// once since start.
    pub queued_requests: u64,
    pub queued_bytes: u64,
    pub max_queued_requests: u64,
    /// Requests sent at once (at most).
    pub senders: u64,
    /// The last interval whose requests all settled: how many, and the
    /// seconds from queueing them to the last answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_interval: Option<IntervalSent>,
    /// Samples merged into `[trimmed]` to fit Pyroscope's limits, and
    /// their nanoseconds.
    pub trimmed_samples: u64,
    pub trimmed_ns: u64,
    /// Unix time of the last delivered request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_success_unix: Option<f64>,
    /// The last failure, as the server or the connection put it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// How an interval's requests went out.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct IntervalSent {
    pub requests: u64,
    pub send_s: f64,
}

/// [`PushReport`] behind a lock held only to update or copy it.
#[derive(Debug, Default)]
pub struct PushStats(Mutex<PushReport>);

impl PushStats {
    /// Counters of sink `sink` for pushes to `url` every `interval_s`.
    pub fn new(sink: &'static str, url: String, interval_s: f64, senders: u64) -> PushStats {
        PushStats(Mutex::new(PushReport {
            sink,
            url,
            interval_s,
            senders,
            ..PushReport::default()
        }))
    }

    /// The counters, locked for a short update.
    pub fn lock(&self) -> MutexGuard<'_, PushReport> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the counters.
    pub fn report(&self) -> PushReport {
        self.lock().clone()
    }

    /// Counts a delivered request of `profiles` profiles and `bytes`.
    pub fn sent(&self, profiles: u64, bytes: u64) {
        let mut r = self.lock();
        r.sent_requests += 1;
        r.sent_profiles += profiles;
        r.sent_bytes += bytes;
        r.last_success_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs_f64());
    }

    /// Counts a failed attempt, with the profiles it gave up for good
    /// (`rejected`: refused as invalid), and keeps its message.
    pub fn failed(&self, failure: Failure, message: String, rejected: u64) {
        let mut r = self.lock();
        r.failed.count(failure);
        r.rejected_profiles += rejected;
        r.last_error = Some(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_count_by_reason() {
        let stats = PushStats::new("push", "http://x/".into(), 15.0, 4);
        stats.failed(Failure::Http5xx, "503".into(), 0);
        stats.failed(Failure::Http4xx, "400".into(), 2);
        stats.failed(Failure::Timeout, "slow".into(), 0);
        stats.sent(2, 100);
        let r = stats.report();
        let counts: Vec<u64> = Failure::ALL.iter().map(|f| r.failed.get(*f)).collect();
        assert_eq!(counts, [1, 0, 1, 1]);
        assert_eq!(r.rejected_profiles, 2);
        assert_eq!(
            (r.sent_requests, r.sent_profiles, r.sent_bytes),
            (1, 2, 100)
        );
        assert_eq!(r.last_error.as_deref(), Some("slow"));
        assert!(r.last_success_unix.is_some());
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["failed"]["http_4xx"], 1);
        // Each failure's name is its field in `/healthz`.
        let names: Vec<&str> = Failure::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["timeout", "refused", "http_4xx", "http_5xx"]);
        for (f, count) in Failure::ALL.iter().zip(counts) {
            assert_eq!(json["failed"][f.name()], count, "{f:?}");
        }
    }
}
