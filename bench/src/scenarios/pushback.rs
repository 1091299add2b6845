//! Scenario 12, pushback that helps clients recover (Admission v2): 300 callers send one call each
//! at once at a multiplexer with room for 2 in flight and 4 queued, so almost all are refused
//! with `RESOURCE_EXHAUSTED` and a `grpc-retry-pushback-ms` hint. Each caller retries as
//! (a) gRPC's built-in retry policy does, waiting exactly the hint, or (b) with a hand-jittered
//! exponential backoff that ignores it; both with the policy docs/clients.md shows (0.1 s initial
//! backoff, doubling, 2 s at most), 5 attempts and one 3 s deadline over all of them. Target:
//! successes with (a) ≥ successes with (b); how many succeed without retrying is shown beside.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::retry::{RetryMode, RetryPolicy};
use teifleet_load::{LoadConfig, Report};

use super::{Context, Measurement, Scenario, gpu_model, measure, warm_up, words};
use crate::Result;
use crate::procs::{self, Device, MuxLimits, SimModel};
use crate::targets::{Rule, Target, median, ratio};

pub const CLIENTS: usize = 300;
pub const MAX_ATTEMPTS: u32 = 5;
/// Each call's deadline, over all its attempts: the time budget both policies share. About what
/// serving all 300 once would take at this backend's ~100 calls/s, so spreading retries well
/// pays and sending them in waves does not.
pub const BUDGET: Duration = Duration::from_secs(3);
pub const GAIN_LIMIT: f64 = 1.0;
const CONNECTIONS: usize = 8;
const TOKENS: usize = 16;

/// How the callers of one run retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    NoRetry,
    Pushback,
    Jitter,
}

impl Policy {
    pub const ALL: [Self; 3] = [Self::NoRetry, Self::Pushback, Self::Jitter];

