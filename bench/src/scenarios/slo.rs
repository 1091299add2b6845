//! Scenario 4, throughput under a latency bound (an NVIDIA GTC throughput talk's method): the
//! highest Poisson rate at which 99% of requests come back OK within the SLO, found by binary
//! search, direct and through the multiplexer. The SLO is also each request's deadline, as a
//! client with an SLO would set it; failed requests count as misses.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::LoadConfig;

use super::overload::{Capacity, measure_capacity, mux_limits};
use super::{Context, Measurement, gpu_model, measure, sim_and_mux};
use crate::Result;
use crate::procs::{Device, MuxLimits, Proc, SimModel};
use crate::targets::{Target, ratio};

/// About four batch times of the scenario-2 backend.
pub const SLO: Duration = Duration::from_millis(100);
pub const QUANTILE: f64 = 0.99;

/// One probe of the search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub rate: f64,
    pub in_slo: f64,
    pub passed: bool,
}

/// Binary search between `lo` (assumed to pass) and `hi` (assumed to fail) for `steps` probes;
/// returns the highest passing rate seen and the probes. Pure over `probe`, so it is testable.
pub async fn search<F, Fut>(mut lo: f64, mut hi: f64, steps: usize, mut probe: F) -> Result<(f64, Vec<Probe>)>
where
    F: FnMut(f64) -> Fut,
    Fut: Future<Output = Result<f64>>,
{
    let mut probes = Vec::new();
    let mut best = 0.0_f64;
    for _ in 0..steps {
        let rate = (lo + hi) / 2.0;
        let in_slo = probe(rate).await?;
        let passed = in_slo >= QUANTILE;
        if passed {
            best = best.max(rate);
            lo = rate;
        } else {
            hi = rate;
        }
        probes.push(Probe { rate, in_slo, passed });
    }
    Ok((best, probes))
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Search {
    /// The highest rate that met the SLO, req/s (0 when none did).
    pub best: f64,
    pub probes: Vec<Probe>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub capacity: Capacity,
    pub slo_ms: f64,
    pub seconds_per_probe: u64,
    /// The search range, req/s.
    pub range: (f64, f64),
    pub direct: Search,
    pub mux: Search,
}

impl Slo {
    /// No target is stated for this scenario; the ratio is reported.
    pub fn ratio(&self) -> f64 {
        ratio(self.mux.best, self.direct.best)
    }
}

async fn in_slo(target: &Proc, rate: f64, duration: Duration) -> Result<f64> {
    let config = LoadConfig {
        connections: 4,
        deadline: Some(SLO),
        grace: Duration::from_secs(3),
        seed: 7,
        ..LoadConfig::open(target.url(), rate, duration)
    };
    let report = measure(config).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(if report.sent == 0 { 0.0 } else { report.ok_in_time as f64 / report.sent as f64 })
}

impl Measurement for Slo {
    const KEY: &'static str = "slo";
    const TITLE: &'static str = "Throughput under a latency SLO";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = gpu_model(512, Device::Sleep);
        let limits = mux_limits();
        let (sim, mux) = sim_and_mux(ctx, "slo", &backend, &limits, 4).await?;
        let capacity = measure_capacity(ctx, &sim, 16, 64).await?;
        let steps = ctx.pick(4, 8);
        let duration = ctx.pick(Duration::from_secs(2), Duration::from_secs(6));
        let range = (0.1 * capacity.rps, 1.2 * capacity.rps);

        ctx.say(&format!("slo: binary search for the highest rate with p99 ≤ {} ms, direct", SLO.as_millis()));
        let (best, probes) = search(range.0, range.1, steps, |rate| in_slo(&sim, rate, duration)).await?;
        let direct = Search { best, probes };
        ctx.say("slo: the same through the multiplexer");
        let (best, probes) = search(range.0, range.1, steps, |rate| in_slo(&mux, rate, duration)).await?;
        let mux = Search { best, probes };
        Ok(Slo {
            backend,
            limits,
            capacity,
            slo_ms: SLO.as_secs_f64() * 1e3,
            seconds_per_probe: duration.as_secs(),
            range,
            direct,
            mux,
        })
    }

    fn targets(&self) -> Vec<Target> {
        Vec::new()
    }

    fn planned_targets() -> Vec<Target> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn search_converges_on_the_threshold() {
        // A system that meets the SLO below 300 req/s.
        let (best, probes) =
            search(0.0, 1000.0, 10, |rate| async move { Ok(if rate <= 300.0 { 1.0 } else { 0.5 }) }).await.unwrap();
        assert_eq!(probes.len(), 10);
        assert!(best <= 300.0 && best > 299.0, "{best}");
        assert!(probes.iter().all(|p| p.passed == (p.rate <= 300.0)));
    }

    #[tokio::test]
    async fn nothing_passes_gives_zero() {
        let (best, _) = search(0.0, 100.0, 3, |_| async { Ok(0.0) }).await.unwrap();
        assert_eq!(best, 0.0);
    }
}
