//! Which failed calls are worth repeating, and how long to wait before each try: a pool that is
//! rolling out, scaling up or shedding load says so with codes a later try gets past; anything
//! else (a bad argument, an unknown pool, a wrong key) would fail the same way again.

use std::hash::{BuildHasher as _, RandomState};
use std::time::Duration;

use teifleet_wire::headers::RETRY_PUSHBACK_MS;
use tonic::{Code, Status};

/// What to do about a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Try again; after the server's hint when it gave one, else after the backoff.
    Retry { hint: Option<Duration> },
    /// The pool refused the call for its size: the same rows in fewer calls' worth may pass.
    TooLarge,
    /// Give up: trying again would fail the same way.
    Fail,
}

/// Judges a failed call. UNAVAILABLE, RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED are retried, and so
/// is any status the client made itself from a transport failure (those carry their cause as a
/// source; statuses a server sends never do). OUT_OF_RANGE (a message over the pool's limit, the
/// request's or the answer's) and RESOURCE_EXHAUSTED with a negative pushback (gRPC's "do not
/// retry": the multiplexer's word for a call that can never fit) are about the call's size.
pub fn verdict(status: &Status) -> Verdict {
    let transport_failure = std::error::Error::source(status).is_some();
    match status.code() {
        Code::OutOfRange if !transport_failure => Verdict::TooLarge,
        Code::ResourceExhausted if futile(status) => Verdict::TooLarge,
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded => Verdict::Retry { hint: hint(status) },
        _ if transport_failure => Verdict::Retry { hint: None },
        _ => Verdict::Fail,
    }
}

/// gRPC's retry pushback (`grpc-retry-pushback-ms`), which the multiplexer sends when it sheds a
/// call. A negative or garbled value means "do not retry" in gRPC's spec; here it is ignored and
/// the backoff applies, since the budget bounds the retries anyway.
fn hint(status: &Status) -> Option<Duration> {
    let text = status.metadata().get(RETRY_PUSHBACK_MS)?.to_str().ok()?;
    text.trim().parse::<u64>().ok().map(Duration::from_millis)
}

/// Whether the pushback is negative: gRPC's "do not retry this call".
fn futile(status: &Status) -> bool {
    let pushback = status.metadata().get(RETRY_PUSHBACK_MS).and_then(|value| value.to_str().ok());
    pushback.is_some_and(|text| text.trim().starts_with('-'))
}

/// Capped exponential backoff with jitter: each wait is drawn between half and all of
/// `min(cap, first * 2^attempt)`, so workers that failed together do not retry together.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(200), Duration::from_secs(30))
    }
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Self {
        Self { first, cap, attempt: 0 }
    }

    /// The wait before the next try.
    pub fn next_wait(&mut self) -> Duration {
        let ceiling = self.first.saturating_mul(1u32 << self.attempt.min(20)).min(self.cap);
        self.attempt += 1;
        ceiling.mul_f64(0.5 + 0.5 * unit_random())
    }
}

/// A number in `[0, 1)`. std's `RandomState` is seeded from the operating system's randomness and
/// differs each time it is made: enough for jitter, without a dependency for it.
fn unit_random() -> f64 {
    (RandomState::new().hash_one(0u8) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_codes_are_retried_and_others_fail() {
        for code in [Code::Unavailable, Code::ResourceExhausted, Code::DeadlineExceeded] {
            assert_eq!(verdict(&Status::new(code, "x")), Verdict::Retry { hint: None }, "{code:?}");
        }
        for code in
            [Code::InvalidArgument, Code::NotFound, Code::Unauthenticated, Code::PermissionDenied, Code::Internal]
        {
            assert_eq!(verdict(&Status::new(code, "x")), Verdict::Fail, "{code:?}");
        }
    }

    #[test]
    fn a_transport_failure_is_retried_whatever_its_code() {
        let status = Status::from_error(Box::new(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")));
        assert_eq!(verdict(&status), Verdict::Retry { hint: None }, "{status:?}");
    }

    #[test]
    fn the_pushback_hint_is_honoured() {
        let mut status = Status::resource_exhausted("shed");
        status.metadata_mut().insert(RETRY_PUSHBACK_MS, "1500".parse().unwrap());
        assert_eq!(verdict(&status), Verdict::Retry { hint: Some(Duration::from_millis(1500)) });
        status.metadata_mut().insert(RETRY_PUSHBACK_MS, "soon".parse().unwrap());
        assert_eq!(verdict(&status), Verdict::Retry { hint: None });
    }

    #[test]
    fn refusals_for_size_are_told_apart() {
        let decode_limit = Status::out_of_range("decoded message length too large: found 6193368 bytes");
        assert_eq!(verdict(&decode_limit), Verdict::TooLarge);
        let mut never_fits = Status::resource_exhausted("over the memory budget");
        never_fits.metadata_mut().insert(RETRY_PUSHBACK_MS, "-1".parse().unwrap());
        assert_eq!(verdict(&never_fits), Verdict::TooLarge);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_with_jitter() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let waits: Vec<Duration> = (0..8).map(|_| backoff.next_wait()).collect();
        for (attempt, wait) in waits.iter().enumerate() {
            let ceiling = Duration::from_millis(100 << attempt).min(Duration::from_secs(1));
            assert!(*wait >= ceiling / 2 && *wait <= ceiling, "attempt {attempt}: {wait:?} vs {ceiling:?}");
        }
        let spread: std::collections::BTreeSet<u128> = (0..20).map(|_| backoff.next_wait().as_nanos()).collect();
        assert!(spread.len() > 1, "jittered: {spread:?}");
    }
}
