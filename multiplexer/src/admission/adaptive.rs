//! The in-flight limit that finds itself: kept where TEI's own queue holds about one batch time of
//! work while TEI stays busy.
//!
//! TEI reports, for every call, how long it waited in TEI's queue and how long its batch ran
//! (response Metadata). A limit too low leaves TEI's queue empty between batches (the GPU idles
//! while the next batch forms); a limit too high lets TEI's queue grow, which is latency without
//! throughput. The right limit is two batches: one running, the next one waiting in full, so
//! every call waits about one batch time in TEI. Like a gradient limiter (Netflix's
//! concurrency-limits, Envoy's adaptive concurrency), the limit moves by the ratio of where TEI's
//! queue should be to where it is, `limit × (batch + target) / (batch + queue)` with
//! `target = batch`; but the signal is TEI's own queue time rather than round-trip inflation, so
//! no "minimum RTT" has to be probed.
//!
//! That ratio cannot see the last few calls: TEI starts a batch with whatever is queued, so
//! anywhere between one and two batches in flight calls wait about one batch time, and one call
//! beyond two batches raises the mean only a little while that call waits out two batches. So
//! the limit also watches each call: calls that waited more than one and a half of their batch
//! times were left behind by a full batch, and the limit steps back by most of the excess their
//! share implies, at once.
//! Between one and two batches it probes upwards a step at a time, and after finding the top it
//! holds for a while before probing again, so the calls a probe leaves behind stay a small
//! fraction (TEI queue p99 within two batch times). Growth needs demand; the limit stays between
//! a floor and the ceiling the operator publishes (the replica's share).

use std::time::Duration;

/// Fraction of the way to the computed limit taken per update: fast enough to settle in a few
/// seconds, slow enough that one odd batch does not swing it.
const SMOOTHING: f64 = 0.5;
/// The most one update may multiply or divide the limit by.
const MAX_STEP: f64 = 2.0;
/// A call that waited longer than this many of its batch times waited behind a second batch.
const LEFT_BEHIND: f64 = 1.5;
/// Share of a round's calls left behind that counts as the limit being over the top, and the
/// fewest calls that may show it: one call that waited out a slow batch is noise, and stepping
/// back on it leaves TEI's batches short.
const LEFT_BEHIND_TOLERANCE: f64 = 0.01;
const LEFT_BEHIND_CALLS: u32 = 2;
/// One probe upwards while the top is unknown, as a share of the limit (at least one call); once
/// found, probes past it are one call.
const PROBE_STEP: f64 = 0.125;
/// A mean TEI queue longer than this many batch times is batches queueing behind each other. Up
/// to it, calls left behind (not the mean) say the limit is over the top: between one and two
/// batches in flight the mean hovers about one batch time, and shrinking on its noise would
/// ratchet the limit down while probes are held.
const LONG_QUEUE: f64 = 1.25;
/// Share of the estimated excess taken off in one step back: the share of calls left behind in
/// one round depends on where the round starts in a batch, so the estimate can be a fifth too
/// high or too low. A step too far leaves TEI's batches short until the next probe; one too short
/// is finished a round later.
const STEP_BACK: f64 = 0.75;
/// Answers without probing past the top after calls were left behind. A probe one call past two
/// batches of `B` leaves about one call in `B` behind for the two rounds (about `2B` answers each)
/// until it is undone: about four calls whatever `B`, so this many answers between probes keeps
/// them near one in four hundred.
const HOLD_ANSWERS: u32 = 1_600;

/// Why the limit last moved, as the `reason` label of `teifleet_limit_changes_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// TEI's queue was under half a batch time while calls waited: room to send more.
    TeiQueueShort,
    /// TEI's queue was about a batch time, nobody was left behind: one step up, to find the top.
    Probe,
    /// TEI's queue was over 1.25 batch times: batches queue behind each other inside TEI.
    TeiQueueLong,
    /// Calls waited behind a second batch: that many calls were over the top.
    LeftBehind,
    /// The ceiling (the replica's share of the pool budget) changed or was reached.
    Ceiling,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TeiQueueShort => "tei_queue_short",
            Self::Probe => "probe",
            Self::TeiQueueLong => "tei_queue_long",
            Self::LeftBehind => "left_behind",
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

/// What one round of answers said.
#[derive(Clone, Copy, Debug, Default)]
struct Round {
    samples: u32,
    queue_secs: f64,
    batch_secs: f64,
    left_behind: u32,
    demand: bool,
}

