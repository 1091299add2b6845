//! The room ingest leaves free for queries that have not arrived yet.
//!
//! Queries go before waiting ingest, but a query that finds every permit held still waits: for
//! the next permit to free, and then in TEI's own first-come queue behind the batch that ingest's
//! calls already prepared there. TEI frees its permits a batch at a time, so that is a whole batch
//! more than the query would wait alone (scenario 19 measured p50 1.7×, p99 1.3–1.6×). So while
//! queries come, ingest is admitted only as far as it leaves a few permits free: a query arriving
//! takes one at once and rides TEI's next batch beside ingest instead of after it.
//!
//! How many: a fraction of the queries' recent in-flight inputs (a time-weighted mean, so a
//! burst's peak does not linger and ingest has the whole pool back within seconds of the last
//! query). The room costs throughput only when fewer queries come than it keeps (TEI then starts
//! a batch with places empty), so it is kept below the queries' mean and never more than a
//! quarter of the limit: ingest keeps at least three quarters of the pool beside any query load,
//! and all of it without queries. Ingest owed its floor turn (queries waiting) ignores the room.

use std::time::Duration;

use tokio::time::Instant;

/// How quickly the queries' mean follows them: a second, many TEI batches, few query bursts.
const SMOOTHING: Duration = Duration::from_secs(1);
/// The share of the queries' mean in-flight inputs kept free: about the queries that arrive
/// while TEI runs one batch (they are in flight for about two: the wait in TEI's queue and their
/// own batch), less a margin, since each permit kept free that no query takes is a place in a
/// batch that TEI runs empty.
pub(super) const ROOM_PER_QUERY_IN_FLIGHT: f64 = 0.4;
/// The most kept free, as a fraction of the in-flight limit.
const MOST_OF_LIMIT: usize = 4;

/// The queries' inputs in flight, and their mean over the last [`SMOOTHING`].
#[derive(Debug, Default)]
pub(super) struct QueryRoom {
    in_flight: usize,
    mean: f64,
    since: Option<Instant>,
}

impl QueryRoom {
    /// Queries of `inputs` went in flight.
    pub fn took(&mut self, inputs: usize, now: Instant) {
        self.settle(now);
        self.in_flight += inputs;
    }

    /// Queries of `inputs` came back.
    pub fn released(&mut self, inputs: usize, now: Instant) {
        self.settle(now);
        self.in_flight = self.in_flight.saturating_sub(inputs);
    }

    /// Permits ingest leaves free at `now`, under an in-flight limit of `limit`.
    pub fn kept_free(&self, now: Instant, limit: usize) -> usize {
        let room = (self.mean_at(now) * ROOM_PER_QUERY_IN_FLIGHT).round() as usize;
        room.min(limit / MOST_OF_LIMIT)
    }

    /// The time-weighted mean at `now`: the count held since the last change pulls the mean
    /// towards itself by how long it was held.
    fn mean_at(&self, now: Instant) -> f64 {
        let Some(since) = self.since else { return 0.0 };
        let held = now.saturating_duration_since(since).as_secs_f64();
        let pull = 1.0 - (-held / SMOOTHING.as_secs_f64()).exp();
        self.mean + pull * (self.in_flight as f64 - self.mean)
    }

    fn settle(&mut self, now: Instant) {
        self.mean = self.mean_at(now);
        self.since = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_kept_without_queries() {
        let room = QueryRoom::default();
        assert_eq!(room.kept_free(Instant::now(), 16), 0);
    }

    #[test]
    fn steady_queries_keep_a_share_of_their_mean_and_the_room_fades_after_them() {
        let start = Instant::now();
        let mut room = QueryRoom::default();
        room.took(10, start);
        // Ten in flight for five smoothing times: the mean is about ten.
        let steady = start + SMOOTHING * 5;
        assert_eq!(room.kept_free(steady, 64), 4, "0.4 of ten");
        assert_eq!(room.kept_free(steady, 16), 4, "a quarter of sixteen at most");
        assert_eq!(room.kept_free(steady, 8), 2, "a quarter of eight");
        room.released(10, steady);
        assert_eq!(room.kept_free(steady + SMOOTHING * 5, 64), 0, "gone within seconds of the last query");
    }

    #[test]
    fn a_short_burst_does_not_linger() {
        let start = Instant::now();
        let mut room = QueryRoom::default();
        room.took(40, start);
        room.released(40, start + Duration::from_millis(20));
        assert_eq!(room.kept_free(start + Duration::from_millis(20), 64), 0, "20 ms of 40 weigh under one");
    }
}
