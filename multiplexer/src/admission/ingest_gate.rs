//! When ingest may go in flight while queries come: just before TEI's next batch starts.
//!
//! TEI runs one batch and keeps the next one open beside it, filling it in arrival order until
//! the running batch ends. Ingest left free to take every permit fills that open batch the moment
//! permits free, so a query arriving a little later finds every permit held: it waits for the
//! running batch to end, then for the batch ingest prepared, then for its own, two batch times
//! more than alone (scenario 19 measured p50 1.7×, p99 1.3–1.6×). Keeping permits free for
//! queries helps only as far as queries come to take them; each one left empty is a place TEI
//! runs empty.
//!
//! So while queries come, ingest waits for the last part of TEI's running batch and then takes
//! every place left: queries that arrive before that take places in the next batch as they would
//! alone, and the batch still starts full. The running batch's start is read from the permits
//! (calls come back when their batch ends, so the first of a batch's calls back marks the start of
//! the batch after it) and its length from TEI's own `inference_time` (a moving mean). Without those (nothing
//! came back yet, an upstream that reports no times, nothing in flight) ingest goes at once, and
//! it always does when no query came for a few seconds. Ingest owed its floor turn (queries
//! waiting) ignores the gate.
//!
//! Where TEI's batch time grows with the batch, a next batch filled to the brim makes every query
//! beside ingest ride a longer batch than alone, and one that arrives after ingest filled it waits
//! a batch more. A pool's `queryReserve` keeps that share of the next batch for queries: while
//! they come, ingest fills the next batch (the inputs let in since the running one started) only
//! up to the rest. A batch is taken as half the in-flight limit: the two batches TEI needs to stay
//! busy, and what the adaptive limit finds.

use std::time::Duration;

use tokio::time::Instant;

use super::lane::Lane;

/// How quickly the queries' mean follows them: a second, many TEI batches, few query bursts.
const SMOOTHING: Duration = Duration::from_secs(1);
/// The queries' mean in-flight inputs from which they are said to come: a query in flight about
/// half the time. Below it the gate stays open: the few queries pay one batch, ingest nothing.
const QUERIES_COME: f64 = 0.5;
/// The share of TEI's batch time after its start from which ingest may go: the rest is the margin
/// for the hop to TEI and for a batch that ends earlier than the mean.
pub(super) const OPENS_AFTER: f64 = 0.75;
/// The weight of each new batch time in the moving mean.
const BATCH_TIME_WEIGHT: f64 = 0.2;

/// The places of TEI's next batch ingest may fill under an in-flight `limit` of two batches, with
/// `reserve` percent of them kept for queries (rounded up).
pub(super) fn ingest_places(limit: usize, reserve: u8) -> usize {
    let batch = limit / 2;
    batch - (batch * usize::from(reserve)).div_ceil(100).min(batch)
}

#[derive(Debug, Default)]
pub(super) struct IngestGate {
    /// Queries' inputs in flight now, and their time-weighted mean until `since`.
    queries: usize,
    queries_mean: f64,
    since: Option<Instant>,
    /// When the first call of the last batch to end came back: the start of TEI's batch running
    /// now. The rest of a batch's calls come back over the next few moments (more of them on a
    /// busy machine), and are not taken for a new start.
    batch_started: Option<Instant>,
    /// TEI's batch time, a moving mean of what it reports.
    batch_time: Option<Duration>,
    /// Inputs let in (either lane) since the running batch started: TEI's next batch.
    next_batch: usize,
}

impl IngestGate {
    /// A call of `inputs` in `lane` went in flight.
    pub fn took(&mut self, lane: Lane, inputs: usize, now: Instant) {
        if lane == Lane::Query {
            self.settle(now);
            self.queries += inputs;
        }
        self.next_batch += inputs;
    }

    /// A call of `inputs` in `lane` went out of flight without an answer from TEI (a waiter gone
    /// before its permit reached it).
    pub fn untook(&mut self, lane: Lane, inputs: usize, now: Instant) {
        self.query_untook(if lane == Lane::Query { inputs } else { 0 }, now);
        self.next_batch = self.next_batch.saturating_sub(inputs);
    }

