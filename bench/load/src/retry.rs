//! Client retries of refused calls, as a client library would do them: gRPC's built-in retry
//! policy (the A6 design: exponential backoff with full jitter, and the server's
//! `grpc-retry-pushback-ms` honoured exactly), or a hand-rolled jittered exponential backoff that
//! ignores the server's hint. The schedule is pure arithmetic on the attempt history and a random
//! draw, so it is tested here without a server.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::Code;

use crate::Error;

/// gRPC clients treat a service config's `maxAttempts` above 5 as 5 (A6, "Limits on Retries and
/// Hedges"), so a pushback-honouring client never makes more.
pub const GRPC_MAX_ATTEMPTS: u32 = 5;

/// How a refused call is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RetryMode {
    /// gRPC's retry policy: a pushback hint ≥ 0 is waited exactly (and resets the backoff), a
    /// negative or unparseable hint stops retrying, and without a hint the exponential backoff
    /// with full jitter applies.
    Pushback,
    /// Exponential backoff with full jitter, ignoring any hint: what a hand-written retry loop
    /// around a client without retry support typically does.
    Jitter,
}

impl FromStr for RetryMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pushback" => Ok(Self::Pushback),
            "jitter" => Ok(Self::Jitter),
            other => Err(Error::InvalidArgument(format!("--retry must be pushback or jitter, not {other:?}"))),
        }
    }
}

impl fmt::Display for RetryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pushback => "pushback",
            Self::Jitter => "jitter",
        })
    }
}

/// A retry policy in the terms of gRPC's service config (`retryPolicy`), with the codes the
/// teifleet docs tell clients to retry: `RESOURCE_EXHAUSTED` (refused, never reached TEI) and
/// `UNAVAILABLE` (draining or down).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub mode: RetryMode,
    /// Attempts including the first (`maxAttempts`).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub multiplier: f64,
}

impl RetryPolicy {
    /// The policy docs/clients.md shows (0.1 s initial, 2 s at most, doubling), with `attempts`.
    pub fn new(mode: RetryMode, max_attempts: u32) -> Self {
        Self {
            mode,
            max_attempts,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            multiplier: 2.0,
        }
    }

    /// Attempts this client really makes: gRPC caps a pushback-honouring policy at 5.
    pub fn attempts(&self) -> u32 {
        match self.mode {
            RetryMode::Pushback => self.max_attempts.min(GRPC_MAX_ATTEMPTS),
            RetryMode::Jitter => self.max_attempts,
        }
    }

    pub fn validate(&self) -> crate::Result<()> {
        let bad = |why: &str| Err(Error::InvalidArgument(why.into()));
        if self.max_attempts == 0 {
            return bad("--max-attempts must be at least 1");
        }
        if self.initial_backoff.is_zero() || self.max_backoff < self.initial_backoff {
            return bad("--initial-backoff must be positive and no more than --max-backoff");
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return bad("--backoff-multiplier must be at least 1");
        }
        Ok(())
    }
}

impl fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} retry, {} attempts, backoff {} ms ×{} up to {} ms",
            self.mode,
            self.attempts(),
            self.initial_backoff.as_millis(),
            self.multiplier,
            self.max_backoff.as_millis()
        )
    }
}

/// What a refusal said about retrying, read from its `grpc-retry-pushback-ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// No pushback header.
    Absent,
    /// A hint ≥ 0: retry after exactly this long.
    RetryAfter(Duration),
    /// A negative or unparseable hint: the server asks not to retry at all.
    DoNotRetry,
}

impl Hint {
    /// A6: "an ASCII encoded signed 32-bit integer ... If the value for pushback is negative or
    /// unparseable, then it will be seen as the server asking the client not to retry at all."
    pub fn parse(value: Option<&str>) -> Self {
        match value.map(|v| v.trim().parse::<i32>()) {
            None => Self::Absent,
            Some(Ok(ms)) if ms >= 0 => Self::RetryAfter(Duration::from_millis(ms.unsigned_abs().into())),
            Some(_) => Self::DoNotRetry,
        }
    }
}

/// Codes worth retrying: the call never reached TEI, or the replica is going away.
pub fn retryable(code: Code) -> bool {
    matches!(code, Code::ResourceExhausted | Code::Unavailable)
}

/// The retry state of one call: how many attempts were made and where the backoff stands.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: RetryPolicy,
    attempts: u32,
    /// The cap of the next jittered wait: `initialBackoff × multiplier^(n-1)`, at most `maxBackoff`.
    next_cap: Duration,
}

