//! Scenario 4, throughput under a latency bound (seed 002): the highest Poisson rate at which
//! 99% of requests come back OK within the SLO, found by binary search, direct and through the
//! multiplexer. The SLO is also each request's deadline, as a client with an SLO would set it;
//! failed requests count as misses.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::overload::{measure_capacity, mux_limits};
use super::procs::{self, Proc};
use super::{Context, failed_section, gpu_model, measure, warm_up};
use crate::Result;
use crate::load::LoadConfig;
use crate::results::Section;

const KEY: &str = "slo";
const TITLE: &str = "4. Throughput under a latency SLO (seed 002)";
/// About four batch times of the scenario-2 backend.
const SLO: Duration = Duration::from_millis(100);
const QUANTILE: f64 = 0.99;

/// One probe of the search.
#[derive(Clone, Debug, Serialize)]
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

pub async fn run(ctx: &Context) -> Section {
    match measure_all(ctx).await {
        Ok(section) => section,
        Err(e) => failed_section(KEY, TITLE, &e, vec![]),
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

async fn measure_all(ctx: &Context) -> Result<Section> {
    let model = gpu_model(512);
    let sim = procs::start_sim(&ctx.bins, "slo-sim", &model).await?;
    let limits = mux_limits();
    let mux = procs::start_mux(&ctx.bins, "slo-mux", &sim, &limits).await?;
    warm_up(&sim.url(), 4).await?;
    warm_up(&mux.url(), 4).await?;
    let capacity = measure_capacity(ctx, &sim, 16).await?;
    let steps = ctx.pick(4, 8);
    let duration = ctx.pick(Duration::from_secs(2), Duration::from_secs(6));
    let (lo, hi) = (0.1 * capacity.rps, 1.2 * capacity.rps);

    ctx.say(&format!("slo: binary search for the highest rate with p99 ≤ {} ms, direct", SLO.as_millis()));
    let (direct_best, direct_probes) = search(lo, hi, steps, |rate| in_slo(&sim, rate, duration)).await?;
    ctx.say("slo: the same through the multiplexer");
    let (mux_best, mux_probes) = search(lo, hi, steps, |rate| in_slo(&mux, rate, duration)).await?;

    let mut markdown = String::new();
    let _ = writeln!(
        markdown,
        "The scenario-2 backend (capacity {:.1} req/s, batch {:.2} ms) and multiplexer. SLO: p99 ≤ {} ms, i.e. at \
         least 99% of the requests sent come back OK within {} ms of their scheduled time (the SLO is also their \
         deadline). {} probes of {} s each between {:.0} and {:.0} req/s, open loop, Poisson, 4 connections.\n",
        capacity.rps,
        capacity.batch_ms,
        SLO.as_millis(),
        SLO.as_millis(),
        steps,
        duration.as_secs(),
        lo,
        hi
    );
    let _ = writeln!(markdown, "| setup | highest rate within SLO | × capacity | probes (rate: share in SLO) |");
    let _ = writeln!(markdown, "| --- | ---: | ---: | --- |");
    for (name, best, probes) in
        [("direct", direct_best, &direct_probes), ("through the multiplexer", mux_best, &mux_probes)]
    {
        let list: Vec<String> = probes.iter().map(|p| format!("{:.0}: {:.3}", p.rate, p.in_slo)).collect();
        let _ = writeln!(markdown, "| {name} | {best:.1} req/s | {:.3} | {} |", best / capacity.rps, list.join(", "));
    }
    let _ = writeln!(
        markdown,
        "\nNo target is stated for this scenario; the ratio multiplexer/direct is {:.3}.",
        if direct_best > 0.0 { mux_best / direct_best } else { f64::NAN }
    );
    Ok(Section {
        key: KEY.into(),
        title: TITLE.into(),
        markdown,
        data: json!({ "slo_ms": SLO.as_millis(), "capacity": capacity, "direct": { "best": direct_best, "probes": direct_probes },
            "multiplexer": { "best": mux_best, "probes": mux_probes } }),
        targets: vec![],
        plots: vec![],
    })
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
