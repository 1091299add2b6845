//! Scenario 1, overhead (the tei-manager benchmarks' table, plus a floor): the same closed-loop
//! calls direct to the backend, through the multiplexer, and through a bare tonic bytes-proxy
//! (the floor this machine allows for one tonic hop), and through HAProxy in TCP mode (the
//! physical floor of one extra hop) and as an h2c proxy (the best L7 proxy here), in interleaved
//! rounds. Info (no device time)
//! and single Embeds at 2/20/100/500 tokens on a ~1 ms device, and 5/10/20 concurrent Embeds.
//! Targets: added p50 ≤ 60 µs on Info and on the ~1 ms Embed.

use serde::{Deserialize, Serialize};
use teifleet_load::{Call, LoadConfig};

use super::{
    Context, FloorSides, Measurement, Sample, Scenario, added_p50_us, interleaved, median_of, precise_model, samples,
    unhurried_limits, warm_up, words,
};
use crate::Result;
use crate::floor::Stack;
use crate::procs::{self, Device, HaproxyMode, MuxLimits, SimModel};
use crate::targets::{Rule, Target, ratio};

/// Most the multiplexer may add to a call's p50, as a multiple of what HAProxy h2 adds.
pub const HAPROXY_RATIO_LIMIT: f64 = 1.0;
/// Most a hop may add to a call's p50.
pub const LIMIT_US: f64 = 60.0;
/// The Embed size the target is on: ~1 ms of device time.
pub const TARGET_TOKENS: usize = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Case {
    /// `Info`: no input, no device time; the path alone.
    Info,
    /// One Embed at a time.
    Single { tokens: usize },
    /// `clients` Embeds of 20 tokens in flight.
    Concurrent { clients: usize },
}

impl Case {
    pub fn label(self) -> String {
        match self {
            Self::Info => "Info (no device time)".into(),
            Self::Single { tokens } => format!("Embed, {tokens} tokens"),
            Self::Concurrent { clients } => format!("{clients} concurrent Embeds, 20 tokens"),
        }
    }

    /// The short name targets use.
    pub fn target_name(self) -> String {
        match self {
            Self::Info => "Info".into(),
            Self::Single { tokens } => format!("Embed {tokens} tokens"),
            Self::Concurrent { clients } => format!("{clients} concurrent"),
        }
    }

    fn has_target(self) -> bool {
        matches!(self, Self::Info | Self::Single { tokens: TARGET_TOKENS })
    }

    pub(crate) fn config(self, target: &str, calls: u64) -> LoadConfig {
        match self {
            Self::Info => LoadConfig { call: Call::Info, ..LoadConfig::closed(target, 1, calls) },
            Self::Single { tokens } => LoadConfig { inputs: words(tokens), ..LoadConfig::closed(target, 1, calls) },
            Self::Concurrent { clients } => {
                LoadConfig { inputs: words(TARGET_TOKENS), ..LoadConfig::closed(target, clients, calls) }
            }
        }
    }

    pub(crate) fn calls(self, quick: bool) -> u64 {
        match (self, quick) {
            (Self::Info, true) => 400,
            (Self::Info, false) => 1500,
            (Self::Single { .. }, true) => 150,
            (Self::Single { .. }, false) => 400,
            (Self::Concurrent { .. }, true) => 300,
            (Self::Concurrent { .. }, false) => 1000,
        }
    }
}

const CASES: [Case; 8] = [
    Case::Info,
    Case::Single { tokens: 2 },
    Case::Single { tokens: TARGET_TOKENS },
    Case::Single { tokens: 100 },
    Case::Single { tokens: 500 },
    Case::Concurrent { clients: 5 },
    Case::Concurrent { clients: 10 },
    Case::Concurrent { clients: 20 },
];

/// One case: per-round samples of each side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    pub case: Case,
    pub calls_per_round: u64,
    pub direct: Vec<Sample>,
    pub mux: Vec<Sample>,
    /// Through the bare tonic proxy; empty when the floor proxy was not built.
    pub floor: Vec<Sample>,
    #[serde(flatten)]
    pub floors: FloorSides,
}

