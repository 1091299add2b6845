//! Scenario 3, burst (the auto-batching proxy's table): 20,000 tiny requests from 2,048
//! closed-loop clients, direct to the backend and through the multiplexer.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};

use super::{Context, Measurement, Scenario, direct_then_mux, gpu_model, sim_and_mux, words};
use crate::Result;
use crate::procs::{Device, MuxLimits, SimModel};
use crate::targets::{Rule, Target, ratio};

pub const CONCURRENCY: usize = 2048;
pub const CONNECTIONS: usize = 16;
pub const TOKENS: usize = 2;
const THROUGHPUT_LIMIT: f64 = 1.0;
const P99_LIMIT: f64 = 0.25;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Burst {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub requests: u64,
    pub direct: Report,
    pub mux: Report,
}

impl Burst {
    /// OK answers per second through the multiplexer over direct.
    pub fn throughput_ratio(&self) -> f64 {
        ratio(self.mux.goodput_rps, self.direct.goodput_rps)
    }

    /// p99 of all answers through the multiplexer over direct.
    pub fn p99_ratio(&self) -> f64 {
        ratio(self.mux.latency.p99_ms, self.direct.latency.p99_ms)
    }
}

impl Measurement for Burst {
    const KEY: &'static str = "burst";
    const TITLE: &'static str = "Burst: 2,048 concurrent clients, tiny inputs";

    async fn run(ctx: &Context) -> Result<Self> {
        // TEI admits the whole burst here (the auto-batching proxy's TEI answered all 20,000), so
        // "direct" is a TEI queue 2,048 deep rather than instant refusals.
        let backend = gpu_model(4096, Device::Sleep);
        // The README's default queueTimeout; a queue that holds the whole burst.
        let limits = MuxLimits {
            max_in_flight: 16,
            max_queued: CONCURRENCY,
            queue_timeout: Duration::from_secs(2),
            max_concurrent_streams: 1024,
            coalesce: false,
        };
        let (sim, mux) = sim_and_mux(ctx, "burst", &backend, &limits, CONNECTIONS).await?;
        let requests = ctx.pick(4000, 20_000);
        let config = |target: String| LoadConfig {
            connections: CONNECTIONS,
            inputs: words(TOKENS),
            duration: Duration::from_secs(240),
            ..LoadConfig::closed(target, CONCURRENCY, requests)
        };
        let what = format!("burst: {requests} requests at concurrency {CONCURRENCY},");
        let (direct, mux) = direct_then_mux(ctx, &what, &sim, &mux, config).await?;
        Ok(Burst { backend, limits, requests, direct, mux })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Burst.label();
        vec![
            Target::at_least(&scenario, "throughput (OK/s) vs direct", self.throughput_ratio(), THROUGHPUT_LIMIT, "×")
                .note_if_not_passed(format!(
                    "both sides drive the same device, so OK/s can at best tie. Through the multiplexer the run \
                     lasts {:.1} s against {:.1} s direct: the clients resend every refusal at once, {:.0} answers a \
                     second, so the first batches' start-up weighs more in its short run, and the refusal storm \
                     shares this machine's 2 cores with the backend's server (scenario 7 measures that cost)",
                    self.mux.elapsed_s, self.direct.elapsed_s, self.mux.throughput_rps
                )),
            Target::at_most(&scenario, "p99 vs direct", self.p99_ratio(), P99_LIMIT, "×").note_if_not_passed(
                "the first wave of 2,048 arrives before the queue can count as standing: what the queue can serve \
                 within the 2 s queueTimeout is queued (the rest is refused at once) and the last of it waits up to \
                 the queueTimeout; the door that closes once the queue stands keeps every later call fast. Refusing the queued tail once the queue stands (p99 0.08×) made the overload \
                 scenario's sheds slow, and refusing at the door any wait longer than an interval (p99 0.08×) \
                 capped every queue at an interval whatever maxQueued says; see docs/admission.md",
            ),
        ]
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Burst.label();
        vec![
            Target::new(&scenario, "throughput (OK/s) vs direct", None, Rule::AtLeast, THROUGHPUT_LIMIT, "×"),
            Target::new(&scenario, "p99 vs direct", None, Rule::AtMost, P99_LIMIT, "×"),
        ]
    }
}
