//! Row 4 of the real-TEI scenario: the hop. One call at a time (Info, and one 20-token Embed),
//! direct to TEI, through the static sidecar, through HAProxy as an h2c proxy (scenario 1's L7
//! floor) and through the bare h2 floor proxy (the sidecar's own HTTP/2 stack relaying frames, no
//! check at all), in interleaved rounds; what each adds to the p50 over TEI direct, and the
//! sidecar's over HAProxy's on Info. The floor splits the sidecar's hop in two: what any proxy on
//! its stack adds in front of this TEI, and what the request path's checks add on top (sidecar −
//! floor), both measured in the same rounds.

use serde::{Deserialize, Serialize};
use teifleet_load::{Call, LoadConfig};

use super::{HOP_LIMIT, Shared, TOKENS};
use crate::Result;
use crate::floor::Stack;
use crate::procs::{self, HaproxyMode};
use crate::scenarios::{Context, Sample, added_p50_us, interleaved, median_of, samples, warm_up, words};
use crate::targets::{Rule, Target, ratio};

pub const INFO_VS_HAPROXY: &str = "sidecar ÷ HAProxy h2 added p50, Info";
const EMBED_VS_HAPROXY: &str = "sidecar ÷ HAProxy h2 added p50, Embed 20 tokens";

/// One case: per-round samples of each side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HopCase {
    /// `Info` or `Embed 20 tokens`.
    pub name: String,
    pub calls_per_round: u64,
    pub direct: Vec<Sample>,
    pub sidecar: Vec<Sample>,
    /// Empty when HAProxy did not run.
    pub haproxy_h2: Vec<Sample>,
    /// The bare h2 floor proxy's; empty when it was not built (or in results from before it ran).
    #[serde(default)]
    pub floor_h2: Vec<Sample>,
}

impl HopCase {
    pub fn sidecar_added_us(&self) -> f64 {
        added_p50_us(&self.direct, &self.sidecar)
    }

    pub fn haproxy_added_us(&self) -> Option<f64> {
        (!self.haproxy_h2.is_empty()).then(|| added_p50_us(&self.direct, &self.haproxy_h2))
    }

    /// What the bare h2 floor proxy adds: any proxy on the sidecar's stack, without its checks.
    pub fn floor_added_us(&self) -> Option<f64> {
        (!self.floor_h2.is_empty()).then(|| added_p50_us(&self.direct, &self.floor_h2))
    }

    /// What the sidecar adds over the bare h2 floor in the same rounds: its checks' cost (the
    /// median of each round's difference, as every added figure here).
    pub fn checks_added_us(&self) -> Option<f64> {
        (!self.floor_h2.is_empty()).then(|| added_p50_us(&self.floor_h2, &self.sidecar))
    }

    /// The floor's added p50 ÷ HAProxy h2's: how near the sidecar's stack alone comes to the limit.
    pub fn floor_vs_haproxy(&self) -> Option<f64> {
        let (floor, haproxy) = (self.floor_added_us()?, self.haproxy_added_us()?);
        Some(ratio(floor, haproxy)).filter(|r| r.is_finite())
    }

    /// The sidecar's added p50 ÷ HAProxy h2's.
    pub fn vs_haproxy(&self) -> Option<f64> {
        self.haproxy_added_us().map(|h| ratio(self.sidecar_added_us(), h))
    }

    /// [`HopCase::vs_haproxy`] for a figure reported without a limit: none when it cannot be
    /// formed (HAProxy added nothing measurable, as on an Embed whose device time varies more
    /// than a hop costs).
    pub fn vs_haproxy_reported(&self) -> Option<f64> {
        self.vs_haproxy().filter(|r| r.is_finite())
    }

