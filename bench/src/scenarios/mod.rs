//! The `make bench` scenarios. Each one starts its own backend (the simulator) and multiplexer as
//! separate processes, measures the same traffic direct and through the multiplexer in one run,
//! and returns a typed result; targets ([`crate::targets`]) and the renderer ([`crate::render`])
//! read those results, so no scenario formats anything itself.

pub mod adaptive;
pub mod burst;
pub mod coalescing;
pub mod cost;
pub mod fairness;
pub mod http_overhead;
pub mod http_overload;
pub mod live_limits;
pub mod overhead;
pub mod overload;
pub mod pushback;
pub mod shed_storm;
pub mod slo;
pub mod spillover;
pub mod streams;
pub mod tls;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::inputs::{Inputs, Tokens};
use teifleet_load::{LoadConfig, Report};
use tokio::time::Instant;

use crate::Result;
use crate::procs::{Bins, Device, Features, MuxLimits, SimModel};
use crate::results::{Outcome, Section};
use crate::targets::Target;

/// What every scenario gets.
#[derive(Clone, Debug)]
pub struct Context {
    pub bins: Bins,
    pub features: Features,
    /// Quick mode: fewer requests and shorter runs, same scenarios.
    pub quick: bool,
    /// The local control plane for the live-limit scenario; without it that scenario is skipped.
    pub kubeconfig: Option<PathBuf>,
    pub repo_root: PathBuf,
    pub started: Instant,
}

impl Context {
    /// A progress line on stderr (the run is long; people want to see where it is).
    pub fn say(&self, message: &str) {
        eprintln!("[bench {:>6.1}s] {message}", self.started.elapsed().as_secs_f64());
    }

    /// `quick` or `full` value.
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick { quick } else { full }
    }
}

/// The scenarios, in the order they run and are numbered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    Overhead,
    Overload,
    Burst,
    Slo,
    Cost,
    LiveLimits,
    ShedStorm,
    Streams,
    Coalescing,
    AdaptiveLimit,
    Fairness,
    Pushback,
    HttpOverhead,
    HttpOverload,
    Spillover,
    Tls,
}

impl Scenario {
    pub const ALL: [Self; 16] = [
        Self::Overhead,
        Self::Overload,
        Self::Burst,
        Self::Slo,
        Self::Cost,
        Self::LiveLimits,
        Self::ShedStorm,
        Self::Streams,
        Self::Coalescing,
        Self::AdaptiveLimit,
        Self::Fairness,
        Self::Pushback,
        Self::HttpOverhead,
        Self::HttpOverload,
        Self::Spillover,
        Self::Tls,
    ];

    pub fn number(self) -> usize {
        Self::ALL.iter().position(|s| *s == self).map_or(0, |i| i + 1)
    }

    pub fn key(self) -> &'static str {
        match self {
            Self::Overhead => "overhead",
            Self::Overload => "overload",
            Self::Burst => "burst",
            Self::Slo => "slo",
            Self::Cost => "cost",
            Self::LiveLimits => "live-limits",
            Self::ShedStorm => "shed-storm",
            Self::Streams => "streams",
            Self::Coalescing => "coalescing",
            Self::AdaptiveLimit => "adaptive-limit",
            Self::Fairness => "fairness",
            Self::Pushback => "pushback",
            Self::HttpOverhead => "http-overhead",
            Self::HttpOverload => "http-overload",
            Self::Spillover => "spillover",
            Self::Tls => "tls",
        }
    }

    /// How targets name their scenario: `7 shed storm`.
    pub fn label(self) -> String {
        format!("{} {}", self.number(), self.key().replace('-', " "))
    }

    pub fn title(self) -> String {
        let title = match self {
            Self::Overhead => "Overhead: one hop, direct vs the multiplexer vs the floor",
            Self::Overload => "Overload: goodput and latency from 0.5× to 10× capacity",
            Self::Burst => "Burst: 2,048 concurrent clients, tiny inputs",
            Self::Slo => "Throughput under a latency SLO",
            Self::Cost => "Cost: CPU and instructions per call, memory per queued call",
            Self::LiveLimits => "Live limit change latency (local control plane)",
            Self::ShedStorm => "Shed storm: 512 clients resending every refusal at a CPU-bound backend",
            Self::Streams => "Streams: a 20-message EmbedStream, direct vs the multiplexer",
            Self::Coalescing => "Coalescing: a Zipf query mix at 2× capacity, with and without --coalesce",
            Self::AdaptiveLimit => "Adaptive limit: one --adaptive config vs the best static limit per backend",
            Self::Fairness => "Fairness: a tenant flooding at 5× capacity beside a light one",
            Self::Pushback => "Pushback: 300 callers retrying against 2 in flight + 4 queued",
            Self::HttpOverhead => "HTTP overhead: TEI's HTTP API through the sidecar vs gRPC through it vs direct",
            Self::HttpOverload => "HTTP overload: goodput at 2× to 10× capacity over HTTP vs gRPC, one sidecar",
            Self::Spillover => "Spillover: a client pinned to one replica gets the whole pool",
            Self::Tls => "TLS cost: a call through the multiplexer in TLS vs in plaintext",
        };
        format!("{}. {title}", self.number())
    }

    /// `3` or `burst`.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        Self::ALL.into_iter().find(|x| x.key() == s || s.parse::<usize>().is_ok_and(|n| n == x.number()))
    }

    /// The targets this scenario would report, unmeasured (for a run that could not measure).
    pub fn planned_targets(self) -> Vec<Target> {
        match self {
            Self::Overhead => overhead::planned_targets(),
            Self::Overload => overload::planned_targets(),
            Self::Burst => burst::planned_targets(),
            Self::Slo => vec![],
            Self::Cost => cost::planned_targets(),
            Self::LiveLimits => live_limits::planned_targets(),
            Self::ShedStorm => shed_storm::planned_targets(),
            Self::Streams => streams::planned_targets(),
            Self::Coalescing => coalescing::planned_targets(),
            Self::AdaptiveLimit => adaptive::planned_targets(),
            Self::Fairness => fairness::planned_targets(),
            Self::Pushback => pushback::planned_targets(),
            Self::HttpOverhead => http_overhead::planned_targets(),
            Self::HttpOverload => http_overload::planned_targets(),
            Self::Spillover => spillover::planned_targets(),
            Self::Tls => tls::planned_targets(),
        }
    }
}

