//! Scenario 21, real TEI (issue 44): the sidecar in front of a real Hugging Face TEI instead of
//! the simulator. TEI 1.9.3 on this machine's CPU (candle, no MKL, so it batches at most 4
//! requests), all-MiniLM-L6-v2 (384 dimensions), from the cache `../shared/tools/real-tei.sh`
//! builds; without that cache the scenario is not measured and says why (CI never builds it).
//! Every figure is a ratio of two loads of the same run, direct to TEI and through the sidecar:
//!
//! 1. throughput through a tight budget: `--max-in-flight 4` (TEI's batch), 64 closed-loop callers
//!    of 20-token Embeds, texts/s through ÷ direct, interleaved rounds (≥ 0.95);
//! 2. patient callers: 600 calls from 64 callers with 30 s deadlines, `--max-queued 64`: every one
//!    served in time, and the throughput ratio beside;
//! 3. a storm with deadlines: 256 callers with 30 s deadlines through a sidecar with `--adaptive`,
//!    goodput ÷ TEI's capacity (direct, at its best of several concurrencies, just before) (≥ 0.9);
//! 4. the hop: Info and one 20-token Embed at a time, the p50 the sidecar adds over TEI direct
//!    beside what HAProxy h2 (scenario 1's L7 floor) adds; sidecar ÷ HAProxy on Info (≤ 0.8);
//! 5. the auto-batching proxy's table: single-input `POST /embed` from 2,048 callers, TEI's HTTP
//!    router direct vs the sidecar's HTTP front (in front of the gRPC router), p99 (≤ 0.15×) and
//!    throughput (≥ 1.0×);
//! 6. lanes: queries at 0.6 × capacity with 1 s deadlines alone and beside an ingest flood, as
//!    scenario 19 on the simulator, p99 beside ÷ alone (≤ 1.3);
//! 7. bulk at 384 dimensions: one `EmbedArrow` call of N rows and one `EmbedStream` call of N
//!    messages through row 1's sidecar (default flags otherwise), each texts/s ÷ 64 unary callers'
//!    through the same sidecar (≥ 0.9, scenario 18's target), every row answered once, in place, 384 long,
//!    a sample equal to TEI direct's vector (cosine ≥ 0.9999). N = 800 (quick 200): 20,000 rows,
//!    scenario 18's call, would take 500–600 s on this CPU TEI.
//!
//! Rows 5 and 6 start processes of their own (TEI's HTTP router, another sidecar); when one of
//! them, or row 7, cannot run, its targets are SKIP with the reason and the other rows stand.

pub mod bulk;
mod hop;
mod http;
pub mod lanes;
mod storm;
mod throughput;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};

pub use self::bulk::RealBulk;
pub use self::hop::{Hop, HopCase};
pub use self::http::HttpStorm;
pub use self::lanes::Lanes;
pub use self::storm::{CALLERS as STORM_CALLERS, DEADLINE as STORM_DEADLINE, Storm};
pub use self::throughput::{Patient, Throughput};
use super::{Context, Measurement, Scenario, measure, words};
use crate::procs::{self, MuxLimits, Proc, RealTeiCache};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result};

/// Tokens of every Embed (words of the load generator; the model's tokenizer makes a few more).
pub const TOKENS: usize = 20;
/// The most requests this CPU TEI puts in one batch ("Backend does not support a batch size > 4").
pub const TEI_BATCH: usize = 4;
/// TEI's own `--max-concurrent-requests`, on both routers: above the 2,048 HTTP callers of row 5,
/// so TEI direct queues every caller (as the auto-batching proxy's table has it: no failures)
/// instead of refusing three in four at its default 512.
pub const TEI_MAX_CONCURRENT: usize = 4096;

/// Row 1's texts/s through ÷ direct, at least.
pub const THROUGHPUT_LIMIT: f64 = 0.95;
/// Row 2: the share of the calls answered OK within their deadline, at least.
pub const SERVED_LIMIT: f64 = 1.0;
/// Row 3: goodput ÷ capacity, at least.
pub const STORM_LIMIT: f64 = 0.9;
/// Row 4: the sidecar's added Info p50 ÷ HAProxy h2's, at most.
pub const HOP_LIMIT: f64 = 0.8;
/// Row 5: p99 through ÷ direct, at most.
pub const HTTP_P99_LIMIT: f64 = 0.15;
/// Row 5: throughput through ÷ direct, at least.
pub const HTTP_THROUGHPUT_LIMIT: f64 = 1.0;
/// Row 6: the queries' p99 beside an ingest flood ÷ alone, at most (scenario 19's target).
pub const LANES_LIMIT: f64 = 1.3;

