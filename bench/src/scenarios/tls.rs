//! Scenario 16, TLS cost: what serving TLS adds to a call through the multiplexer. One simulator
//! (scenario 1's precise backend) behind two multiplexers started with identical flags but for
//! `--tls-cert`/`--tls-key`; the same closed-loop calls through each in interleaved rounds, as
//! scenario 1 does. Over a long-lived connection (the steady state: only record encryption) on
//! Info and a 20-token (~1 ms) Embed, and on Info with a new connection per call (the TLS one
//! resuming the run's session). Each multiplexer's CPU over a case comes from `/proc/<pid>/stat`,
//! as in scenario 5; each process serves only its own side's calls, so its CPU is theirs.
//! Targets: TLS adds ≤ 50 µs to Info's p50 over a long-lived connection; the multiplexer's CPU per
//! call with TLS ≤ 1.5× without, over long-lived connections.

use serde::{Deserialize, Serialize};
use teifleet_load::report::Handshakes;
use teifleet_load::{Call, LoadConfig, Report};

use super::cost::ProxyCpu;
use super::{
    Context, Measurement, Sample, Scenario, added_p50_us, interleaved, measure, median_of, precise_model, samples,
    unhurried_limits, words,
};
use crate::procfs::CpuMeter;
use crate::procs::{self, MuxLimits, SimModel, TlsFiles};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result};

/// Most TLS may add to Info's p50 over a long-lived connection.
pub const ADDED_LIMIT_US: f64 = 50.0;
/// Most the multiplexer's CPU per call with TLS may be, times its CPU per call without.
pub const CPU_RATIO_LIMIT: f64 = 1.5;
/// The Embed size: ~1 ms of device time, as scenario 1's judged Embed.
pub const TOKENS: usize = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Case {
    /// `Info` over one long-lived connection: the path alone, plus record encryption.
    Info,
    /// Embeds of `tokens` over one long-lived connection.
    Embed { tokens: usize },
    /// `Info`, each call on a connection of its own: TCP (and a resumed TLS) handshake included.
    InfoPerCall,
}

impl Case {
    pub fn label(self) -> String {
        match self {
            Self::Info => "Info, long-lived connection".into(),
            Self::Embed { tokens } => format!("Embed {tokens} tokens, long-lived connection"),
            Self::InfoPerCall => "Info, a new connection per call".into(),
        }
    }

    /// Long-lived connections: the cases the targets judge.
    pub fn long_lived(self) -> bool {
        !matches!(self, Self::InfoPerCall)
    }

    fn config(self, target: &str, calls: u64, files: &TlsFiles) -> LoadConfig {
        let base = LoadConfig {
            ca_cert: teifleet_load::is_tls(target).then(|| files.ca.clone()),
            ..LoadConfig::closed(target, 1, calls)
        };
        match self {
            Self::Info => LoadConfig { call: Call::Info, ..base },
            Self::Embed { tokens } => LoadConfig { inputs: words(tokens), ..base },
            Self::InfoPerCall => LoadConfig { call: Call::Info, connection_per_call: true, ..base },
        }
    }

    /// Enough calls per side that `/proc`'s 10 ms CPU ticks are a few percent of a case's CPU.
    fn calls(self, quick: bool) -> u64 {
        match (self, quick) {
            (Self::Info, true) => 2000,
            (Self::Info, false) => 5000,
            (Self::Embed { .. }, true) => 500,
            (Self::Embed { .. }, false) => 1500,
            (Self::InfoPerCall, true) => 400,
            (Self::InfoPerCall, false) => 800,
        }
    }
}

const CASES: [Case; 3] = [Case::Info, Case::Embed { tokens: TOKENS }, Case::InfoPerCall];

/// One case: per-round samples and each multiplexer's CPU over all the rounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    pub case: Case,
    pub calls_per_round: u64,
    pub plain: Vec<Sample>,
    pub tls: Vec<Sample>,
    /// The plaintext multiplexer's OK calls and CPU seconds over the case.
    pub plain_cpu: ProxyCpu,
    /// The TLS multiplexer's.
    pub tls_cpu: ProxyCpu,
    /// The TLS side's handshakes over the case (one full per round on long-lived connections).
    pub handshakes: Handshakes,
}

impl CaseResult {
    /// What TLS adds to the p50, µs.
    pub fn added_us(&self) -> f64 {
        added_p50_us(&self.plain, &self.tls)
    }

