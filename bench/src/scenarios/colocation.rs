//! Scenario 17, GPU co-location: four pools share one GPU, as four pods given time-sliced replicas
//! of one card do (docs/gpu-cluster.md). Each pool is a simulator and its multiplexer; the four
//! simulators take turns on one device (`tei-sim --shared-device`: a batch runs while its
//! simulator holds a lock file every one of them opens), and each multiplexer lets in a quarter of
//! a device batch, the budget sized to the pool's slice. Pool A floods at 5× its share (a quarter
//! of the device's capacity) while B, C and D send 0.2× theirs, open loop, 1 s deadline, all at
//! once; B, C and D first without A, the same schedules, for their latency without the flood,
//! and A alone, for what it gets of the device with nobody beside it. Run with static limits and
//! with the adaptive limit, uncapped; both again with every pool's `--gpu-share` at its share,
//! what the operator's sidecar derives from `gpu.sharing` by default (a cap on TEI time while a
//! neighbour is busy, none while the device is quiet); once with A's `deviceTimeCap` at its
//! share (the cap always on) for comparison; and once with the four loads straight to the
//! simulators. Targets, for the default share: every light pool keeps ≥ 0.95 of its calls and
//! its p99 ≤ 1.5× its p99 without the flood, and A alone gets ≥ 0.95× of what it gets uncapped.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};

use super::adaptive::require_flag;
use super::overload::{Capacity, DEADLINE, measure_capacity};
use super::{Context, Measurement, Scenario, measure_apart, warm_up, words};
use crate::Result;
use crate::admin::{self, SimStats};
use crate::procs::{self, Device, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};

pub const POOLS: usize = 4;
pub const FLOOD_FACTOR: f64 = 5.0;
pub const LIGHT_FACTOR: f64 = 0.2;
pub const LIGHT_GOODPUT_LIMIT: f64 = 0.95;
pub const LIGHT_P99_LIMIT: f64 = 1.5;
/// What A gets of the device alone with the default share, ÷ uncapped, at least.
pub const FLOOD_ALONE_LIMIT: f64 = 0.95;
/// A pool's share of the device: A's `deviceTimeCap` in the capped run, and every pool's
/// `--gpu-share` in the default runs, as the sidecar derives it from `gpu.sharing.replicas`.
pub const DEVICE_TIME_CAP: u8 = (100 / POOLS) as u8;
/// How a run keeps A to its share, if at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guard {
    None,
    /// Every pool's `--gpu-share`: the default for pools on a time-sliced GPU.
    Share,
    /// A's `--device-time-cap`: always on.
    Cap,
}
/// The runs: the static limit and the adaptive one, uncapped and with the default share, then the
/// static limit with A's explicit cap. The targets are judged with the default share; the
/// uncapped runs (which measured 2.1–2.4×) and the explicit cap are reported for comparison.
const MODES: [(bool, Guard); 5] =
    [(false, Guard::None), (true, Guard::None), (false, Guard::Share), (true, Guard::Share), (false, Guard::Cap)];
const TOKENS: usize = 16;
/// How long each load runs in a full run (a quick run: 4 s).
const LIGHT_SECONDS: Duration = Duration::from_secs(30);
/// Requests of one device batch; each pool's multiplexer lets in its quarter of it.
const BATCH_REQUESTS: usize = 8;

/// The shared GPU: a batch takes 2 ms plus 50 µs a token, at most 8 requests, so a lone call
/// (16 tokens) takes 2.8 ms and a full batch 8.4 ms of the device.
pub fn shared_gpu() -> SimModel {
    SimModel {
        max_concurrent_requests: 512,
        max_batch_requests: Some(BATCH_REQUESTS),
        fixed_latency: Duration::from_millis(2),
        per_token_latency: Duration::from_micros(50),
        device: Device::Sleep,
    }
}

/// Each pool's multiplexer: a quarter of a device batch in flight (the adaptive limit's ceiling),
/// a queue it drains well within the deadline.
pub fn slice_limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: BATCH_REQUESTS / POOLS,
        max_queued: 64,
        queue_timeout: Duration::from_millis(500),
        max_concurrent_streams: 1024,
        coalesce: false,
    }
}

