//! The `make bench` scenarios. Each one starts its own backend (the simulator) and multiplexer as
//! separate processes, measures the same traffic direct and through the multiplexer in one run,
//! and returns a typed result; targets ([`crate::targets`]) and the renderer ([`crate::render`])
//! read those results, so no scenario formats anything itself.
//!
//! Every scenario has one shape, [`Measurement`]: its result type measures itself ([`Measurement::run`]:
//! setup, then rounds), and judges itself ([`Measurement::targets`]). [`for_each_scenario!`] lists
//! them in order; [`Scenario`] (numbers, names, titles) and [`Outcome`] (the results file's
//! tagged union) are expanded from that list, and so is the renderer's dispatch. The shared
//! plumbing is in [`setup`] (backends, limits, load loops) and [`sample`] (per-round figures).

pub mod adaptive;
pub mod batch;
pub mod bulk;
pub mod burst;
pub mod cache;
pub mod coalescing;
pub mod colocation;
pub mod cost;
pub mod fairness;
pub mod fairness_defaults;
pub mod http_overhead;
pub mod http_overload;
pub mod job;
pub mod lanes;
pub mod learned;
pub mod live_limits;
pub mod overhead;
pub mod overload;
pub mod pushback;
pub mod real_tei;
pub mod sample;
pub mod setup;
pub mod shed_storm;
pub mod slo;
pub mod spillover;
pub mod streams;
pub mod tenant_pair;
pub mod tls;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::Result;
use crate::procs::{Bins, Features};
use crate::targets::Target;

pub use sample::{FloorSides, Sample, added_p50_us, median_of, samples};
pub use setup::{
    direct_then_mux, fast_model, gpu_model, interleaved, measure, measure_apart, precise_model, sim_and_mux,
    unhurried_limits, warm_up, words,
};

/// What every scenario gets.
#[derive(Clone, Debug)]
pub struct Context {
    pub bins: Bins,
    pub features: Features,
    /// Quick mode: fewer requests and shorter runs, same scenarios.
    pub quick: bool,
    /// The local control plane for the live-limit scenario; without it that scenario is skipped.
    pub kubeconfig: Option<PathBuf>,
    pub repo_root: PathBuf,
    pub started: Instant,
}

impl Context {
    /// A progress line on stderr (the run is long; people want to see where it is).
    pub fn say(&self, message: &str) {
        eprintln!("[bench {:>6.1}s] {message}", self.started.elapsed().as_secs_f64());
    }

    /// `quick` or `full` value.
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick { quick } else { full }
    }
}

/// The shape of a scenario, implemented by the type of its result: how it is named, how it
/// measures, and what it is judged on. Its Markdown section is [`crate::render::Render`].
pub trait Measurement: Sized {
    /// Its name in `--only`, in the results file and in its targets (`shed-storm`); the same as
    /// its variant of [`Scenario`] in kebab case (a test checks).
    const KEY: &'static str;
    /// Its section's heading, without the number.
    const TITLE: &'static str;

    /// Starts the processes it measures (its setup), drives its load (its rounds) and returns
    /// what it measured. An error is an environment failure; a failed call is data.
    fn run(ctx: &Context) -> impl Future<Output = Result<Self>>;

    /// Its verdicts: a pure function of the result.
    fn targets(&self) -> Vec<Target>;

    /// The targets it would report, unmeasured (for a run that could not measure): the same
    /// names, rules and limits as [`Measurement::targets`] judges.
    fn planned_targets() -> Vec<Target>;
}

/// The scenarios, in the order they run and are numbered: the one list a new scenario joins,
/// with its variant (its name in the code) and the type of its result. Expands `$expand!` with
/// the list, so each layer generates what it needs without a list of its own: [`Scenario`] and
/// [`Outcome`] here, the renderer's dispatch in [`crate::render`].
macro_rules! for_each_scenario {
    ($expand:ident) => {
        $expand! {
            Overhead => overhead::Overhead,
            Overload => overload::Overload,
            Burst => burst::Burst,
            Slo => slo::Slo,
            Cost => cost::Cost,
            LiveLimits => live_limits::LiveLimits,
            ShedStorm => shed_storm::ShedStorm,
            Streams => streams::Streams,
            Coalescing => coalescing::Coalescing,
            AdaptiveLimit => adaptive::AdaptiveLimit,
            Fairness => fairness::Fairness,
            Pushback => pushback::Pushback,
            HttpOverhead => http_overhead::HttpOverhead,
            HttpOverload => http_overload::HttpOverload,
            Spillover => spillover::Spillover,
            Tls => tls::TlsCost,
            Colocation => colocation::Colocation,
            Bulk => bulk::Bulk,
            Lanes => lanes::Lanes,
            Job => job::Job,
            RealTei => real_tei::RealTei,
            Cache => cache::Cache,
            Batch => batch::Batch,
        }
    };
}
pub(crate) use for_each_scenario;

