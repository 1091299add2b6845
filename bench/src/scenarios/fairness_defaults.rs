//! Scenario 11's runs as a new user meets them (issue 45): the multiplexer in static mode at
//! `--max-in-flight 4 --max-queued 64 --queue-timeout 1s` in front of the same simulator (20 ms a
//! batch of 8), tenant A flooding at 5× capacity with 3 s deadlines, tenant B at 0.2× capacity
//! over 8 callers (connections) with a 1 s deadline. Once with no tenant configured (the header
//! alone names them, both weigh 1), once with B given weight 3. B alone first, through the same
//! multiplexer, for its latency without a neighbour.
//!
//! Rules: B is served when its OK answers within its deadline are at least 0.99 of what it sent;
//! B's p99 (all answers) beside the flood is at most 2× alone without configured tenants and at
//! most 1.5× with B's weight configured. Total goodput is reported against the backend's capacity
//! (four in flight and TEI's next batch are fewer than the 64 calls capacity is measured with), and
//! with B's weight it is at least 0.9× the run without: the places kept for B must not run empty
//! while B sends nothing for them (a share that idles the GPU for an absent tenant is a bug).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};

use super::overload::DEADLINE;
use super::tenant_pair::{FLOOD, FLOOD_FACTOR, LIGHT, LIGHT_FACTOR, Pair};
use super::{Context, measure, warm_up, words};
use crate::Result;
use crate::procs::{self, MuxLimits, Proc};
use crate::targets::{Rule, Target, ratio};

pub const FLOOD_DEADLINE: Duration = Duration::from_secs(3);
pub const LIGHT_CALLERS: usize = 8;
pub const FLOOD_CONNECTIONS: usize = 8;
pub const LIGHT_WEIGHT: u32 = 3;
pub const SERVED_LIMIT: f64 = 0.99;
pub const P99_LIMIT_UNCONFIGURED: f64 = 2.0;
pub const P99_LIMIT_WEIGHTED: f64 = 1.5;
/// The total goodput with B's weight over the total without, at least.
pub const WEIGHTED_GOODPUT_LIMIT: f64 = 0.9;
const TOKENS: usize = 16;

/// The limits of the trial: what a user writes first.
pub fn limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: 4,
        max_queued: 64,
        queue_timeout: Duration::from_secs(1),
        max_concurrent_streams: 1024,
        coalesce: false,
    }
}

/// One multiplexer configuration, B alone and then A and B together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DefaultsRun {
    /// B's configured weight; `None`: no tenant configured.
    pub light_weight: Option<u32>,
    pub light_alone: Report,
    pub mux: Pair,
}

impl DefaultsRun {
    pub fn setting(&self) -> String {
        setting(self.light_weight)
    }

    pub fn light_p99_ratio(&self) -> f64 {
        ratio(self.mux.light.latency.p99_ms, self.light_alone.latency.p99_ms)
    }

    fn p99_limit(&self) -> f64 {
        if self.light_weight.is_some() { P99_LIMIT_WEIGHTED } else { P99_LIMIT_UNCONFIGURED }
    }
}

fn setting(light_weight: Option<u32>) -> String {
    match light_weight {
        Some(weight) => format!("B weight {weight}"),
        None => "no tenants configured".into(),
    }
}

fn load(target: String, tenant: &str, rate: f64, duration: Duration, seed: u64) -> LoadConfig {
    let (deadline, connections) =
        if tenant == FLOOD { (FLOOD_DEADLINE, FLOOD_CONNECTIONS) } else { (DEADLINE, LIGHT_CALLERS) };
    LoadConfig {
        connections,
        deadline: Some(deadline),
        grace: Duration::from_secs(4),
        inputs: words(TOKENS),
        tenant: Some(tenant.into()),
        seed,
        ..LoadConfig::open(target, rate, duration)
    }
}

/// Both configurations against `sim`, whose capacity is `capacity` req/s.
pub async fn run(ctx: &Context, sim: &Proc, capacity: f64, duration: Duration) -> Result<Vec<DefaultsRun>> {
    let mut runs = Vec::new();
    for light_weight in [None, Some(LIGHT_WEIGHT)] {
        let weights: Vec<String> = light_weight.map(|w| format!("--tenant={LIGHT}={w}")).into_iter().collect();
        let mux = procs::start_mux_with(&ctx.bins, "fairness-defaults-mux", sim, &limits(), &weights).await?;
        warm_up(&mux.url(), 8).await?;
        let light_rate = LIGHT_FACTOR * capacity;
        let said = setting(light_weight);
        ctx.say(&format!("fairness, as a new user ({said}): B alone at {light_rate:.0} req/s"));
        let light_alone = measure(load(mux.url(), LIGHT, light_rate, duration, 12)).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("fairness, as a new user ({said}): A at {:.0} req/s beside B", FLOOD_FACTOR * capacity));
        let flood = load(mux.url(), FLOOD, FLOOD_FACTOR * capacity, duration, 11);
        let light = load(mux.url(), LIGHT, light_rate, duration, 12);
        let (flood, light) = tokio::join!(measure(flood), measure(light));
        let run = DefaultsRun { light_weight, light_alone, mux: Pair { flood: flood?, light: light? } };
        ctx.say(&format!(
            "fairness, as a new user ({said}): B got {}/{}, p99 {:.0} ms beside A, {:.0} ms alone",
            run.mux.light.ok_in_time, run.mux.light.sent, run.mux.light.latency.p99_ms, run.light_alone.latency.p99_ms
        ));
        runs.push(run);
        drop(mux);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(runs)
}

fn served_name(setting: &str) -> String {
    format!("as a new user ({setting}): B's goodput ÷ what B sends, A flooding")
}