/// The flooding pool's run and the three light pools', side by side.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub flood: Report,
    pub light: Vec<Report>,
    /// What each pool's simulator did with the shared device meanwhile, A first; empty in results
    /// from before it was read.
    #[serde(default)]
    pub device: Vec<DeviceUse>,
}

/// One simulator's use of the shared device over a run, from its own counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceUse {
    /// Its batches' time on the device ÷ the run's length: what the share holds A to.
    pub busy_share: f64,
    /// Calls answered ÷ batches run.
    pub calls_per_batch: f64,
}

impl DeviceUse {
    fn from_stats(stats: SimStats, seconds: f64) -> Self {
        Self {
            busy_share: ratio(stats.device_busy_us as f64 / 1e6, seconds),
            calls_per_batch: ratio(stats.completed as f64, stats.batches_run as f64),
        }
    }
}

/// One way of admitting: the light pools without the flood, then beside it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mode {
    pub adaptive: bool,
    /// Pool A's `deviceTimeCap` (its share of the device), if it has one.
    #[serde(default)]
    pub cap: Option<u8>,
    /// Every pool's `--gpu-share` (its share of the device, capped while a neighbour is busy),
    /// if they have one.
    #[serde(default)]
    pub share: Option<u8>,
    /// B, C and D at their rates with A idle.
    pub alone: Vec<Report>,
    /// A flooding with B, C and D silent.
    #[serde(default)]
    pub flood_alone: Option<Report>,
    pub shared: Side,
}

impl Mode {
    pub fn name(&self) -> String {
        let limit = if self.adaptive { "adaptive limit" } else { "static limit" };
        match (self.cap, self.share) {
            (Some(cap), _) => format!("{limit}, A's device time capped at {cap} %"),
            (None, Some(share)) => format!("{limit}, every pool's GPU share {share} % (the default)"),
            (None, None) => limit.to_owned(),
        }
    }

    fn new(adaptive: bool, guard: Guard) -> Self {
        let (cap, share) = match guard {
            Guard::None => (None, None),
            Guard::Share => (None, Some(DEVICE_TIME_CAP)),
            Guard::Cap => (Some(DEVICE_TIME_CAP), None),
        };
        Self { adaptive, cap, share, alone: Vec::new(), flood_alone: None, shared: Side::default() }
    }

    /// Whether this is a run of the default: every pool with its GPU share, no explicit cap.
    pub fn is_default_share(&self) -> bool {
        self.share.is_some() && self.cap.is_none()
    }

    /// The worst light pool's OK answers in time ÷ what it sent, A flooding.
    pub fn worst_light_share(&self) -> f64 {
        self.shared.light.iter().map(share).fold(f64::INFINITY, f64::min)
    }

    /// The worst light pool's p99 beside the flood ÷ its p99 without it.
    pub fn worst_p99_ratio(&self) -> f64 {
        self.shared
            .light
            .iter()
            .zip(&self.alone)
            .map(|(shared, alone)| ratio(shared.latency.p99_ms, alone.latency.p99_ms))
            .fold(f64::NEG_INFINITY, f64::max)
    }
}