impl CaseResult {
    /// What the multiplexer adds to the p50, µs.
    pub fn added_us(&self) -> f64 {
        added_p50_us(&self.direct, &self.mux)
    }

    /// What the floor proxy adds to the p50, µs.
    pub fn floor_added_us(&self) -> Option<f64> {
        (!self.floor.is_empty()).then(|| added_p50_us(&self.direct, &self.floor))
    }

    /// What the bare h2 proxy adds to the p50, µs.
    pub fn floor_h2_added_us(&self) -> Option<f64> {
        (!self.floors.floor_h2.is_empty()).then(|| added_p50_us(&self.direct, &self.floors.floor_h2))
    }

    /// The multiplexer's added latency over the floor's.
    pub fn vs_floor(&self) -> Option<f64> {
        self.floor_added_us().map(|floor| ratio(self.added_us(), floor))
    }

    /// What HAProxy in `mode` adds to the p50, µs.
    pub fn haproxy_added_us(&self, mode: HaproxyMode) -> Option<f64> {
        let side = match mode {
            HaproxyMode::Tcp => &self.floors.haproxy_tcp,
            HaproxyMode::H2 => &self.floors.haproxy_h2,
        };
        (!side.is_empty()).then(|| added_p50_us(&self.direct, side))
    }

    /// The multiplexer's added latency over HAProxy h2's.
    pub fn vs_haproxy_h2(&self) -> Option<f64> {
        self.over_haproxy_h2(self.added_us())
    }

    /// `added_us` over HAProxy h2's added latency.
    pub fn over_haproxy_h2(&self, added_us: f64) -> Option<f64> {
        self.haproxy_added_us(HaproxyMode::H2).map(|h2| ratio(added_us, h2))
    }

    pub fn p50_ms(side: &[Sample]) -> f64 {
        median_of(side, |s| s.p50_ms)
    }

    pub fn p99_ms(side: &[Sample]) -> f64 {
        median_of(side, |s| s.p99_ms)
    }

