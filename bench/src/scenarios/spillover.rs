//! Scenario 15, spillover (one budget across the pool's replicas, docs/admission.md): N simulated
//! replicas (N = 2 and 3), each a GPU-like TEI behind its own multiplexer in static mode with the
//! same share, each naming the others' multiplexers with `--sibling`. Open-loop Poisson at 2× the
//! pool's capacity, the same schedule three times: (a) one client pinned to replica 1 over one
//! HTTP/2 connection; (b) the same client over 8 connections spread over the replicas in turn (a
//! balancing client: the reference); (c) as (a), to a multiplexer of replica 1 started without
//! `--sibling` (the floor without spillover). Targets: (a) ≥ 0.9 × (b) in OK answers per second;
//! under (a), the replicas' device busy time within 1.15× of each other; no replica's TEI ever
//! holding more than the share. Then what one spilled call costs: one call at a time through a
//! replica whose only permit is held (its TEI stalled), so every call spills, beside the same
//! calls straight to the sibling's TEI and through the sibling's own multiplexer.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};

use super::adaptive::require_flag;
use super::overhead::{Case, TARGET_TOKENS};
use super::overload::{Capacity, DEADLINE, measure_capacity};
use super::{
    Context, Measurement, Sample, Scenario, added_p50_us, gpu_model, interleaved, measure, precise_model, samples,
    warm_up,
};
use crate::admin::{self, SimStats};
use crate::procs::{self, Device, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result};

/// Replicas in each pool measured.
pub const REPLICAS: [usize; 2] = [2, 3];
/// Offered load, × the pool's capacity (its replicas' × one replica's measured direct).
pub const LOAD_FACTOR: f64 = 2.0;
/// The balancing client's connections, spread over the replicas in turn.
pub const BALANCED_CONNECTIONS: usize = 8;
/// The pinned client's OK/s, at least this × the balancing client's.
pub const PINNED_LIMIT: f64 = 0.9;
/// The busiest replica's device time, at most this × the idlest's, under the pinned client.
pub const SPREAD_LIMIT: f64 = 1.15;
const TOKENS: usize = 16;
/// Share of the multiplexer whose one permit is held while spilled calls are timed.
const HOP_SHARE: usize = 1;

/// Every replica's limits: scenario 2's (two batches in flight, a queue TEI drains in ~0.4 s).
pub fn limits() -> MuxLimits {
    super::overload::mux_limits()
}

/// Replica 1's `teifleet_spills_total` over one run, by result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spills {
    /// Served by the sibling.
    pub served: f64,
    /// The sibling had no room after all: served here instead.
    pub refused: f64,
    /// The sibling could not be reached: served here instead.
    pub unreachable: f64,
}

/// One load against the pool, and what each replica's TEI did meanwhile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub report: Report,
    /// Each replica's simulator over the run (counters reset before it), replica 1 first.
    pub sims: Vec<SimStats>,
    /// What replica 1's multiplexer spilled.
    pub spills: Spills,
}

impl Run {
    /// OK answers within the deadline, per second.
    pub fn ok_rps(&self) -> f64 {
        self.report.goodput_rps
    }

    pub fn refused(&self) -> u64 {
        self.report.count("RESOURCE_EXHAUSTED")
    }

    /// The busiest replica's device time ÷ the idlest's (NaN when one never ran a batch).
    pub fn busy_spread(&self) -> f64 {
        let busy = self.sims.iter().map(|s| s.device_busy_us as f64);
        let (lo, hi) = busy.fold((f64::INFINITY, 0.0_f64), |(lo, hi), b| (lo.min(b), hi.max(b)));
        ratio(hi, lo)
    }

    /// The most requests any replica's TEI held at once.
    pub fn max_in_flight(&self) -> u64 {
        self.sims.iter().map(|s| s.max_in_flight_observed).max().unwrap_or(0)
    }