pub fn share(report: &Report) -> f64 {
    ratio(report.ok_in_time as f64, report.sent as f64)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Colocation {
    pub backend: SimModel,
    pub limits: MuxLimits,
    /// The shared device's capacity, one simulator saturating it; a pool's share is a quarter.
    pub capacity: Capacity,
    pub seconds: f64,
    pub modes: Vec<Mode>,
    /// The same four loads straight to the simulators (TEI's own admission only).
    pub direct: Side,
}

fn label(mode: &str, what: &str) -> String {
    format!("{what}, {mode}")
}

const LIGHT_GOODPUT: &str = "worst light pool's goodput ÷ what it sends, A flooding";
const LIGHT_P99: &str = "worst light pool's p99, A flooding ÷ without A";
const FLOOD_ALONE: &str = "A's calls OK in time alone ÷ alone uncapped";

fn load(target: String, rate: f64, duration: Duration, connections: usize, seed: u64) -> LoadConfig {
    LoadConfig {
        connections,
        deadline: Some(DEADLINE),
        grace: Duration::from_secs(3),
        inputs: words(TOKENS),
        seed,
        ..LoadConfig::open(target, rate, duration)
    }
}

/// The light pools' loads at once when `light`, and A's flood beside them when `flood`: each
/// pool's clients on a runtime of their own, as four workloads' clients are four processes (see
/// `measure_apart`).
///
/// The simulators' counters are reset first and read after, for each one's use of the device;
/// when any cannot be reset or read, none is reported rather than a count of something else.
async fn loads(
    targets: &[String],
    sims: &[Proc],
    share_rps: f64,
    duration: Duration,
    light: bool,
    flood: bool,
) -> Result<Side> {
    let mut counted = true;
    for sim in sims {
        counted &= admin::reset_sim_stats(sim.admin_addr()).await.is_some();
    }
    let light_rate = LIGHT_FACTOR * share_rps;
    let mut tasks = Vec::new();
    for (k, target) in targets.iter().enumerate().skip(1).filter(|_| light) {
        tasks.push(tokio::spawn(measure_apart(load(target.clone(), light_rate, duration, 2, 20 + k as u64))));
    }
    let flood_run = match flood {
        true => Some(tokio::spawn(measure_apart(load(targets[0].clone(), FLOOD_FACTOR * share_rps, duration, 8, 20)))),
        false => None,
    };
    let mut light = Vec::new();
    for task in tasks {
        light.push(joined(task.await)?);
    }
    let flood = match flood_run {
        Some(task) => joined(task.await)?,
        None => Report::default(),
    };
    let mut device = Vec::new();
    for sim in sims.iter().filter(|_| counted) {
        match admin::sim_stats(sim.admin_addr()).await {
            Some(stats) => device.push(DeviceUse::from_stats(stats, duration.as_secs_f64())),
            None => {
                device.clear();
                break;
            }
        }
    }
    Ok(Side { flood, light, device })
}

fn joined(outcome: std::result::Result<Result<Report>, tokio::task::JoinError>) -> Result<Report> {
    outcome.map_err(|e| crate::Error::Process(format!("a load task failed: {e}")))?
}

/// The four simulators on one device, named `colocation-sim-<n>`.
async fn shared_sims(ctx: &Context, device: &std::path::Path, backend: &SimModel) -> Result<Vec<Proc>> {
    let mut sims = Vec::new();
    for n in 0..POOLS {
        let flag = format!("--shared-device={}", device.display());
        sims.push(procs::start_sim_with(&ctx.bins, &format!("colocation-sim-{n}"), backend, &[flag]).await?);
    }
    Ok(sims)
}

impl Measurement for Colocation {
    const KEY: &'static str = "colocation";
    const TITLE: &'static str =
        "GPU co-location: one pool flooding at 5× its share of a shared GPU beside three light ones";

    async fn run(ctx: &Context) -> Result<Self> {
        require_flag(&ctx.bins, "--adaptive", " (no adaptive limit)")?;
        let backend = shared_gpu();
        let limits = slice_limits();
        let device: PathBuf = ctx.bins.logs.join("colocation-device.lock");
        let sims = shared_sims(ctx, &device, &backend).await?;
        for sim in &sims {
            warm_up(&sim.url(), 2).await?;
        }
        ctx.say("colocation: measuring the shared device's capacity");
        let capacity = measure_capacity(ctx, &sims[0], TOKENS, 64).await?;
        let share_rps = capacity.rps / POOLS as f64;
        // A light pool sends about 40 calls a second: at 12 s its p99 was its 5th-slowest call of
        // 470, and the worst of three such ratios moved between 1.25× and 1.85× from run to run.
        // 30 s makes it the 12th of about 1,200.
        let duration = ctx.pick(Duration::from_secs(4), LIGHT_SECONDS);

        let mut modes = Vec::new();
        for (adaptive, guard) in MODES {
            let mode = Mode::new(adaptive, guard);
            let mut muxes = Vec::new();
            for (n, sim) in sims.iter().enumerate() {
                let mut extra: Vec<String> = if adaptive { vec!["--adaptive".into()] } else { Vec::new() };
                // An explicit cap is for the pool that floods, not the quiet ones beside it.
                if let Some(cap) = mode.cap.filter(|_| n == 0) {
                    extra.push(format!("--device-time-cap={cap}"));
                }
                // The share is every pool's, as the sidecar derives it from `gpu.sharing`.
                if let Some(share) = mode.share {
                    extra.push(format!("--gpu-share={share}"));
                }
                let name = format!(
                    "colocation-mux-{n}{}{}",
                    if adaptive { "-adaptive" } else { "" },
                    match guard {
                        Guard::None => "",
                        Guard::Share => "-share",
                        Guard::Cap => "-capped",
                    }
                );
                muxes.push(procs::start_mux_with(&ctx.bins, &name, sim, &limits, &extra).await?);
            }
            let targets: Vec<String> = muxes.iter().map(Proc::url).collect();
            for target in &targets {
                warm_up(target, 2).await?;
            }
            let name = mode.name();
            ctx.say(&format!("colocation ({name}): B, C, D at {:.0} req/s each, without A", LIGHT_FACTOR * share_rps));
            let alone = loads(&targets, &sims, share_rps, duration, true, false).await?.light;
            tokio::time::sleep(Duration::from_secs(1)).await;
            ctx.say(&format!("colocation ({name}): A at {:.0} req/s alone", FLOOD_FACTOR * share_rps));
            let flood_alone = loads(&targets, &sims, share_rps, duration, false, true).await?.flood;
            ctx.say(&format!("colocation ({name}): A got {}/{} alone", flood_alone.ok_in_time, flood_alone.sent));
            // A's queue drains before the light pools come.
            tokio::time::sleep(Duration::from_secs(2)).await;
            ctx.say(&format!("colocation ({name}): A at {:.0} req/s beside B, C, D", FLOOD_FACTOR * share_rps));
            let shared = loads(&targets, &sims, share_rps, duration, true, true).await?;
            let got: Vec<String> = shared.light.iter().map(|r| format!("{}/{}", r.ok_in_time, r.sent)).collect();
            ctx.say(&format!("colocation ({name}): light pools got {}", got.join(", ")));
            modes.push(Mode { alone, flood_alone: Some(flood_alone), shared, ..mode });
            for mux in muxes {
                mux.terminate(Duration::from_secs(5));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        ctx.say("colocation: the same loads straight to the simulators");
        let targets: Vec<String> = sims.iter().map(Proc::url).collect();
        let direct = loads(&targets, &sims, share_rps, duration, true, true).await?;
        let _ = std::fs::remove_file(&device);
        Ok(Colocation { backend, limits, capacity, seconds: duration.as_secs_f64(), modes, direct })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Colocation.label();
        let mut targets = Vec::new();
        for mode in &self.modes {
            let name = mode.name();
            // Uncapped, the light pools' figures are what the share is measured against; the
            // explicit cap is the always-on alternative. Both are reported beside the targets,
            // as the direct run is (see `MODES`).
            if !mode.is_default_share() {
                let compared = |what: &str| format!("{what}, {name} (for comparison)");
                targets.push(Target::info(&scenario, &compared(LIGHT_GOODPUT), Some(mode.worst_light_share()), "×"));
                targets.push(Target::info(&scenario, &compared(LIGHT_P99), Some(mode.worst_p99_ratio()), "×"));
                if mode.cap.is_some() {
                    let alone = self.flood_alone_ratio(mode);
                    targets.push(Target::info(&scenario, &compared(FLOOD_ALONE), alone, "×"));
                }
                continue;
            }
            let got: Vec<String> = mode.shared.light.iter().map(|r| format!("{}/{}", r.ok_in_time, r.sent)).collect();
            targets.push(
                Target::at_least(
                    &scenario,
                    &label(&name, LIGHT_GOODPUT),
                    mode.worst_light_share(),
                    LIGHT_GOODPUT_LIMIT,
                    "×",
                )
                .note_if_not_passed(format!(
                    "the light pools got {} in time beside the flood: their calls waited past the deadline for \
                     the shared device",
                    got.join(", ")
                )),
            );
            let p99s: Vec<String> = mode
                .shared
                .light
                .iter()
                .zip(&mode.alone)
                .map(|(s, a)| format!("{:.1} ms against {:.1} ms", s.latency.p99_ms, a.latency.p99_ms))
                .collect();
            targets.push(
                Target::at_most(&scenario, &label(&name, LIGHT_P99), mode.worst_p99_ratio(), LIGHT_P99_LIMIT, "×")
                    .note_if_not_passed(format!(
                        "light pools' p99 beside the flood and without it: {}. A light call waits for the batch \
                         holding the device (A's, at most its multiplexer's {} in flight) and any other light \
                         pool's before its own",
                        p99s.join("; "),
                        self.limits.max_in_flight
                    )),
            );
            let alone = self.flood_alone_ratio(mode);
            let target = match alone {
                Some(alone) => Target::at_least(&scenario, &label(&name, FLOOD_ALONE), alone, FLOOD_ALONE_LIMIT, "×"),
                None => Target::new(&scenario, &label(&name, FLOOD_ALONE), None, Rule::AtLeast, FLOOD_ALONE_LIMIT, "×"),
            };
            let counts = [Some(mode), self.uncapped(mode.adaptive)]
                .map(|mode| mode.and_then(|m| m.flood_alone.as_ref()).map_or(0, |r| r.ok_in_time));
            targets.push(target.note_if_not_passed(format!(
                "A alone got {} calls OK in time with its share, {} uncapped: the share read a neighbour where \
                 there was none",
                counts[0], counts[1]
            )));
        }
        let direct = self.direct.light.iter().map(share).fold(f64::INFINITY, f64::min);
        targets.push(Target::info(
            &scenario,
            "worst light pool's goodput ÷ sent, A flooding, direct to TEI",
            Some(direct),
            "×",
        ));
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Colocation.label();
        let mut targets = Vec::new();
        for (adaptive, guard) in MODES.into_iter().filter(|(_, guard)| *guard == Guard::Share) {
            let name = Mode::new(adaptive, guard).name();
            let name = name.as_str();
            targets.push(Target::new(
                &scenario,
                &label(name, LIGHT_GOODPUT),
                None,
                Rule::AtLeast,
                LIGHT_GOODPUT_LIMIT,
                "×",
            ));
            targets.push(Target::new(&scenario, &label(name, LIGHT_P99), None, Rule::AtMost, LIGHT_P99_LIMIT, "×"));
            targets.push(Target::new(
                &scenario,
                &label(name, FLOOD_ALONE),
                None,
                Rule::AtLeast,
                FLOOD_ALONE_LIMIT,
                "×",
            ));
        }
        targets
    }
}

impl Colocation {
    /// The uncapped run with the same limit as `adaptive`, if it was run.
    fn uncapped(&self, adaptive: bool) -> Option<&Mode> {
        self.modes.iter().find(|m| m.adaptive == adaptive && m.cap.is_none() && m.share.is_none())
    }

    /// A's calls OK in time alone in `mode` ÷ alone uncapped with the same limit.
    pub fn flood_alone_ratio(&self, mode: &Mode) -> Option<f64> {
        let uncapped = self.uncapped(mode.adaptive)?.flood_alone.as_ref()?;
        let this = mode.flood_alone.as_ref()?;
        Some(ratio(this.ok_in_time as f64, uncapped.ok_in_time as f64))
    }
}

#[cfg(test)]
mod tests {
    use teifleet_load::summary::Summary;

    use super::*;
    use crate::targets::Verdict;

    fn report(sent: u64, ok_in_time: u64, p99_ms: f64) -> Report {
        Report { sent, ok_in_time, latency: Summary { p99_ms, ..Summary::default() }, ..Report::default() }
    }

    #[test]
    fn the_worst_light_pool_is_judged_against_itself_without_the_flood_and_a_alone_against_uncapped() {
        let mode = |adaptive, guard, flood_ok: u64, light: Vec<Report>| Mode {
            alone: vec![report(100, 100, 5.0), report(100, 100, 6.0), report(100, 100, 4.0)],
            flood_alone: Some(report(5000, flood_ok, 50.0)),
            shared: Side { flood: report(5000, 900, 900.0), light, device: vec![] },
            ..Mode::new(adaptive, guard)
        };
        let r = Colocation {
            backend: shared_gpu(),
            limits: slice_limits(),
            capacity: Capacity { rps: 900.0, batch_ms: 8.4, concurrency: 64 },
            seconds: 4.0,
            modes: vec![
                // Uncapped: B at 12 ms against 5 ms (2.4×), reported, not judged; A alone 2000.
                mode(
                    false,
                    Guard::None,
                    2000,
                    vec![report(100, 100, 12.0), report(100, 100, 9.0), report(100, 90, 7.0)],
                ),
                // C: 8.4 ms against 6 ms alone (1.4×), all in time; D: 96 of 100; A alone 1960.
                mode(
                    false,
                    Guard::Share,
                    1960,
                    vec![report(100, 100, 7.0), report(100, 100, 8.4), report(100, 96, 5.0)],
                ),
                // B: 11 ms against 5 ms alone (2.2×); D: 94 of 100; no uncapped adaptive run to judge A by.
                mode(
                    true,
                    Guard::Share,
                    2000,
                    vec![report(100, 100, 11.0), report(100, 100, 9.0), report(100, 94, 7.0)],
                ),
                // The explicit cap: A alone at 600 of 2000, reported.
                mode(false, Guard::Cap, 600, vec![report(100, 100, 6.0), report(100, 100, 7.0), report(100, 100, 5.0)]),
            ],
            direct: Side { flood: report(5000, 900, 990.0), light: vec![report(100, 30, 990.0); 3], device: vec![] },
        };
        let t = r.targets();
        assert_eq!(t.len(), 12, "{t:?}");
        assert!(t[..2].iter().all(|t| t.verdict == Verdict::Info && t.name.contains("for comparison")), "{t:?}");
        assert!((t[1].measured.unwrap() - 2.4).abs() < 1e-9);
        let (static_share, rest) = t[2..].split_at(3);
        assert!((static_share[0].measured.unwrap() - 0.96).abs() < 1e-9);
        assert_eq!(static_share[0].verdict, Verdict::Pass);
        assert!((static_share[1].measured.unwrap() - 1.4).abs() < 1e-9, "C: 8.4 ms against 6 ms");
        assert_eq!(static_share[1].verdict, Verdict::Pass);
        assert!((static_share[2].measured.unwrap() - 0.98).abs() < 1e-9, "A alone: 1960 of 2000");
        assert_eq!(static_share[2].verdict, Verdict::Pass);
        let (adaptive_share, rest) = rest.split_at(3);
        assert_eq!(adaptive_share[0].verdict, Verdict::Fail);
        assert!(adaptive_share[0].note.contains("100/100, 100/100, 94/100"), "{}", adaptive_share[0].note);
        assert!((adaptive_share[1].measured.unwrap() - 2.2).abs() < 1e-9);
        assert_eq!(adaptive_share[1].verdict, Verdict::Fail);
        assert_eq!(adaptive_share[2].measured, None, "no uncapped adaptive run");
        assert!(rest[..3].iter().all(|t| t.verdict == Verdict::Info), "{rest:?}");
        assert!((rest[2].measured.unwrap() - 0.3).abs() < 1e-9, "the explicit cap alone: 600 of 2000");
        assert_eq!(rest[3].verdict, Verdict::Info, "direct");
        let planned: Vec<String> = Colocation::planned_targets().into_iter().map(|t| t.name).collect();
        let judged: Vec<String> = t[2..8].iter().map(|t| t.name.clone()).collect();
        assert_eq!(planned, judged);
    }
}