/// [`Scenario`], [`Outcome`] and their dispatch to each result type's [`Measurement`].
macro_rules! define_scenarios {
    ($($variant:ident => $result:ty,)*) => {
        /// A scenario by name, in the order they run and are numbered.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "kebab-case")]
        pub enum Scenario {
            $($variant,)*
        }

        impl Scenario {
            pub const ALL: [Self; [$(stringify!($variant),)*].len()] = [$(Self::$variant,)*];

            pub fn key(self) -> &'static str {
                match self {
                    $(Self::$variant => <$result as Measurement>::KEY,)*
                }
            }

            fn title_text(self) -> &'static str {
                match self {
                    $(Self::$variant => <$result as Measurement>::TITLE,)*
                }
            }

            /// The targets this scenario would report, unmeasured (for a run that could not measure).
            pub fn planned_targets(self) -> Vec<Target> {
                match self {
                    $(Self::$variant => <$result as Measurement>::planned_targets(),)*
                }
            }

            /// Measures this scenario.
            pub async fn run(self, ctx: &Context) -> Result<Outcome> {
                match self {
                    $(Self::$variant => <$result as Measurement>::run(ctx).await.map(|r| Outcome::$variant(Box::new(r))),)*
                }
            }
        }

        /// What a scenario measured (boxed: results differ in size by kilobytes).
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", content = "result", rename_all = "kebab-case")]
        pub enum Outcome {
            $($variant(Box<$result>),)*
        }

        impl Outcome {
            pub fn targets(&self) -> Vec<Target> {
                match self {
                    $(Self::$variant(r) => r.targets(),)*
                }
            }
        }
    };
}

for_each_scenario!(define_scenarios);

impl Scenario {
    pub fn number(self) -> usize {
        Self::ALL.iter().position(|s| *s == self).map_or(0, |i| i + 1)
    }

    /// How targets name their scenario: `7 shed storm`.
    pub fn label(self) -> String {
        format!("{} {}", self.number(), self.key().replace('-', " "))
    }

    pub fn title(self) -> String {
        format!("{}. {}", self.number(), self.title_text())
    }

    /// `3` or `burst`.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        Self::ALL.into_iter().find(|x| x.key() == s || s.parse::<usize>().is_ok_and(|n| n == x.number()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_parse_by_number_or_key_and_label_themselves() {
        assert_eq!(Scenario::parse("7"), Some(Scenario::ShedStorm));
        assert_eq!(Scenario::parse("shed-storm"), Some(Scenario::ShedStorm));
        assert_eq!(Scenario::parse("10"), Some(Scenario::AdaptiveLimit));
        assert_eq!(Scenario::parse("pushback"), Some(Scenario::Pushback));
        assert_eq!(Scenario::parse("13"), Some(Scenario::HttpOverhead));
        assert_eq!(Scenario::parse("http-overload"), Some(Scenario::HttpOverload));
        assert_eq!(Scenario::parse("15"), Some(Scenario::Spillover));
        assert_eq!(Scenario::parse("spillover"), Some(Scenario::Spillover));
        assert_eq!(Scenario::parse("16"), Some(Scenario::Tls));
        assert_eq!(Scenario::parse("tls"), Some(Scenario::Tls));
        assert_eq!(Scenario::Tls.label(), "16 tls");
        assert_eq!(Scenario::parse("17"), Some(Scenario::Colocation));
        assert_eq!(Scenario::parse("18"), Some(Scenario::Bulk));
        assert_eq!(Scenario::parse("bulk"), Some(Scenario::Bulk));
        assert_eq!(Scenario::parse("19"), Some(Scenario::Lanes));
        assert_eq!(Scenario::parse("lanes"), Some(Scenario::Lanes));
        assert_eq!(Scenario::Lanes.label(), "19 lanes");
        assert_eq!(Scenario::parse("20"), Some(Scenario::Job));
        assert_eq!(Scenario::parse("job"), Some(Scenario::Job));
        assert_eq!(Scenario::Job.label(), "20 job");
        assert_eq!(Scenario::parse("21"), Some(Scenario::RealTei));
        assert_eq!(Scenario::parse("real-tei"), Some(Scenario::RealTei));
        assert_eq!(Scenario::parse("22"), Some(Scenario::Cache));
        assert_eq!(Scenario::parse("cache"), Some(Scenario::Cache));
        assert_eq!(Scenario::Cache.label(), "22 cache");
        assert_eq!(Scenario::parse("23"), Some(Scenario::Batch));
        assert_eq!(Scenario::parse("batch"), Some(Scenario::Batch));
        assert_eq!(Scenario::parse("24"), None);
        assert_eq!(Scenario::ShedStorm.label(), "7 shed storm");
        assert!(Scenario::Coalescing.title().starts_with("9. Coalescing"));
        assert!(Scenario::ALL.iter().enumerate().all(|(i, s)| s.number() == i + 1));
    }

    #[test]
    fn every_scenario_is_named_in_the_results_by_its_key() {
        for scenario in Scenario::ALL {
            assert_eq!(serde_json::to_value(scenario).unwrap(), scenario.key(), "{scenario:?}");
        }
    }
}