    pub fn device_ms(&self) -> Option<f64> {
        let v = median_of(&self.direct, |s| s.tei_inference_p50_ms.unwrap_or(f64::NAN));
        (!v.is_nan()).then_some(v)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub rounds: usize,
    pub cases: Vec<CaseResult>,
    /// Why there are no HAProxy sides (not installed, or it did not start).
    #[serde(default)]
    pub haproxy_missing: Option<String>,
}

/// Why a device-time target is not judged on a sleeping simulator.
const SLEEPING_DEVICE: &str = "the simulator has no --device spin yet: a sleeping device rounds to 1 ms timer ticks and \
                               a closed loop phase-locks to them, which hides or inflates a hop's microseconds";

/// Why the multiplexer adds more than HAProxy h2, from the floors of the same run.
fn vs_haproxy_note(c: &CaseResult) -> String {
    let floor = |added: Option<f64>| match added {
        Some(us) => format!("{us:.0} µs ({})", c.over_haproxy_h2(us).map_or("n/a".into(), |r| format!("{r:.2}×"))),
        None => "n/a (not built)".into(),
    };
    format!(
        "the multiplexer adds {:.0} µs; in the same rounds a bare tonic proxy adds {} and a bare proxy on the h2 \
         crate alone {}. The multiplexer's unary calls are on h2 directly on both sides (the gRPC port's server \
         and the upstream client), so what it adds above the h2 floor is its own work per call: routing, the key \
         check, admission, metrics, the load report and the call's accounting; the h2 floor's ratio is the least \
         a data path on h2 could reach here",
        c.added_us(),
        floor(c.floor_added_us()),
        floor(c.floor_h2_added_us()),
    )
}

fn fix_note(added: f64, floor_h2: Option<f64>) -> String {
    let floor = match floor_h2 {
        Some(f) => format!(
            "a bare proxy on the h2 crate (the multiplexer's own HTTP/2 stack, both sides) adds {f:.0} µs on this \
             machine, so {:.0} µs are the multiplexer's own work",
            added - f
        ),
        None => "the h2 floor proxy was not built, so how much of it any hop on h2 costs here is unknown".into(),
    };
    format!(
        "the multiplexer adds {added:.0} µs; {floor}: routing, admission and metrics (messages are forwarded as \
         bytes). The floor itself is near or above the limit here: most of a loopback hop is two extra wake-ups \
         and four extra socket calls, which a faster machine or pinned cores shrink and no proxy code avoids"
    )
}

impl Measurement for Overhead {
    const KEY: &'static str = "overhead";
    const TITLE: &'static str = "Overhead: one hop, direct vs the multiplexer vs the floor";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = precise_model(ctx.features);
        let sim = procs::start_sim(&ctx.bins, "overhead-sim", &backend).await?;
        let limits = unhurried_limits();
        let mux = procs::start_mux(&ctx.bins, "overhead-mux", &sim, &limits).await?;
        let mut floors = Vec::new();
        if ctx.features.floor_proxy {
            for stack in Stack::PROXIES {
                let name = format!("overhead-floor-{}", stack.flag());
                floors.push(procs::start_floor(&ctx.bins, &name, &sim, stack).await?);
            }
        }
        let (haproxy, haproxy_missing) = start_haproxies(ctx, "overhead", &sim).await;
        let mut targets = vec![sim.url(), mux.url()];
        targets.extend(floors.iter().map(procs::Proc::url));
        targets.extend(haproxy.iter().map(procs::Proc::url));
        for target in &targets {
            warm_up(target, 1).await?;
        }
        let floor_ran = !floors.is_empty();
        let rounds = ctx.pick(3, 5);
        let mut cases = Vec::new();
        for case in CASES {
            ctx.say(&format!("overhead: {}, {rounds} rounds", case.label()));
            let calls = case.calls(ctx.quick);
            let mut sides = interleaved(&targets, rounds, |t| case.config(t, calls)).await?.into_iter();
            let (direct, mux) = (sides.next().unwrap_or_default(), sides.next().unwrap_or_default());
            // The sides in `targets`' order: the floors' (tonic, h2) only when they run, then HAProxy's.
            let mut floor = || if floor_ran { sides.next().unwrap_or_default() } else { Vec::new() };
            let (floor, floor_h2) = (floor(), floor());
            let (haproxy_tcp, haproxy_h2) = (sides.next().unwrap_or_default(), sides.next().unwrap_or_default());
            cases.push(CaseResult {
                case,
                calls_per_round: calls,
                direct: samples(&direct),
                mux: samples(&mux),
                floor: samples(&floor),
                floors: FloorSides {
                    floor_h2: samples(&floor_h2),
                    haproxy_tcp: samples(&haproxy_tcp),
                    haproxy_h2: samples(&haproxy_h2),
                },
            });
        }
        Ok(Overhead { backend, limits, rounds, cases, haproxy_missing })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Overhead.label();
        let mut targets = Vec::new();
        for c in self.cases.iter().filter(|c| c.case.has_target()) {
            let name = c.case.target_name();
            let added = c.added_us();
            let floor = c.floor_added_us();
            let mut target = Target::at_most(&scenario, &format!("added p50, {name}"), added, LIMIT_US, "µs");
            let sleeping = self.backend.device == Device::Sleep && c.case != Case::Info;
            if sleeping {
                target = target.skip_because(SLEEPING_DEVICE);
            }
            targets.push(target.note_if_not_passed(fix_note(added, c.floor_h2_added_us())));
            targets.push(Target::info(&scenario, &format!("{}: added p50, {name}", Stack::Tonic.label()), floor, "µs"));
            targets.push(Target::info(&scenario, &format!("multiplexer ÷ floor, {name}"), c.vs_floor(), "×"));
            let floor_h2 = c.floor_h2_added_us();
            targets.push(Target::info(&scenario, &format!("{}: added p50, {name}", Stack::H2.label()), floor_h2, "µs"));
            let haproxy = |name: String, measured: Option<f64>, unit: &str| {
                let target = Target::info(&scenario, &name, measured, unit);
                match (&self.haproxy_missing, measured) {
                    (Some(why), None) => target.skip_because(why.clone()),
                    _ => target,
                }
            };
            for mode in [HaproxyMode::Tcp, HaproxyMode::H2] {
                let label = mode.label();
                targets.push(haproxy(format!("{label}: added p50, {name}"), c.haproxy_added_us(mode), "µs"));
            }
            let vs_haproxy = Target::new(
                &scenario,
                &format!("multiplexer ÷ HAProxy h2, {name}"),
                c.vs_haproxy_h2(),
                Rule::AtMost,
                HAPROXY_RATIO_LIMIT,
                "×",
            );
            targets.push(match (&self.haproxy_missing, c.vs_haproxy_h2()) {
                (Some(why), None) => vs_haproxy.skip_because(why.clone()),
                _ if sleeping => vs_haproxy.skip_because(SLEEPING_DEVICE),
                _ => vs_haproxy.note_if_not_passed(vs_haproxy_note(c)),
            });
            targets.push(haproxy(
                format!("{} ÷ HAProxy h2, {name}", Stack::H2.label()),
                floor_h2.and_then(|us| c.over_haproxy_h2(us)),
                "×",
            ));
        }
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Overhead.label();
        CASES
            .iter()
            .filter(|c| c.has_target())
            .flat_map(|c| {
                let name = c.target_name();
                [
                    Target::new(&scenario, &format!("added p50, {name}"), None, Rule::AtMost, LIMIT_US, "µs"),
                    Target::new(
                        &scenario,
                        &format!("multiplexer ÷ HAProxy h2, {name}"),
                        None,
                        Rule::AtMost,
                        HAPROXY_RATIO_LIMIT,
                        "×",
                    ),
                ]
            })
            .collect()
    }
}