/// The static sidecar of rows 1, 2 and 4: TEI's batch in flight, 64 waiting, as long as a
/// patient caller's deadline.
pub fn static_limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: TEI_BATCH,
        max_queued: 64,
        queue_timeout: Duration::from_secs(30),
        max_concurrent_streams: 256,
        coalesce: false,
    }
}

/// One load's figures: what a throughput comparison needs, and the codes of what failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub sent: u64,
    pub ok: u64,
    /// OK within the deadline (all OK answers without one).
    pub ok_in_time: u64,
    pub elapsed_s: f64,
    /// OK answers per second: texts embedded per second (one text per call).
    pub ok_per_s: f64,
    /// OK answers within the deadline per second.
    pub goodput_per_s: f64,
    /// Of the OK answers.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Of every answer, refusals and deadlines included (a queue that sheds must not look faster
    /// for it).
    #[serde(default)]
    pub p99_all_ms: f64,
    /// Answers by gRPC code (HTTP statuses counted under theirs).
    pub codes: BTreeMap<String, u64>,
}

impl From<&Report> for Run {
    fn from(r: &Report) -> Self {
        let secs = r.elapsed_s.max(1e-9);
        Self {
            sent: r.sent,
            ok: r.ok,
            ok_in_time: r.ok_in_time,
            elapsed_s: r.elapsed_s,
            ok_per_s: r.ok as f64 / secs,
            goodput_per_s: r.goodput_rps,
            p50_ms: r.latency_ok.p50_ms,
            p99_ms: r.latency_ok.p99_ms,
            p99_all_ms: r.latency.p99_ms,
            codes: r.codes.clone(),
        }
    }
}

impl Run {
    /// `OK 600` or `OK 590, DEADLINE_EXCEEDED 10`.
    pub fn codes_text(&self) -> String {
        self.codes.iter().map(|(code, n)| format!("{code} {n}")).collect::<Vec<_>>().join(", ")
    }
}

/// The median over rounds of `f(through) ÷ f(direct)`, each round's pair compared (the rounds
/// ran back to back, so each ratio compares like with like).
pub fn round_ratio(direct: &[Run], through: &[Run], f: impl Fn(&Run) -> f64) -> f64 {
    let ratios: Vec<f64> = direct.iter().zip(through).map(|(d, t)| ratio(f(t), f(d))).collect();
    crate::targets::median(&ratios)
}

