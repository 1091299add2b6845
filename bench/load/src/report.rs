//! What one load run saw: counts by gRPC code, rates and latency distributions. The [`Recorder`]
//! accumulates answers as they arrive; [`Recorder::finish`] does the arithmetic once.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::summary::{Latencies, Summary};

/// How the run was driven, copied into the report so a result file explains itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub target: String,
    /// `grpc` or `http` (TEI's HTTP API).
    #[serde(default)]
    pub protocol: String,
    /// `open` or `closed`.
    pub mode: String,
    /// Open loop: `poisson` or `constant`.
    pub arrivals: Option<String>,
    /// Open loop: the asked rate, requests per second.
    pub rate: Option<f64>,
    /// Closed loop: requests kept in flight.
    pub concurrency: Option<usize>,
    pub connections: usize,
    /// Every call opened a connection of its own (and closed it).
    #[serde(default)]
    pub connection_per_call: bool,
    /// The RPC: `Embed`, `EmbedStream of N` (a request is then the whole call) or `Info`.
    pub call: String,
    /// What the requests embed, e.g. `tokens 16` or a Zipf query mix.
    pub inputs: String,
    pub deadline_ms: Option<f64>,
    pub priority: Option<String>,
    /// `x-teifleet-tenant` of every request.
    #[serde(default)]
    pub tenant: Option<String>,
    /// `x-teifleet-pool` of every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// `x-teifleet-lane` of every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// The retry policy, described (`pushback retry, 5 attempts, ...`).
    #[serde(default)]
    pub retry: Option<String>,
}

/// TEI's own timing of one answer, from its `Metadata`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerTiming {
    pub queue: Duration,
    pub inference: Duration,
}

/// One finished request.
#[derive(Clone, Debug)]
pub struct Answer {
    /// From the time the request was due (open loop) or sent (closed loop) to its answer.
    pub latency: Duration,
    /// From the actual send to the answer: what the server (and the client library) took,
    /// without the generator's own lateness.
    pub response: Duration,
    /// Open loop: how late the send was against its schedule.
    pub lateness: Option<Duration>,
    /// Canonical gRPC code name (see [`crate::codes`]).
    pub code: &'static str,
    /// Met the request's deadline (always true without one), measured from the due time.
    pub in_time: bool,
    pub server: Vec<ServerTiming>,
    /// Attempts the call made (1 without retries).
    pub attempts: u32,
    /// Retry hints (`grpc-retry-pushback-ms`) its refusals carried.
    pub hints: Vec<Duration>,
}

#[derive(Debug, Default)]
pub struct Recorder {
    codes: BTreeMap<String, u64>,
    all: Latencies,
    ok: Latencies,
    failed: Latencies,
    failed_response: Latencies,
    lateness: Latencies,
    tei_queue: Latencies,
    tei_inference: Latencies,
    ok_in_time: u64,
    attempts: u64,
    ok_by_attempt: Vec<u64>,
    hints: Latencies,
}

impl Recorder {
    pub fn record(&mut self, answer: &Answer) {
        *self.codes.entry(answer.code.to_owned()).or_default() += 1;
        self.all.record(answer.latency);
        self.attempts += u64::from(answer.attempts);
        for hint in &answer.hints {
            self.hints.record(*hint);
        }
        if answer.code == "OK" {
            let nth = usize::try_from(answer.attempts.max(1) - 1).unwrap_or(0);
            if self.ok_by_attempt.len() <= nth {
                self.ok_by_attempt.resize(nth + 1, 0);
            }
            self.ok_by_attempt[nth] += 1;
            self.ok.record(answer.latency);
            if answer.in_time {
                self.ok_in_time += 1;
            }
        } else {
            self.failed.record(answer.latency);
            self.failed_response.record(answer.response);
        }
        if let Some(late) = answer.lateness {
            self.lateness.record(late);
        }
        for timing in &answer.server {
            self.tei_queue.record(timing.queue);
            self.tei_inference.record(timing.inference);
        }
    }

    /// Requests that never got an answer within the run's grace period.
    pub fn unfinished(&mut self, count: u64) {
        if count > 0 {
            *self.codes.entry(crate::codes::UNFINISHED.to_owned()).or_default() += count;
        }
    }

