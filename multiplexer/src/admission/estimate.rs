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

/// Suggested client back-off when shedding: a moment picked at random in the last `window` before
/// the caller's `turn` (at most half of it), so the queue has room when it arrives and holds the
/// callers that come back slightly early, never below 5 ms; 100 ms ± 50% while nothing is known.
/// gRPC's retry policy waits exactly the hint it gets, so identical hints would bring a whole
/// burst of refused calls back at the same instant, and TEI would idle between the waves.
pub(super) fn pushback(turn: Option<Duration>, window: Duration) -> Duration {
    spread(turn, window, rand::random_range(0.0..1.0))
}

fn spread(turn: Option<Duration>, window: Duration, fraction: f64) -> Duration {
    let hint = match turn {
        Some(turn) => turn.saturating_sub(window.min(turn / 2).mul_f64(fraction)),
        None => Duration::from_millis(50).mul_f64(1.0 + 2.0 * fraction),
    };
    hint.max(Duration::from_millis(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_estimate_before_the_first_sample() {
        assert_eq!(ServiceTime::default().wait_for(10, 2), None);
        assert_eq!(spread(None, Duration::ZERO, 0.0), Duration::from_millis(50));
        assert_eq!(spread(None, Duration::ZERO, 1.0), Duration::from_millis(150));
    }

    #[test]
    fn pushback_is_spread_just_before_the_turn() {
        let (turn, window) = (Some(Duration::from_millis(400)), Duration::from_millis(40));
        let hints: Vec<Duration> = (0..200).map(|_| pushback(turn, window)).collect();
        assert!(hints.iter().all(|h| (360..=400).contains(&h.as_millis())), "{hints:?}");
        let distinct: std::collections::BTreeSet<_> = hints.iter().collect();
        assert!(distinct.len() > 100, "spread, not identical: {} distinct", distinct.len());
        // A turn shorter than the window: spread over its second half only.
        assert_eq!(spread(Some(Duration::from_millis(30)), window, 1.0), Duration::from_millis(15));
        assert_eq!(spread(Some(Duration::from_millis(6)), window, 1.0), Duration::from_millis(5), "floor");
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