/// HAProxy in TCP and h2 modes in front of `sim` (named after `scenario`), or none and why: a
/// machine without HAProxy reports its rows as SKIP instead of failing the scenario.
pub(crate) async fn start_haproxies(
    ctx: &Context,
    scenario: &str,
    sim: &procs::Proc,
) -> (Vec<procs::Proc>, Option<String>) {
    if !ctx.features.haproxy {
        return (Vec::new(), Some(procs::HAPROXY_MISSING.into()));
    }
    let mut started = Vec::new();
    for mode in [HaproxyMode::Tcp, HaproxyMode::H2] {
        let name = format!("{scenario}-haproxy-{}", mode.flag());
        let proc = match procs::start_haproxy(&ctx.bins, &name, sim, mode).await {
            Ok(proc) => proc,
            Err(e) => return (Vec::new(), Some(format!("{} did not start: {e}", mode.label()))),
        };
        if let Err(e) = warm_up(&proc.url(), 1).await {
            return (Vec::new(), Some(format!("{} did not forward a call: {e}", mode.label())));
        }
        started.push(proc);
    }
    (started, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::fast_model;
    use crate::targets::Verdict;

    fn side(p50s: &[f64]) -> Vec<Sample> {
        p50s.iter().map(|p| Sample { p50_ms: *p, ..Sample::default() }).collect()
    }

    fn result(backend: SimModel) -> Overhead {
        let limits = unhurried_limits();
        Overhead {
            backend,
            limits,
            rounds: 2,
            cases: vec![
                CaseResult {
                    case: Case::Info,
                    calls_per_round: 10,
                    direct: side(&[0.100, 0.110]),
                    mux: side(&[0.140, 0.150]),
                    floor: side(&[0.120, 0.130]),
                    floors: FloorSides {
                        floor_h2: side(&[0.115, 0.125]),
                        haproxy_tcp: side(&[0.105, 0.115]),
                        haproxy_h2: side(&[0.110, 0.120]),
                    },
                },
                CaseResult {
                    case: Case::Single { tokens: TARGET_TOKENS },
                    calls_per_round: 10,
                    direct: side(&[1.10, 1.12]),
                    mux: side(&[1.20, 1.22]),
                    floor: vec![],
                    floors: FloorSides::default(),
                },
                CaseResult {
                    case: Case::Concurrent { clients: 5 },
                    calls_per_round: 10,
                    direct: side(&[2.0, 2.0]),
                    mux: side(&[3.0, 3.0]),
                    floor: vec![],
                    floors: FloorSides::default(),
                },
            ],
            haproxy_missing: None,
        }
    }

    #[test]
    fn targets_on_info_and_the_1ms_embed_with_the_floor_beside() {
        let spin = SimModel { device: Device::Spin, ..fast_model() };
        let targets = result(spin).targets();
        let by_name = |n: &str| targets.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n}: {targets:?}"));
        let info = by_name("added p50, Info");
        assert_eq!(info.verdict, Verdict::Pass);
        assert!((info.measured.unwrap() - 40.0).abs() < 1e-6);
        let floor = by_name("floor (bare tonic proxy): added p50, Info");
        assert!((floor.measured.unwrap() - 20.0).abs() < 1e-6);
        assert!((by_name("multiplexer ÷ floor, Info").measured.unwrap() - 2.0).abs() < 1e-6);
        let embed = by_name("added p50, Embed 20 tokens");
        assert_eq!(embed.verdict, Verdict::Fail);
        assert!(embed.note.contains("floor proxy was not built"), "{}", embed.note);
        let tcp = by_name("HAProxy TCP: added p50, Info");
        assert_eq!(tcp.verdict, Verdict::Info);
        assert!((tcp.measured.unwrap() - 5.0).abs() < 1e-6);
        assert!((by_name("HAProxy h2: added p50, Info").measured.unwrap() - 10.0).abs() < 1e-6);
        let vs_haproxy = by_name("multiplexer ÷ HAProxy h2, Info");
        assert!((vs_haproxy.measured.unwrap() - 4.0).abs() < 1e-6);
        assert_eq!(vs_haproxy.verdict, Verdict::Fail);
        // The note gives both floors of the same rounds against HAProxy h2.
        assert!(
            vs_haproxy.note.contains("20 µs (2.00×)") && vs_haproxy.note.contains("15 µs (1.50×)"),
            "{}",
            vs_haproxy.note
        );
        assert!((by_name("floor (bare h2 proxy) ÷ HAProxy h2, Info").measured.unwrap() - 1.5).abs() < 1e-6);
        // Concurrent rows are reported, not judged.
        assert!(!targets.iter().any(|t| t.name.contains("concurrent")));
    }

    #[test]
    fn a_sleeping_device_skips_the_embed_target_but_not_info() {
        let targets = result(fast_model()).targets();
        let verdict = |n: &str| targets.iter().find(|t| t.name == n).map(|t| t.verdict);
        assert_eq!(verdict("added p50, Info"), Some(Verdict::Pass));
        assert_eq!(verdict("added p50, Embed 20 tokens"), Some(Verdict::Skip));
    }

    #[test]
    fn without_haproxy_its_rows_skip_with_the_reason() {
        let mut r = result(SimModel { device: Device::Spin, ..fast_model() });
        for c in &mut r.cases {
            (c.floors.haproxy_tcp, c.floors.haproxy_h2) = (vec![], vec![]);
        }
        r.haproxy_missing = Some("haproxy is not installed".into());
        let targets = r.targets();
        let h2 = targets.iter().find(|t| t.name == "HAProxy h2: added p50, Info").unwrap();
        assert_eq!((h2.measured, h2.verdict), (None, Verdict::Skip));
        assert!(h2.note.contains("not installed"), "{}", h2.note);
        let ratio = targets.iter().find(|t| t.name == "multiplexer ÷ HAProxy h2, Embed 20 tokens").unwrap();
        assert_eq!(ratio.verdict, Verdict::Skip);
        // The multiplexer's own targets are unchanged.
        let info = targets.iter().find(|t| t.name == "added p50, Info").unwrap();
        assert_eq!(info.verdict, Verdict::Pass);
    }
}