impl Backoff {
    /// The state after the first attempt has been sent.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy, attempts: 1, next_cap: policy.initial_backoff }
    }

    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// After a failed attempt with `code` and `hint`: how long to wait before the next attempt,
    /// or `None` to give up with this failure. `unit` is a uniform random draw in [0, 1) for the
    /// jitter (passed in so the schedule is testable).
    pub fn after_failure(&mut self, code: Code, hint: Hint, unit: f64) -> Option<Duration> {
        if !retryable(code) || self.attempts >= self.policy.attempts() {
            return None;
        }
        let hint = match self.policy.mode {
            RetryMode::Pushback => hint,
            RetryMode::Jitter => Hint::Absent,
        };
        let wait = match hint {
            Hint::DoNotRetry => return None,
            Hint::RetryAfter(wait) => {
                // "If this attempt also fails, retry delay will reset to initial backoff for the
                // following retry" (A6, summary of retry logic).
                self.next_cap = self.policy.initial_backoff;
                wait
            }
            Hint::Absent => {
                // "The n-th attempt will occur at random(0, min(initialBackoff *
                // backoffMultiplier**(n-1), maxBackoff))": full jitter.
                let wait = self.next_cap.mul_f64(unit.clamp(0.0, 1.0));
                self.next_cap = self.next_cap.mul_f64(self.policy.multiplier).min(self.policy.max_backoff);
                wait
            }
        };
        self.attempts += 1;
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy(mode: RetryMode, attempts: u32) -> RetryPolicy {
        RetryPolicy { mode, max_attempts: attempts, initial_backoff: 100 * MS, max_backoff: 300 * MS, multiplier: 2.0 }
    }

    #[test]
    fn hints_parse_as_a6_says() {
        assert_eq!(Hint::parse(None), Hint::Absent);
        assert_eq!(Hint::parse(Some("250")), Hint::RetryAfter(250 * MS));
        assert_eq!(Hint::parse(Some("0")), Hint::RetryAfter(Duration::ZERO));
        assert_eq!(Hint::parse(Some("-1")), Hint::DoNotRetry);
        assert_eq!(Hint::parse(Some("soon")), Hint::DoNotRetry);
        // Beyond a signed 32-bit integer: unparseable, so do not retry.
        assert_eq!(Hint::parse(Some("4294967296")), Hint::DoNotRetry);
    }

    #[test]
    fn jitter_draws_below_a_doubling_capped_bound_and_ignores_hints() {
        let mut b = Backoff::new(policy(RetryMode::Jitter, 5));
        let hint = Hint::RetryAfter(7 * MS);
        // unit 1.0 shows each cap: 100, 200, 300 (capped), 300 ms.
        let waits: Vec<_> = (0..4).map(|_| b.after_failure(Code::ResourceExhausted, hint, 1.0)).collect();
        assert_eq!(waits, vec![Some(100 * MS), Some(200 * MS), Some(300 * MS), Some(300 * MS)]);
        assert_eq!(b.attempts(), 5);
        assert_eq!(b.after_failure(Code::ResourceExhausted, hint, 1.0), None, "five attempts at most");
        let mut b = Backoff::new(policy(RetryMode::Jitter, 5));
        assert_eq!(b.after_failure(Code::Unavailable, Hint::DoNotRetry, 0.25), Some(25 * MS));
    }

    #[test]
    fn pushback_waits_exactly_the_hint_and_then_resets_the_backoff() {
        let mut b = Backoff::new(policy(RetryMode::Pushback, 5));
        // Without a hint: the jittered backoff, which grows.
        assert_eq!(b.after_failure(Code::ResourceExhausted, Hint::Absent, 1.0), Some(100 * MS));
        assert_eq!(b.after_failure(Code::ResourceExhausted, Hint::Absent, 0.5), Some(100 * MS));
        // A hint is waited exactly, whatever the draw.
        assert_eq!(b.after_failure(Code::ResourceExhausted, Hint::RetryAfter(37 * MS), 0.9), Some(37 * MS));
        // ... and the next backoff starts again from the initial one.
        assert_eq!(b.after_failure(Code::ResourceExhausted, Hint::Absent, 1.0), Some(100 * MS));
        assert_eq!(b.after_failure(Code::ResourceExhausted, Hint::RetryAfter(MS), 0.0), None, "attempts spent");
    }

    #[test]
    fn pushback_stops_on_a_negative_hint_on_fatal_codes_and_at_grpcs_cap() {
        let mut b = Backoff::new(policy(RetryMode::Pushback, 5));
        assert_eq!(b.after_failure(Code::ResourceExhausted, Hint::DoNotRetry, 0.5), None);
        let mut b = Backoff::new(policy(RetryMode::Pushback, 5));
        assert_eq!(b.after_failure(Code::InvalidArgument, Hint::RetryAfter(MS), 0.5), None);
        assert_eq!(b.after_failure(Code::DeadlineExceeded, Hint::Absent, 0.5), None);
        let ten = policy(RetryMode::Pushback, 10);
        assert_eq!(ten.attempts(), 5);
        let mut b = Backoff::new(ten);
        let retries =
            std::iter::from_fn(|| b.after_failure(Code::ResourceExhausted, Hint::RetryAfter(MS), 0.5)).count();
        assert_eq!(retries, 4);
        assert_eq!(policy(RetryMode::Jitter, 10).attempts(), 10);
        let mut once = Backoff::new(policy(RetryMode::Pushback, 1));
        assert_eq!(once.after_failure(Code::ResourceExhausted, Hint::RetryAfter(MS), 0.5), None);
    }

    #[test]
    fn policies_validate_and_describe_themselves() {
        assert!(RetryPolicy::new(RetryMode::Pushback, 5).validate().is_ok());
        assert!(RetryPolicy::new(RetryMode::Jitter, 0).validate().is_err());
        let p = RetryPolicy { multiplier: 0.5, ..RetryPolicy::new(RetryMode::Jitter, 3) };
        assert!(p.validate().is_err());
        assert_eq!(
            RetryPolicy::new(RetryMode::Pushback, 9).to_string(),
            "pushback retry, 5 attempts, backoff 100 ms ×2 up to 2000 ms"
        );
        assert_eq!("jitter".parse::<RetryMode>().unwrap(), RetryMode::Jitter);
        assert!("never".parse::<RetryMode>().is_err());
    }
}