    /// The simulators counted device time (a simulator without the counter reports 0).
    pub fn busy_counted(&self) -> bool {
        self.sims.iter().any(|s| s.device_busy_us > 0)
    }
}

/// One pool of `replicas`: the three loads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    pub replicas: usize,
    pub offered_rps: f64,
    /// (a) one connection to replica 1, spillover on.
    pub pinned: Run,
    /// (b) connections spread over the replicas, spillover on: the reference.
    pub balanced: Run,
    /// (c) one connection to replica 1, without `--sibling`.
    pub alone: Run,
}

impl Pool {
    pub fn pinned_vs_balanced(&self) -> f64 {
        ratio(self.pinned.ok_rps(), self.balanced.ok_rps())
    }

    pub fn alone_vs_balanced(&self) -> f64 {
        ratio(self.alone.ok_rps(), self.balanced.ok_rps())
    }

    /// The most requests any replica's TEI held at once, over the three runs.
    pub fn max_in_flight(&self) -> u64 {
        [&self.pinned, &self.balanced, &self.alone].iter().map(|r| r.max_in_flight()).max().unwrap_or(0)
    }

    pub fn runs(&self) -> [(&'static str, &Run); 3] {
        [
            ("(a) pinned, one connection to replica 1", &self.pinned),
            ("(b) balanced, 8 connections over the replicas", &self.balanced),
            ("(c) pinned, replica 1 without --sibling", &self.alone),
        ]
    }
}

/// One call at a time: straight to a replica's TEI, through its own multiplexer (a local call),
/// and through a sibling's multiplexer whose only permit is held (a spilled call).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub tokens: usize,
    pub rounds: usize,
    pub calls_per_round: u64,
    pub direct: Vec<Sample>,
    pub local: Vec<Sample>,
    pub spilled: Vec<Sample>,
    /// Calls through the full replica that its sibling served (1.0: every one spilled).
    pub spilled_share: f64,
}

impl Hop {
    /// What one multiplexer adds over TEI directly (scenario 1's figure), µs.
    pub fn hop_added_us(&self) -> f64 {
        added_p50_us(&self.direct, &self.local)
    }

