//! Telling a standing queue from a burst, CoDel-style, to close the door on a queue that only adds
//! latency.
//!
//! A burst drains within an interval; a queue whose oldest waiter has stayed older than the
//! target for a whole interval is standing (overload at several times capacity, or seed 004's
//! thousands of closed-loop clients, keep one full). First-in-first-out then makes every admitted
//! call wait about the whole queue, up to the queue timeout, for the same throughput. So while the
//! queue stands, a newcomer whose expected wait is longer than the target is refused at once, with
//! a retry hint: the queue shrinks to about a target's worth of work, enough to keep TEI busy,
//! and admitted calls wait about the target instead of the whole queue. The queue stops standing
//! only when it empties, so it does not flap between the two modes under steady overload.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Copy, Debug, Default)]
pub struct Standing {
    /// Since when the oldest waiter has been older than the target.
    above_since: Option<Instant>,
    standing: bool,
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
            None => *self = Self::default(),
            Some(_) if self.standing => {}
            Some(age) if age >= target => {
                let since = *self.above_since.get_or_insert(now);
                self.standing = now.duration_since(since) >= interval;
            }
            Some(_) => self.above_since = None,
        }
        self.standing
    }

    pub fn standing(&self) -> bool {
        self.standing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_not_standing_a_long_queue_is_until_it_empties() {
        let mut standing = Standing::default();
        let start = Instant::now();
        let service = Some(Duration::from_millis(10)); // target 20 ms, interval 100 ms
        let old = Some(Duration::from_millis(50));
        assert!(!standing.update(old, start, service), "just above target: maybe a burst");
        assert!(!standing.update(Some(Duration::from_millis(5)), start + Duration::from_millis(50), service));
        assert!(!standing.update(old, start + Duration::from_millis(60), service), "a short wait restarts the clock");
        assert!(!standing.update(old, start + Duration::from_millis(159), service));
        assert!(standing.update(old, start + Duration::from_millis(160), service));
        assert!(standing.update(Some(Duration::from_millis(5)), start + Duration::from_millis(161), service), "held");
        assert!(!standing.update(None, start + Duration::from_millis(300), service), "over once empty");
        assert!(!standing.standing());
    }
}
