//! What each pool's calls came to over the last minute, as rates the sidecar's own report
//! (`/admission`) carries: the operator sums them into `status.demand` without needing a
//! Prometheus. Prometheus users get the same from `rate()` over the counters in `metrics`.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

use crate::vocab::Outcome;

/// Seconds in the window, one count per second each.
const WINDOW_SECONDS: u64 = 60;
const BUCKETS: usize = WINDOW_SECONDS as usize;

/// Per-pool counts of the last minute, in one-second buckets. One lock over every pool: a count is
/// a lookup and an add, and refusals come at most as fast as calls arrive.
pub struct RecentRates {
    /// Seconds are counted from here, on tokio's clock, so tests can pause and advance it.
    origin: Instant,
    pools: Mutex<HashMap<String, Window>>,
}

/// One pool's last minute. Bucket `s % 60` counts second `s` while `s` is within the 60 seconds
/// that end at `newest`.
struct Window {
    newest: u64,
    refused: [u32; BUCKETS],
    spilled: [u32; BUCKETS],
}

#[derive(Clone, Copy)]
enum Count {
    Refused,
    Spilled,
}

impl Window {
    fn new(second: u64) -> Self {
        Self { newest: second, refused: [0; BUCKETS], spilled: [0; BUCKETS] }
    }

    /// Moves the window's end to `second`, emptying the buckets of the seconds it passes over.
    fn advance_to(&mut self, second: u64) {
        if second <= self.newest {
            return;
        }
        let passed = (second - self.newest).min(WINDOW_SECONDS);
        for gone in second + 1 - passed..=second {
            let bucket = (gone % WINDOW_SECONDS) as usize;
            self.refused[bucket] = 0;
            self.spilled[bucket] = 0;
        }
        self.newest = second;
    }

    fn count(&mut self, count: Count, second: u64) {
        self.advance_to(second);
        // A caller that read the clock just before another one advanced the window still counts
        // in its own second; one a whole window late has nowhere to go.
        if self.newest - second >= WINDOW_SECONDS {
            return;
        }
        let bucket = (second % WINDOW_SECONDS) as usize;
        let buckets = match count {
            Count::Refused => &mut self.refused,
            Count::Spilled => &mut self.spilled,
        };
        buckets[bucket] = buckets[bucket].saturating_add(1);
    }
}

impl RecentRates {
    pub fn new() -> Self {
        Self { origin: Instant::now(), pools: Mutex::new(HashMap::new()) }
    }

    /// Counts a call of `pool` refused for capacity.
    pub fn record_refused(&self, pool: &str) {
        self.record_at(pool, Count::Refused, Instant::now());
    }

    /// Counts a call of `pool` handed to a sibling replica.
    pub fn record_spilled(&self, pool: &str) {
        self.record_at(pool, Count::Spilled, Instant::now());
    }

