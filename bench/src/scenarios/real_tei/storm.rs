//! Row 3 of the real-TEI scenario: 256 callers with 30 s deadlines through a sidecar whose
//! in-flight limit finds itself (`--adaptive`), against TEI's capacity: the best texts/s TEI
//! served direct at a few concurrencies, measured just before.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Run, STORM_LIMIT, Shared, closed};
use crate::procs::{self, MuxLimits};
use crate::scenarios::adaptive::require_flag;
use crate::scenarios::{Context, measure};
use crate::targets::{Target, ratio};
use crate::{Result, admin};

pub const CALLERS: usize = 256;
pub const DEADLINE: Duration = Duration::from_secs(30);
/// The concurrencies TEI is measured at, direct, for its capacity.
pub const SWEEP: [usize; 4] = [4, 8, 16, 64];
/// The adaptive sidecar's ceiling: its limit starts at a quarter of it and finds its level.
pub const ADAPTIVE_CEILING: usize = 64;

pub const GOODPUT: &str = "storm goodput ÷ capacity, 256 callers, adaptive";
const DIRECT_GOODPUT: &str = "storm goodput ÷ capacity, 256 callers, direct";

/// The adaptive sidecar: the ceiling in flight, every caller of the storm room to wait as long
/// as its deadline.
pub fn adaptive_limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: ADAPTIVE_CEILING,
        max_queued: CALLERS,
        queue_timeout: DEADLINE,
        max_concurrent_streams: 256,
        coalesce: false,
    }
}

/// TEI direct at one concurrency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub concurrency: usize,
    pub run: Run,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Storm {
    pub limits: MuxLimits,
    pub seconds: f64,
    /// Seconds of each concurrency of the capacity sweep.
    pub sweep_seconds: f64,
    pub sweep: Vec<SweepPoint>,
    /// The storm direct to TEI (reported, not judged).
    pub direct: Run,
    /// The storm through the adaptive sidecar.
    pub through: Run,
    /// The sidecar's in-flight limit at the end of the storm.
    pub limit_after: Option<f64>,
}

impl Storm {
    /// TEI's best texts/s direct over the sweep.
    pub fn capacity_per_s(&self) -> f64 {
        self.sweep.iter().map(|p| p.run.ok_per_s).fold(f64::NAN, f64::max)
    }

    /// The concurrency the capacity was measured at.
    pub fn best_concurrency(&self) -> Option<usize> {
        self.sweep.iter().max_by(|a, b| a.run.ok_per_s.total_cmp(&b.run.ok_per_s)).map(|p| p.concurrency)
    }

    pub fn ratio(&self) -> f64 {
        ratio(self.through.goodput_per_s, self.capacity_per_s())
    }

    pub fn targets(&self, scenario: &str) -> Vec<Target> {
        vec![
            Target::at_least(scenario, GOODPUT, self.ratio(), STORM_LIMIT, "× capacity").note_if_not_passed(format!(
                "the sidecar's storm answered {}, {:.0} in time per second, where TEI served {:.0} texts/s at its \
                 best; its limit ended at {} (it never goes below TEI's batch); the storm direct is the same storm's \
                 ceiling on this machine",
                self.through.codes_text(),
                self.through.goodput_per_s,
                self.capacity_per_s(),
                self.limit_after.map_or("unknown".into(), |l| format!("{l:.0}"))
            )),
            Target::info(scenario, DIRECT_GOODPUT, Some(ratio(self.direct.goodput_per_s, self.capacity_per_s())), "×"),
        ]
    }
}

fn storm(target: &str, seconds: Duration) -> teifleet_load::LoadConfig {
    let mut config = closed(target, CALLERS, 1_000_000, seconds);
    config.deadline = Some(DEADLINE);
    config
}

pub async fn measure_row(ctx: &Context, shared: &Shared) -> Result<Storm> {
    require_flag(&ctx.bins, "--adaptive", ": row 3 needs the adaptive limit")?;
    let sweep_seconds = ctx.pick(Duration::from_secs(2), Duration::from_secs(4));
    ctx.say(&format!("real tei 3: TEI's capacity direct at concurrency {SWEEP:?}"));
    let mut sweep = Vec::new();
    for concurrency in SWEEP {
        let report = measure(closed(&shared.tei.url(), concurrency, 1_000_000, sweep_seconds)).await?;
        sweep.push(SweepPoint { concurrency, run: Run::from(&report) });
    }
    let limits = adaptive_limits();
    let mux =
        procs::start_mux_with(&ctx.bins, "real-tei-adaptive-mux", &shared.tei, &limits, &["--adaptive".into()]).await?;
    let seconds = ctx.pick(Duration::from_secs(8), Duration::from_secs(15));
    // The limit finds its level under the storm itself first, as it would in a pod already serving.
    measure(storm(&mux.url(), ctx.pick(Duration::from_secs(3), Duration::from_secs(5)))).await?;
    ctx.say(&format!(
        "real tei 3: {CALLERS} callers with {} s deadlines, {} s per side",
        DEADLINE.as_secs(),
        seconds.as_secs()
    ));
    let through = Run::from(&measure(storm(&mux.url(), seconds)).await?);
    let limit_after = admin::metric_sum(mux.admin_addr(), "teifleet_limit_in_flight").await;
    let direct = Run::from(&measure(storm(&shared.tei.url(), seconds)).await?);
    let result = Storm {
        limits,
        seconds: seconds.as_secs_f64(),
        sweep_seconds: sweep_seconds.as_secs_f64(),
        sweep,
        direct,
        through,
        limit_after,
    };
    ctx.say(&format!(
        "real tei 3: capacity {:.0} texts/s, storm goodput through {:.0}/s ({:.3}×)",
        result.capacity_per_s(),
        result.through.goodput_per_s,
        result.ratio()
    ));
    Ok(result)
}
