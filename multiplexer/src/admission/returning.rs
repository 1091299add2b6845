//! Refused callers that were told to come back and have not yet: a line behind the queue.
//!
//! A burst refuses many callers at once. Hinting each the wait of the queue alone sends them all
//! back at about the same instant (gRPC's retry policy waits exactly the hint), to be refused
//! again together while the pool idles between the waves. Counting the callers already sent
//! away as standing in line behind the queue gives each refused caller a later turn than the
//! one before it; the line drains at the rate the pool serves, as those callers come back.

use tokio::time::Instant;

#[derive(Clone, Copy, Debug, Default)]
pub struct Returning {
    line: f64,
    updated: Option<Instant>,
}

impl Returning {
    /// How many refused callers are still due back at `now`, the line draining at `rate` calls
    /// per second (as served callers make room for returning ones).
    pub fn ahead(&mut self, now: Instant, rate: f64) -> usize {
        if let Some(updated) = self.updated {
            self.line = (self.line - now.saturating_duration_since(updated).as_secs_f64() * rate).max(0.0);
        }
        self.updated = Some(now);
        self.line.ceil() as usize
    }

    /// Empties the line: a slot freed with nobody waiting shows the callers due by now did not
    /// come back (callers that do not retry, or retry elsewhere). Keeping their places would push
    /// the turns of later refused callers past their deadlines while the pool idles.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Puts one more refused caller in line, behind those counted by [`Self::ahead`].
    pub fn join(&mut self) {
        self.line = self.line.ceil() + 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_refused_caller_gets_a_later_turn_and_the_line_drains() {
        let mut returning = Returning::default();
        let now = Instant::now();
        let rate = 20.0; // 2 slots per 100 ms
        let turns: Vec<usize> = (0..5)
            .map(|_| {
                let ahead = returning.ahead(now, rate);
                returning.join();
                ahead
            })
            .collect();
        assert_eq!(turns, [0, 1, 2, 3, 4]);
        assert_eq!(returning.ahead(now + Duration::from_millis(100), rate), 3, "two served in 100 ms");
        assert_eq!(returning.ahead(now + Duration::from_secs(1), rate), 0, "drained");
        assert_eq!(returning.ahead(now + Duration::from_secs(1), rate), 0, "asking does not join");
        returning.join();
        returning.clear();
        assert_eq!(returning.ahead(now + Duration::from_secs(1), rate), 0, "cleared");
    }
}
