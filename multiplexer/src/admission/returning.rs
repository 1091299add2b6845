//! Refused callers that were told to come back and have not yet: a line behind the queue.
//!
//! A burst refuses many callers at once. Hinting each the wait of the queue alone sends them all
//! back at about the same instant (gRPC's retry policy waits exactly the hint), to be refused
//! again together while the pool idles between the waves. Counting the callers already sent
//! away as standing in line behind the queue gives each refused caller a later turn than the
//! one before it; the line drains at the rate the pool serves, as those callers come back.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Copy, Debug, Default)]
pub struct Returning {
    line: f64,
    updated: Option<Instant>,
}

impl Returning {
    /// Puts one more refused caller in line at `now`; returns how many are ahead of it. The line
    /// drains at `slots` calls per `service_time` (as served callers make room for returning
    /// ones), and holds at most what the pool serves in `horizon` (its queue timeout): callers
    /// that retry on their own schedule, ignoring the hint, would otherwise be counted again
    /// each time and push everyone's turn out of reach.
    pub fn join(&mut self, now: Instant, slots: usize, service_time: Option<Duration>, horizon: Duration) -> usize {
        let Some(service) = service_time.filter(|s| !s.is_zero()) else { return 0 };
        let rate = slots as f64 / service.as_secs_f64();
        if let Some(updated) = self.updated {
            self.line = (self.line - now.saturating_duration_since(updated).as_secs_f64() * rate).max(0.0);
        }
        self.updated = Some(now);
        self.line = self.line.min(rate * horizon.as_secs_f64());
        let ahead = self.line.ceil() as usize;
        self.line += 1.0;
        ahead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refused_caller_gets_a_later_turn_and_the_line_drains() {
        let mut returning = Returning::default();
        let now = Instant::now();
        let (service, horizon) = (Some(Duration::from_millis(100)), Duration::from_secs(2));
        let turns: Vec<usize> = (0..5).map(|_| returning.join(now, 2, service, horizon)).collect();
        assert_eq!(turns, [0, 1, 2, 3, 4]);
        // 2 slots per 100 ms: after 1 s, 20 would have been served; the line is empty again.
        assert_eq!(returning.join(now + Duration::from_secs(1), 2, service, horizon), 0);
        assert_eq!(returning.join(now + Duration::from_secs(1), 2, service, horizon), 1);
        // At most what 2 s serve (40): a flood of refusals does not push turns beyond that.
        let last = (0..1000).map(|_| returning.join(now + Duration::from_secs(1), 2, service, horizon)).last();
        assert_eq!(last, Some(40));
        assert_eq!(Returning::default().join(now, 2, None, horizon), 0, "no service time yet: no line");
    }
}
