//! Whether a neighbour on a time-sliced GPU is busy, read from TEI's own batch times: what makes
//! a pool's `gpu.sharing` share a work-conserving cap (see `device_time`).
//!
//! A time-sliced GPU runs one process's batch at a time, so a batch that has to wait for a
//! neighbour's turn takes longer from TEI's point of view: TEI measures a batch end to end, and
//! its `inference_time` includes the wait. This learns how long this replica's batches take
//! when nobody is in the way, a minimum per batch size over a long window, and calls a batch
//! *waited* when it took well above that ([`WAITED`] times). A neighbour is *busy* while the
//! share of recent batches that waited is high, with hysteresis ([`ENTER`], [`LEAVE`]) so the
//! verdict does not flap.
//!
//! Nothing beyond what TEI already answers with is needed, and nothing from outside the pod is
//! believed: the signal is TEI's own timing of this replica's batches.
//!
//! Why a misread is cheap and never lasts:
//! - A false "busy" (this pool's own batches got slower: longer inputs, a slower model, a busy
//!   host) costs only throughput, and only until the minimum catches up: it is let rise by
//!   [`DRIFT_PER_SECOND`] of itself each second it is not undercut, so a lasting change of
//!   speed becomes the new normal within about half a minute. Meanwhile the pool still gets its
//!   share of the device.
//! - A false "quiet" (every batch waits, so the minimum itself is inflated) costs neighbours
//!   their protection, never this pool's throughput.
//! - A pool cannot starve itself: a capped pool still runs batches at its share, each one
//!   observed, so the verdict is re-read all along; once the neighbours go quiet its batches stop
//!   waiting and the cap lifts within a few dozen batches.
//!
//! A batch (told apart from TEI's answers by `tei_batch`) is judged when the first answer of the
//! next one comes, against the minimum of its size's bucket (powers of two).

use tokio::time::Instant;

use super::tei_batch::Batch;

/// A batch that took more than this many times the learned minimum for its size waited for a
/// neighbour's turn. A neighbour's batch on the device at least doubles a short batch; jitter
/// and a batch a little larger than its bucket say stay below.
pub(super) const WAITED: f64 = 1.5;
/// The weight of each batch in the moving share of batches that waited.
const WEIGHT: f64 = 1.0 / 16.0;
/// A neighbour becomes busy once this share of recent batches waited...
pub(super) const ENTER: f64 = 0.25;
/// ...and quiet again once it falls to this.
pub(super) const LEAVE: f64 = 0.08;
/// How fast the learned minimum rises while nothing undercuts it, per second: what re-learns a
/// pool whose own batches got slower for good.
pub(super) const DRIFT_PER_SECOND: f64 = 0.02;
/// Batch-size buckets: 1, 2, 3–4, 5–8, ... inputs; larger ones share the last.
const BUCKETS: usize = 12;
/// The least share of its wall time in flight a pool is charged as its own: a batch twenty
/// times its minimum is more likely a misread than a neighbour that slow.
pub(super) const LEAST_OWN_SHARE: f64 = 0.05;

/// The shortest batch time seen for one batch size, and when it was seen.
#[derive(Clone, Copy, Debug)]
struct Minimum {
    seconds: f64,
    seen: Instant,
}

impl Minimum {
    /// The minimum at `now`, risen since it was seen.
    fn at(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.seen).as_secs_f64();
        self.seconds * (DRIFT_PER_SECOND * elapsed).exp()
    }
}

#[derive(Debug, Default)]
pub(super) struct Contention {
    minimums: [Option<Minimum>; BUCKETS],
    /// The moving share of batches that waited.
    waited_share: f64,
    busy: bool,
    /// Moving means of judged batches' minimum and actual times: their ratio is the share of
    /// this replica's time in flight that the device spent on its own batches.
    minimum_mean: f64,
    actual_mean: f64,
}

/// The bucket of a batch of about `inputs` inputs.
fn bucket(inputs: usize) -> usize {
    let rounded_up = inputs.max(1).next_power_of_two();
    (rounded_up.trailing_zeros() as usize).min(BUCKETS - 1)
}

impl Contention {
    /// Whether a neighbour is busy on the device, as last read.
    pub fn neighbour_busy(&self) -> bool {
        self.busy
    }

