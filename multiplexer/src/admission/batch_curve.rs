//! TEI's batch-time curve, learned from its answers, and the places of its next batch ingest may
//! take beside queries by it (the learned query reserve, `ingest_gate`).
//!
//! TEI reports each call's `inference_time`: the time of the batch the call rode. The sidecar
//! counts the inputs it let in for each batch, so each answer is a point (inputs, batch time). A
//! device's batch time is close to a line, `fixed + per_input × inputs`: a GPU's fixed cost per
//! forward pass and the work per input. Where the line is mostly fixed, a full batch costs a query
//! little more than one of queries alone, and ingest may fill it; where it climbs, a batch ingest
//! fills makes every query beside it ride (and wait for) a longer batch.
//!
//! The points are kept as a mean batch time per batch size, so sizes seen an hour ago (the queries
//! alone, the job alone) still pin the line when every batch now has the same size, and a single
//! slow batch moves one size's mean a little. The line is the least-squares fit through those
//! means, weighted by how often each size was seen (capped, so the commonest size does not drown
//! the others): it needs sizes a few inputs apart, and says nothing before.

use std::time::Duration;

/// How many times the batch the queries fill alone a batch beside ingest may take, both at the
/// mean, by the learned line. The queries' latency beside ingest grows about this much, at the
/// median and at p99 alike: each rides the rest of the running batch and then its own, both this
/// much longer. Scenario 20 (10 ms + 0.32 ms an input, the sidecar learning about 11.1 + 0.36 ms,
/// queries at 0.5× capacity), full runs with batches counted as TEI ran them: an aim of 1.3 gave
/// the queries 1.29× at p99 and the job 0.349× of capacity; 1.4 gave 1.38× and 0.435× (quick
/// runs: 1.2 1.20× and 0.263×, 1.45 1.44× and 0.426×, 1.5 1.49× and 0.460×). The aim is set for
/// the queries (the lanes hold them to 1.3× alone), with a margin for the noise of their p99; the
/// job gets what that leaves (about 0.3× of capacity there). A job at 0.4× beside those queries
/// needs batches 1.37× theirs alone by that line, whatever admits them.
pub const TARGET: f64 = 1.25;
/// Ingest keeps a floor of places beside queries only where it gains by riding full batches: a
/// full batch at least this many times cheaper an input than a batch of one, or at least
/// [`FLOOR_FIXED_SHARE`] of its time fixed (a batch of 2 saves at most 2× however flat the device;
/// a limit of 4 in front of 40 ms batches is such a pool). A GPU's fixed cost per forward pass
/// makes a full batch many times cheaper (scenario 20's backend: 16×, 49% fixed; scenario 19's:
/// 7×, 88%), and a job held to the few places the queries leave would lose most of the device.
/// TEI on CPU (about 14 ms + 21 ms an input, batches of 4) saves 1.4× and is 14% fixed: there each
/// ingest input beside queries costs every one of them about a query's own work (real TEI: query
/// p99 1.49× and 1.89× alone with a floor of 2, then of 1), and ingest loses little by going only
/// into an idle TEI.
const FLOOR_ECONOMY: f64 = 2.0;
/// See [`FLOOR_ECONOMY`].
const FLOOR_FIXED_SHARE: f64 = 0.25;
/// Batch sizes above this count as this one (a batch this large is far up any device's line).
const MAX_INPUTS: usize = 1024;
/// A size's mean follows its new times with this weight once seen this often (a plain mean before).
const SIZE_MEMORY: u32 = 20;
/// A size counts in the fit once seen this often, and weighs at most [`SIZE_MEMORY`].
const MIN_SEEN: u32 = 3;
/// A time this many times a size's mean (or under its share) counts as that far off, no more.
const OUTLIER: f64 = 2.0;
/// The fit needs sizes at least this many inputs apart (closer sizes differ by less than a
/// sleeping device's timer tick), or half the largest size apart where batches are that small.
const MIN_SPAN: usize = 4;

/// TEI's batch time as a line in its inputs, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    pub fixed: f64,
    pub per_input: f64,
}