/// A closed loop of `callers` 20-token Embeds over 4 connections, bounded by `requests` and
/// `seconds`, every caller's answer awaited at most a minute past the end.
pub fn closed(target: &str, callers: usize, requests: u64, seconds: Duration) -> LoadConfig {
    LoadConfig {
        inputs: words(TOKENS),
        connections: 4,
        duration: seconds,
        grace: Duration::from_secs(60),
        ..LoadConfig::closed(target, callers, requests)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RealTei {
    /// The cache the routers and the model came from.
    pub cache: String,
    pub model: String,
    /// The sidecar of rows 1, 2 and 4.
    pub limits: MuxLimits,
    pub throughput: Throughput,
    pub patient: Patient,
    pub storm: Storm,
    pub hop: Hop,
    /// Row 5; `None` when the HTTP router is not built (`http_missing` says so).
    pub http: Option<HttpStorm>,
    #[serde(default)]
    pub http_missing: Option<String>,
    /// Row 6; `None` when it could not run (`lanes_missing` says why).
    #[serde(default)]
    pub lanes: Option<Lanes>,
    #[serde(default)]
    pub lanes_missing: Option<String>,
    /// Row 7; `None` when it could not run (`bulk_missing` says why).
    #[serde(default)]
    pub bulk: Option<RealBulk>,
    #[serde(default)]
    pub bulk_missing: Option<String>,
}

/// The processes every row shares: TEI's gRPC router and the static sidecar in front of it.
pub struct Shared {
    pub tei: Proc,
    pub sidecar: Proc,
}

impl Measurement for RealTei {
    const KEY: &'static str = "real-tei";
    const TITLE: &'static str = "Real TEI: the sidecar in front of Hugging Face TEI 1.9.3 (CPU, all-MiniLM-L6-v2)";

    async fn run(ctx: &Context) -> Result<Self> {
        let cache = RealTeiCache::from_env();
        if let Some(why) = cache.missing() {
            return Err(Error::Process(why));
        }
        ctx.say(&format!("real tei: starting TEI's gRPC router from {}", cache.root.display()));
        let tei =
            procs::start_real_tei(&ctx.bins, "real-tei-grpc", &cache.grpc_router(), &cache, TEI_MAX_CONCURRENT).await?;
        let limits = static_limits();
        let sidecar = procs::start_mux(&ctx.bins, "real-tei-mux", &tei, &limits).await?;
        for target in [tei.url(), sidecar.url()] {
            measure(closed(&target, TEI_BATCH, 100, Duration::from_secs(30))).await?;
        }
        let shared = Shared { tei, sidecar };
        let throughput = throughput::measure_throughput(ctx, &shared).await?;
        let patient = throughput::measure_patient(ctx, &shared).await?;
        let storm = storm::measure_row(ctx, &shared).await?;
        let hop = hop::measure_row(ctx, &shared).await?;
        // Row 5 adds TEI's HTTP router beside the gRPC one, and a sidecar with an HTTP front.
        let (http, http_missing) = if cache.http_router().is_file() {
            split(http::measure_row(ctx, &cache, &shared.tei, storm.capacity_per_s()).await)
        } else {
            (None, Some(format!("TEI's HTTP router is not built ({} missing)", cache.http_router().display())))
        };
        let (lanes, lanes_missing) = split(lanes::measure_row(ctx, &shared, storm.capacity_per_s()).await);
        let (bulk, bulk_missing) = split(bulk::measure_row(ctx, &shared).await);
        for (row, why) in [(5, &http_missing), (6, &lanes_missing), (7, &bulk_missing)] {
            if let Some(why) = why {
                ctx.say(&format!("real tei {row}: not measured: {why}"));
            }
        }
        Ok(Self {
            cache: cache.root.display().to_string(),
            model: procs::REAL_TEI_MODEL.into(),
            limits,
            throughput,
            patient,
            storm,
            hop,
            http,
            http_missing,
            lanes,
            lanes_missing,
            bulk,
            bulk_missing,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::RealTei.label();
        let mut targets = self.throughput.targets(&scenario);
        targets.extend(self.patient.targets(&scenario));
        targets.extend(self.storm.targets(&scenario));
        targets.extend(self.hop.targets(&scenario));
        match (&self.http, &self.http_missing) {
            (Some(http), _) => targets.extend(http.targets(&scenario)),
            (None, why) => targets.extend(
                http::planned(&scenario)
                    .into_iter()
                    .map(|t| t.skip_because(why.clone().unwrap_or_else(|| "not measured".into()))),
            ),
        }
        let lanes_planned = Target::new(&scenario, lanes::P99, None, Rule::AtMost, LANES_LIMIT, "×");
        match (&self.lanes, &self.lanes_missing) {
            (Some(lanes), _) => targets.extend(lanes.targets(&scenario)),
            (None, why) => {
                targets.push(lanes_planned.skip_because(why.clone().unwrap_or_else(|| "not measured".into())))
            }
        }
        match (&self.bulk, &self.bulk_missing) {
            (Some(bulk), _) => targets.extend(bulk.targets(&scenario)),
            (None, why) => targets.extend(
                bulk::planned(&scenario)
                    .into_iter()
                    .map(|t| t.skip_because(why.clone().unwrap_or_else(|| "not measured".into()))),
            ),
        }
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::RealTei.label();
        let mut targets = vec![
            Target::new(&scenario, throughput::THROUGHPUT, None, Rule::AtLeast, THROUGHPUT_LIMIT, "×"),
            Target::new(&scenario, throughput::SERVED, None, Rule::AtLeast, SERVED_LIMIT, "× sent"),
            Target::new(&scenario, storm::GOODPUT, None, Rule::AtLeast, STORM_LIMIT, "× capacity"),
            Target::new(&scenario, hop::INFO_VS_HAPROXY, None, Rule::AtMost, HOP_LIMIT, "×"),
        ];
        targets.extend(http::planned(&scenario));
        targets.push(Target::new(&scenario, lanes::P99, None, Rule::AtMost, LANES_LIMIT, "×"));
        targets.extend(bulk::planned(&scenario));
        targets
    }
}

/// A row that starts processes of its own: its result, or why it could not run.
fn split<T>(row: Result<T>) -> (Option<T>, Option<String>) {
    match row {
        Ok(row) => (Some(row), None),
        Err(e) => (None, Some(e.to_string())),
    }
}

#[cfg(test)]
mod tests;
