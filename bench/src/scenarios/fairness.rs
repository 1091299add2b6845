//! Scenario 11, fairness between tenants (Admission v2): tenant A (`x-teifleet-tenant: a`) floods
//! at 5× the backend's capacity while tenant B sends 0.2× capacity at the same priority, through
//! one multiplexer; and B alone, the same schedule, for its latency without a neighbour. Both
//! loads are open-loop Poisson with a 1 s deadline, run as two tasks of this process at once.
//! Targets: B's goodput ≥ 0.95 of what B sends; B's p99 ≤ 2 × B's p99 alone; total goodput
//! ≥ 0.97 × capacity. The same two loads direct to TEI are shown for comparison. Then the same
//! tenants as a new user meets them, four in flight and nothing configured (see
//! `fairness_defaults`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};

use super::adaptive::require_flag;
use super::fairness_defaults::{self, DefaultsRun};
use super::overload::{Capacity, DEADLINE, measure_capacity, mux_limits};
pub use super::tenant_pair::{FLOOD, FLOOD_FACTOR, LIGHT, LIGHT_FACTOR, Pair};
use super::{Context, Measurement, Scenario, gpu_model, measure, warm_up, words};
use crate::Result;
use crate::procs::{self, Device, MuxLimits, SimModel};
use crate::targets::{Rule, Target, ratio};

pub const LIGHT_GOODPUT_LIMIT: f64 = 0.95;
pub const LIGHT_P99_LIMIT: f64 = 2.0;
pub const TOTAL_GOODPUT_LIMIT: f64 = 0.97;
const TOKENS: usize = 16;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fairness {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub capacity: Capacity,
    pub seconds: f64,
    /// B through the multiplexer with nobody else.
    pub light_alone: Report,
    pub mux: Pair,
    /// The same two loads straight to TEI (its own admission only).
    pub direct: Pair,
    /// The issue-45 runs: four in flight, the flood with 3 s deadlines, tenants unconfigured and
    /// then weighted (absent from results recorded before them).
    #[serde(default)]
    pub new_user: Vec<DefaultsRun>,
}

const LIGHT_GOODPUT: &str = "B's goodput ÷ what B sends, A flooding";
const LIGHT_P99: &str = "B's p99, A flooding ÷ B alone";
const TOTAL: &str = "total goodput ÷ capacity";

impl Fairness {
    /// B's p99 (all answers) beside A's flood over B's p99 alone.
    pub fn light_p99_ratio(&self) -> f64 {
        ratio(self.mux.light.latency.p99_ms, self.light_alone.latency.p99_ms)
    }
}

fn load(target: String, tenant: &str, rate: f64, duration: Duration, connections: usize, seed: u64) -> LoadConfig {
    LoadConfig {
        connections,
        deadline: Some(DEADLINE),
        grace: Duration::from_secs(3),
        inputs: words(TOKENS),
        tenant: Some(tenant.into()),
        seed,
        ..LoadConfig::open(target, rate, duration)
    }
}

/// A's flood and B's light load at once, as two tasks.
async fn pair(target: &str, capacity: f64, duration: Duration) -> Result<Pair> {
    let flood = load(target.into(), FLOOD, FLOOD_FACTOR * capacity, duration, 8, 11);
    let light = load(target.into(), LIGHT, LIGHT_FACTOR * capacity, duration, 2, 12);
    let (flood, light) = tokio::join!(measure(flood), measure(light));
    Ok(Pair { flood: flood?, light: light? })
}

impl Measurement for Fairness {
    const KEY: &'static str = "fairness";
    const TITLE: &'static str = "Fairness: a tenant flooding at 5× capacity beside a light one";