#[derive(Clone, Debug)]
pub struct Adaptive {
    limit: f64,
    round: Round,
    /// Answers left before the next probe past the top.
    hold: u32,
    /// The limit just moved: the round in progress still answers calls let in under the old one.
    moved: bool,
    /// Where the limit stepped back to when calls were last left behind: the top, as far as
    /// known, until TEI has room again.
    top: Option<f64>,
}

impl Adaptive {
    /// Starts at a quarter of the ceiling: a new replica probes upwards rather than flooding TEI.
    pub fn new(floor: usize, ceiling: usize) -> Self {
        let start = (ceiling as f64 / 4.0).max(floor as f64);
        Self { limit: start, round: Round::default(), hold: 0, moved: false, top: None }
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
        let round = &mut self.round;
        round.samples += 1;
        round.queue_secs += tei_queue.as_secs_f64();
        round.batch_secs += batch.as_secs_f64();
        round.left_behind += u32::from(!batch.is_zero() && tei_queue.as_secs_f64() > LEFT_BEHIND * batch.as_secs_f64());
        round.demand |= demand;
        // One update per round of the limit's calls, and never on fewer than sixteen answers: a
        // round shorter than a few batches sees one batch's luck, and the limit swings with it.
        if round.samples < (before as u32).max(16) {
            return None;
        }
        let round = std::mem::take(&mut self.round);
        if std::mem::take(&mut self.moved) {
            return None;
        }
        let samples = f64::from(round.samples);
        let (queue, batch) = (round.queue_secs / samples, round.batch_secs / samples);
        if batch <= 0.0 {
            return None;
        }
        let (floor_f, ceiling_f) = (floor as f64, ceiling.max(floor) as f64);
        let current = self.limit.clamp(floor_f, ceiling_f);
        let gradient = ((batch + batch) / (batch + queue)).clamp(1.0 / MAX_STEP, MAX_STEP);
        let smoothed = current + SMOOTHING * (current * gradient - current);
        let left_behind = f64::from(round.left_behind) / samples;
        let (next, reason) = if left_behind > LEFT_BEHIND_TOLERANCE && round.left_behind >= LEFT_BEHIND_CALLS {
            // With `e` calls over two batches of `B`, every batch starts with `e` calls left from
            // the one before, so a share `f = e / B` of the calls is left behind, and with
            // `limit = 2B + e`: `e = f × limit / (2 + f)`.
            let over = (STEP_BACK * left_behind * current / (2.0 + left_behind)).floor().max(1.0);
            let back = (current.floor() - over).min(smoothed.floor()).max(floor_f);
            (self.hold, self.top) = (HOLD_ANSWERS, Some(back));
            (back, Reason::LeftBehind)
        } else if queue > batch * LONG_QUEUE {
            // Batches queue up behind each other (a start far above the top, or TEI slowed down
            // per call): shrink by the gradient.
            (smoothed, Reason::TeiQueueLong)
        } else if !round.demand {
            return None; // A short queue without demand says nothing about capacity.
        } else if queue < batch / 2.0 {
            // TEI idles between batches: grow by the gradient (at least one call, or a small limit
            // could never leave the floor), and look for the top again from here.
            (self.hold, self.top) = (0, None);
            (smoothed.max(current + 1.0), Reason::TeiQueueShort)
        } else {
            // About one batch time: probe upwards, straight back to the known top if below it,
            // one call past it once the hold is over, by an eighth while no top is known.
            let whole = current.floor();
            let eighth_up = whole + (whole * PROBE_STEP).max(1.0);
            match self.top {
                Some(top) if whole < top => (eighth_up.min(top), Reason::Probe),
                Some(_) if self.hold > 0 => {
                    self.hold = self.hold.saturating_sub(round.samples);
                    return None;
                }
                Some(_) => (whole + 1.0, Reason::Probe),
                None => (eighth_up, Reason::Probe),
            }
        };
        self.limit = next.clamp(floor_f, ceiling_f);
        let after = self.limit(floor, ceiling);
        let reason = if after == ceiling && after > before { Reason::Ceiling } else { reason };
        self.moved = after != before;
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

    /// A model of TEI that starts full batches of `capacity` calls, one at a time, each taking
    /// `batch`: with `limit` calls in flight, `limit - capacity` wait, first in first out, so the
    /// `i`th call of a batch waited `(limit - capacity + i) / capacity` batch times.
    fn round_of_answers(limit: usize, capacity: usize, batch: Duration) -> impl Iterator<Item = Duration> {
        (0..capacity).map(move |i| batch * ((limit.saturating_sub(capacity) + i) / capacity) as u32)
    }

    /// Feeds `batches` batches' answers at the limit in force; returns the share of calls that
    /// waited behind two batches or more, and the limit's median over the batches.
    fn run(adaptive: &mut Adaptive, batches: usize, capacity: usize, batch: Duration, ceiling: usize) -> (f64, usize) {
        let (mut calls, mut behind, mut limits) = (0, 0, Vec::with_capacity(batches));
        for _ in 0..batches {
            let limit = adaptive.limit(1, ceiling);
            limits.push(limit);
            for queued in round_of_answers(limit, capacity, batch) {
                calls += 1;
                behind += usize::from(queued >= batch * 2);
                adaptive.observe(queued, batch, true, 1, ceiling);
            }
        }
        limits.sort_unstable();
        (behind as f64 / calls as f64, limits[limits.len() / 2])
    }

    #[test]
    fn settles_at_two_batches_and_rarely_leaves_a_call_behind() {
        for capacity in [4, 16, 64] {
            let mut adaptive = Adaptive::new(1, 512);
            run(&mut adaptive, 2_000, capacity, 25 * MS, 512);
            let (behind, median) = run(&mut adaptive, 20_000, capacity, 25 * MS, 512);
            // A step back from a probe lands within a few calls of the top: the share of calls
            // left behind in one round depends on where the round starts in a batch.
            let close = (2 * capacity / 16).max(1);
            assert!(
                (2 * capacity - close..=2 * capacity).contains(&median),
                "batches of {capacity}: two in flight most of the time, got {median}"
            );
            assert!(behind < 0.01, "batches of {capacity}: {:.2}% of calls behind two batches", behind * 100.0);
        }
    }

    #[test]
    fn noise_around_one_batch_time_does_not_wear_the_limit_down() {
        let (capacity, batch) = (4, 6 * MS);
        let mut adaptive = Adaptive::new(1, 64);
        let mut limits = Vec::new();
        for n in 0..20_000u32 {
            let limit = adaptive.limit(1, 64);
            limits.push(limit);
            for (i, modelled) in round_of_answers(limit, capacity, batch).enumerate() {
                // TEI's queue times jitter by a tenth of a batch either way.
                let jitter = if (n as usize + i).is_multiple_of(2) { batch / 10 } else { Duration::ZERO };
                let queued = if modelled.is_zero() { modelled } else { modelled + jitter };
                adaptive.observe(queued, batch, true, 1, 64);
            }
        }
        let late = &mut limits[10_000..];
        late.sort_unstable();
        assert_eq!(late[late.len() / 2], 2 * capacity, "two batches in flight");
        assert!(late[late.len() / 100] >= capacity, "never long below one batch: {}", late[late.len() / 100]);
    }

    #[test]
    fn climbs_from_a_quarter_of_the_ceiling_within_a_few_dozen_batches() {
        let mut adaptive = Adaptive::new(1, 256);
        assert_eq!(adaptive.limit(1, 256), 64);
        run(&mut adaptive, 40, 64, 100 * MS, 256);
        assert!(adaptive.limit(1, 256) >= 2 * 64 - 8, "{}", adaptive.limit(1, 256));
    }

    #[test]
    fn follows_capacity_down_and_up() {
        let mut adaptive = Adaptive::new(1, 512);
        run(&mut adaptive, 2_000, 64, 10 * MS, 512);
        let before = adaptive.limit(1, 512);
        run(&mut adaptive, 2_000, 32, 10 * MS, 512);
        let halved = adaptive.limit(1, 512);
        assert!(halved < before, "{halved} < {before}");
        run(&mut adaptive, 2_000, 64, 10 * MS, 512);
        let restored = adaptive.limit(1, 512);
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
        for _ in 0..400 {
            adaptive.observe(Duration::ZERO, 10 * MS, true, 2, 8);
        }
        assert_eq!(adaptive.limit(2, 8), 8, "capped by the ceiling");
        for _ in 0..400 {
            adaptive.observe(100 * MS, 10 * MS, true, 2, 8);
        }
        assert_eq!(adaptive.limit(2, 8), 2, "held at the floor");
    }
}