    /// What a spilled call adds over a local one, µs.
    pub fn spill_added_us(&self) -> f64 {
        added_p50_us(&self.local, &self.spilled)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spillover {
    pub backend: SimModel,
    pub limits: MuxLimits,
    /// One replica's capacity, measured directly.
    pub capacity: Capacity,
    pub seconds: f64,
    pub pools: Vec<Pool>,
    pub hop: Hop,
}

fn pinned_name(n: usize) -> String {
    format!("N={n}: pinned client's OK/s ÷ balanced client's")
}

fn spread_name(n: usize) -> String {
    format!("N={n}: device busy, busiest ÷ idlest replica, pinned client")
}

fn budget_name(n: usize, share: usize) -> String {
    format!("N={n}: most in flight at one replica's TEI (share {share})")
}

impl Measurement for Spillover {
    const KEY: &'static str = "spillover";
    const TITLE: &'static str = "Spillover: a client pinned to one replica gets the whole pool";

    async fn run(ctx: &Context) -> Result<Self> {
        require_flag(&ctx.bins, "--sibling", " (no spillover)")?;
        let backend = gpu_model(512, Device::Sleep);
        let limits = limits();
        let duration = ctx.pick(Duration::from_secs(3), Duration::from_secs(10));
        let mut capacity = None;
        let mut pools = Vec::new();
        for n in REPLICAS {
            pools.push(pool(ctx, n, &backend, &limits, &mut capacity, duration).await?);
        }
        let capacity = capacity.ok_or_else(|| Error::Process("no pool was measured".into()))?;
        let hop = hop(ctx).await?;
        Ok(Spillover { backend, limits, capacity, seconds: duration.as_secs_f64(), pools, hop })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Spillover.label();
        let share = self.limits.max_in_flight;
        let mut targets = Vec::new();
        for pool in &self.pools {
            let n = pool.replicas;
            let (a, b) = (&pool.pinned, &pool.balanced);
            targets.push(
                Target::at_least(&scenario, &pinned_name(n), pool.pinned_vs_balanced(), PINNED_LIMIT, "×")
                    .note_if_not_passed(format!(
                        "the client pinned to replica 1 got {:.0} OK/s against {:.0} spread over the {n} replicas; \
                         replica 1 spilled {:.0} calls ({:.0} refused by the sibling, {:.0} unreachable): calls \
                         that wait in replica 1's queue must take room at a sibling as soon as it opens, and a \
                         sibling's window must stay at its share while it answers",
                        a.ok_rps(),
                        b.ok_rps(),
                        a.spills.served,
                        a.spills.refused,
                        a.spills.unreachable
                    )),
            );
            let mut spread = Target::at_most(&scenario, &spread_name(n), a.busy_spread(), SPREAD_LIMIT, "×")
                .note_if_not_passed(format!(
                    "device busy per replica {} ms: the siblings ran less than replica 1, so spilled calls did not \
                     keep their TEIs as full as replica 1's",
                    a.sims
                        .iter()
                        .map(|s| format!("{:.0}", s.device_busy_us as f64 / 1e3))
                        .collect::<Vec<_>>()
                        .join(" / ")
                ));
            if !a.busy_counted() {
                spread = spread.skip_because("this simulator does not count device time (Stats.device_busy_us)");
            }
            targets.push(spread);
            targets.push(
                Target::at_most(&scenario, &budget_name(n, share), pool.max_in_flight() as f64, share as f64, "calls")
                    .note_if_not_passed(
                        "a replica's TEI held more than its share: a spilled call must be admitted at the sibling only \
                         under one of its own permits, never beside them",
                    ),
            );
            targets.push(Target::info(
                &scenario,
                &format!("N={n}: OK/s without spillover ÷ balanced"),
                Some(pool.alone_vs_balanced()),
                "×",
            ));
            targets.push(Target::info(
                &scenario,
                &format!("N={n}: refusals, pinned with spillover"),
                Some(a.refused() as f64),
                "calls",
            ));
            targets.push(Target::info(
                &scenario,
                &format!("N={n}: refusals, pinned without spillover"),
                Some(pool.alone.refused() as f64),
                "calls",
            ));
        }
        let hop = &self.hop;
        targets.push(Target::info(
            &scenario,
            "a spilled call's added p50 over a local one",
            Some(hop.spill_added_us()),
            "µs",
        ));
        targets.push(Target::info(
            &scenario,
            "one multiplexer's added p50 over TEI (scenario 1's hop), same run",
            Some(hop.hop_added_us()),
            "µs",
        ));
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Spillover.label();
        let share = limits().max_in_flight;
        REPLICAS
            .iter()
            .flat_map(|&n| {
                [
                    Target::new(&scenario, &pinned_name(n), None, Rule::AtLeast, PINNED_LIMIT, "×"),
                    Target::new(&scenario, &spread_name(n), None, Rule::AtMost, SPREAD_LIMIT, "×"),
                    Target::new(&scenario, &budget_name(n, share), None, Rule::AtMost, share as f64, "calls"),
                ]
            })
            .collect()
    }
}

/// `n` replicas, each naming the others with `--sibling`: every multiplexer's gRPC port is picked
/// before any of them starts (a sibling is connected to lazily, at its first spill), and a
/// multiplexer without siblings in front of replica 1's TEI for (c).
async fn pool(
    ctx: &Context,
    n: usize,
    backend: &SimModel,
    limits: &MuxLimits,
    capacity: &mut Option<Capacity>,
    duration: Duration,
) -> Result<Pool> {
    let bins = &ctx.bins;
    let mut sims = Vec::with_capacity(n);
    for i in 1..=n {
        sims.push(procs::start_sim(bins, &format!("spillover-{n}-sim{i}"), backend).await?);
    }
    let ports = (0..n).map(|_| procs::pick_port()).collect::<Result<Vec<u16>>>()?;
    let mut muxes = Vec::with_capacity(n);
    for (i, sim) in sims.iter().enumerate() {
        let siblings: Vec<String> = ports
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, port)| format!("--sibling={}", procs::url_of(*port)))
            .collect();
        let name = format!("spillover-{n}-mux{}", i + 1);
        muxes.push(procs::start_mux_on(bins, &name, ports[i], sim, limits, &siblings).await?);
    }
    let alone = procs::start_mux(bins, &format!("spillover-{n}-alone"), &sims[0], limits).await?;
    // A few batches through each (scenario 1's warm-up is 200 calls, seconds on this device).
    for target in sims.iter().chain(&muxes).chain([&alone]) {
        measure(LoadConfig { inputs: super::words(TOKENS), ..LoadConfig::closed(target.url(), 8, 48) }).await?;
    }
    let capacity = match capacity {
        Some(c) => *c,
        None => {
            ctx.say("spillover: measuring one replica's capacity");
            let c = measure_capacity(ctx, &sims[0], TOKENS, 64).await?;
            ctx.say(&format!("spillover: one replica {:.1} req/s, batch {:.2} ms", c.rps, c.batch_ms));
            *capacity = Some(c);
            c
        }
    };
    let rate = LOAD_FACTOR * n as f64 * capacity.rps;
    let config = |targets: Vec<String>, connections: usize| {
        let (first, rest) = targets.split_first().map(|(f, r)| (f.clone(), r.to_vec())).unwrap_or_default();
        LoadConfig {
            more_targets: rest,
            connections,
            deadline: Some(DEADLINE),
            grace: Duration::from_secs(3),
            inputs: super::words(TOKENS),
            seed: 150 + n as u64,
            ..LoadConfig::open(first, rate, duration)
        }
    };
    // The pinned client first: the balanced one fills every replica, so replica 1's windows on
    // its siblings would start the pinned run shrunk by the refusals of a full pool.
    ctx.say(&format!("spillover: N={n}, {rate:.0} req/s on one connection to replica 1"));
    let pinned = load(&sims, &muxes[0], config(vec![muxes[0].url()], 1)).await?;
    ctx.say(&format!("spillover: N={n}, {rate:.0} req/s over {BALANCED_CONNECTIONS} connections to the replicas"));
    let balanced = load(&sims, &muxes[0], config(muxes.iter().map(Proc::url).collect(), BALANCED_CONNECTIONS)).await?;
    ctx.say(&format!("spillover: N={n}, {rate:.0} req/s on one connection to replica 1 without --sibling"));
    let alone = load(&sims, &alone, config(vec![alone.url()], 1)).await?;
    ctx.say(&format!(
        "spillover: N={n}: pinned {:.0} OK/s, balanced {:.0}, without spillover {:.0}",
        pinned.ok_rps(),
        balanced.ok_rps(),
        alone.ok_rps()
    ));
    Ok(Pool { replicas: n, offered_rps: rate, pinned, balanced, alone })
}