impl Line {
    pub fn at(&self, inputs: f64) -> f64 {
        self.fixed + self.per_input * inputs
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Size {
    seen: u32,
    mean: f64,
}

#[derive(Debug, Default)]
pub struct BatchCurve {
    /// Indexed by a batch's inputs.
    sizes: Vec<Size>,
    /// The fit through `sizes`, redone on each observation: it is read on every ingest decision
    /// and every metrics snapshot, far more often than a batch ends.
    line: Option<Line>,
}

impl BatchCurve {
    /// TEI took `time` for a batch of `inputs`.
    pub fn observe(&mut self, inputs: usize, time: Duration) {
        if inputs == 0 || time.is_zero() {
            return;
        }
        let inputs = inputs.min(MAX_INPUTS);
        if self.sizes.len() <= inputs {
            self.sizes.resize(inputs + 1, Size::default());
        }
        let size = &mut self.sizes[inputs];
        let mut time = time.as_secs_f64();
        if size.seen >= MIN_SEEN {
            // A batch stalled by something else (a busy host, a hiccup) says little about the
            // curve: it moves the mean as far as one twice as long would.
            time = time.clamp(size.mean / OUTLIER, size.mean * OUTLIER);
        }
        size.seen = size.seen.saturating_add(1);
        let weight = 1.0 / f64::from(size.seen.min(SIZE_MEMORY));
        size.mean += weight * (time - size.mean);
        self.line = self.fit();
    }

    /// The weighted least-squares line through the sizes seen, if they span enough.
    pub fn line(&self) -> Option<Line> {
        self.line
    }

    fn fit(&self) -> Option<Line> {
        let seen = || {
            self.sizes
                .iter()
                .enumerate()
                .filter(|(_, size)| size.seen >= MIN_SEEN)
                .map(|(inputs, size)| (inputs as f64, size.mean, f64::from(size.seen.min(SIZE_MEMORY))))
        };
        let (smallest, largest) = seen().fold((f64::MAX, 0.0f64), |(lo, hi), (n, _, _)| (lo.min(n), hi.max(n)));
        if largest - smallest < (MIN_SPAN as f64).min(largest / 2.0) || largest == smallest {
            return None;
        }
        let total: f64 = seen().map(|(_, _, w)| w).sum();
        let mean_n = seen().map(|(n, _, w)| w * n).sum::<f64>() / total;
        let mean_t = seen().map(|(_, t, w)| w * t).sum::<f64>() / total;
        let spread: f64 = seen().map(|(n, _, w)| w * (n - mean_n).powi(2)).sum();
        let together: f64 = seen().map(|(n, t, w)| w * (n - mean_n) * (t - mean_t)).sum();
        // A batch never takes less for more inputs; a line that says so is noise about a flat one.
        let per_input = (together / spread).max(0.0);
        let fixed = (mean_t - per_input * mean_n).max(0.0);
        Some(Line { fixed, per_input })
    }
}

/// How many inputs TEI's next batch (at most `batch`) may hold, queries and ingest together,
/// before ingest stops adding to it, on a device whose batch time is `line`, with queries coming
/// at `query_rate` inputs a second and `left` before the batch starts: the largest batch that
/// takes at most [`TARGET`] × the batch the queries would fill alone, less the queries expected
/// to arrive in `left` (they join that batch too). Never less than half the batch (the fixed
/// reserve's own bound): few queries alone ride batches of a few inputs, and holding a job to as
/// few beside them would cost it most of the device for milliseconds a query. Unless the queries
/// need more than half of a full batch: on a device whose batch time grows with every input (TEI
/// on CPU), queries at 0.6× capacity fill 60% of each batch, and a floor of half let ingest fill
/// the next batch to half before they came (real TEI: query p99 1.49× alone beside ingest); the
/// floor is then what they leave of a full batch. And no floor where ingest gains little by
/// riding full batches (see [`FLOOR_ECONOMY`]): the places are then what the line allows, and none
/// where that leaves no whole input beside the queries a batch holds alone; ingest then goes only
/// while TEI is idle (`ingest_gate`).
pub fn ingest_places(line: Line, query_rate: f64, batch: usize, left: Duration) -> usize {
    let batch_f = batch as f64;
    // Queries alone fill each batch with what arrives while the one before runs: q = rate × T(q).
    let crowd = query_rate * line.per_input;
    if crowd >= 1.0 {
        return 0;
    }
    let queries_alone = (query_rate * line.fixed / (1.0 - crowd)).min(batch_f);
    let longest = TARGET * line.at(queries_alone);
    let queries_in_full = (query_rate * line.at(batch_f)).ceil();
    let by_line = match line.per_input > 0.0 {
        true => ((longest - line.fixed) / line.per_input).floor().min(batch_f),
        false => batch_f,
    };
    let economy = batch_f * line.at(1.0) / line.at(batch_f);
    let gains_by_riding = economy >= FLOOR_ECONOMY || line.fixed >= FLOOR_FIXED_SHARE * line.at(batch_f);
    if !gains_by_riding && by_line < queries_alone + 1.0 {
        // Not one ingest input fits beside the queries a batch holds alone, and no floor.
        return 0;
    }
    let floor = match gains_by_riding {
        true => (batch_f - queries_in_full).clamp(0.0, (batch / 2) as f64),
        false => 0.0,
    };
    let largest = by_line.max(floor);
    // Whole queries only: a place kept for a fraction of one is, more often than not, a place TEI
    // runs empty (a pool whose batch is a few inputs would keep one of two).
    let late = (query_rate * left.as_secs_f64()).floor();
    (largest - late).max(0.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1000.0)
    }

    /// Scenario 20's device: 10 ms and 0.32 ms an input (16 tokens at 20 µs), batches of 32.
    const JOB_DEVICE: Line = Line { fixed: 0.010, per_input: 0.000_32 };

    #[test]
    fn a_line_through_two_sizes_is_found() {
        let mut curve = BatchCurve::default();
        for _ in 0..10 {
            curve.observe(8, ms(12.56));
            curve.observe(32, ms(20.24));
        }
        let line = curve.line().unwrap();
        assert!((line.fixed - 0.010).abs() < 1e-6, "{line:?}");
        assert!((line.per_input - 0.000_32).abs() < 1e-8, "{line:?}");
    }

    #[test]
    fn one_size_or_sizes_too_close_say_nothing() {
        let mut curve = BatchCurve::default();
        for _ in 0..10 {
            curve.observe(32, ms(20.0));
        }
        assert_eq!(curve.line(), None, "every batch full");
        let mut small = BatchCurve::default();
        for _ in 0..10 {
            small.observe(1, ms(40.0));
            small.observe(2, ms(40.0));
        }
        assert!(small.line().is_some(), "a pool of batches of two: one and two are half apart");
        for _ in 0..10 {
            curve.observe(30, ms(19.0));
        }
        assert_eq!(curve.line(), None, "two inputs apart");
        curve.observe(8, ms(12.0));
        curve.observe(8, ms(12.0));
        assert_eq!(curve.line(), None, "a size seen twice is not yet a point");
        curve.observe(8, ms(12.0));
        assert!(curve.line().is_some());
    }

    #[test]
    fn noise_about_a_flat_device_gives_a_flat_line() {
        // A sleeping device's timer ticks: 20 or 21 ms whatever the size, a little more when small.
        let mut curve = BatchCurve::default();
        for i in 0..40 {
            let tick = if i % 2 == 0 { 20.0 } else { 21.0 };
            curve.observe(2, ms(tick + 0.3));
            curve.observe(8, ms(tick));
        }
        let line = curve.line().unwrap();
        assert_eq!(line.per_input, 0.0, "{line:?}");
        assert!((line.fixed - 0.0205).abs() < 0.000_5, "{line:?}");
    }

    #[test]
    fn an_old_size_still_pins_the_line_and_a_slow_batch_moves_it_little() {
        let mut curve = BatchCurve::default();
        for _ in 0..SIZE_MEMORY {
            curve.observe(9, ms(12.88));
        }
        for _ in 0..10_000 {
            curve.observe(32, ms(20.24));
        }
        curve.observe(32, ms(200.0));
        let line = curve.line().unwrap();
        assert!((line.per_input - 0.000_32).abs() < 0.000_1, "{line:?}");
    }

    #[test]
    fn a_flat_device_gives_ingest_the_whole_batch_but_the_late_queries() {
        let flat = Line { fixed: 0.020, per_input: 0.0 };
        assert_eq!(ingest_places(flat, 200.0, 8, Duration::ZERO), 8);
        assert_eq!(ingest_places(flat, 200.0, 8, ms(5.0)), 7, "one query expected in the last 5 ms");
        assert_eq!(ingest_places(flat, 60.0, 2, ms(10.0)), 2, "none kept for 0.6 of a query");
        // Scenario 19's device, 20 ms and 0.32 ms an input: a full batch of 8 is 1.05× the queries'.
        let nearly_flat = Line { fixed: 0.020, per_input: 0.000_32 };
        assert_eq!(ingest_places(nearly_flat, 213.0, 8, Duration::ZERO), 8);
        // A limit of 4 (a batch of 2) in front of 40 ms batches, a millisecond more an input.
        let nearly_flat_pair = Line { fixed: 0.040, per_input: 0.001 };
        assert_eq!(ingest_places(nearly_flat_pair, 30.0, 2, Duration::ZERO), 2);
    }

    #[test]
    fn a_climbing_device_keeps_what_the_queries_p99_needs() {
        // Queries at 690/s fill about 9 of 32 alone (12.8 ms); 1.25× that is 16.0 ms, 18 inputs.
        assert_eq!(ingest_places(JOB_DEVICE, 690.0, 32, Duration::ZERO), 18);
        assert!(JOB_DEVICE.at(18.0) <= TARGET * JOB_DEVICE.at(8.85));
        assert!(JOB_DEVICE.at(19.0) > TARGET * JOB_DEVICE.at(8.85));
        assert_eq!(ingest_places(JOB_DEVICE, 690.0, 32, ms(4.0)), 16, "2.8 more queries come in 4 ms");
        // Fewer queries ride shorter batches alone, but ingest keeps at least half the batch.
        assert_eq!(ingest_places(JOB_DEVICE, 100.0, 32, Duration::ZERO), 16);
        assert_eq!(ingest_places(JOB_DEVICE, 100.0, 32, ms(10.0)), 15);
        // A steeper device keeps more.
        let steep = Line { fixed: 0.002, per_input: 0.000_5 };
        assert_eq!(ingest_places(steep, 690.0, 32, Duration::ZERO), 16, "half the batch at most");
    }

    #[test]
    fn queries_needing_most_of_a_full_batch_keep_it_from_the_floor() {
        // A device with a fixed cost to share (a full batch of 4 is 2× cheaper an input than one
        // alone, a third of it fixed) where queries at 0.54× capacity arrive 2.16 to a full batch:
        // ingest keeps the one left, where the line alone would keep it none.
        let shared = Line { fixed: 0.030, per_input: 0.015 };
        assert_eq!(ingest_places(shared, 24.0, 4, Duration::ZERO), 1);
        // At 0.18× capacity they need 0.72 of 4: ingest keeps its half.
        assert_eq!(ingest_places(shared, 8.0, 4, Duration::ZERO), 2);
    }

    #[test]
    fn a_device_with_little_to_share_keeps_no_floor_beside_queries() {
        // TEI on CPU (all-MiniLM-L6-v2, batches of 4): about 14 ms + 21 ms an input, a full batch
        // 1.4× cheaper an input than one alone and 14% fixed. Any ingest input beside queries lengthens their
        // batch by most of a query's own time, at 0.6× capacity and at 0.3×.
        let cpu = Line { fixed: 0.014, per_input: 0.021 };
        assert_eq!(ingest_places(cpu, 24.0, 4, Duration::ZERO), 0);
        assert_eq!(ingest_places(cpu, 12.0, 4, Duration::ZERO), 0);
    }

    #[test]
    fn queries_that_fill_batches_alone_leave_nothing() {
        assert_eq!(ingest_places(JOB_DEVICE, 5000.0, 32, Duration::ZERO), 0);
    }
}