    pub fn answered(&self) -> u64 {
        self.all.len()
    }

    pub fn ok(&self) -> u64 {
        self.ok.len()
    }

    /// `sent` requests went out over `elapsed` (first due time to last answer); the schedule
    /// spanned `schedule_span` (open loop).
    pub fn finish(self, info: RunInfo, sent: u64, elapsed: Duration, schedule_span: Option<Duration>) -> Report {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let answered = self.all.len();
        let offered_rps = schedule_span.filter(|s| !s.is_zero()).map(|s| sent as f64 / s.as_secs_f64());
        let retries = info.retry.is_some().then(|| Retries {
            attempts: self.attempts,
            ok_by_attempt: self.ok_by_attempt,
            hint: self.hints.summary(),
        });
        Report {
            info,
            sent,
            answered,
            codes: self.codes,
            ok: self.ok.len(),
            ok_in_time: self.ok_in_time,
            elapsed_s: elapsed.as_secs_f64(),
            offered_rps,
            throughput_rps: answered as f64 / secs,
            goodput_rps: self.ok_in_time as f64 / secs,
            latency: self.all.summary(),
            latency_ok: self.ok.summary(),
            latency_failed: self.failed.summary(),
            response_failed: self.failed_response.summary(),
            lateness: (!self.lateness.is_empty()).then(|| self.lateness.summary()),
            tei_queue: (!self.tei_queue.is_empty()).then(|| self.tei_queue.summary()),
            tei_inference: (!self.tei_inference.is_empty()).then(|| self.tei_inference.summary()),
            retries,
            tls: None,
        }
    }
}

/// What a run with a retry policy did besides answering: how many attempts the calls took, and
/// the hints the refusals carried.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Retries {
    /// Attempts made by the answered calls, first attempts included.
    pub attempts: u64,
    /// OK answers by the attempt that got them: `[0]` at the first attempt, `[1]` the second, …
    pub ok_by_attempt: Vec<u64>,
    /// The retry hints (ms) of the refusals; `count` is how many refusals carried one.
    pub hint: Summary,
}

impl Retries {
    /// OK answers that needed no retry.
    pub fn ok_first(&self) -> u64 {
        self.ok_by_attempt.first().copied().unwrap_or(0)
    }

    /// OK answers that came from a retry.
    pub fn ok_retried(&self) -> u64 {
        self.ok_by_attempt.iter().skip(1).sum()
    }
}

/// The result of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub info: RunInfo,
    pub sent: u64,
    pub answered: u64,
    /// Answers by canonical gRPC code, plus `UNFINISHED` for requests cut off at the end.
    pub codes: BTreeMap<String, u64>,
    pub ok: u64,
    /// OK answers that also met the deadline, counted from the due time.
    pub ok_in_time: u64,
    /// First due time to last answer.
    pub elapsed_s: f64,
    /// Open loop: what the schedule offered, requests per second.
    pub offered_rps: Option<f64>,
    /// Answers (any code) per second.
    pub throughput_rps: f64,
    /// OK answers within the deadline per second: the work that was worth doing.
    pub goodput_rps: f64,
    pub latency: Summary,
    pub latency_ok: Summary,
    pub latency_failed: Summary,
    /// Failed answers timed from their actual send, not their due time: how fast a refusal
    /// comes back, without the generator's lateness.
    pub response_failed: Summary,
    /// Open loop: send lateness against the schedule (the generator's own honesty).
    pub lateness: Option<Summary>,
    /// TEI's queue time, from the answers' Metadata.
    pub tei_queue: Option<Summary>,
    /// TEI's inference (device) time, from the answers' Metadata.
    pub tei_inference: Option<Summary>,
    /// With a retry policy: attempts, OK answers by attempt, and the hints received.
    #[serde(default)]
    pub retries: Option<Retries>,
    /// `https://` targets: the run's TLS handshakes (connections made before it included).
    #[serde(default)]
    pub tls: Option<Handshakes>,
}

