//! The in-flight limit that finds itself: kept where TEI's own queue holds about one batch time of
//! work while TEI stays busy.
//!
//! TEI reports, for every call, how long it waited in TEI's queue and how long its batch ran
//! (response Metadata). A limit too low leaves TEI's queue empty between batches (the GPU idles
//! while the next batch forms); a limit too high lets TEI's queue grow, which is latency without
//! throughput. Like a gradient limiter (Netflix's concurrency-limits, Envoy's adaptive
//! concurrency), the limit moves by the ratio of where TEI's queue should be to where it is, but
//! the signal is TEI's own queue time rather than round-trip inflation, so no "minimum RTT" has to
//! be probed: `next = limit × (batch + target) / (batch + queue)` with `target = batch`, smoothed,
//! growing only while there is demand to use it, and clamped between a floor and the ceiling the
//! operator publishes (the replica's share).

use std::time::Duration;

/// Fraction of the way to the computed limit taken per update: fast enough to settle in a few
/// seconds, slow enough that one odd batch does not swing it.
const SMOOTHING: f64 = 0.5;
/// The most one update may multiply or divide the limit by.
const MAX_STEP: f64 = 2.0;

/// Why the limit last moved, as the `reason` label of `teifleet_limit_changes_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// TEI's queue was shorter than a batch time while calls waited: room to send more.
    TeiQueueShort,
    /// TEI's queue was longer than a batch time: the extra calls only wait inside TEI.
    TeiQueueLong,
    /// The ceiling (the replica's share of the pool budget) changed or was reached.
    Ceiling,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TeiQueueShort => "tei_queue_short",
            Self::TeiQueueLong => "tei_queue_long",
            Self::Ceiling => "ceiling",
        }
    }
}

/// A limit change, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub from: usize,
    pub to: usize,
    pub reason: Reason,
}

#[derive(Clone, Debug)]
pub struct Adaptive {
    limit: f64,
    samples: u32,
    queue_secs: f64,
    batch_secs: f64,
    demand: bool,
}

impl Adaptive {
    /// Starts at a quarter of the ceiling: a new replica probes upwards rather than flooding TEI.
    pub fn new(floor: usize, ceiling: usize) -> Self {
        let start = (ceiling as f64 / 4.0).max(floor as f64);
        Self { limit: start, samples: 0, queue_secs: 0.0, batch_secs: 0.0, demand: false }
    }

    /// Rounded down: a limit that drifts a fraction above a whole number of batches would
    /// otherwise let one call more through, and that call waits behind two batches in TEI's queue.
    pub fn limit(&self, floor: usize, ceiling: usize) -> usize {
        (self.limit.floor() as usize).clamp(floor, ceiling.max(floor))
    }

    /// Learns from one answer: TEI's queue time and batch time for it; `demand` says whether calls
    /// were waiting for a permit (or the limit was in full use) when it arrived.
    pub fn observe(
        &mut self,
        tei_queue: Duration,
        batch: Duration,
        demand: bool,
        floor: usize,
        ceiling: usize,
    ) -> Option<Change> {
        let before = self.limit(floor, ceiling);
        self.samples += 1;
        self.queue_secs += tei_queue.as_secs_f64();
        self.batch_secs += batch.as_secs_f64();
        self.demand |= demand;
        // One update per round of the limit's calls, and never on fewer than sixteen answers: a
        // round shorter than a few batches sees one batch's luck, and the limit swings with it.
        if self.samples < (before as u32).max(16) {
            return None;
        }
        let (queue, batch) = (self.queue_secs / f64::from(self.samples), self.batch_secs / f64::from(self.samples));
        let demand = std::mem::take(&mut self.demand);
        (self.samples, self.queue_secs, self.batch_secs) = (0, 0.0, 0.0);
        if batch <= 0.0 {
            return None;
        }
        let gradient = ((batch + batch) / (batch + queue)).clamp(1.0 / MAX_STEP, MAX_STEP);
        if gradient > 1.0 && !demand {
            return None; // A short queue without demand says nothing about capacity.
        }
        let current = self.limit.clamp(floor as f64, ceiling.max(floor) as f64);
        let next = current + SMOOTHING * (current * gradient - current);
        // Grow by at least one call, or a small limit could never leave the floor.
        let next = if gradient > 1.0 { next.max(current + 1.0) } else { next };
        self.limit = next.clamp(floor as f64, ceiling.max(floor) as f64);
        let after = self.limit(floor, ceiling);
        let reason = match () {
            () if after == ceiling && gradient > 1.0 => Reason::Ceiling,
            () if gradient > 1.0 => Reason::TeiQueueShort,
            () => Reason::TeiQueueLong,
        };
        (after != before).then_some(Change { from: before, to: after, reason })
    }

    /// The ceiling moved (a budget edit, replicas joining or leaving).
    pub fn set_bounds(&mut self, floor: usize, ceiling: usize) {
        self.limit = self.limit.clamp(floor as f64, ceiling.max(floor) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A model of TEI: one batch of `capacity` calls at a time, taking `batch`; with `limit` calls
    /// in flight, the calls beyond one batch wait a batch time per extra batch.
    fn tei_queue(limit: usize, capacity: usize, batch: Duration) -> Duration {
        let batches_ahead = limit.saturating_sub(1) / capacity;
        batch * batches_ahead as u32
    }

    fn settle(adaptive: &mut Adaptive, capacity: usize, batch: Duration, ceiling: usize) -> usize {
        for _ in 0..2_000 {
            let limit = adaptive.limit(1, ceiling);
            adaptive.observe(tei_queue(limit, capacity, batch), batch, true, 1, ceiling);
        }
        adaptive.limit(1, ceiling)
    }

    #[test]
    fn settles_near_two_batches_in_flight() {
        let mut adaptive = Adaptive::new(1, 512);
        let limit = settle(&mut adaptive, 32, 25 * MS, 512);
        assert!((33..=96).contains(&limit), "TEI busy with about one batch queued: {limit}");
    }

    #[test]
    fn follows_capacity_down_and_up() {
        let mut adaptive = Adaptive::new(1, 512);
        let before = settle(&mut adaptive, 64, 10 * MS, 512);
        let halved = settle(&mut adaptive, 32, 10 * MS, 512);
        assert!(halved < before, "{halved} < {before}");
        let restored = settle(&mut adaptive, 64, 10 * MS, 512);
        assert!(restored > halved, "{restored} > {halved}");
    }

    #[test]
    fn stays_between_floor_and_ceiling_and_needs_demand_to_grow() {
        let mut adaptive = Adaptive::new(2, 8);
        assert_eq!(adaptive.limit(2, 8), 2);
        for _ in 0..100 {
            adaptive.observe(Duration::ZERO, 10 * MS, false, 2, 8);
        }
        assert_eq!(adaptive.limit(2, 8), 2, "no demand, no growth");
        for _ in 0..100 {
            adaptive.observe(Duration::ZERO, 10 * MS, true, 2, 8);
        }
        assert_eq!(adaptive.limit(2, 8), 8, "capped by the ceiling");
        for _ in 0..100 {
            adaptive.observe(100 * MS, 10 * MS, true, 2, 8);
        }
        assert_eq!(adaptive.limit(2, 8), 2, "held at the floor");
    }
}
