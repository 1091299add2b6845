//! Scenario 13, the HTTP hop: the same closed-loop calls as scenario 1 over TEI's HTTP API
//! through the sidecar's HTTP front (`POST /embed`, `GET /info` on HTTP/1.1 keep-alive
//! connections), beside gRPC through the sidecar and gRPC direct to the backend, in interleaved
//! rounds. The backend (like TEI's gRPC image) has no HTTP server, so "direct" is gRPC: the HTTP
//! figure is what an HTTP client pays over a gRPC client calling TEI itself, JSON included.
//! Targets, as ratios of the same run: an HTTP client of the pool waits at most 1.1× what a gRPC
//! client of the same sidecar waits on the ~1 ms Embed (p50), and 1.5× on Info (no device time,
//! so the path is all there is). What each path adds over gRPC direct is reported beside; it
//! also holds the client stacks' difference (an HTTP/1.1 request alone on its connection, a gRPC
//! call through tonic's channel on a shared HTTP/2 connection), which is why it is not judged.

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Protocol};

use super::{
    Context, Measurement, Sample, Scenario, added_p50_us, interleaved, measure, median_of, precise_model, samples,
    unhurried_limits, warm_up,
};
use crate::Result;
use crate::procs::{self, Device, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};

/// An HTTP client's p50 over a gRPC client's, through the same sidecar, on the ~1 ms Embed: the
/// HTTP front does the gRPC path's work plus a JSON request and a JSON answer (one short text, a
/// 384-float vector), which should cost a tenth of a millisecond call at most.
pub const EMBED_RATIO_LIMIT: f64 = 1.1;
/// The same on Info, where there is no device time and the path is the whole call.
pub const INFO_RATIO_LIMIT: f64 = 1.5;
/// The Embed size the target is on: ~1 ms of device time, as in scenario 1.
pub const TARGET_TOKENS: usize = super::overhead::TARGET_TOKENS;

/// The cases of scenario 1, each sent over both protocols.
pub use super::overhead::Case;

/// The case as both protocols name it.
pub fn label(case: Case) -> String {
    match case {
        Case::Info => "Info / GET /info (no device time)".into(),
        Case::Single { tokens } => format!("Embed / POST /embed, {tokens} tokens"),
        Case::Concurrent { clients } => format!("{clients} concurrent Embeds, {TARGET_TOKENS} tokens"),
    }
}

/// The limit on HTTP p50 ÷ gRPC p50 through the sidecar, for the judged cases.
fn limit(case: Case) -> Option<f64> {
    match case {
        Case::Info => Some(INFO_RATIO_LIMIT),
        Case::Single { tokens: TARGET_TOKENS } => Some(EMBED_RATIO_LIMIT),
        Case::Single { .. } | Case::Concurrent { .. } => None,
    }
}

fn config(case: Case, target: &str, protocol: Protocol, calls: u64) -> LoadConfig {
    LoadConfig { protocol, ..case.config(target, calls) }
}

const CASES: [Case; 3] = [Case::Info, Case::Single { tokens: TARGET_TOKENS }, Case::Concurrent { clients: 10 }];

/// One case: per-round samples of each side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    pub case: Case,
    pub calls_per_round: u64,
    /// gRPC, direct to the backend.
    pub direct: Vec<Sample>,
    /// gRPC through the sidecar.
    pub grpc: Vec<Sample>,
    /// TEI's HTTP API through the sidecar's HTTP front.
    pub http: Vec<Sample>,
}

impl CaseResult {
    /// What the gRPC hop adds to the p50, µs.
    pub fn grpc_added_us(&self) -> f64 {
        added_p50_us(&self.direct, &self.grpc)
    }

    /// What the HTTP hop adds to the p50 over gRPC direct, µs.
    pub fn http_added_us(&self) -> f64 {
        added_p50_us(&self.direct, &self.http)
    }

    /// An HTTP client's p50 over a gRPC client's, through the same sidecar: the median over rounds
    /// of each round's ratio.
    pub fn http_vs_grpc(&self) -> f64 {
        let ratios: Vec<f64> = self.grpc.iter().zip(&self.http).map(|(g, h)| ratio(h.p50_ms, g.p50_ms)).collect();
        crate::targets::median(&ratios)
    }

    pub fn p50_ms(side: &[Sample]) -> f64 {
        median_of(side, |s| s.p50_ms)
    }