    /// The share of this replica's time in flight that was its own work on the device, not a wait
    /// for a neighbour's turn: recent batches' minimum time over their actual time, time-weighted.
    /// What a pool's GPU share charges it (see `device_time`), so a light pool whose every call
    /// waits behind a flood is not held for the flood's time. 1 until batches have been judged.
    pub fn own_share(&self) -> f64 {
        if self.actual_mean <= 0.0 {
            return 1.0;
        }
        (self.minimum_mean / self.actual_mean).clamp(LEAST_OWN_SHARE, 1.0)
    }

    /// Judges a batch all of whose answers came back by `now`: did it wait for a neighbour?
    /// Returns true when the verdict changed.
    pub fn batch_ended(&mut self, batch: Batch, now: Instant) -> bool {
        let seconds = batch.time.as_secs_f64();
        let slot = &mut self.minimums[bucket(batch.inputs)];
        let minimum = match slot {
            Some(minimum) => minimum.at(now),
            // The first of its size: nothing to compare with yet.
            None => {
                *slot = Some(Minimum { seconds, seen: now });
                return false;
            }
        };
        if seconds < minimum {
            *slot = Some(Minimum { seconds, seen: now });
        }
        self.minimum_mean += (minimum.min(seconds) - self.minimum_mean) * WEIGHT;
        self.actual_mean += (seconds - self.actual_mean) * WEIGHT;
        let waited = if seconds > minimum * WAITED { 1.0 } else { 0.0 };
        self.waited_share += (waited - self.waited_share) * WEIGHT;
        let busy = match self.busy {
            true => self.waited_share > LEAVE,
            false => self.waited_share >= ENTER,
        };
        let changed = busy != self.busy;
        self.busy = busy;
        changed
    }
}

#[cfg(test)]
mod tests {
    use std::ops::{Deref, DerefMut};
    use std::time::Duration;

    use super::*;
    use crate::admission::tei_batch::TeiBatches;

    const MS: Duration = Duration::from_millis(1);

    /// A pool's contention fed with answers, as the pool feeds it: through the batches they make.
    #[derive(Default)]
    struct Fed {
        batches: TeiBatches,
        contention: Contention,
    }

    impl Fed {
        fn observe(&mut self, inference: Duration, inputs: usize, now: Instant) -> bool {
            let ended = self.batches.answered(inference, inputs, now);
            ended.is_some_and(|batch| self.contention.batch_ended(batch, now))
        }
    }

    impl Deref for Fed {
        type Target = Contention;
        fn deref(&self) -> &Contention {
            &self.contention
        }
    }

    impl DerefMut for Fed {
        fn deref_mut(&mut self) -> &mut Contention {
            &mut self.contention
        }
    }

    /// A batch's time as TEI reports it: `base`, and a few nanoseconds that tell batches apart.
    fn timed(base: Duration, n: usize) -> Duration {
        base + Duration::from_nanos((n % 997) as u64 + 1)
    }

    /// Feeds `batches` batches of two one-input calls, each taking `batch`, back to back; every
    /// `waits_every`-th (if any) waited `wait` for a neighbour. Returns the verdict after each.
    fn feed(
        contention: &mut Fed,
        now: &mut Instant,
        batches: usize,
        batch: Duration,
        waits_every: Option<usize>,
        wait: Duration,
    ) -> Vec<bool> {
        let mut verdicts = Vec::new();
        for n in 0..batches {
            let waited = waits_every.is_some_and(|every| n % every == 0);
            let took = timed(if waited { batch + wait } else { batch }, n);
            *now += took;
            contention.observe(took, 1, *now);
            contention.observe(took, 1, *now);
            *now += MS;
            verdicts.push(contention.neighbour_busy());
        }
        verdicts
    }

    #[test]
    fn a_pool_alone_never_reads_a_neighbour_even_with_jitter() {
        let mut contention = Fed::default();
        let mut now = Instant::now();
        // 10 % jitter on every other batch, and one batch in twenty 40 % slower.
        for n in 0..5_000 {
            let jitter = match n {
                n if n % 20 == 0 => 1.4,
                n if n % 2 == 0 => 1.1,
                _ => 1.0,
            };
            contention.observe(timed(Duration::from_secs_f64(0.004 * jitter), n), 2, now);
            now += 5 * MS;
            assert!(!contention.neighbour_busy(), "batch {n}");
        }
    }