/// Runs one scenario; a scenario that could not measure still gets a section saying why.
pub async fn run(ctx: &Context, scenario: Scenario) -> Section {
    let outcome = match scenario {
        Scenario::Overhead => overhead::run(ctx).await.map(|r| Outcome::Overhead(Box::new(r))),
        Scenario::Overload => overload::run(ctx).await.map(|r| Outcome::Overload(Box::new(r))),
        Scenario::Burst => burst::run(ctx).await.map(|r| Outcome::Burst(Box::new(r))),
        Scenario::Slo => slo::run(ctx).await.map(|r| Outcome::Slo(Box::new(r))),
        Scenario::Cost => cost::run(ctx).await.map(|r| Outcome::Cost(Box::new(r))),
        Scenario::LiveLimits => live_limits::run(ctx).await.map(|r| Outcome::LiveLimits(Box::new(r))),
        Scenario::ShedStorm => shed_storm::run(ctx).await.map(|r| Outcome::ShedStorm(Box::new(r))),
        Scenario::Streams => streams::run(ctx).await.map(|r| Outcome::Streams(Box::new(r))),
        Scenario::Coalescing => coalescing::run(ctx).await.map(|r| Outcome::Coalescing(Box::new(r))),
        Scenario::AdaptiveLimit => adaptive::run(ctx).await.map(|r| Outcome::AdaptiveLimit(Box::new(r))),
        Scenario::Fairness => fairness::run(ctx).await.map(|r| Outcome::Fairness(Box::new(r))),
        Scenario::Pushback => pushback::run(ctx).await.map(|r| Outcome::Pushback(Box::new(r))),
        Scenario::HttpOverhead => http_overhead::run(ctx).await.map(|r| Outcome::HttpOverhead(Box::new(r))),
        Scenario::HttpOverload => http_overload::run(ctx).await.map(|r| Outcome::HttpOverload(Box::new(r))),
        Scenario::Spillover => spillover::run(ctx).await.map(|r| Outcome::Spillover(Box::new(r))),
        Scenario::Tls => tls::run(ctx).await.map(|r| Outcome::Tls(Box::new(r))),
    };
    match outcome {
        Ok(outcome) => Section::measured(scenario, outcome),
        Err(error) => {
            ctx.say(&format!("{}: not measured: {error}", scenario.key()));
            Section::not_measured(scenario, &error.to_string())
        }
    }
}

/// The GPU-like backend of the overload, burst, SLO, storm and coalescing scenarios: TEI batching
/// at most 8 requests per device batch, 20 ms per batch plus 20 µs per token (a small embedding
/// model on a modest GPU, slowed so that 10× its capacity is still a load this 2-core machine
/// can offer).
pub fn gpu_model(max_concurrent_requests: usize, device: Device) -> SimModel {
    SimModel {
        max_concurrent_requests,
        max_batch_requests: Some(8),
        fixed_latency: Duration::from_millis(20),
        per_token_latency: Duration::from_micros(20),
        device,
    }
}

