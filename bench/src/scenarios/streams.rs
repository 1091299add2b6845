//! Scenario 8, streams (the tei-manager benchmarks' streaming rows): one EmbedStream call
//! carrying 5, 10 or 20 messages at a time, closed loop, direct and through the multiplexer in
//! interleaved rounds, on the ~1 ms device of the overhead scenario. The multiplexer takes a
//! permit per message, so this is where a per-message cost would show. Target: the 20-message
//! call's p50 grows ≤ 3%. The same calls go through the floors of scenario 1 in the same rounds
//! (a bare proxy on `h2` alone, HAProxy in TCP and h2c modes), so every run shows what one hop
//! adds to a stream here before any work of the multiplexer's.

use serde::{Deserialize, Serialize};
use teifleet_load::{Call, LoadConfig};

use super::{
    Context, FloorSides, Measurement, Sample, Scenario, interleaved, median_of, precise_model, samples,
    unhurried_limits, warm_up, words,
};
use crate::Result;
use crate::floor::Stack;
use crate::procs::{self, Device, HaproxyMode, MuxLimits, SimModel};
use crate::targets::{Rule, Target, added_percent};

pub const LIMIT_PERCENT: f64 = 3.0;
pub const TARGET_BATCH: usize = 20;
const BATCHES: [usize; 3] = [5, 10, TARGET_BATCH];
const TOKENS: usize = 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamCase {
    pub messages: usize,
    pub calls_per_round: u64,
    pub direct: Vec<Sample>,
    pub mux: Vec<Sample>,
    #[serde(flatten)]
    pub floors: FloorSides,
}

impl StreamCase {
    pub fn direct_p50_ms(&self) -> f64 {
        median_of(&self.direct, |s| s.p50_ms)
    }

    pub fn mux_p50_ms(&self) -> f64 {
        median_of(&self.mux, |s| s.p50_ms)
    }

    /// Percent the multiplexer adds to the call's p50: the median over rounds of each round's.
    pub fn added_percent(&self) -> f64 {
        self.added_percent_by(&self.mux).unwrap_or(f64::NAN)
    }

    /// Percent `side` (one of this case's) adds to the call's p50, as for the multiplexer; `None`
    /// when that side did not run.
    pub fn added_percent_by(&self, side: &[Sample]) -> Option<f64> {
        let per_round: Vec<f64> =
            self.direct.iter().zip(side).map(|(d, m)| added_percent(d.p50_ms, m.p50_ms)).collect();
        (!per_round.is_empty()).then(|| crate::targets::median(&per_round))
    }

