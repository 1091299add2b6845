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
//! a batch more. So while queries come, ingest fills the next batch (the inputs let in since the
//! running one started) only up to the places TEI's own batch-time curve leaves it
//! (`batch_curve`): the largest batch a query takes at most a little longer to ride than one of
//! queries alone, less the queries expected before it starts. The curve is learned from TEI's
//! `inference_time` and the batches' sizes, both exact (`tei_batch`); until it is known (sizes too
//! alike), ingest takes half the next batch, which also shows the curve batches of two sizes. A
//! pool's `queryReserve`, when set, keeps that fixed share of the next batch for queries instead.
//! A batch is taken as half the in-flight limit: the two batches TEI needs to stay busy, and what
//! the adaptive limit finds.

use std::time::Duration;

use tokio::time::Instant;

use super::batch_curve::{self, BatchCurve, Line};
use super::lane::Lane;
use super::tei_batch::Batch;

/// How quickly the queries' mean follows them: a second, many TEI batches, few query bursts.
const SMOOTHING: Duration = Duration::from_secs(1);
/// The queries' mean in-flight inputs from which they are said to come: a query in flight about
/// half the time. Below it the gate stays open: the few queries pay one batch, ingest nothing.
const QUERIES_COME: f64 = 0.5;
/// How quickly a second mean of the queries in flight follows them, so that queries starting
/// beside ingest are seen within a batch or two rather than the half second the slow mean takes
/// to reach [`QUERIES_COME`] (from nothing to about one in flight). Meanwhile ingest kept every
/// permit TEI's batches freed, and each query that came rode a batch of ingest after waiting for
/// one: on the real-TEI lanes row (CPU, 18 ms an input, batches of 4) the row's p99 was
/// 1.45–1.73× alone in 12 s runs and 0.98× in a 36 s run of the same build (measured,
/// `docs/admission.md`), so its queries' start, not their steady state, made it. Short enough that a
/// query in flight for a CPU batch of a few inputs tips it, long enough that one lone query of an
/// input on a GPU (a few ms in flight) does not. A query that had to wait for its permit counts
/// at once ([`IngestGate::query_waited`]).
const ONSET: Duration = Duration::from_millis(50);
/// Queries have stopped once none is in flight and none was let in for this many times the
/// longest gap between two of them of late ([`GAP_MEMORY`]), and two of TEI's batch times: then
/// nothing holds ingest back, without waiting for the queries' mean to decay (by its smoothing
/// about 2.8 s from 8 in flight, as behind 64 callers, during which a bulk call got a fifth of
/// TEI's idle time). A stream's gaps rarely reach twice their recent longest (Poisson queries at
/// 36 a second, whose longest of late is about four mean gaps: by the exponential's tail about
/// once in 5,000 gaps, when ingest may go in flight for that gap; not measured); queries in
/// bursts a second apart keep coming between bursts.
const STOPPED_AFTER_GAPS: f64 = 2.0;
/// How long the longest gap between queries is remembered: it decays by e every this long.
const GAP_MEMORY: Duration = Duration::from_secs(2);
/// The share of TEI's batch time after its start from which ingest may go: the rest is the margin
/// for the hop to TEI and for a batch that ends earlier than the mean.
pub(super) const OPENS_AFTER: f64 = 0.75;
/// Batch times without a call back after which the next batch's count is stale (see
/// [`IngestGate::stale_at`]).
const STALE_AFTER: u32 = 2;
/// The weight of each new batch time in the moving mean.
const BATCH_TIME_WEIGHT: f64 = 0.2;
/// On a device whose batches save little (no places beside queries, [`IngestGate::places`]: TEI
/// on CPU), the most of the time the queries leave TEI idle that ingest takes while they come.
/// There each input costs about a query's own work, so ingest rides only TEI's idle moments, and
/// a query that arrives during one waits for it: queries keeping TEI busy a share ρ of the time
/// wait about as 1 / (1 − ρ), and ingest taking a share s of the idle time stretches that by
/// about 1 / (1 − s). Let into every idle moment, ingest took all of it (real TEI: 0.98× of what
/// the queries leave) and the queries' p99 rose 2.4× alone; a fifth keeps the stretch near
/// 1.25×, within the lanes' 1.3×.
const IDLE_SHARE: f64 = 0.2;
/// The most ingest's ration may owe, in inputs: turns its floor share (`ingestShare`) is owed
/// spend the ration too, and a long overload must not hold ingest back for long after it.
const RATION_DEBT: f64 = 1.0;