    pub fn p99_ms(side: &[Sample]) -> f64 {
        median_of(side, |s| s.p99_ms)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HttpOverhead {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub rounds: usize,
    pub cases: Vec<CaseResult>,
}

fn fix_note(c: &CaseResult) -> String {
    format!(
        "an HTTP client waited {:.0} µs at the median where a gRPC client of the same sidecar waited {:.0} µs: the \
         difference is HTTP/1.1 parsing, the JSON request and answer, and the protobuf message built for the \
         upstream call; a CPU profile of the multiplexer under this load (perf) shows which to make cheaper",
        CaseResult::p50_ms(&c.http) * 1e3,
        CaseResult::p50_ms(&c.grpc) * 1e3
    )
}

/// The HTTP scenarios' setup: a simulator, and a multiplexer in front of it with its HTTP front on
/// a port of its own, named `<name>-sim` and `<name>-mux`, each warmed up over `connections` (the
/// HTTP front too, so the pool's connections are open before measuring). Returns the simulator,
/// the multiplexer and the HTTP front's URL.
pub async fn sim_and_http_mux(
    ctx: &Context,
    name: &str,
    backend: &SimModel,
    limits: &MuxLimits,
    connections: usize,
) -> Result<(Proc, Proc, String)> {
    let sim = procs::start_sim(&ctx.bins, &format!("{name}-sim"), backend).await?;
    let port = teifleet_testkit::net::free_port()?;
    let listen = [format!("--http-listen=127.0.0.1:{port}")];
    let mux = procs::start_mux_with(&ctx.bins, &format!("{name}-mux"), &sim, limits, &listen).await?;
    let http = format!("http://127.0.0.1:{port}");
    warm_up(&sim.url(), connections).await?;
    warm_up(&mux.url(), connections).await?;
    measure(LoadConfig { protocol: Protocol::Http, ..LoadConfig::closed(&http, connections, 200) }).await?;
    Ok((sim, mux, http))
}

impl Measurement for HttpOverhead {
    const KEY: &'static str = "http-overhead";
    const TITLE: &'static str = "HTTP overhead: TEI's HTTP API through the sidecar vs gRPC through it vs direct";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = precise_model(ctx.features);
        let limits = unhurried_limits();
        let (sim, mux, http) = sim_and_http_mux(ctx, "http-overhead", &backend, &limits, 1).await?;
        let targets = [sim.url(), mux.url(), http.clone()];
        let protocol = |target: &str| if target == http { Protocol::Http } else { Protocol::Grpc };
        let rounds = ctx.pick(3, 5);
        let mut cases = Vec::new();
        for case in CASES {
            ctx.say(&format!("http overhead: {}, {rounds} rounds", label(case)));
            let calls = case.calls(ctx.quick);
            let mut sides = interleaved(&targets, rounds, |t| config(case, t, protocol(t), calls)).await?.into_iter();
            let (direct, grpc, http) =
                (sides.next().unwrap_or_default(), sides.next().unwrap_or_default(), sides.next().unwrap_or_default());
            cases.push(CaseResult {
                case,
                calls_per_round: calls,
                direct: samples(&direct),
                grpc: samples(&grpc),
                http: samples(&http),
            });
        }
        Ok(HttpOverhead { backend, limits, rounds, cases })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::HttpOverhead.label();
        let mut targets = Vec::new();
        for c in &self.cases {
            let Some(limit) = limit(c.case) else { continue };
            let name = c.case.target_name();
            let judged = format!("HTTP ÷ gRPC p50 through the sidecar, {name}");
            let mut target = Target::at_most(&scenario, &judged, c.http_vs_grpc(), limit, "×");
            if self.backend.device == Device::Sleep && c.case != Case::Info {
                target = target.skip_because(
                    "the simulator has no --device spin: a sleeping device rounds to 1 ms timer ticks and a closed \
                     loop phase-locks to them, which hides or inflates a hop's microseconds",
                );
            }
            targets.push(target.note_if_not_passed(fix_note(c)));
            let added = |protocol: &str| format!("{protocol} added p50 over gRPC direct, {name}");
            targets.push(Target::info(&scenario, &added("HTTP"), Some(c.http_added_us()), "µs"));
            targets.push(Target::info(&scenario, &added("gRPC"), Some(c.grpc_added_us()), "µs"));
        }
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::HttpOverhead.label();
        CASES
            .iter()
            .filter_map(|c| {
                let name = format!("HTTP ÷ gRPC p50 through the sidecar, {}", c.target_name());
                limit(*c).map(|limit| Target::new(&scenario, &name, None, Rule::AtMost, limit, "×"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::fast_model;
    use crate::targets::Verdict;

    fn side(p50s: &[f64]) -> Vec<Sample> {
        p50s.iter().map(|p| Sample { p50_ms: *p, ..Sample::default() }).collect()
    }

    fn result(device: Device) -> HttpOverhead {
        HttpOverhead {
            backend: SimModel { device, ..fast_model() },
            limits: unhurried_limits(),
            rounds: 2,
            cases: vec![
                CaseResult {
                    case: Case::Info,
                    calls_per_round: 10,
                    direct: side(&[0.100, 0.100]),
                    grpc: side(&[0.200, 0.200]),
                    http: side(&[0.250, 0.250]),
                },
                CaseResult {
                    case: Case::Single { tokens: TARGET_TOKENS },
                    calls_per_round: 10,
                    direct: side(&[1.0, 1.0]),
                    grpc: side(&[1.1, 1.1]),
                    http: side(&[1.4, 1.4]),
                },
            ],
        }
    }

    #[test]
    fn http_is_judged_against_grpc_through_the_same_sidecar_in_the_same_run() {
        let targets = result(Device::Spin).targets();
        let by_name = |n: &str| targets.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n}: {targets:?}"));
        let info = by_name("HTTP ÷ gRPC p50 through the sidecar, Info");
        assert_eq!(info.verdict, Verdict::Pass, "0.25 ms over 0.2 ms");
        assert!((info.measured.unwrap() - 1.25).abs() < 1e-6);
        let embed = by_name("HTTP ÷ gRPC p50 through the sidecar, Embed 20 tokens");
        assert_eq!(embed.verdict, Verdict::Fail, "1.4 ms over 1.1 ms");
        assert!(embed.note.contains("waited 1400 µs"), "{}", embed.note);
        let added = by_name("HTTP added p50 over gRPC direct, Info");
        assert!((added.measured.unwrap() - 150.0).abs() < 1e-6);
        assert!(!targets.iter().any(|t| t.name.contains("concurrent")), "reported, not judged");
    }

    #[test]
    fn a_sleeping_device_skips_the_embed_ratio_but_not_info() {
        let targets = result(Device::Sleep).targets();
        let verdict = |n: &str| targets.iter().find(|t| t.name == n).map(|t| t.verdict);
        assert_eq!(verdict("HTTP ÷ gRPC p50 through the sidecar, Info"), Some(Verdict::Pass));
        assert_eq!(verdict("HTTP ÷ gRPC p50 through the sidecar, Embed 20 tokens"), Some(Verdict::Skip));
    }
}