/// The fast backend of the cost and live-limit scenarios: about 1 ms per call on a sleeping
/// device (its timer ticks in milliseconds, so a batch takes at least ~1 ms) that leaves the CPU
/// to the processes being measured.
pub fn fast_model() -> SimModel {
    SimModel {
        max_concurrent_requests: 512,
        max_batch_requests: None,
        fixed_latency: Duration::ZERO,
        per_token_latency: Duration::from_micros(1),
        device: Device::Sleep,
    }
}

/// The backend of the overhead and stream scenarios: 1 ms + 1 µs/token per batch, spent spinning
/// so it is exact (a sleeping device rounds to timer ticks, and a closed loop phase-locks to
/// them, which hides or inflates a hop's microseconds). Without a spinning simulator, the fast
/// model.
pub fn precise_model(features: Features) -> SimModel {
    if !features.sim_spin {
        return fast_model();
    }
    SimModel { fixed_latency: Duration::from_millis(1), device: Device::Spin, ..fast_model() }
}

/// Multiplexer limits under which admission never waits: what a hop costs, without a queue.
pub fn unhurried_limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: 64,
        max_queued: 256,
        queue_timeout: Duration::from_secs(2),
        max_concurrent_streams: 256,
        coalesce: false,
    }
}

/// Runs one load, quietly.
pub async fn measure(config: LoadConfig) -> Result<Report> {
    Ok(teifleet_load::run(&LoadConfig { progress: false, ..config }).await?)
}

/// A short closed-loop warm-up so connections, allocators and the simulator's batcher are warm
/// before anything is measured.
pub async fn warm_up(target: &str, connections: usize) -> Result<()> {
    let config = LoadConfig { connections, ..LoadConfig::closed(target, 4, 200) };
    measure(config).await.map(|_| ())
}

/// Inputs of `tokens` words.
pub fn words(tokens: usize) -> Inputs {
    Inputs::Words(Tokens::Fixed(tokens))
}

/// Runs `config(target)` against every target `rounds` times, rotating which goes first in each
/// round, so slow drift on the machine favours none. Returns one report per round, per target.
pub async fn interleaved(
    targets: &[String],
    rounds: usize,
    config: impl Fn(&str) -> LoadConfig,
) -> Result<Vec<Vec<Report>>> {
    let mut out = vec![Vec::with_capacity(rounds); targets.len()];
    for round in 0..rounds {
        for k in 0..targets.len() {
            let side = (round + k) % targets.len();
            out[side].push(measure(config(&targets[side])).await?);
        }
    }
    Ok(out)
}

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
    fn scenarios_parse_by_number_or_key_and_label_themselves() {
        assert_eq!(Scenario::parse("7"), Some(Scenario::ShedStorm));
        assert_eq!(Scenario::parse("shed-storm"), Some(Scenario::ShedStorm));
        assert_eq!(Scenario::parse("10"), Some(Scenario::AdaptiveLimit));
        assert_eq!(Scenario::parse("pushback"), Some(Scenario::Pushback));
        assert_eq!(Scenario::parse("13"), Some(Scenario::HttpOverhead));
        assert_eq!(Scenario::parse("http-overload"), Some(Scenario::HttpOverload));
        assert_eq!(Scenario::parse("15"), Some(Scenario::Spillover));
        assert_eq!(Scenario::parse("spillover"), Some(Scenario::Spillover));
        assert_eq!(Scenario::parse("16"), Some(Scenario::Tls));
        assert_eq!(Scenario::parse("tls"), Some(Scenario::Tls));
        assert_eq!(Scenario::Tls.label(), "16 tls");
        assert_eq!(Scenario::parse("17"), None);
        assert_eq!(Scenario::ShedStorm.label(), "7 shed storm");
        assert!(Scenario::Coalescing.title().starts_with("9. Coalescing"));
        assert!(Scenario::ALL.iter().enumerate().all(|(i, s)| s.number() == i + 1));
    }

    #[test]
    fn added_latency_is_the_median_of_per_round_differences() {
        let s = |p50_ms| Sample { p50_ms, ..Sample::default() };
        let direct = [s(1.0), s(1.1), s(5.0)];
        let through = [s(1.05), s(1.13), s(9.0)];
        // Differences 50, 30 and 4000 µs: one wild round does not move the median.
        assert!((added_p50_us(&direct, &through) - 50.0).abs() < 1e-6);
    }
}
