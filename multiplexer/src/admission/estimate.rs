//! How long a newcomer would wait: from the service times this pool has actually observed.

use std::time::Duration;

/// Exponentially weighted mean of recent service times.
#[derive(Default, Clone, Copy, Debug)]
pub(super) struct ServiceTime {
    mean_secs: Option<f64>,
}

/// Weight of the newest sample: recent enough to follow load changes, smooth enough to ignore one
/// outlier.
const ALPHA: f64 = 0.2;

impl ServiceTime {
    pub fn observe(&mut self, took: Duration) {
        let sample = took.as_secs_f64();
        self.mean_secs = Some(match self.mean_secs {
            Some(mean) => mean + ALPHA * (sample - mean),
            None => sample,
        });
    }

    pub fn mean(&self) -> Option<Duration> {
        self.mean_secs.map(Duration::from_secs_f64)
    }

    /// Expected wait for a newcomer with `ahead` waiters before it and `slots` permits turning
    /// over: each round of `slots` requests takes one mean service time. `None` until a request
    /// has completed: without evidence, nobody is shed on a guess.
    pub fn wait_for(&self, ahead: usize, slots: usize) -> Option<Duration> {
        let mean = self.mean()?;
        let rounds = (ahead + 1).div_ceil(slots.max(1));
        Some(mean.mul_f64(rounds as f64))
    }
}

/// Suggested client back-off when shedding: the wait the caller's place in line implies, never
/// below 10 ms, 100 ms while nothing is known, spread by a random factor between 0.5 and 1.5.
/// gRPC's retry policy waits exactly the hint it gets, so identical hints would bring a whole
/// burst of refused calls back at the same instant, and TEI would idle between the waves.
pub(super) fn pushback(estimate: Option<Duration>) -> Duration {
    spread(base_pushback(estimate), rand::random_range(0.5..1.5))
}

fn base_pushback(estimate: Option<Duration>) -> Duration {
    estimate.unwrap_or(Duration::from_millis(100)).max(Duration::from_millis(10))
}

fn spread(base: Duration, factor: f64) -> Duration {
    base.mul_f64(factor).max(Duration::from_millis(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_estimate_before_the_first_sample() {
        assert_eq!(ServiceTime::default().wait_for(10, 2), None);
        assert_eq!(base_pushback(None), Duration::from_millis(100));
    }

    #[test]
    fn pushback_is_spread_around_the_expected_wait() {
        let hints: Vec<Duration> = (0..200).map(|_| pushback(Some(Duration::from_millis(400)))).collect();
        assert!(hints.iter().all(|h| (200..=600).contains(&h.as_millis())), "{hints:?}");
        let distinct: std::collections::BTreeSet<_> = hints.iter().collect();
        assert!(distinct.len() > 100, "spread, not identical: {} distinct", distinct.len());
        assert_eq!(spread(Duration::from_millis(10), 0.5), Duration::from_millis(5));
    }

    #[test]
    fn wait_grows_in_rounds_of_slots() {
        let mut time = ServiceTime::default();
        time.observe(Duration::from_millis(100));
        assert_eq!(time.wait_for(0, 4), Some(Duration::from_millis(100)));
        assert_eq!(time.wait_for(3, 4), Some(Duration::from_millis(100)));
        assert_eq!(time.wait_for(4, 4), Some(Duration::from_millis(200)));
        assert_eq!(time.wait_for(9, 2), Some(Duration::from_millis(500)));
    }

    #[test]
    fn mean_follows_new_samples_smoothly() {
        let mut time = ServiceTime::default();
        time.observe(Duration::from_millis(100));
        time.observe(Duration::from_millis(200));
        let mean = time.mean().unwrap().as_secs_f64();
        assert!((mean - 0.120).abs() < 1e-9, "{mean}");
    }
}