    /// Calls of `pool` refused and spilled, per second over the last minute.
    pub fn per_second(&self, pool: &str) -> (f64, f64) {
        self.per_second_at(pool, Instant::now())
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    fn record_at(&self, pool: &str, count: Count, now: Instant) {
        let second = self.second(now);
        let mut pools = self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The pool's name is copied once, at its first count, not on every one.
        match pools.get_mut(pool) {
            Some(window) => window.count(count, second),
            None => pools.entry(pool.to_owned()).or_insert_with(|| Window::new(second)).count(count, second),
        }
    }

    fn per_second_at(&self, pool: &str, now: Instant) -> (f64, f64) {
        let second = self.second(now);
        let mut pools = self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(window) = pools.get_mut(pool) else { return (0.0, 0.0) };
        window.advance_to(second);
        let per_second = |buckets: &[u32; BUCKETS]| buckets.iter().map(|&n| u64::from(n)).sum::<u64>() as f64 / 60.0;
        (per_second(&window.refused), per_second(&window.spilled))
    }
}

impl Default for RecentRates {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether a call that ended so was refused for capacity: shed before it got a permit, or out of
/// time while waiting for one. Every outcome is placed here on purpose (no wildcard arm).
pub fn refused_for_capacity(outcome: Outcome) -> bool {
    match outcome {
        Outcome::ShedQueueFull | Outcome::ShedDeadline | Outcome::ShedQueueTimeout | Outcome::ExpiredInQueue => true,
        // Admitted (whatever became of it at TEI), gone, not taken for another reason than room,
        // or the caller's doing.
        Outcome::Ok
        | Outcome::ExpiredAtUpstream
        | Outcome::Cancelled
        | Outcome::UpstreamError
        | Outcome::Unavailable
        | Outcome::Rejected => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(rates: &RecentRates, seconds: f64) -> Instant {
        rates.origin + Duration::from_secs_f64(seconds)
    }

    #[test]
    fn counts_of_the_last_minute_over_60_seconds_per_pool() {
        let rates = RecentRates::new();
        assert_eq!(rates.per_second_at("bge", at(&rates, 0.0)), (0.0, 0.0), "a pool never counted");
        for tenth in 0..300 {
            rates.record_at("bge", Count::Refused, at(&rates, f64::from(tenth) / 10.0));
        }
        for second in 0..6 {
            rates.record_at("bge", Count::Spilled, at(&rates, f64::from(second)));
        }
        rates.record_at("gte", Count::Spilled, at(&rates, 10.0));
        assert_eq!(rates.per_second_at("bge", at(&rates, 30.0)), (5.0, 0.1));
        assert_eq!(rates.per_second_at("gte", at(&rates, 30.0)), (0.0, 1.0 / 60.0));
        // Second 59 still holds second 0; at 60.5 it has gone.
        assert_eq!(rates.per_second_at("bge", at(&rates, 59.9)), (5.0, 0.1));
        assert_eq!(rates.per_second_at("bge", at(&rates, 60.5)), (290.0 / 60.0, 5.0 / 60.0));
        // Thirty seconds on, the first half of the refusals has left the window.
        assert_eq!(rates.per_second_at("bge", at(&rates, 74.5)), (150.0 / 60.0, 0.0));
        assert_eq!(rates.per_second_at("bge", at(&rates, 3600.0)), (0.0, 0.0), "an hour quiet");
    }

    #[test]
    fn a_count_read_before_the_window_moved_on_lands_in_its_own_second() {
        let rates = RecentRates::new();
        rates.record_at("bge", Count::Refused, at(&rates, 100.0));
        // Another thread read the clock at 99.9 and took the lock after.
        rates.record_at("bge", Count::Refused, at(&rates, 99.9));
        // One a whole window late is dropped rather than counted in the wrong second.
        rates.record_at("bge", Count::Refused, at(&rates, 30.0));
        assert_eq!(rates.per_second_at("bge", at(&rates, 100.0)).0, 2.0 / 60.0);
        assert_eq!(rates.per_second_at("bge", at(&rates, 159.5)).0, 1.0 / 60.0, "second 99 has left");
    }

    #[tokio::test(start_paused = true)]
    async fn reads_tokios_clock() {
        let rates = RecentRates::new();
        rates.record_refused("bge");
        rates.record_spilled("bge");
        tokio::time::advance(Duration::from_secs(30)).await;
        rates.record_refused("bge");
        assert_eq!(rates.per_second("bge"), (2.0 / 60.0, 1.0 / 60.0));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(rates.per_second("bge"), (1.0 / 60.0, 0.0));
    }

    #[test]
    fn refusals_are_the_shed_and_expired_in_queue_outcomes() {
        let refused = [
            Outcome::Ok,
            Outcome::ShedQueueFull,
            Outcome::ShedDeadline,
            Outcome::ShedQueueTimeout,
            Outcome::ExpiredInQueue,
            Outcome::ExpiredAtUpstream,
            Outcome::Cancelled,
            Outcome::UpstreamError,
            Outcome::Unavailable,
            Outcome::Rejected,
        ]
        .into_iter()
        .filter(|outcome| refused_for_capacity(*outcome))
        .map(Outcome::as_str)
        .collect::<Vec<_>>();
        assert_eq!(refused, ["shed_queue_full", "shed_deadline", "shed_queue_timeout", "expired_in_queue"]);
    }
}