/// Why an ingest call went in flight: what `teifleet_ingest_let_in_total` counts by `reason`, so
/// a pool's operator sees which rule let ingest beside its queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IngestWhy {
    /// No query came for a few seconds (or the pool's `queryReserve` is 0): nothing held it.
    NoQueries,
    /// Nothing was in flight: TEI was idle.
    IdleTei,
    /// No call came back for two of TEI's batch times, so the next batch's count meant nothing.
    StaleCount,
    /// TEI's next batch was empty and the places ingest may fill are not none.
    EmptyNextBatch,
    /// Within the places of TEI's next batch a fixed `queryReserve` or the learned curve leaves.
    Places,
    /// The turn its floor share (`ingestShare`) was owed while queries waited.
    FloorTurn,
}

impl IngestWhy {
    pub const ALL: [IngestWhy; 6] = [
        IngestWhy::NoQueries,
        IngestWhy::IdleTei,
        IngestWhy::StaleCount,
        IngestWhy::EmptyNextBatch,
        IngestWhy::Places,
        IngestWhy::FloorTurn,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IngestWhy::NoQueries => "no_queries",
            IngestWhy::IdleTei => "idle_tei",
            IngestWhy::StaleCount => "stale_count",
            IngestWhy::EmptyNextBatch => "empty_next_batch",
            IngestWhy::Places => "places",
            IngestWhy::FloorTurn => "floor_turn",
        }
    }
}

/// The places of TEI's next batch ingest may fill under an in-flight `limit` of two batches, with
/// `reserve` percent of them kept for queries (rounded up).
pub(super) fn reserved_places(limit: usize, reserve: u8) -> usize {
    let batch = limit / 2;
    batch - (batch * usize::from(reserve)).div_ceil(100).min(batch)
}

#[derive(Debug, Default)]
pub(super) struct IngestGate {
    /// Queries' inputs in flight now, and their time-weighted means until `since`: over
    /// [`SMOOTHING`] and over [`ONSET`].
    queries: usize,
    queries_mean: f64,
    queries_onset: f64,
    since: Option<Instant>,
    /// When the first call of the last batch to end came back: the start of TEI's batch running
    /// now. The rest of a batch's calls come back over the next few moments (more of them on a
    /// busy machine), and are not taken for a new start.
    batch_started: Option<Instant>,
    /// TEI's batch time, a moving mean of what it reports.
    batch_time: Option<Duration>,
    /// Inputs let in (either lane) since the running batch started: TEI's next batch.
    next_batch: usize,
    /// TEI's batch time by the batch's inputs.
    curve: BatchCurve,
    /// The queries' inputs let in per second, decayed over [`SMOOTHING`] until `rate_since`.
    query_rate: f64,
    rate_since: Option<Instant>,
    /// The longest gap between two queries let in, decayed over [`GAP_MEMORY`].
    longest_gap: Duration,
    /// Ingest's ration of TEI's idle time (see [`IDLE_SHARE`]), in inputs, as of `credit_since`
    /// (none: full).
    idle_credit: f64,
    credit_since: Option<Instant>,
}

impl IngestGate {
    /// A call of `inputs` in `lane` went in flight.
    pub fn took(&mut self, lane: Lane, inputs: usize, now: Instant) {
        if lane == Lane::Query {
            self.settle(now);
            self.queries += inputs;
            self.query_rate = self.query_rate_at(now) + inputs as f64 / SMOOTHING.as_secs_f64();
            if let Some(last) = self.rate_since {
                let gap = now.saturating_duration_since(last);
                let kept = (-gap.as_secs_f64() / GAP_MEMORY.as_secs_f64()).exp();
                self.longest_gap = gap.max(self.longest_gap.mul_f64(kept));
            }
            self.rate_since = Some(now);
        }
        self.next_batch += inputs;
    }

    /// A query waited in the queue for its permit: others held them all, so queries come beside
    /// whatever holds them. The onset mean is lifted to [`QUERIES_COME`] at once: the queries
    /// that start beside an ingest flood all wait for their first permit, and ingest let into the
    /// permits freed with it would fill the batch that query rides (then it decays as before).
    pub fn query_waited(&mut self, now: Instant) {
        self.settle(now);
        self.queries_onset = self.queries_onset.max(QUERIES_COME);
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
        if !self.in_last_batch_end(now) {
            self.batch_started = Some(now);
            // What was let in since the last start is TEI's running batch now.
            self.next_batch = 0;
        }
    }

    /// Whether `now` is less than half a batch time after the last batch ended: a call back then
    /// is one more of that batch's.
    fn in_last_batch_end(&self, now: Instant) -> bool {
        match (self.batch_started, self.batch_time) {
            (Some(started), Some(batch_time)) => now.saturating_duration_since(started) < batch_time / 2,
            _ => false,
        }
    }