    fn query_untook(&mut self, inputs: usize, now: Instant) {
        self.settle(now);
        self.queries = self.queries.saturating_sub(inputs);
    }

    /// A call of either lane came back (`query_inputs` of them queries): its batch ended, unless
    /// it is one more call of a batch that ended less than half a batch time ago.
    pub fn released(&mut self, query_inputs: usize, now: Instant) {
        self.query_untook(query_inputs, now);
        let same_batch = match (self.batch_started, self.batch_time) {
            (Some(started), Some(batch_time)) => now.saturating_duration_since(started) < batch_time / 2,
            _ => false,
        };
        if !same_batch {
            self.batch_started = Some(now);
            // What was let in since the last start is TEI's running batch now.
            self.next_batch = 0;
        }
    }

    /// TEI reported `batch_time` for a call's batch.
    pub fn observed_batch(&mut self, batch_time: Duration) {
        if batch_time.is_zero() {
            return;
        }
        self.batch_time = Some(match self.batch_time {
            Some(mean) => mean.mul_f64(1.0 - BATCH_TIME_WEIGHT) + batch_time.mul_f64(BATCH_TIME_WEIGHT),
            None => batch_time,
        });
    }

    /// Whether queries come (see [`QUERIES_COME`]) at `now`.
    pub fn queries_come(&self, now: Instant) -> bool {
        self.queries_mean_at(now) >= QUERIES_COME
    }

    /// Whether ingest of `inputs` fits TEI's next batch under an in-flight `limit` with `reserve`
    /// percent of the batch kept for queries, with `in_flight` inputs in flight: always while no
    /// query comes, without a reserve, or with nothing in flight (TEI idle: whatever was counted
    /// came back early, and no call back would let the ingest in later); and a call larger than
    /// the places goes alone into an empty next batch.
    pub fn ingest_fits(&self, inputs: usize, in_flight: usize, limit: usize, reserve: u8, now: Instant) -> bool {
        reserve == 0
            || in_flight == 0
            || !self.queries_come(now)
            || self.next_batch == 0
            || self.next_batch + inputs <= ingest_places(limit, reserve)
    }

    /// When ingest may go in flight, if not at `now`, with `in_flight` inputs in flight.
    pub fn closed_until(&self, now: Instant, in_flight: usize) -> Option<Instant> {
        if in_flight == 0 || !self.queries_come(now) {
            return None;
        }
        let opens = self.batch_started? + self.batch_time?.mul_f64(OPENS_AFTER);
        (now < opens).then_some(opens)
    }

    /// The queries' time-weighted mean at `now`: the count held since the last change pulls the
    /// mean towards itself by how long it was held.
    fn queries_mean_at(&self, now: Instant) -> f64 {
        let Some(since) = self.since else { return 0.0 };
        let held = now.saturating_duration_since(since).as_secs_f64();
        let pull = 1.0 - (-held / SMOOTHING.as_secs_f64()).exp();
        self.queries_mean + pull * (self.queries as f64 - self.queries_mean)
    }

    fn settle(&mut self, now: Instant) {
        self.queries_mean = self.queries_mean_at(now);
        self.since = Some(now);
    }