/// TLS handshakes of a run: full ones, and ones that resumed an earlier connection's session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handshakes {
    pub full: u64,
    pub resumed: u64,
}

impl Report {
    /// Share of sent requests that did not come back OK.
    pub fn failed_fraction(&self) -> f64 {
        if self.sent == 0 { 0.0 } else { (self.sent - self.ok.min(self.sent)) as f64 / self.sent as f64 }
    }

    pub fn count(&self, code: &str) -> u64 {
        self.codes.get(code).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(ms: u64, code: &'static str, in_time: bool) -> Answer {
        Answer {
            latency: Duration::from_millis(ms),
            response: Duration::from_millis(ms),
            lateness: Some(Duration::from_micros(ms)),
            code,
            in_time,
            server: vec![ServerTiming { queue: Duration::from_millis(1), inference: Duration::from_millis(2) }],
            attempts: 1,
            hints: vec![],
        }
    }

    #[test]
    fn rates_counts_and_split_distributions() {
        let mut r = Recorder::default();
        for _ in 0..6 {
            r.record(&answer(10, "OK", true));
        }
        r.record(&answer(900, "OK", false));
        for _ in 0..3 {
            r.record(&answer(1, "RESOURCE_EXHAUSTED", true));
        }
        r.unfinished(2);
        let report = r.finish(RunInfo::default(), 12, Duration::from_secs(2), Some(Duration::from_secs(1)));
        assert_eq!(report.answered, 10);
        assert_eq!(report.ok, 7);
        assert_eq!(report.ok_in_time, 6);
        assert_eq!(report.count("RESOURCE_EXHAUSTED"), 3);
        assert_eq!(report.count(crate::codes::UNFINISHED), 2);
        assert_eq!(report.offered_rps, Some(12.0));
        assert!((report.throughput_rps - 5.0).abs() < 1e-9);
        assert!((report.goodput_rps - 3.0).abs() < 1e-9);
        assert!((report.failed_fraction() - 5.0 / 12.0).abs() < 1e-9);
        assert!((report.latency_failed.max_ms - 1.0).abs() < 0.01);
        assert!((report.latency_ok.max_ms - 900.0).abs() < 1.0);
        assert_eq!(report.tei_queue.unwrap().count, 10);
        assert!((report.tei_inference.unwrap().p50_ms - 2.0).abs() < 0.01);
        assert_eq!(report.lateness.unwrap().count, 10);
    }

    #[test]
    fn closed_loop_has_no_lateness_and_no_server_split_without_metadata() {
        let mut r = Recorder::default();
        let latency = Duration::from_millis(1);
        r.record(&Answer {
            latency,
            response: latency,
            lateness: None,
            code: "OK",
            in_time: true,
            server: vec![],
            attempts: 1,
            hints: vec![],
        });
        let report = r.finish(RunInfo::default(), 1, Duration::from_secs(1), None);
        assert!(report.lateness.is_none());
        assert!(report.tei_queue.is_none());
        assert!(report.offered_rps.is_none());
        assert!(report.retries.is_none(), "no policy, no retry figures");
    }

    #[test]
    fn retried_calls_are_counted_by_the_attempt_that_succeeded() {
        let mut r = Recorder::default();
        let ms = Duration::from_millis;
        let call = |code, attempts, hints: Vec<u64>| Answer {
            hints: hints.into_iter().map(ms).collect(),
            attempts,
            ..answer(5, code, true)
        };
        r.record(&call("OK", 1, vec![]));
        r.record(&call("OK", 3, vec![40, 60]));
        r.record(&call("RESOURCE_EXHAUSTED", 5, vec![10, 20, 30, 40, 50]));
        let info = RunInfo { retry: Some("pushback".into()), ..RunInfo::default() };
        let retries = r.finish(info, 3, Duration::from_secs(1), None).retries.unwrap();
        assert_eq!(retries.attempts, 9);
        assert_eq!(retries.ok_by_attempt, vec![1, 0, 1]);
        assert_eq!((retries.ok_first(), retries.ok_retried()), (1, 1));
        assert_eq!(retries.hint.count, 7);
        assert!((retries.hint.max_ms - 60.0).abs() < 0.1);
    }
}