    pub fn p50_ms(side: &[Sample]) -> f64 {
        median_of(side, |s| s.p50_ms)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    pub rounds: usize,
    pub cases: Vec<HopCase>,
    /// Why there is no HAProxy side.
    pub haproxy_missing: Option<String>,
}

impl Hop {
    pub fn targets(&self, scenario: &str) -> Vec<Target> {
        let mut targets = Vec::new();
        for c in &self.cases {
            let info = c.name == "Info";
            let (name, rule, limit) = if info {
                (INFO_VS_HAPROXY, Rule::AtMost, HOP_LIMIT)
            } else {
                (EMBED_VS_HAPROXY, Rule::Report, f64::NAN)
            };
            let measured = if info { c.vs_haproxy() } else { c.vs_haproxy_reported() };
            let target = Target::new(scenario, name, measured, rule, limit, "×");
            targets.push(match (&self.haproxy_missing, c.vs_haproxy()) {
                (Some(why), None) if info => target.skip_because(why.clone()),
                _ => target.note_if_not_passed(format!(
                    "on Info TEI answered in {:.0} µs at the median; the sidecar added {:.0} µs, HAProxy h2 {:.0} µs",
                    HopCase::p50_ms(&c.direct) * 1e3,
                    c.sidecar_added_us(),
                    c.haproxy_added_us().unwrap_or(f64::NAN)
                )),
            });
            targets.push(Target::info(
                scenario,
                &format!("sidecar added p50, {}", c.name),
                Some(c.sidecar_added_us()),
                "µs",
            ));
            targets.push(Target::info(
                scenario,
                &format!("HAProxy h2 added p50, {}", c.name),
                c.haproxy_added_us(),
                "µs",
            ));
            if info && !c.floor_h2.is_empty() {
                targets.push(Target::info(scenario, "floor (bare h2 proxy) added p50, Info", c.floor_added_us(), "µs"));
                targets.push(Target::info(
                    scenario,
                    "sidecar − floor (bare h2 proxy) added p50, Info",
                    c.checks_added_us(),
                    "µs",
                ));
                targets.push(Target::info(
                    scenario,
                    "floor (bare h2 proxy) ÷ HAProxy h2 added p50, Info",
                    c.floor_vs_haproxy(),
                    "×",
                ));
            }
        }
        targets
    }
}

fn config(info: bool, target: &str, calls: u64) -> LoadConfig {
    match info {
        true => LoadConfig { call: Call::Info, ..LoadConfig::closed(target, 1, calls) },
        false => LoadConfig { inputs: words(TOKENS), ..LoadConfig::closed(target, 1, calls) },
    }
}

pub async fn measure_row(ctx: &Context, shared: &Shared) -> Result<Hop> {
    let (haproxy, haproxy_missing) = if ctx.features.haproxy {
        match procs::start_haproxy(&ctx.bins, "real-tei-haproxy-h2", &shared.tei, HaproxyMode::H2).await {
            Ok(proc) => match warm_up(&proc.url(), 1).await {
                Ok(()) => (Some(proc), None),
                Err(e) => (None, Some(format!("HAProxy h2 did not forward a call: {e}"))),
            },
            Err(e) => (None, Some(format!("HAProxy h2 did not start: {e}"))),
        }
    } else {
        (None, Some(procs::HAPROXY_MISSING.to_owned()))
    };
    // Started beside HAProxy, so both proxies are as fresh; without the floor binary the row runs
    // as before.
    let floor = match ctx.features.floor_proxy {
        true => match procs::start_floor(&ctx.bins, "real-tei-floor-h2", &shared.tei, Stack::H2).await {
            Ok(proc) => warm_up(&proc.url(), 1).await.ok().map(|()| proc),
            Err(_) => None,
        },
        false => None,
    };
    let mut targets = vec![shared.tei.url(), shared.sidecar.url()];
    targets.extend(haproxy.iter().map(procs::Proc::url));
    targets.extend(floor.iter().map(procs::Proc::url));
    let rounds = ctx.pick(3, 5);
    let mut cases = Vec::new();
    for (info, name, calls) in [(true, "Info", ctx.pick(300, 1000)), (false, "Embed 20 tokens", ctx.pick(60, 100))] {
        ctx.say(&format!("real tei 4: the hop, {name}, {rounds} rounds of {calls} calls per side"));
        let mut sides = interleaved(&targets, rounds, |t| config(info, t, calls)).await?.into_iter();
        let mut next = || samples(&sides.next().unwrap_or_default());
        let (direct, sidecar) = (next(), next());
        let haproxy_h2 = if haproxy.is_some() { next() } else { Vec::new() };
        let floor_h2 = if floor.is_some() { next() } else { Vec::new() };
        cases.push(HopCase { name: name.into(), calls_per_round: calls, direct, sidecar, haproxy_h2, floor_h2 });
    }
    Ok(Hop { rounds, cases, haproxy_missing })
}
