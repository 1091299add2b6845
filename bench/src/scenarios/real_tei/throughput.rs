//! Rows 1 and 2 of the real-TEI scenario: what a budget of exactly TEI's batch costs in
//! throughput (64 callers, no deadline), and whether patient callers (30 s deadlines, a queue of
//! 64) are all served.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Run, SERVED_LIMIT, Shared, TEI_BATCH, THROUGHPUT_LIMIT, closed, round_ratio};
use crate::Result;
use crate::scenarios::{Context, interleaved};
use crate::targets::Target;

/// Row 1's closed-loop callers.
pub const CALLERS: usize = 64;
/// Row 2's calls per round, and their deadline.
pub const PATIENT_CALLS: u64 = 600;
pub const PATIENT_DEADLINE: Duration = Duration::from_secs(30);

pub const THROUGHPUT: &str = "texts/s through ÷ direct, 64 callers, maxInFlight 4";
pub const SERVED: &str = "served in time, 600 calls from 64 patient callers";
const PATIENT_RATIO: &str = "texts/s through ÷ direct, 64 patient callers";

/// Row 1: per-round runs of each side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    pub callers: usize,
    pub seconds_per_run: f64,
    pub direct: Vec<Run>,
    pub through: Vec<Run>,
}

impl Throughput {
    /// Texts/s through ÷ direct: the median of each round's ratio.
    pub fn ratio(&self) -> f64 {
        round_ratio(&self.direct, &self.through, |r| r.ok_per_s)
    }

    pub fn targets(&self, scenario: &str) -> Vec<Target> {
        let direct = crate::targets::median(&self.direct.iter().map(|r| r.ok_per_s).collect::<Vec<_>>());
        let through = crate::targets::median(&self.through.iter().map(|r| r.ok_per_s).collect::<Vec<_>>());
        vec![Target::at_least(scenario, THROUGHPUT, self.ratio(), THROUGHPUT_LIMIT, "×").note_if_not_passed(format!(
            "the sidecar passed {through:.0} texts/s where TEI alone served {direct:.0}, its next batch of {} kept \
             ready in TEI's queue (`--next-batch-ready`): what is left is the sidecar's CPU beside a CPU-bound TEI \
             on the same cores, and the rounds' spread on a busy machine (the round ratios are above)",
            TEI_BATCH
        ))]
    }
}

/// Row 2: per-round runs of each side, every call with the same deadline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Patient {
    pub callers: usize,
    pub calls: u64,
    pub deadline_s: f64,
    pub direct: Vec<Run>,
    pub through: Vec<Run>,
}

impl Patient {
    /// The least share of a round's calls served OK in time, through the sidecar.
    pub fn served(&self) -> f64 {
        self.through.iter().map(|r| r.ok_in_time as f64 / r.sent.max(1) as f64).fold(f64::NAN, f64::min)
    }

    pub fn ratio(&self) -> f64 {
        round_ratio(&self.direct, &self.through, |r| r.ok_per_s)
    }

    pub fn targets(&self, scenario: &str) -> Vec<Target> {
        let codes: Vec<String> = self.through.iter().map(Run::codes_text).collect();
        vec![
            Target::at_least(scenario, SERVED, self.served(), SERVED_LIMIT, "× sent").note_if_not_passed(format!(
                "through the sidecar, rounds answered {}: a caller that waits 30 s for a place among 64 should never \
                 be refused or cut off, since 64 callers fit maxInFlight 4 + maxQueued 64",
                codes.join("; ")
            )),
            Target::info(scenario, PATIENT_RATIO, Some(self.ratio()), "×"),
        ]
    }
}

/// Row 1: interleaved rounds of 64 closed-loop callers, direct and through the static sidecar.
pub async fn measure_throughput(ctx: &Context, shared: &Shared) -> Result<Throughput> {
    let rounds = ctx.pick(2, 3);
    let seconds = ctx.pick(Duration::from_secs(4), Duration::from_secs(8));
    ctx.say(&format!("real tei 1: {CALLERS} callers, {rounds} rounds of {} s per side", seconds.as_secs()));
    let targets = [shared.tei.url(), shared.sidecar.url()];
    let mut sides = interleaved(&targets, rounds, |t| closed(t, CALLERS, 1_000_000, seconds)).await?.into_iter();
    let (direct, through) = (sides.next().unwrap_or_default(), sides.next().unwrap_or_default());
    let result = Throughput {
        callers: CALLERS,
        seconds_per_run: seconds.as_secs_f64(),
        direct: direct.iter().map(Run::from).collect(),
        through: through.iter().map(Run::from).collect(),
    };
    ctx.say(&format!("real tei 1: texts/s through ÷ direct {:.3}", result.ratio()));
    Ok(result)
}

/// Row 2: interleaved rounds of 600 calls from 64 callers, each with a 30 s deadline.
pub async fn measure_patient(ctx: &Context, shared: &Shared) -> Result<Patient> {
    let rounds = ctx.pick(1, 2);
    ctx.say(&format!("real tei 2: {PATIENT_CALLS} calls from {CALLERS} patient callers, {rounds} rounds"));
    let targets = [shared.tei.url(), shared.sidecar.url()];
    let config = |t: &str| {
        let mut config = closed(t, CALLERS, PATIENT_CALLS, Duration::from_secs(120));
        config.deadline = Some(PATIENT_DEADLINE);
        config
    };
    let mut sides = interleaved(&targets, rounds, config).await?.into_iter();
    let (direct, through) = (sides.next().unwrap_or_default(), sides.next().unwrap_or_default());
    Ok(Patient {
        callers: CALLERS,
        calls: PATIENT_CALLS,
        deadline_s: PATIENT_DEADLINE.as_secs_f64(),
        direct: direct.iter().map(Run::from).collect(),
        through: through.iter().map(Run::from).collect(),
    })
}
