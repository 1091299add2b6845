//! A scenario's rows: the per-round figures a latency comparison keeps (the whole load report
//! stays out of the results file: dozens of them per scenario), and how rounds are summarised.

use serde::{Deserialize, Serialize};
use teifleet_load::Report;

/// The floors' sides of a case that runs them (scenarios 1 and 8), each empty when that floor did
/// not run (or in results written before it was added).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FloorSides {
    /// Through the bare h2 proxy; empty when the floor proxy was not built.
    #[serde(default)]
    pub floor_h2: Vec<Sample>,
    /// Through HAProxy in `mode tcp`; empty when HAProxy did not run.
    #[serde(default)]
    pub haproxy_tcp: Vec<Sample>,
    /// Through HAProxy as an h2c proxy; empty when HAProxy did not run.
    #[serde(default)]
    pub haproxy_h2: Vec<Sample>,
}

/// The figures of one run that a latency comparison needs (the whole report stays out of the
/// results file: dozens of them per scenario).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub sent: u64,
    pub ok: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    /// TEI's device time per answer (p50), from the answers' Metadata.
    pub tei_inference_p50_ms: Option<f64>,
}

impl From<&Report> for Sample {
    fn from(r: &Report) -> Self {
        Self {
            sent: r.sent,
            ok: r.ok,
            p50_ms: r.latency_ok.p50_ms,
            p99_ms: r.latency_ok.p99_ms,
            mean_ms: r.latency_ok.mean_ms,
            tei_inference_p50_ms: r.tei_inference.map(|s| s.p50_ms),
        }
    }
}

/// Per-round samples of one side of a comparison.
pub fn samples(reports: &[Report]) -> Vec<Sample> {
    reports.iter().map(Sample::from).collect()
}

/// The median over rounds of `f` of each round.
pub fn median_of(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    crate::targets::median(&samples.iter().map(f).collect::<Vec<_>>())
}

/// Added p50 of `through` over `direct`, in µs: the median over rounds of each round's difference
/// (rounds ran back to back, so each difference compares like with like).
pub fn added_p50_us(direct: &[Sample], through: &[Sample]) -> f64 {
    let diffs: Vec<f64> = direct.iter().zip(through).map(|(d, t)| (t.p50_ms - d.p50_ms) * 1e3).collect();
    crate::targets::median(&diffs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_latency_is_the_median_of_per_round_differences() {
        let s = |p50_ms| Sample { p50_ms, ..Sample::default() };
        let direct = [s(1.0), s(1.1), s(5.0)];
        let through = [s(1.05), s(1.13), s(9.0)];
        // Differences 50, 30 and 4000 µs: one wild round does not move the median.
        assert!((added_p50_us(&direct, &through) - 50.0).abs() < 1e-6);
    }
}
