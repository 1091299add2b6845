//! Telling a standing queue from a burst, CoDel-style, to switch the queue to adaptive LIFO.
//!
//! A burst drains within an interval; a queue whose oldest waiter has been older than the target
//! for a whole interval is standing (seed 004's thousands of closed-loop clients keep one full).
//! First-in-first-out then makes every served call wait about the whole queue, up to the queue
//! timeout, while throughput is the same either way. So while the queue stands, each tenant's
//! newest waiter is served first: served calls wait little, and the old waiters leave at their
//! queue timeout or deadline with a retry hint, as they would have. Priorities and fairness
//! between tenants hold in both modes; a burst that drains within the interval is served FIFO.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Copy, Debug, Default)]
pub struct Standing {
    /// Since when the oldest waiter has been older than the target.
    above_since: Option<Instant>,
}

/// The target wait never goes below this: a TEI batch takes milliseconds.
const MIN_TARGET: Duration = Duration::from_millis(5);
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// How long a waiter may wait before the queue counts as above target, and for how long it must
/// stay above to be standing, from the observed service time.
pub fn target_and_interval(service_time: Option<Duration>) -> (Duration, Duration) {
    let service = service_time.unwrap_or(MIN_TARGET);
    ((service * 2).max(MIN_TARGET), (service * 10).max(MIN_INTERVAL))
}

impl Standing {
    /// Updates with the age of the oldest waiter (`None`: the queue is empty); true while the
    /// queue stands.
    pub fn update(&mut self, oldest: Option<Duration>, now: Instant, service_time: Option<Duration>) -> bool {
        let (target, interval) = target_and_interval(service_time);
        match oldest {
            Some(age) if age >= target => {
                let since = *self.above_since.get_or_insert(now);
                now.duration_since(since) >= interval
            }
            _ => {
                self.above_since = None;
                false
            }
        }
    }

    pub fn standing(&self, now: Instant, service_time: Option<Duration>) -> bool {
        let (_, interval) = target_and_interval(service_time);
        self.above_since.is_some_and(|since| now.duration_since(since) >= interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_not_standing_a_long_queue_is() {
        let mut standing = Standing::default();
        let start = Instant::now();
        let service = Some(Duration::from_millis(10)); // target 20 ms, interval 100 ms
        let old = Some(Duration::from_millis(50));
        assert!(!standing.update(old, start, service), "just above target: maybe a burst");
        assert!(!standing.update(old, start + Duration::from_millis(99), service));
        assert!(standing.update(old, start + Duration::from_millis(100), service));
        assert!(standing.standing(start + Duration::from_millis(100), service));
        assert!(!standing.update(Some(Duration::from_millis(5)), start + Duration::from_millis(101), service));
        assert!(!standing.update(None, start + Duration::from_millis(300), service), "empty: over");
        assert!(!standing.standing(start + Duration::from_millis(300), service));
    }
}