    /// A call came back from a batch TEI timed at `batch_time`.
    pub fn answered_in(&mut self, batch_time: Duration) {
        if batch_time.is_zero() {
            return;
        }
        self.batch_time = Some(match self.batch_time {
            Some(mean) => mean.mul_f64(1.0 - BATCH_TIME_WEIGHT) + batch_time.mul_f64(BATCH_TIME_WEIGHT),
            None => batch_time,
        });
    }

    /// All of one of TEI's batches came back: a point of its batch-time curve.
    pub fn batch_ended(&mut self, batch: Batch) {
        self.curve.observe(batch.inputs, batch.time);
    }

    /// Whether queries come (see [`QUERIES_COME`]) at `now`.
    pub fn queries_come(&self, now: Instant) -> bool {
        let (mean, onset) = self.queries_means_at(now);
        mean.max(onset) >= QUERIES_COME && !self.queries_stopped(now)
    }

    /// Whether the queries have stopped at `now` (see [`STOPPED_AFTER_GAPS`]).
    fn queries_stopped(&self, now: Instant) -> bool {
        self.rate_since.is_none() || self.stops_at().is_some_and(|stops| now >= stops)
    }

    /// When the queries will have stopped if none comes meanwhile (see [`STOPPED_AFTER_GAPS`]);
    /// `None` while one is in flight (its return dispatches) or before any came. Ingest held by
    /// the queries' rules is woken then: with nothing in flight no permit comes back to let it in,
    /// and its ration's own timer may be a second or more away.
    pub fn stops_at(&self) -> Option<Instant> {
        let last = self.rate_since.filter(|_| self.queries == 0)?;
        let quiet = (self.longest_gap.mul_f64(STOPPED_AFTER_GAPS)).max(self.batch_time.unwrap_or_default() * 2);
        Some(last + quiet)
    }

    /// Why ingest of `inputs` fits TEI's next batch, if it does, under an in-flight `limit` with `reserve`
    /// percent of the batch kept for queries (none: what TEI's curve says, see [`Self::places`]),
    /// with `in_flight` inputs in flight: always while no query comes, with a reserve of 0, or
    /// with nothing in flight (TEI idle: whatever was counted came back early, and no call back
    /// would let the ingest in later); and a call larger than the places goes alone into an empty
    /// next batch, unless the learned places are none (only an idle TEI then). Under the learned
    /// places a call goes in if at most half of it is over them: ingest comes in calls of several
    /// inputs, and the places fall between two calls' worth. (Where places are none, an idle TEI
    /// is also rationed, see [`Self::rationed_until`].)
    pub fn ingest_fits(
        &self,
        inputs: usize,
        in_flight: usize,
        limit: usize,
        reserve: Option<u8>,
        now: Instant,
    ) -> Option<IngestWhy> {
        if reserve == Some(0) || !self.queries_come(now) {
            return Some(IngestWhy::NoQueries);
        }
        if in_flight == 0 {
            return Some(IngestWhy::IdleTei);
        }
        if self.stale_at().is_some_and(|stale| now >= stale) {
            return Some(IngestWhy::StaleCount);
        }
        if self.next_batch == 0 && (reserve.is_some() || self.places(limit, now) > 0) {
            return Some(IngestWhy::EmptyNextBatch);
        }
        let fits = match reserve {
            Some(reserve) => self.next_batch + inputs <= reserved_places(limit, reserve),
            // No place beside queries: TEI's batch time grows by most of a query's own with each
            // input (TEI on CPU), so ingest goes only into an idle TEI (nothing in flight, above).
            None => match self.places(limit, now) {
                0 => false,
                places => self.next_batch + inputs.div_ceil(2) <= places,
            },
        };
        fits.then_some(IngestWhy::Places)
    }

    /// When the count of TEI's next batch stops meaning anything: no call came back for
    /// [`STALE_AFTER`] batch times. Calls held in flight without reaching TEI (a `RerankStream`'s
    /// texts, held until its one answer) bring none back, so the count would never reset and
    /// ingest would wait on permits its own stream holds; none before a call came back with TEI's
    /// batch time (the count then holds as it is).
    pub fn stale_at(&self) -> Option<Instant> {
        Some(self.batch_started? + self.batch_time? * STALE_AFTER)
    }

    /// The inputs TEI's next batch may hold before ingest stops adding to it while queries come,
    /// under an in-flight `limit` of two batches: what TEI's batch-time curve leaves ingest beside
    /// the queries' rate (`batch_curve`), or half the batch while the curve is unknown.
    pub fn places(&self, limit: usize, now: Instant) -> usize {
        let batch = limit / 2;
        let Some(line) = self.curve.line() else { return batch.div_ceil(2) };
        let left = match (self.batch_started, self.batch_time) {
            (Some(started), Some(batch_time)) => (started + batch_time).saturating_duration_since(now),
            _ => Duration::ZERO,
        };
        batch_curve::ingest_places(line, self.query_rate_at(now), batch, left)
    }