    /// Each side that ran besides direct, with its label, in the table's order.
    pub fn proxies(&self) -> Vec<(&'static str, &[Sample])> {
        [
            ("multiplexer", self.mux.as_slice()),
            (Stack::H2.label(), self.floors.floor_h2.as_slice()),
            (HaproxyMode::Tcp.label(), self.floors.haproxy_tcp.as_slice()),
            (HaproxyMode::H2.label(), self.floors.haproxy_h2.as_slice()),
        ]
        .into_iter()
        .filter(|(_, side)| !side.is_empty())
        .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Streams {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub rounds: usize,
    pub tokens: usize,
    pub cases: Vec<StreamCase>,
}

impl Measurement for Streams {
    const KEY: &'static str = "streams";
    const TITLE: &'static str = "Streams: a 20-message EmbedStream, direct vs the multiplexer";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = precise_model(ctx.features);
        let sim = procs::start_sim(&ctx.bins, "streams-sim", &backend).await?;
        let limits = unhurried_limits();
        let mux = procs::start_mux(&ctx.bins, "streams-mux", &sim, &limits).await?;
        // The floors of scenario 1 (the tonic one forwards unary calls only).
        let floor = match ctx.features.floor_proxy {
            true => Some(procs::start_floor(&ctx.bins, "streams-floor-h2", &sim, Stack::H2).await?),
            false => None,
        };
        let (haproxy, _) = super::overhead::start_haproxies(ctx, "streams", &sim).await;
        let mut targets = vec![sim.url(), mux.url()];
        targets.extend(floor.iter().map(procs::Proc::url));
        targets.extend(haproxy.iter().map(procs::Proc::url));
        for target in &targets {
            warm_up(target, 1).await?;
        }
        let rounds = ctx.pick(3, 5);
        let calls = ctx.pick(60, 200);
        let mut cases = Vec::new();
        for messages in BATCHES {
            ctx.say(&format!("streams: EmbedStream of {messages}, {rounds} rounds"));
            let config = |t: &str| LoadConfig {
                call: Call::EmbedStream { batch: messages },
                inputs: words(TOKENS),
                ..LoadConfig::closed(t, 1, calls)
            };
            let mut sides = interleaved(&targets, rounds, config).await?.into_iter();
            let mut next = || samples(&sides.next().unwrap_or_default());
            let (direct, mux) = (next(), next());
            let floor_h2 = if floor.is_some() { next() } else { Vec::new() };
            let (haproxy_tcp, haproxy_h2) =
                if haproxy.is_empty() { (Vec::new(), Vec::new()) } else { (next(), next()) };
            let floors = FloorSides { floor_h2, haproxy_tcp, haproxy_h2 };
            cases.push(StreamCase { messages, calls_per_round: calls, direct, mux, floors });
        }
        Ok(Streams { backend, limits, rounds, tokens: TOKENS, cases })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Streams.label();
        self.cases
            .iter()
            .filter(|c| c.messages == TARGET_BATCH)
            .flat_map(|c| {
                let added = c.added_percent();
                let target = Target::at_most(
                    &scenario,
                    &format!("added p50, EmbedStream of {}", c.messages),
                    added,
                    LIMIT_PERCENT,
                    "%",
                );
                let target = if self.backend.device == Device::Sleep {
                    target.skip_because(
                        "the simulator has no --device spin yet: on a sleeping device the call's batches round to \
                         1 ms ticks, so a few µs can move it by a whole tick",
                    )
                } else {
                    target
                };
                let added_us = |case: &StreamCase| (case.mux_p50_ms() - case.direct_p50_ms()) * 1e3;
                let per_size: Vec<String> =
                    self.cases.iter().map(|case| format!("{:+.0} µs for {}", added_us(case), case.messages)).collect();
                let floors: Vec<String> = c
                    .proxies()
                    .into_iter()
                    .skip(1)
                    .filter_map(|(label, side)| Some(format!("{label} {:+.1}%", c.added_percent_by(side)?)))
                    .collect();
                let floors = match floors.is_empty() {
                    true => "no floor ran".to_owned(),
                    false => format!("in the same rounds {}", floors.join(", ")),
                };
                let target = target.note_if_not_passed(format!(
                    "{:.0} µs added to a {:.2} ms call ({}): about the same whatever the message count, so it is \
                     the call's one extra hop, not a per-message cost; {floors}",
                    added_us(c),
                    c.direct_p50_ms(),
                    per_size.join(", ")
                ));
                let mut targets = vec![target];
                for (label, side) in c.proxies().into_iter().skip(1) {
                    let name = format!("{label}: added p50, EmbedStream of {}", c.messages);
                    targets.push(Target::info(&scenario, &name, c.added_percent_by(side), "%"));
                }
                targets
            })
            .collect()
    }

    fn planned_targets() -> Vec<Target> {
        let name = format!("added p50, EmbedStream of {TARGET_BATCH}");
        vec![Target::new(&Scenario::Streams.label(), &name, None, Rule::AtMost, LIMIT_PERCENT, "%")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::fast_model;
    use crate::targets::Verdict;

    #[test]
    fn the_target_is_the_median_round_of_the_20_message_call() {
        let s = |p50_ms| Sample { p50_ms, ..Sample::default() };
        let case = |messages, direct: Vec<Sample>, mux: Vec<Sample>| StreamCase {
            messages,
            calls_per_round: 1,
            floors: FloorSides {
                floor_h2: direct.iter().map(|d| s(d.p50_ms * 1.01)).collect(),
                haproxy_tcp: Vec::new(),
                haproxy_h2: direct.iter().map(|d| s(d.p50_ms * 1.04)).collect(),
            },
            direct,
            mux,
        };
        let limits = unhurried_limits();
        let result = Streams {
            backend: SimModel { device: Device::Spin, ..fast_model() },
            limits,
            rounds: 3,
            tokens: TOKENS,
            cases: vec![
                case(5, vec![s(1.0)], vec![s(2.0)]),
                case(20, vec![s(2.0), s(2.0), s(2.0)], vec![s(2.02), s(2.04), s(3.0)]),
            ],
        };
        let targets = result.targets();
        // The target, then the h2 floor's and HAProxy h2's added percent beside it.
        assert_eq!(targets.len(), 3, "{targets:?}");
        assert!((targets[0].measured.unwrap() - 2.0).abs() < 1e-9, "{targets:?}");
        assert_eq!(targets[0].verdict, Verdict::Pass);
        assert!((targets[1].measured.unwrap() - 1.0).abs() < 1e-6, "{targets:?}");
        assert!(targets[2].name.starts_with("HAProxy h2"), "{targets:?}");
        assert!((targets[2].measured.unwrap() - 4.0).abs() < 1e-6, "{targets:?}");
        let sleeping = Streams { backend: fast_model(), ..result };
        assert_eq!(sleeping.targets()[0].verdict, Verdict::Skip);
    }
}