    pub fn retry(self) -> Option<RetryPolicy> {
        match self {
            Self::NoRetry => None,
            Self::Pushback => Some(RetryPolicy::new(RetryMode::Pushback, MAX_ATTEMPTS)),
            Self::Jitter => Some(RetryPolicy::new(RetryMode::Jitter, MAX_ATTEMPTS)),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::NoRetry => "no retry",
            Self::Pushback => "(a) gRPC retry policy, waits the pushback hint",
            Self::Jitter => "(b) jittered exponential backoff, ignores the hint",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pushback {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub clients: usize,
    pub budget_ms: f64,
    /// The retry policy of (a); (b) has the same numbers and ignores hints.
    pub policy: RetryPolicy,
    /// Per round, runs in [`Policy::ALL`] order.
    pub rounds: Vec<[Report; 3]>,
}

const GAIN: &str = "successes, pushback ÷ jittered backoff";

impl Pushback {
    /// Each round's OK answers within the budget for `policy`.
    pub fn successes(&self, policy: Policy) -> Vec<f64> {
        let i = Policy::ALL.iter().position(|p| *p == policy).unwrap_or(0);
        self.rounds.iter().map(|r| r[i].ok_in_time as f64).collect()
    }

    /// The median over rounds of the successes with `policy`.
    pub fn median_successes(&self, policy: Policy) -> f64 {
        median(&self.successes(policy))
    }

    pub fn gain(&self) -> f64 {
        ratio(self.median_successes(Policy::Pushback), self.median_successes(Policy::Jitter))
    }

    /// The runs of `policy`, one per round.
    pub fn runs(&self, policy: Policy) -> Vec<&Report> {
        let i = Policy::ALL.iter().position(|p| *p == policy).unwrap_or(0);
        self.rounds.iter().map(|r| &r[i]).collect()
    }
}

pub fn limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: 2,
        max_queued: 4,
        queue_timeout: Duration::from_secs(2),
        max_concurrent_streams: 1024,
        coalesce: false,
    }
}

impl Measurement for Pushback {
    const KEY: &'static str = "pushback";
    const TITLE: &'static str = "Pushback: 300 callers retrying against 2 in flight + 4 queued";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = gpu_model(512, Device::Sleep);
        let sim = procs::start_sim(&ctx.bins, "pushback-sim", &backend).await?;
        let limits = limits();
        let mux = procs::start_mux(&ctx.bins, "pushback-mux", &sim, &limits).await?;
        // Gives the multiplexer its service-time estimate, which its hints are made of.
        warm_up(&mux.url(), CONNECTIONS).await?;
        let rounds = ctx.pick(1, 3);
        let mut out = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let mut reports: [Option<Report>; 3] = [None, None, None];
            // The order rotates each round, so drift on the machine favours no policy.
            for k in 0..Policy::ALL.len() {
                let i = (round + k) % Policy::ALL.len();
                let policy = Policy::ALL[i];
                let config = LoadConfig {
                    connections: CONNECTIONS,
                    deadline: Some(BUDGET),
                    inputs: words(TOKENS),
                    retry: policy.retry(),
                    // Each call has its whole time budget: none is cut off before its deadline.
                    grace: BUDGET + Duration::from_secs(1),
                    ..LoadConfig::closed(mux.url(), CLIENTS, CLIENTS as u64)
                };
                let report = measure(config).await?;
                ctx.say(&format!(
                    "pushback: {}: {} of {CLIENTS} succeeded ({})",
                    policy.label(),
                    report.ok_in_time,
                    teifleet_load::render::codes(&report)
                ));
                reports[i] = Some(report);
                // Let the queue empty and the last retries land before the next policy's burst.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let [a, b, c] = reports;
            out.push([a.unwrap_or_default(), b.unwrap_or_default(), c.unwrap_or_default()]);
        }
        Ok(Pushback {
            backend,
            limits,
            clients: CLIENTS,
            budget_ms: BUDGET.as_secs_f64() * 1e3,
            policy: RetryPolicy::new(RetryMode::Pushback, MAX_ATTEMPTS),
            rounds: out,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Pushback.label();
        let hint_p50 =
            self.runs(Policy::Pushback).first().and_then(|r| r.retries.as_ref()).map_or(f64::NAN, |r| r.hint.p50_ms);
        let span = |p: Policy| median(&self.runs(p).iter().map(|r| r.elapsed_s).collect::<Vec<_>>());
        vec![
            Target::at_least(&scenario, GAIN, self.gain(), GAIN_LIMIT, "×").note_if_not_passed(format!(
                "the hints (p50 {hint_p50:.0} ms) are each refused caller's turn behind the {} queued calls and \
                 the callers refused before it, at the rate the pool served (slots ÷ mean service time); callers \
                 whose turn came after their deadline were told not to retry. Pushback callers spent {:.1} s, \
                 the backoff's {:.1} s. Fewer successes mean callers came back to a full queue: the pool served \
                 slower than its service times said, or callers that never came back were still counted in line",
                self.limits.max_queued,
                span(Policy::Pushback),
                span(Policy::Jitter),
            )),
            Target::info(
                &scenario,
                "successes of 300 with pushback",
                Some(self.median_successes(Policy::Pushback)),
                "",
            ),
            Target::info(
                &scenario,
                "successes of 300 with jittered backoff",
                Some(self.median_successes(Policy::Jitter)),
                "",
            ),
            Target::info(
                &scenario,
                "successes of 300 without retrying",
                Some(self.median_successes(Policy::NoRetry)),
                "",
            ),
        ]
    }

    fn planned_targets() -> Vec<Target> {
        vec![Target::new(&Scenario::Pushback.label(), GAIN, None, Rule::AtLeast, GAIN_LIMIT, "×")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::Verdict;

    fn ok(n: u64) -> Report {
        Report { ok_in_time: n, ok: n, sent: 300, ..Report::default() }
    }

    #[test]
    fn the_gain_is_the_ratio_of_median_successes() {
        let r = Pushback {
            backend: gpu_model(512, Device::Sleep),
            limits: limits(),
            clients: CLIENTS,
            budget_ms: 3000.0,
            policy: RetryPolicy::new(RetryMode::Pushback, MAX_ATTEMPTS),
            rounds: vec![[ok(6), ok(40), ok(60)], [ok(6), ok(38), ok(66)], [ok(7), ok(90), ok(64)]],
        };
        assert_eq!(r.successes(Policy::Jitter), vec![60.0, 66.0, 64.0]);
        let t = r.targets();
        assert!((t[0].measured.unwrap() - 40.0 / 64.0).abs() < 1e-9);
        assert_eq!(t[0].verdict, Verdict::Fail);
        assert!(t[0].note.contains("the 4 queued calls"), "{}", t[0].note);
        assert_eq!(t[3].measured, Some(6.0));
        assert_eq!(Policy::NoRetry.retry(), None);
        assert_eq!(Policy::Jitter.retry().unwrap().mode, RetryMode::Jitter);
    }
}