    /// TEI's batch-time curve as learned so far (see `batch_curve`).
    pub fn line(&self) -> Option<Line> {
        self.curve.line()
    }

    /// The inputs of TEI's next batch ingest may fill while queries come, at the queries' rate
    /// now: the share a `reserve` leaves (all of it with none), or else [`Self::places`]. What
    /// the metrics show: the decision itself also lets ingest into an idle TEI, and a call in
    /// whole where the places fall inside it.
    pub fn places_with(&self, limit: usize, reserve: Option<u8>, now: Instant) -> usize {
        match reserve {
            Some(reserve) => reserved_places(limit, reserve),
            None => self.places(limit, now),
        }
    }

    /// The queries' inputs a second at `now`.
    fn query_rate_at(&self, now: Instant) -> f64 {
        let Some(since) = self.rate_since else { return 0.0 };
        let held = now.saturating_duration_since(since).as_secs_f64();
        self.query_rate * (-held / SMOOTHING.as_secs_f64()).exp()
    }

    /// Ingest's inputs a second on a device with no places beside queries: [`IDLE_SHARE`] of the
    /// time the queries leave TEI idle, in batches of one; `None` where ingest is not rationed
    /// (a device whose batches save, a fixed reserve, no queries, the curve not known yet).
    fn idle_ration(&self, limit: usize, reserve: Option<u8>, now: Instant) -> Option<f64> {
        if reserve.is_some() || !self.queries_come(now) {
            return None;
        }
        let alone = self.curve.line()?.at(1.0);
        if self.places(limit, now) > 0 || alone <= 0.0 {
            return None;
        }
        let busy = (self.query_rate_at(now) * alone).min(1.0);
        Some(IDLE_SHARE * (1.0 - busy) / alone)
    }

    fn credit_at(&self, rate: f64, now: Instant) -> f64 {
        match self.credit_since {
            Some(since) => (self.idle_credit + rate * now.saturating_duration_since(since).as_secs_f64()).min(1.0),
            None => 1.0,
        }
    }

    /// When ingest's ration of TEI's idle time lets its next input in, if not at `now` (see
    /// [`IDLE_SHARE`]), under an in-flight `limit` with `reserve` percent kept for queries.
    pub fn rationed_until(&self, limit: usize, reserve: Option<u8>, now: Instant) -> Option<Instant> {
        let rate = self.idle_ration(limit, reserve, now)?;
        let credit = self.credit_at(rate, now);
        match credit >= 1.0 {
            true => None,
            // Queries keep TEI busy: ingest gets only its floor's turns; look again in a while.
            false if rate <= 0.0 => Some(now + SMOOTHING),
            false => Some(now + Duration::from_secs_f64((1.0 - credit) / rate)),
        }
    }

    /// Ingest of `inputs` went in flight: it spends its ration, where it is rationed.
    pub fn ingest_took(&mut self, inputs: usize, limit: usize, reserve: Option<u8>, now: Instant) {
        match self.idle_ration(limit, reserve, now) {
            Some(rate) => {
                self.idle_credit = (self.credit_at(rate, now) - inputs as f64).max(-RATION_DEBT);
                self.credit_since = Some(now);
            }
            None => self.credit_since = None,
        }
    }

    /// When ingest may go in flight, if not at `now`, with `in_flight` inputs in flight.
    pub fn closed_until(&self, now: Instant, in_flight: usize) -> Option<Instant> {
        if in_flight == 0 || !self.queries_come(now) {
            return None;
        }
        let opens = self.batch_started? + self.batch_time?.mul_f64(OPENS_AFTER);
        (now < opens).then_some(opens)
    }

    /// The queries' time-weighted means at `now`, over [`SMOOTHING`] and over [`ONSET`]: the count
    /// held since the last change pulls each mean towards itself by how long it was held.
    fn queries_means_at(&self, now: Instant) -> (f64, f64) {
        let Some(since) = self.since else { return (0.0, 0.0) };
        let held = now.saturating_duration_since(since).as_secs_f64();
        let pulled = |mean: f64, smoothing: Duration| {
            let pull = 1.0 - (-held / smoothing.as_secs_f64()).exp();
            mean + pull * (self.queries as f64 - mean)
        };
        (pulled(self.queries_mean, SMOOTHING), pulled(self.queries_onset, ONSET))
    }