    async fn run(ctx: &Context) -> Result<Self> {
        require_flag(&ctx.bins, "--tenant", " (no fair queuing)")?;
        let backend = gpu_model(512, Device::Sleep);
        let sim = procs::start_sim(&ctx.bins, "fairness-sim", &backend).await?;
        let limits = mux_limits();
        // Equal weights, said explicitly so the multiplexer keeps per-tenant series for both.
        let weights = [format!("--tenant={FLOOD}=1"), format!("--tenant={LIGHT}=1")];
        let mux = procs::start_mux_with(&ctx.bins, "fairness-mux", &sim, &limits, &weights).await?;
        warm_up(&sim.url(), 8).await?;
        warm_up(&mux.url(), 8).await?;
        ctx.say("fairness: measuring the backend's capacity");
        let capacity = measure_capacity(ctx, &sim, TOKENS, 64).await?;
        let duration = ctx.pick(Duration::from_secs(3), Duration::from_secs(10));
        let light_rate = LIGHT_FACTOR * capacity.rps;
        ctx.say(&format!("fairness: B alone at {light_rate:.0} req/s through the multiplexer"));
        let light_alone = measure(load(mux.url(), LIGHT, light_rate, duration, 2, 12)).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!(
            "fairness: A at {:.0} req/s and B at {light_rate:.0} req/s through the multiplexer",
            FLOOD_FACTOR * capacity.rps
        ));
        let through = pair(&mux.url(), capacity.rps, duration).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say("fairness: the same two loads direct to TEI");
        let direct = pair(&sim.url(), capacity.rps, duration).await?;
        ctx.say(&format!(
            "fairness: B got {}/{} beside the flood ({}/{} direct)",
            through.light.ok_in_time, through.light.sent, direct.light.ok_in_time, direct.light.sent
        ));
        drop(mux);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let new_user = fairness_defaults::run(ctx, &sim, capacity.rps, duration).await?;
        Ok(Fairness {
            backend,
            limits,
            capacity,
            seconds: duration.as_secs_f64(),
            light_alone,
            mux: through,
            direct,
            new_user,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Fairness.label();
        let b = &self.mux.light;
        let mut targets = vec![
            Target::at_least(&scenario, LIGHT_GOODPUT, self.mux.light_share(), LIGHT_GOODPUT_LIMIT, "×")
                .note_if_not_passed(format!(
                    "B got {} of {} sent ({}): B's calls are refused or evicted for A's; the fair queue should \
                     serve the tenant with the smallest finish tag next and evict the tenant holding the most of \
                     the queue",
                    b.ok_in_time,
                    b.sent,
                    teifleet_load::render::codes(b)
                )),
            Target::at_most(&scenario, LIGHT_P99, self.light_p99_ratio(), LIGHT_P99_LIMIT, "×").note_if_not_passed(
                format!(
                    "B's p99 was {:.0} ms beside the flood and {:.0} ms alone, batches taking {:.0} ms. B is first in \
                     the multiplexer's queue whenever a permit frees (p50 {:.0} ms, not the queue timeout), but the \
                     {} calls in flight are two batches: beside the flood B waits up to a batch for a permit, then \
                     behind the batch of A's calls already prepared in TEI's own first-come queue, then runs, about \
                     three batch times against one or two alone. The tenant gate (admission/tenant_gate.rs) should \
                     keep A out of TEI's next batch until its running batch's last quarter while B comes: check that \
                     TEI reports batch times and that A holds most of the queue",
                    b.latency.p99_ms,
                    self.light_alone.latency.p99_ms,
                    self.capacity.batch_ms,
                    b.latency.p50_ms,
                    self.limits.max_in_flight
                ),
            ),
            Target::at_least(
                &scenario,
                TOTAL,
                ratio(self.mux.total_goodput_rps(), self.capacity.rps),
                TOTAL_GOODPUT_LIMIT,
                "× capacity",
            )
            .note_if_not_passed("TEI idled between batches: the flood's refusals took CPU or permits were left unused"),
            Target::info(
                &scenario,
                "B's goodput ÷ what B sends, A flooding, direct to TEI",
                Some(self.direct.light_share()),
                "×",
            ),
        ];
        targets.extend(fairness_defaults::targets(
            &scenario,
            &self.new_user,
            self.capacity.rps,
            self.capacity.batch_ms,
        ));
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Fairness.label();
        let mut targets = vec![
            Target::new(&scenario, LIGHT_GOODPUT, None, Rule::AtLeast, LIGHT_GOODPUT_LIMIT, "×"),
            Target::new(&scenario, LIGHT_P99, None, Rule::AtMost, LIGHT_P99_LIMIT, "×"),
            Target::new(&scenario, TOTAL, None, Rule::AtLeast, TOTAL_GOODPUT_LIMIT, "× capacity"),
        ];
        targets.extend(fairness_defaults::planned_targets(&scenario));
        targets
    }
}

#[cfg(test)]
mod tests {
    use super::super::tenant_pair::report;
    use super::*;
    use crate::targets::Verdict;

    #[test]
    fn the_light_tenant_is_judged_against_itself_and_the_total_against_capacity() {
        let r = Fairness {
            backend: gpu_model(512, Device::Sleep),
            limits: mux_limits(),
            capacity: Capacity { rps: 350.0, batch_ms: 23.0, concurrency: 64 },
            seconds: 3.0,
            light_alone: report(210, 210, 70.0, 40.0),
            mux: Pair { flood: report(5250, 840, 280.0, 900.0), light: report(210, 205, 68.0, 90.0) },
            direct: Pair { flood: report(5250, 900, 300.0, 990.0), light: report(210, 40, 13.0, 990.0) },
            new_user: Vec::new(),
        };
        let t = r.targets();
        assert!((t[0].measured.unwrap() - 205.0 / 210.0).abs() < 1e-9);
        assert_eq!(t[0].verdict, Verdict::Pass);
        // 90 ms beside the flood against 40 ms alone: 2.25×.
        assert_eq!(t[1].verdict, Verdict::Fail);
        assert!(t[1].note.contains("90 ms beside the flood and 40 ms alone, batches taking 23 ms"), "{}", t[1].note);
        assert!((t[2].measured.unwrap() - 348.0 / 350.0).abs() < 1e-9);
        assert_eq!(t[2].verdict, Verdict::Pass);
        assert_eq!(t[3].verdict, Verdict::Info);
        assert_eq!(Fairness::planned_targets().len(), 8);
    }
}