    #[test]
    fn batches_that_wait_for_a_neighbour_read_busy_within_a_few_dozen_and_quiet_after() {
        let mut contention = Fed::default();
        let mut now = Instant::now();
        let batch = 4 * MS;
        assert!(!feed(&mut contention, &mut now, 200, batch, None, MS).contains(&true));
        // A neighbour's batch ahead of every other one of ours.
        let busy = feed(&mut contention, &mut now, 200, batch, Some(2), 3 * MS);
        let first = busy.iter().position(|b| *b).expect("read busy");
        assert!(first < 20, "busy after {first} batches");
        assert!(busy[first..].iter().all(|b| *b), "no flapping while the neighbour stays busy");
        // The neighbour goes quiet.
        let quiet = feed(&mut contention, &mut now, 200, batch, None, MS);
        let back = quiet.iter().position(|b| !*b).expect("read quiet");
        assert!(back < 40, "quiet after {back} batches");
        assert!(quiet[back..].iter().all(|b| !*b));
    }

    #[test]
    fn a_share_between_the_thresholds_keeps_the_verdict_it_has() {
        // One batch in six waited: above LEAVE, below ENTER.
        let mut rising = Fed::default();
        let mut now = Instant::now();
        feed(&mut rising, &mut now, 10, 4 * MS, None, MS);
        assert!(!feed(&mut rising, &mut now, 1_000, 4 * MS, Some(6), 4 * MS).contains(&true), "not entered");
        let mut falling = Fed::default();
        feed(&mut falling, &mut now, 10, 4 * MS, None, MS);
        feed(&mut falling, &mut now, 200, 4 * MS, Some(2), 4 * MS);
        assert!(falling.neighbour_busy());
        assert!(feed(&mut falling, &mut now, 1_000, 4 * MS, Some(6), 4 * MS).iter().all(|b| *b), "not left");
    }

    #[test]
    fn answers_with_one_time_are_one_batch_judged_against_its_own_size() {
        let mut contention = Fed::default();
        let now = Instant::now();
        // A lone input takes 2 ms, a batch of sixteen 8 ms: the larger batch did not wait, and
        // its sixteen answers are one batch, not sixteen.
        for n in 0..500u32 {
            let at = now + n * 10 * MS;
            contention.observe(timed(2 * MS, 2 * n as usize), 1, at);
            for _ in 0..16 {
                contention.observe(timed(8 * MS, 2 * n as usize + 1), 1, at + 5 * MS);
            }
            assert!(!contention.neighbour_busy(), "batch {n}");
        }
        assert_eq!(contention.minimums.iter().flatten().count(), 2, "two sizes: 1 and 16");
    }

    #[test]
    fn a_pool_that_got_slower_for_good_relearns_its_speed() {
        let mut contention = Fed::default();
        let mut now = Instant::now();
        feed(&mut contention, &mut now, 100, 4 * MS, None, MS);
        // From now on every batch takes 10 ms (a slower model, longer inputs): read as waiting
        // at first, then the minimum rises to it.
        let mut busy_for = Duration::ZERO;
        for n in 0..10_000 {
            contention.observe(timed(10 * MS, n), 2, now);
            now += 11 * MS;
            if contention.neighbour_busy() {
                busy_for += 11 * MS;
            }
        }
        assert!(!contention.neighbour_busy(), "relearned");
        // ln(10 / 4 / 1.5) / 2 % a second is about 26 s, and the moving share takes a little more.
        assert!(busy_for < Duration::from_secs(35), "busy for {busy_for:?}");
    }

    #[test]
    fn the_own_share_is_the_batches_minimum_over_their_time() {
        let mut contention = Fed::default();
        let mut now = Instant::now();
        assert_eq!(contention.own_share(), 1.0, "nothing judged yet");
        feed(&mut contention, &mut now, 200, 4 * MS, None, MS);
        assert!(contention.own_share() > 0.99, "alone: {}", contention.own_share());
        // Every batch waits 6 ms for a neighbour's: 4 ms of every 10 are its own (the minimum
        // drifts up a few percent meanwhile, so a little more).
        feed(&mut contention, &mut now, 200, 4 * MS, Some(1), 6 * MS);
        assert!((contention.own_share() - 0.4).abs() < 0.03, "light beside a flood: {}", contention.own_share());
        // Every other batch waits: 8 ms of every 14.
        feed(&mut contention, &mut now, 200, 4 * MS, Some(2), 6 * MS);
        let expected = 8.0 / 14.0;
        assert!((contention.own_share() - expected).abs() < 0.04, "flooding: {}", contention.own_share());
    }

    #[test]
    fn buckets_are_powers_of_two() {
        let buckets: Vec<usize> = [0, 1, 2, 3, 4, 5, 8, 9, 1 << 20].into_iter().map(bucket).collect();
        assert_eq!(buckets, [0, 0, 1, 2, 2, 3, 3, 4, BUCKETS - 1]);
    }
}