    fn settle(&mut self, now: Instant) {
        (self.queries_mean, self.queries_onset) = self.queries_means_at(now);
        self.since = Some(now);
    }

    /// When TEI's running batch enters its last part ([`OPENS_AFTER`] of its time on), where its
    /// next batch is best filled; `None` before a call came back or TEI reported a batch time.
    pub fn last_part_from(&self) -> Option<Instant> {
        self.running_batch_at(OPENS_AFTER)
    }

    /// The moment `share` of TEI's batch time after its running batch started; `None` before a
    /// call came back or TEI reported a batch time.
    pub fn running_batch_at(&self, share: f64) -> Option<Instant> {
        Some(self.batch_started? + self.batch_time?.mul_f64(share))
    }
}

#[cfg(test)]
mod tests {
    use std::ops::{Deref, DerefMut};

    use super::*;
    use crate::admission::tei_batch::TeiBatches;

    /// The gate fed as the pool feeds it: every answer's time, and each batch once all of its
    /// answers came back.
    #[derive(Default)]
    struct Fed {
        gate: IngestGate,
        batches: TeiBatches,
    }

    impl Fed {
        fn observed_batch(&mut self, time: Duration, inputs: usize, now: Instant) {
            self.gate.answered_in(time);
            if let Some(batch) = self.batches.answered(time, inputs, now) {
                self.gate.batch_ended(batch);
            }
        }
    }

    impl Deref for Fed {
        type Target = IngestGate;
        fn deref(&self) -> &IngestGate {
            &self.gate
        }
    }

    impl DerefMut for Fed {
        fn deref_mut(&mut self) -> &mut IngestGate {
            &mut self.gate
        }
    }

    const BATCH: Duration = Duration::from_millis(24);

    /// A gate that has seen one of TEI's batches take [`BATCH`] at `start`.
    fn knowing_tei(start: Instant) -> Fed {
        let mut gate = Fed::default();
        gate.observed_batch(BATCH, 1, start);
        gate
    }

    /// A gate that has seen queries in flight for a while and TEI's batches take [`BATCH`].
    fn with_queries(start: Instant) -> Fed {
        let mut gate = knowing_tei(start);
        gate.took(Lane::Query, 4, start);
        gate
    }