    pub fn p50_ms(side: &[Sample]) -> f64 {
        median_of(side, |s| s.p50_ms)
    }

    pub fn p99_ms(side: &[Sample]) -> f64 {
        median_of(side, |s| s.p99_ms)
    }

    /// The multiplexer's CPU per call with TLS over without.
    pub fn cpu_ratio(&self) -> f64 {
        ratio(self.tls_cpu.us_per_call(), self.plain_cpu.us_per_call())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TlsCost {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub rounds: usize,
    pub cases: Vec<CaseResult>,
}

fn fix_note(c: &CaseResult) -> String {
    format!(
        "{}: TLS added {:.0} µs to the p50 ({} ms plaintext) and the multiplexer spent {:.0} µs of CPU per call \
         with TLS against {:.0} µs without ({:.2}×). Over a long-lived connection no handshake is in the calls, so \
         this is rustls's record layer on both ends (the client's too: it shares the cores): each HTTP/2 write \
         sealed as a record, each read opened and copied through rustls's buffers. What would shrink it: fewer \
         records per call (a call's headers, message and trailers written together rather than frame by \
         frame); the added latency also holds the client's own record work on the same cores",
        c.case.label(),
        c.added_us(),
        crate::targets::number(CaseResult::p50_ms(&c.plain)),
        c.tls_cpu.us_per_call(),
        c.plain_cpu.us_per_call(),
        c.cpu_ratio()
    )
}

impl Measurement for TlsCost {
    const KEY: &'static str = "tls";
    const TITLE: &'static str = "TLS cost: a call through the multiplexer in TLS vs in plaintext";

    async fn run(ctx: &Context) -> Result<Self> {
        if !ctx.features.mux_tls {
            return Err(Error::Process("this teifleet-multiplexer has no --tls-cert: rebuild it".into()));
        }
        let backend = precise_model(ctx.features);
        let sim = procs::start_sim(&ctx.bins, "tls-sim", &backend).await?;
        let limits = unhurried_limits();
        let files = TlsFiles::write(&ctx.bins, "tls")?;
        let plain = procs::start_mux(&ctx.bins, "tls-mux-plain", &sim, &limits).await?;
        let tls = procs::start_mux_tls(&ctx.bins, "tls-mux-tls", &sim, &limits, &files).await?;
        let targets = [plain.url(), tls.url()];
        for target in &targets {
            let warm = LoadConfig { call: Call::Embed, ..Case::Info.config(target, 200, &files) };
            let report = measure(warm).await?;
            if report.ok == 0 {
                return Err(Error::Process(format!("no call succeeded through {target}")));
            }
        }
        let rounds = ctx.pick(3, 5);
        let mut cases = Vec::new();
        for case in CASES {
            ctx.say(&format!("tls: {}, {rounds} rounds", case.label()));
            let calls = case.calls(ctx.quick);
            let meter = CpuMeter::start(&[plain.pid(), tls.pid()])?;
            let mut sides = interleaved(&targets, rounds, |t| case.config(t, calls, &files)).await?.into_iter();
            let spent = meter.stop()?;
            let (plain_reports, tls_reports) = (sides.next().unwrap_or_default(), sides.next().unwrap_or_default());
            let ok = |reports: &[Report]| reports.iter().map(|r| r.ok).sum::<u64>();
            let handshakes = tls_reports.iter().filter_map(|r| r.tls).fold(Handshakes::default(), |a, h| Handshakes {
                full: a.full + h.full,
                resumed: a.resumed + h.resumed,
            });
            cases.push(CaseResult {
                case,
                calls_per_round: calls,
                plain: samples(&plain_reports),
                tls: samples(&tls_reports),
                plain_cpu: ProxyCpu { calls: ok(&plain_reports), cpu_s: spent[0] },
                tls_cpu: ProxyCpu { calls: ok(&tls_reports), cpu_s: spent[1] },
                handshakes,
            });
        }
        Ok(TlsCost { backend, limits, rounds, cases })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Tls.label();
        let mut targets = Vec::new();
        for c in &self.cases {
            let (added, cpu) = (c.added_us(), c.cpu_ratio());
            let added_name = format!("TLS added p50, {}", c.case.label());
            let cpu_name = format!("multiplexer CPU per call, TLS ÷ plaintext, {}", c.case.label());
            let note = fix_note(c);
            targets.push(match c.case {
                Case::Info => {
                    Target::at_most(&scenario, &added_name, added, ADDED_LIMIT_US, "µs").note_if_not_passed(&note)
                }
                _ => Target::info(&scenario, &added_name, Some(added), "µs"),
            });
            targets.push(match c.case.long_lived() {
                true => Target::at_most(&scenario, &cpu_name, cpu, CPU_RATIO_LIMIT, "×").note_if_not_passed(&note),
                false => Target::info(&scenario, &cpu_name, Some(cpu), "×"),
            });
            if !c.case.long_lived() {
                let h = c.handshakes;
                let resumed = ratio(h.resumed as f64 * 100.0, (h.full + h.resumed) as f64);
                targets.push(Target::info(
                    &scenario,
                    "TLS handshakes that resumed, a new connection per call",
                    Some(resumed),
                    "%",
                ));
            }
        }
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Tls.label();
        let mut targets = vec![Target::new(
            &scenario,
            &format!("TLS added p50, {}", Case::Info.label()),
            None,
            Rule::AtMost,
            ADDED_LIMIT_US,
            "µs",
        )];
        for case in CASES.into_iter().filter(|c| c.long_lived()) {
            let name = format!("multiplexer CPU per call, TLS ÷ plaintext, {}", case.label());
            targets.push(Target::new(&scenario, &name, None, Rule::AtMost, CPU_RATIO_LIMIT, "×"));
        }
        targets
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

    fn result() -> TlsCost {
        let cpu = |calls, cpu_s| ProxyCpu { calls, cpu_s };
        let case = |case, plain: &[f64], tls: &[f64], plain_cpu, tls_cpu, handshakes| CaseResult {
            case,
            calls_per_round: 100,
            plain: side(plain),
            tls: side(tls),
            plain_cpu,
            tls_cpu,
            handshakes,
        };
        let long = Handshakes { full: 3, resumed: 0 };
        TlsCost {
            backend: fast_model(),
            limits: unhurried_limits(),
            rounds: 3,
            cases: vec![
                case(Case::Info, &[0.20, 0.21, 0.22], &[0.23, 0.24, 0.30], cpu(300, 0.03), cpu(300, 0.036), long),
                case(
                    Case::Embed { tokens: TOKENS },
                    &[1.2, 1.2, 1.2],
                    &[1.3, 1.3, 1.3],
                    cpu(300, 0.03),
                    cpu(300, 0.06),
                    long,
                ),
                case(
                    Case::InfoPerCall,
                    &[0.5, 0.5, 0.5],
                    &[0.9, 0.9, 0.9],
                    cpu(300, 0.06),
                    cpu(300, 0.18),
                    Handshakes { full: 3, resumed: 297 },
                ),
            ],
        }
    }

    #[test]
    fn info_added_p50_and_long_lived_cpu_are_judged_the_rest_reported() {
        let targets = result().targets();
        let find = |n: &str| targets.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n}: {targets:?}"));
        let info = find("TLS added p50, Info, long-lived connection");
        assert!((info.measured.unwrap() - 30.0).abs() < 1e-6);
        assert_eq!(info.verdict, Verdict::Pass);
        let cpu = find("multiplexer CPU per call, TLS ÷ plaintext, Info, long-lived connection");
        assert!((cpu.measured.unwrap() - 1.2).abs() < 1e-6);
        assert_eq!(cpu.verdict, Verdict::Pass);
        let embed_cpu = find("multiplexer CPU per call, TLS ÷ plaintext, Embed 20 tokens, long-lived connection");
        assert_eq!(embed_cpu.verdict, Verdict::Fail);
        assert!(embed_cpu.note.contains("200 µs of CPU per call with TLS against 100 µs"), "{}", embed_cpu.note);
        assert_eq!(find("TLS added p50, Embed 20 tokens, long-lived connection").verdict, Verdict::Info);
        let per_call = find("multiplexer CPU per call, TLS ÷ plaintext, Info, a new connection per call");
        assert_eq!((per_call.verdict, per_call.measured), (Verdict::Info, Some(3.0)));
        assert_eq!(find("TLS handshakes that resumed, a new connection per call").measured, Some(99.0));
        assert_eq!(targets.iter().filter(|t| t.rule != Rule::Report).count(), TlsCost::planned_targets().len());
    }
}