/// Replica 1's spills so far, from `mux`'s metrics.
async fn spills(mux: &Proc) -> Spills {
    let count = |result| async move {
        admin::metric_sum_matching(mux.admin_addr(), "teifleet_spills_total", &[("result", result)])
            .await
            .unwrap_or(0.0)
    };
    Spills { served: count("served").await, refused: count("refused").await, unreachable: count("unreachable").await }
}

/// One load, with every simulator's counters reset before and read after, and `mux`'s spills.
async fn load(sims: &[Proc], mux: &Proc, config: LoadConfig) -> Result<Run> {
    for sim in sims {
        admin::reset_sim_stats(sim.admin_addr()).await;
    }
    let before = spills(mux).await;
    let report = measure(config).await?;
    let after = spills(mux).await;
    let mut stats = Vec::with_capacity(sims.len());
    for sim in sims {
        let read = admin::sim_stats(sim.admin_addr()).await;
        stats.push(read.ok_or_else(|| Error::Process("the simulator's /stats did not answer".into()))?);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spills = Spills {
        served: after.served - before.served,
        refused: after.refused - before.refused,
        unreachable: after.unreachable - before.unreachable,
    };
    Ok(Run { report, sims: stats, spills })
}

/// A spilled call's cost: replicas A and B on the precise (~1 ms) device, each multiplexer with
/// one permit; A's TEI stalled and one call holding A's permit there, so every call through A
/// spills to B. One 20-token Embed at a time, in rotating rounds: to B's TEI, through B's
/// multiplexer, through A's.
async fn hop(ctx: &Context) -> Result<Hop> {
    let bins = &ctx.bins;
    let backend = precise_model(ctx.features);
    let limits = MuxLimits {
        max_in_flight: HOP_SHARE,
        max_queued: 16,
        queue_timeout: Duration::from_secs(2),
        max_concurrent_streams: 256,
        coalesce: false,
    };
    let sim_a = procs::start_sim(bins, "spillover-hop-sim-a", &backend).await?;
    let sim_b = procs::start_sim(bins, "spillover-hop-sim-b", &backend).await?;
    let mux_b = procs::start_mux(bins, "spillover-hop-mux-b", &sim_b, &limits).await?;
    let sibling = [format!("--sibling={}", mux_b.url())];
    let mux_a = procs::start_mux_with(bins, "spillover-hop-mux-a", &sim_a, &limits, &sibling).await?;
    for target in [&sim_b, &mux_b, &mux_a] {
        warm_up(&target.url(), 1).await?;
    }
    ctx.say("spillover: holding replica A's one permit (its TEI stalled)");
    admin::set_sim_fault(sim_a.admin_addr(), "stall")
        .await
        .ok_or_else(|| Error::Process("the simulator would not stall".into()))?;
    let holder = LoadConfig { deadline: Some(Duration::from_secs(120)), ..LoadConfig::closed(mux_a.url(), 1, 1) };
    let holder = tokio::spawn(measure(holder));
    let held = async {
        loop {
            if admin::sim_stats(sim_a.admin_addr()).await.is_some_and(|s| s.in_flight >= 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), held).await.is_err() {
        holder.abort();
        return Err(Error::Process("the call meant to hold replica A's permit never reached its TEI".into()));
    }
    let case = Case::Single { tokens: TARGET_TOKENS };
    let calls = case.calls(ctx.quick);
    // A call that is not spilled waits here behind the stalled one: the deadline ends it.
    let config = |target: &str| LoadConfig { deadline: Some(Duration::from_secs(2)), ..case.config(target, calls) };
    // The spill path's connection to B opens at its first call.
    measure(LoadConfig { requests: 50, ..config(&mux_a.url()) }).await?;
    let rounds = ctx.pick(3, 5);
    ctx.say(&format!("spillover: {rounds} rounds of {calls} calls: direct to B, through B, spilled from A to B"));
    let before = spills(&mux_a).await.served;
    let sides = interleaved(&[sim_b.url(), mux_b.url(), mux_a.url()], rounds, config).await?;
    let after = spills(&mux_a).await.served;
    admin::set_sim_fault(sim_a.admin_addr(), "none").await;
    let _ = tokio::time::timeout(Duration::from_secs(5), holder).await;
    let spilled_share = ratio(after - before, (rounds as u64 * calls) as f64);
    let [direct, local, spilled] = [&sides[0], &sides[1], &sides[2]].map(|s| samples(s));
    let hop = Hop {
        backend,
        limits,
        tokens: TARGET_TOKENS,
        rounds,
        calls_per_round: calls,
        direct,
        local,
        spilled,
        spilled_share,
    };
    ctx.say(&format!(
        "spillover: one hop adds {:.0} µs, a spill {:.0} µs more ({:.0}% of calls through A spilled)",
        hop.hop_added_us(),
        hop.spill_added_us(),
        spilled_share * 100.0
    ));
    Ok(hop)
}

/// Results for the tests of the targets and the renderer.
#[cfg(test)]
pub(crate) mod example {
    use super::*;

    fn stats(busy_ms: u64, max_in_flight: u64) -> SimStats {
        SimStats { device_busy_us: busy_ms * 1000, max_in_flight_observed: max_in_flight, ..SimStats::default() }
    }

    fn run(goodput_rps: f64, refused: u64, sims: Vec<SimStats>) -> Run {
        let mut report = Report { goodput_rps, ..Report::default() };
        report.codes.insert("RESOURCE_EXHAUSTED".into(), refused);
        Run { report, sims, spills: Spills::default() }
    }

    fn sample(p50_ms: f64) -> Sample {
        Sample { p50_ms, ..Sample::default() }
    }

    /// Two replicas; the pinned client's OK/s, the replicas' device busy ms under it, and the most
    /// in flight at replica 2's TEI under it.
    pub(crate) fn result(pinned_rps: f64, busy: [u64; 2], max_in_flight: u64) -> Spillover {
        let pool = Pool {
            replicas: 2,
            offered_rps: 1400.0,
            pinned: run(pinned_rps, 700, vec![stats(busy[0], 16), stats(busy[1], max_in_flight)]),
            balanced: run(690.0, 710, vec![stats(2900, 16), stats(2900, 16)]),
            alone: run(345.0, 1050, vec![stats(2900, 16), stats(0, 0)]),
        };
        Spillover {
            backend: gpu_model(512, Device::Sleep),
            limits: limits(),
            capacity: Capacity { rps: 350.0, batch_ms: 23.0, concurrency: 64 },
            seconds: 3.0,
            pools: vec![pool],
            hop: Hop {
                backend: gpu_model(512, Device::Spin),
                limits: limits(),
                tokens: 20,
                rounds: 2,
                calls_per_round: 100,
                direct: vec![sample(1.0), sample(1.0)],
                local: vec![sample(1.06), sample(1.05)],
                spilled: vec![sample(1.12), sample(1.10)],
                spilled_share: 1.0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::example::result;
    use super::*;
    use crate::targets::Verdict;

    #[test]
    fn the_pinned_client_is_judged_against_the_balanced_one_and_the_budget_against_the_share() {
        let t = result(680.0, [2900, 2800], 16).targets();
        assert_eq!(t.len(), 8);
        assert!((t[0].measured.unwrap() - 680.0 / 690.0).abs() < 1e-9);
        assert_eq!(t[0].verdict, Verdict::Pass);
        assert!((t[1].measured.unwrap() - 2900.0 / 2800.0).abs() < 1e-9);
        assert_eq!(t[1].verdict, Verdict::Pass);
        assert_eq!((t[2].measured, t[2].verdict), (Some(16.0), Verdict::Pass));
        assert!((t[3].measured.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!((t[4].measured, t[5].measured), (Some(700.0), Some(1050.0)));
        // 110 - 55 µs and 55 - 0 µs: medians of the per-round differences.
        assert!((t[6].measured.unwrap() - 55.0).abs() < 1e-6, "{:?}", t[6].measured);
        assert!((t[7].measured.unwrap() - 55.0).abs() < 1e-6, "{:?}", t[7].measured);
        assert_eq!(Spillover::planned_targets().len(), 6);
    }

    #[test]
    fn an_idle_sibling_and_a_broken_budget_fail() {
        let t = result(345.0, [2900, 0], 17).targets();
        assert_eq!(t[0].verdict, Verdict::Fail);
        assert!(t[0].note.contains("got 345 OK/s against 690"), "{}", t[0].note);
        // A sibling that never ran a batch: no ratio can be formed, which must not pass.
        assert_eq!(t[1].verdict, Verdict::Fail);
        assert_eq!(t[2].verdict, Verdict::Fail);
    }
}