    #[test]
    fn open_without_queries_or_without_knowing_tei() {
        let now = Instant::now();
        let mut gate = Fed::default();
        gate.observed_batch(BATCH, 1, now);
        gate.released(0, now);
        assert_eq!(gate.closed_until(now, 8), None, "no query came");

        let mut unknown = Fed::default();
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

    /// A stream of queries 10 ms apart (the longest gap 15 ms) keeps the gate's verdict through
    /// its gaps; once the last query is back and none came for twice the longest gap (and two
    /// batch times), nothing holds ingest back, seconds before the queries' mean decays.
    #[test]
    fn queries_have_stopped_once_none_came_for_twice_their_longest_gap() {
        let start = Instant::now();
        let mut gate = knowing_tei(start);
        let mut now = start;
        for k in 0..200u32 {
            now += Duration::from_millis(if k % 10 == 0 { 15 } else { 10 });
            gate.took(Lane::Query, 1, now);
            gate.released(1, now + Duration::from_millis(8));
        }
        let last = now;
        let in_a_gap = last + Duration::from_millis(40);
        assert!(gate.queries_come(in_a_gap), "within two batch times of the last: queries still come");
        assert_eq!(gate.ingest_fits(4, 4, 8, None, in_a_gap).filter(|why| *why == IngestWhy::NoQueries), None);
        let stopped = last + BATCH * 2 + Duration::from_millis(1);
        assert!(gate.queries_means_at(stopped).0 >= QUERIES_COME, "the mean alone would still say they come");
        assert!(!gate.queries_come(stopped), "twice the longest gap and two batch times: stopped");
        assert_eq!(gate.ingest_fits(4, 4, 8, None, stopped), Some(IngestWhy::NoQueries));
        assert_eq!(gate.closed_until(stopped, 4), None);

        gate.took(Lane::Query, 1, stopped);
        assert!(gate.queries_come(stopped), "a query in flight: they come again");
    }

    /// A gate that knows TEI and saw no query for seconds, and the moment one of one input went
    /// in flight.
    fn one_query_after_a_quiet_while() -> (Fed, Instant) {
        let start = Instant::now();
        let mut gate = knowing_tei(start);
        let sent = start + SMOOTHING * 5;
        gate.took(Lane::Query, 1, sent);
        (gate, sent)
    }

    /// Queries starting beside ingest are seen while the first of them is still in flight, half
    /// a second before the slow mean would see them.
    #[test]
    fn queries_starting_beside_ingest_are_seen_within_a_batch_or_two() {
        let (gate, first) = one_query_after_a_quiet_while();
        assert!(!gate.queries_come(first), "nothing held yet");
        let riding = first + BATCH * 2;
        assert!(gate.queries_means_at(riding).0 < QUERIES_COME, "the slow mean alone would not see them");
        assert!(gate.queries_come(riding), "one query in flight for two batch times: they come");
        assert_ne!(gate.ingest_fits(4, 4, 8, None, riding), Some(IngestWhy::NoQueries));
    }

    /// A lone query of one input, back within 10 ms (a GPU's batch), does not hold ingest back.
    #[test]
    fn a_lone_short_query_leaves_the_gate_open() {
        let (mut gate, sent) = one_query_after_a_quiet_while();
        let back = sent + Duration::from_millis(10);
        assert!(!gate.queries_come(back), "in flight 10 ms: not yet half a query over the onset mean");
        gate.released(1, back);
        for after in [Duration::ZERO, BATCH, SMOOTHING] {
            assert!(!gate.queries_come(back + after), "{after:?} after it came back");
        }
    }

    /// A query that waited for its permit (ingest held them all) says queries come the moment it
    /// goes in flight: the permits freed with it are not ingest's; once it is back and the queries
    /// have stopped (two batch times on), ingest goes free again.
    #[test]
    fn a_query_that_waited_for_its_permit_says_queries_come_at_once() {
        let start = Instant::now();
        let mut gate = knowing_tei(start);
        let freed = start + SMOOTHING * 5;
        gate.released(0, freed);
        gate.query_waited(freed);
        gate.took(Lane::Query, 1, freed);
        assert!(gate.queries_come(freed));
        assert_ne!(gate.ingest_fits(1, 1, 4, None, freed), Some(IngestWhy::NoQueries));
        let back = freed + BATCH;
        gate.released(1, back);
        let quiet = back + ONSET * 2;
        assert!(!gate.queries_come(quiet), "back, and nothing waited since");
    }

    /// Bursts a second apart: between them queries still come (the longest gap is the second).
    #[test]
    fn queries_in_bursts_a_second_apart_keep_coming_between_bursts() {
        let start = Instant::now();
        let mut gate = knowing_tei(start);
        let mut now = start;
        for _ in 0..5 {
            now += Duration::from_secs(1);
            for _ in 0..40 {
                gate.took(Lane::Query, 1, now);
            }
            now += BATCH * 4;
            gate.released(40, now);
        }
        let between = now + Duration::from_millis(500);
        assert!(!gate.queries_stopped(between), "half a second after a burst, bursts a second apart");
    }

    /// A burst of 20 queries for 20 ms holds ingest back while it is in flight (the onset mean
    /// sees it; the slow one would not) and not once it has stopped.
    #[test]
    fn a_short_burst_holds_ingest_back_only_until_it_has_stopped() {
        let start = Instant::now();
        let mut gate = Fed::default();
        gate.observed_batch(BATCH, 1, start);
        gate.took(Lane::Query, 20, start);
        let end = start + Duration::from_millis(20);
        assert!(gate.queries_means_at(end).0 < QUERIES_COME, "20 ms of 20 weigh under a half in the slow mean");
        assert!(gate.queries_come(end), "the onset mean sees them");
        gate.released(20, end);
        let stopped = start + BATCH * 2;
        assert_eq!(gate.closed_until(stopped, 8), None, "none in flight and none since for two batch times");
    }

    #[test]
    fn a_count_no_call_back_has_reset_for_two_batch_times_holds_nothing_back() {
        let start = Instant::now();
        let mut gate = with_queries(start);
        let batch_start = start + SMOOTHING * 5;
        gate.released(0, batch_start);
        // A stream's messages held in flight (a RerankStream's texts, until its one answer):
        // counted into the next batch, and no call of theirs comes back.
        gate.took(Lane::Ingest, 40, batch_start);
        let (held, ok) = (batch_start + BATCH, batch_start + BATCH * STALE_AFTER);
        assert_eq!(gate.ingest_fits(4, 44, 64, Some(25), held), None, "a batch time on: still TEI's next batch");
        assert_eq!(gate.ingest_fits(4, 44, 64, None, held), None, "the learned places too");
        assert_eq!(
            gate.ingest_fits(4, 44, 64, Some(25), ok),
            Some(IngestWhy::StaleCount),
            "two batch times without a call back"
        );
        assert_eq!(gate.ingest_fits(4, 44, 64, None, ok), Some(IngestWhy::StaleCount));
        assert_eq!(gate.stale_at(), Some(ok));
    }

    #[test]
    fn with_nothing_in_flight_ingest_fits_whatever_was_counted() {
        let now = Instant::now();
        let mut gate = with_queries(now);
        gate.took(Lane::Ingest, 20, now + SMOOTHING * 5);
        let later = now + SMOOTHING * 5;
        assert_eq!(
            gate.ingest_fits(8, 24, 64, Some(25), later),
            None,
            "four queries and twenty ingest fill the 24 places"
        );
        assert_eq!(
            gate.ingest_fits(8, 0, 64, Some(25), later),
            Some(IngestWhy::IdleTei),
            "TEI idle: its next batch is empty"
        );
    }

    #[test]
    fn the_reserve_is_a_share_of_the_next_batch() {
        assert_eq!(reserved_places(64, 25), 24, "a batch of 32, 8 kept");
        assert_eq!(reserved_places(16, 10), 7, "rounded up for queries");
        assert_eq!(reserved_places(64, 0), 32);
        assert_eq!(reserved_places(1, 50), 0, "a limit of one: ingest only into an empty next batch");
    }

    #[test]
    fn the_batch_time_follows_tei() {
        let now = Instant::now();
        let mut gate = Fed::default();
        gate.observed_batch(BATCH, 1, now);
        for _ in 0..50 {
            gate.observed_batch(BATCH * 2, 1, now);
        }
        let mean = gate.batch_time.unwrap();
        assert!(mean > BATCH.mul_f64(1.99) && mean <= BATCH * 2, "{mean:?}");
        gate.observed_batch(Duration::ZERO, 1, now);
        assert_eq!(gate.batch_time, Some(mean), "an upstream without times changes nothing");
    }

    /// Batches of `size` inputs, each taking `time`, from `start`: a batch's inputs are let in
    /// while the one before runs, and it starts when that one's first call comes back; its own
    /// first call back tells its time before its permit goes, its other calls after. Each batch's
    /// time differs from the one before by a nanosecond, as TEI's measured times do. Ends at the
    /// last batch's end, its first call back told.
    fn batches(gate: &mut Fed, lane: Lane, size: usize, time: Duration, count: u32, start: Instant) -> Instant {
        let mut now = start;
        let time_of = |i: u32| time + Duration::from_nanos(u64::from(i % 2));
        for i in 0..count {
            gate.took(lane, size, now);
            gate.released(0, now);
            if i > 0 {
                gate.observed_batch(time_of(i - 1), size - 1, now + Duration::from_millis(1));
            }
            now += time;
            gate.observed_batch(time_of(i), 1, now);
        }
        now
    }

    #[test]
    fn a_batch_is_the_calls_that_come_back_with_one_time() {
        // A CPU TEI batching at most 4 (14 ms + 21 ms an input), under a limit of 8: 8 inputs let
        // in while each batch runs, which TEI runs as batches of 1 and 3 (its router hands the
        // backend a batch as soon as it holds a request) and then 4.
        let mut gate = Fed::default();
        let mut now = Instant::now();
        let time = |inputs: u64| Duration::from_millis(14 + 21 * inputs);
        for _ in 0..20 {
            gate.took(Lane::Ingest, 8, now);
            for batch in [1, 3, 4] {
                now += time(batch);
                for call in 0..batch {
                    gate.observed_batch(time(batch), 1, now + Duration::from_micros(100 * call));
                }
                gate.released(0, now);
            }
        }
        let line = gate.curve.line().unwrap();
        assert!((line.per_input - 0.021).abs() < 0.0005 && (line.fixed - 0.014).abs() < 0.001, "{line:?}");
    }

    #[test]
    fn the_batches_sizes_and_times_teach_the_curve() {
        let start = Instant::now();
        let mut gate = Fed::default();
        let now = batches(&mut gate, Lane::Ingest, 32, Duration::from_micros(20_240), 20, start);
        assert_eq!(gate.curve.line(), None, "every batch full");
        assert_eq!(gate.places(64, now), 16, "half the batch until the curve is known");
        batches(&mut gate, Lane::Ingest, 8, Duration::from_micros(12_560), 20, now);
        let line = gate.curve.line().unwrap();
        assert!((line.per_input - 0.000_32).abs() < 0.000_01, "{line:?}");
        assert!((line.fixed - 0.010).abs() < 0.000_2, "{line:?}");
    }

    #[test]
    fn on_a_device_with_little_to_share_ingest_waits_for_an_idle_tei() {
        // TEI on CPU: 14 ms + 21 ms an input, batches of 4 (a limit of 8); queries alone, one a
        // batch, about 28 a second.
        let start = Instant::now();
        let mut gate = Fed::default();
        let now = batches(&mut gate, Lane::Ingest, 4, Duration::from_millis(98), 20, start);
        let now = batches(&mut gate, Lane::Query, 1, Duration::from_millis(35), 60, now);
        let after = now + Duration::from_millis(1);
        let line = gate.curve.line().unwrap();
        assert!(line.per_input > line.fixed, "{line:?}");
        assert_eq!(gate.places(8, after), 0);
        assert_eq!(gate.ingest_fits(1, 1, 8, None, after), None, "an empty next batch, TEI busy");
        assert_eq!(gate.ingest_fits(1, 0, 8, None, after), Some(IngestWhy::IdleTei), "TEI idle");
        assert_eq!(
            gate.ingest_fits(1, 1, 8, Some(25), after),
            Some(IngestWhy::EmptyNextBatch),
            "a fixed reserve still fills the empty next batch"
        );
    }

    #[test]
    fn on_a_device_with_little_to_share_ingest_takes_a_fifth_of_the_idle_time() {
        // TEI on CPU as above; queries alone now one every 50 ms (20 a second), each a batch of
        // one of 35 ms: TEI idle 30% of the time.
        let start = Instant::now();
        let mut gate = Fed::default();
        let mut now = batches(&mut gate, Lane::Ingest, 4, Duration::from_millis(98), 20, start);
        let query = |gate: &mut Fed, now: &mut Instant, i: u64| {
            gate.took(Lane::Query, 1, *now);
            let back = *now + Duration::from_millis(35);
            gate.observed_batch(Duration::from_millis(35) + Duration::from_nanos(i % 2), 1, back);
            gate.released(1, back);
            *now += Duration::from_millis(50);
        };
        for i in 0..200 {
            query(&mut gate, &mut now, i);
        }
        assert_eq!(gate.places(8, now), 0);
        assert_eq!(gate.rationed_until(8, None, now), None, "a full ration: the first input goes");
        assert_eq!(gate.rationed_until(8, Some(25), now), None, "a fixed reserve is not rationed");
        gate.ingest_took(1, 8, None, now);
        // A fifth of the idle 30% of each second, in batches of one of 35 ms: about 1.7 inputs a
        // second, the next one about 0.58 s on.
        let took = now;
        assert!(gate.rationed_until(8, None, now).is_some(), "rationed");
        let mut i = 200;
        while gate.rationed_until(8, None, now).is_some() {
            query(&mut gate, &mut now, i);
            i += 1;
        }
        let wait = now - took;
        assert!(wait > Duration::from_millis(450) && wait < Duration::from_millis(750), "{wait:?}");
        let quiet = now + SMOOTHING * 10;
        gate.ingest_took(1, 8, None, now);
        assert_eq!(gate.rationed_until(8, None, quiet), None, "no query comes: not rationed");
    }

    #[test]
    fn learned_places_follow_the_curve_and_the_queries() {
        let start = Instant::now();
        let mut gate = Fed::default();
        let now = batches(&mut gate, Lane::Ingest, 32, Duration::from_micros(20_240), 20, start);
        // Queries alone at 700 inputs a second: 9 a batch of 12.9 ms, for the five seconds their
        // rate takes to settle.
        let now = batches(&mut gate, Lane::Query, 9, Duration::from_micros(12_880), 400, now);
        let right_after = now + Duration::from_micros(100);
        let places = gate.places(64, right_after);
        assert_eq!(places, 18, "a climbing device keeps room for queries");
        gate.took(Lane::Query, 4, right_after);
        assert_eq!(gate.ingest_fits(8, 8, 64, None, right_after), Some(IngestWhy::Places), "4 + 8 within 18");
        gate.took(Lane::Ingest, 8, right_after);
        assert_eq!(
            gate.ingest_fits(8, 16, 64, None, right_after),
            Some(IngestWhy::Places),
            "12 + 8: a quarter of the call over 18"
        );
        gate.took(Lane::Ingest, 8, right_after);
        assert_eq!(gate.ingest_fits(8, 24, 64, None, right_after), None, "20 + 8: more than half of it over 18");
        assert_eq!(
            gate.ingest_fits(8, 24, 64, Some(0), right_after),
            Some(IngestWhy::NoQueries),
            "a reserve of 0 said explicitly"
        );

        let mut flat = Fed::default();
        let now = batches(&mut flat, Lane::Query, 2, Duration::from_millis(20), 20, start);
        let now = batches(&mut flat, Lane::Query, 8, Duration::from_millis(20), 100, now);
        assert_eq!(flat.places(16, now + Duration::from_millis(19)), 8, "a flat device: the whole batch");
    }
}