fn p99_name(setting: &str) -> String {
    format!("as a new user ({setting}): B's p99, A flooding ÷ B alone")
}

fn total_name(setting: &str) -> String {
    format!("as a new user ({setting}): total goodput ÷ capacity")
}

fn weighted_total_name() -> String {
    format!("as a new user: total goodput with {} ÷ with {}", setting(Some(LIGHT_WEIGHT)), setting(None))
}

/// The weighted run's total goodput over the unconfigured run's, when both ran.
fn weighted_goodput_ratio(runs: &[DefaultsRun]) -> Option<f64> {
    let total = |weighted: bool| {
        runs.iter().find(|run| run.light_weight.is_some() == weighted).map(|run| run.mux.total_goodput_rps())
    };
    Some(ratio(total(true)?, total(false)?))
}

pub fn targets(scenario: &str, runs: &[DefaultsRun], capacity: f64, batch_ms: f64) -> Vec<Target> {
    let mut targets = Vec::new();
    for run in runs {
        let setting = run.setting();
        let b = &run.mux.light;
        targets.push(
            Target::at_least(scenario, &served_name(&setting), run.mux.light_share(), SERVED_LIMIT, "×")
                .note_if_not_passed(format!(
                    "B got {} of {} sent ({}): B's calls were refused, evicted or late beside A's flood",
                    b.ok_in_time,
                    b.sent,
                    teifleet_load::render::codes(b)
                )),
        );
        targets.push(
            Target::at_most(scenario, &p99_name(&setting), run.light_p99_ratio(), run.p99_limit(), "×")
                .note_if_not_passed(format!(
                    "B's p99 was {:.0} ms beside the flood and {:.0} ms alone (p50 {:.0} ms), batches taking {:.0} \
                     ms: B waits behind TEI's running batch and the next one the flood filled",
                    b.latency.p99_ms, run.light_alone.latency.p99_ms, b.latency.p50_ms, batch_ms
                )),
        );
        targets.push(Target::info(
            scenario,
            &total_name(&setting),
            Some(ratio(run.mux.total_goodput_rps(), capacity)),
            "× capacity",
        ));
    }
    if let Some(measured) = weighted_goodput_ratio(runs) {
        targets.push(
            Target::at_least(scenario, &weighted_total_name(), measured, WEIGHTED_GOODPUT_LIMIT, "×")
                .note_if_not_passed(
                    "the places of TEI's next batch kept for B ran empty while B sent nothing for them: the crowd \
                 should take them near the running batch's end (admission/tenant_gate.rs, KEPT_UNTIL)",
                ),
        );
    }
    targets
}

pub fn planned_targets(scenario: &str) -> Vec<Target> {
    let mut targets = Vec::new();
    for (weight, limit) in [(None, P99_LIMIT_UNCONFIGURED), (Some(LIGHT_WEIGHT), P99_LIMIT_WEIGHTED)] {
        let setting = setting(weight);
        targets.push(Target::new(scenario, &served_name(&setting), None, Rule::AtLeast, SERVED_LIMIT, "×"));
        targets.push(Target::new(scenario, &p99_name(&setting), None, Rule::AtMost, limit, "×"));
    }
    targets.push(Target::new(scenario, &weighted_total_name(), None, Rule::AtLeast, WEIGHTED_GOODPUT_LIMIT, "×"));
    targets
}

#[cfg(test)]
mod tests {
    use super::super::tenant_pair::report;
    use super::*;
    use crate::targets::Verdict;

    #[test]
    fn weights_tighten_the_p99_limit() {
        let run = |light_weight, p99_ms| DefaultsRun {
            light_weight,
            light_alone: report(700, 700, 70.0, 26.0),
            mux: Pair { flood: report(17000, 2000, 200.0, 2900.0), light: report(700, 700, 70.0, p99_ms) },
        };
        let t = targets("11 fairness", &[run(None, 45.0), run(Some(3), 45.0)], 350.0, 22.0);
        assert_eq!(t.len(), 7);
        assert_eq!(t[0].verdict, Verdict::Pass, "all 700 served");
        assert_eq!(t[1].verdict, Verdict::Pass, "45 ÷ 26 under 2");
        assert!(t[1].name.contains("no tenants configured"), "{}", t[1].name);
        assert_eq!(t[4].verdict, Verdict::Fail, "45 ÷ 26 over 1.5");
        assert!(t[4].name.contains("B weight 3"), "{}", t[4].name);
        assert!((t[5].measured.unwrap() - 270.0 / 350.0).abs() < 1e-9);
        assert_eq!(t[6].verdict, Verdict::Pass, "the same total goodput with and without weights");
        assert_eq!(planned_targets("11 fairness").len(), 5);
    }

    #[test]
    fn a_weighted_share_that_idles_the_gpu_fails() {
        let run = |light_weight, flood_ok| DefaultsRun {
            light_weight,
            light_alone: report(700, 700, 70.0, 26.0),
            mux: Pair {
                flood: report(17000, flood_ok, flood_ok as f64 / 10.0, 2900.0),
                light: report(700, 700, 70.0, 40.0),
            },
        };
        let t = targets("11 fairness", &[run(None, 1200), run(Some(3), 200)], 350.0, 22.0);
        let weighted = t.iter().find(|t| t.name.contains("total goodput with")).expect("the ratio's target");
        assert!((weighted.measured.unwrap() - 90.0 / 190.0).abs() < 1e-9);
        assert_eq!(weighted.verdict, Verdict::Fail);
        assert_eq!(targets("11 fairness", &[run(None, 1200)], 350.0, 22.0).len(), 3, "one run: no ratio");
    }
}