    /// When TEI's running batch enters its last part ([`OPENS_AFTER`] of its time on), where its
    /// next batch is best filled; `None` before a call came back or TEI reported a batch time.
    pub fn last_part_from(&self) -> Option<Instant> {
        Some(self.batch_started? + self.batch_time?.mul_f64(OPENS_AFTER))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BATCH: Duration = Duration::from_millis(24);

    /// A gate that has seen queries in flight for a while and TEI's batches take [`BATCH`].
    fn with_queries(start: Instant) -> IngestGate {
        let mut gate = IngestGate::default();
        gate.observed_batch(BATCH);
        gate.took(Lane::Query, 4, start);
        gate
    }

    #[test]
    fn open_without_queries_or_without_knowing_tei() {
        let now = Instant::now();
        let mut gate = IngestGate::default();
        gate.observed_batch(BATCH);
        gate.released(0, now);
        assert_eq!(gate.closed_until(now, 8), None, "no query came");

        let mut unknown = IngestGate::default();
        unknown.took(Lane::Query, 4, now);
        unknown.released(0, now + SMOOTHING * 5);
        assert_eq!(unknown.closed_until(now + SMOOTHING * 5, 8), None, "no batch time reported");
    }

    #[test]
    fn closed_from_a_batch_start_until_its_last_quarter() {
        let start = Instant::now();
        let mut gate = with_queries(start);
        let batch_start = start + SMOOTHING * 5;
        gate.released(0, batch_start);
        let opens = batch_start + BATCH.mul_f64(OPENS_AFTER);
        assert_eq!(gate.closed_until(batch_start, 8), Some(opens));
        assert_eq!(gate.closed_until(batch_start + Duration::from_millis(10), 8), Some(opens));
        assert_eq!(gate.closed_until(opens, 8), None, "open for the batch's last quarter");
        assert_eq!(gate.closed_until(batch_start, 0), None, "nothing in flight: TEI is idle");
    }

    #[test]
    fn the_calls_of_one_batch_coming_back_one_after_another_mark_one_start() {
        let start = Instant::now();
        let mut gate = with_queries(start);
        let batch_start = start + SMOOTHING * 5;
        gate.released(0, batch_start);
        // The batch's other calls come back over the next few milliseconds.
        gate.released(0, batch_start + Duration::from_millis(5));
        let opens = batch_start + BATCH.mul_f64(OPENS_AFTER);
        assert_eq!(gate.closed_until(batch_start + Duration::from_millis(5), 8), Some(opens));
        // The next batch's first call, a batch time later, starts the next one.
        let next = batch_start + BATCH;
        gate.released(0, next);
        assert_eq!(gate.closed_until(next, 8), Some(next + BATCH.mul_f64(OPENS_AFTER)));
    }

    #[test]
    fn the_gate_stays_open_seconds_after_the_last_query() {
        let start = Instant::now();
        let mut gate = with_queries(start);
        let last = start + SMOOTHING * 5;
        gate.released(4, last);
        let later = last + SMOOTHING * 5;
        gate.released(0, later);
        assert_eq!(gate.closed_until(later, 8), None);
    }

    #[test]
    fn a_short_burst_does_not_close_it() {
        let start = Instant::now();
        let mut gate = IngestGate::default();
        gate.observed_batch(BATCH);
        gate.took(Lane::Query, 20, start);
        let end = start + Duration::from_millis(20);
        gate.released(20, end);
        assert_eq!(gate.closed_until(end, 8), None, "20 ms of 20 weigh under a half");
    }

    #[test]
    fn with_nothing_in_flight_ingest_fits_whatever_was_counted() {
        let now = Instant::now();
        let mut gate = with_queries(now);
        gate.took(Lane::Ingest, 20, now + SMOOTHING * 5);
        let later = now + SMOOTHING * 5;
        assert!(!gate.ingest_fits(8, 24, 64, 25, later), "four queries and twenty ingest fill the 24 places");
        assert!(gate.ingest_fits(8, 0, 64, 25, later), "TEI idle: its next batch is empty");
    }

    #[test]
    fn the_reserve_is_a_share_of_the_next_batch() {
        assert_eq!(ingest_places(64, 25), 24, "a batch of 32, 8 kept");
        assert_eq!(ingest_places(16, 10), 7, "rounded up for queries");
        assert_eq!(ingest_places(64, 0), 32);
        assert_eq!(ingest_places(1, 50), 0, "a limit of one: ingest only into an empty next batch");
    }

    #[test]
    fn the_batch_time_follows_tei() {
        let mut gate = IngestGate::default();
        gate.observed_batch(BATCH);
        for _ in 0..50 {
            gate.observed_batch(BATCH * 2);
        }
        let mean = gate.batch_time.unwrap();
        assert!(mean > BATCH.mul_f64(1.99) && mean <= BATCH * 2, "{mean:?}");
        gate.observed_batch(Duration::ZERO);
        assert_eq!(gate.batch_time, Some(mean), "an upstream without times changes nothing");
    }
}
