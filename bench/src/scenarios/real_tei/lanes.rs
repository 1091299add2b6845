//! Row 6 of the real-TEI scenario: lanes, as scenario 19 measures them on the simulator. Queries
//! (open-loop Poisson unary Embeds at 0.6 × TEI's capacity, 1 s deadline, no lane header) alone,
//! then the same schedule beside an ingest flood (64 closed-loop callers with
//! `x-teifleet-lane: ingest` and no deadline, started a second before the queries and stopped a
//! second after), through a sidecar with row 1's budget and `--ingest-share 10`. While the queries
//! run beside ingest the sidecar's metrics are read (`scenarios::learned`): the batch-time line it
//! learned from TEI and the places of TEI's next batch that leaves ingest, so the row says why
//! ingest got what it got.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::LoadConfig;

use super::{LANES_LIMIT, Run, Shared, TOKENS, static_limits};
use crate::Result;
use crate::procs::{self, MuxLimits};
use crate::scenarios::adaptive::require_flag;
use crate::scenarios::learned::{Learned, during};
use crate::scenarios::{Context, measure, words};
use crate::targets::{Target, ratio};

/// The queries' rate, × capacity: room left for ingest.
pub const QUERY_FACTOR: f64 = 0.6;
pub const QUERY_DEADLINE: Duration = Duration::from_secs(1);
pub const INGEST_CALLERS: usize = 64;
pub const INGEST_SHARE_PERCENT: u8 = 10;
/// The ingest flood starts this long before the queries and ends this long after them.
const MARGIN: Duration = Duration::from_secs(1);
const SEED: u64 = 2106;

pub const P99: &str = "query p99 beside ingest ÷ alone, queries at 0.6× capacity";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lanes {
    pub limits: MuxLimits,
    pub ingest_share_percent: u8,
    /// The queries' rate, per second.
    pub rate: f64,
    pub seconds: f64,
    pub alone: Run,
    pub beside: Run,
    /// The ingest flood beside the queries.
    pub ingest: Run,
    /// What the sidecar learned and decided meanwhile.
    #[serde(default)]
    pub learned: Learned,
}

impl Lanes {
    pub fn p99_ratio(&self) -> f64 {
        ratio(self.beside.p99_all_ms, self.alone.p99_all_ms)
    }

    pub fn targets(&self, scenario: &str) -> Vec<Target> {
        vec![
            Target::at_most(scenario, P99, self.p99_ratio(), LANES_LIMIT, "×").note_if_not_passed(format!(
                "the queries' p99 was {:.0} ms beside ingest and {:.0} ms alone ({} and {}): with TEI's batch \
                 of 4 as the whole budget, a query that arrives while ingest holds the 4 permits waits for one \
                 of those calls to end, about a batch time, which on this CPU is the queries' whole latency alone",
                self.beside.p99_all_ms,
                self.alone.p99_all_ms,
                self.beside.codes_text(),
                self.alone.codes_text()
            )),
            Target::info(
                scenario,
                "ingest texts/s beside the queries ÷ capacity left",
                Some(ratio(self.ingest.ok_per_s, self.rate / QUERY_FACTOR - self.beside.goodput_per_s)),
                "×",
            ),
            self.learned.places_row(scenario, "ingest's places in TEI's next batch while queries came, median"),
        ]
    }
}

fn queries(target: &str, rate: f64, seconds: Duration) -> LoadConfig {
    LoadConfig {
        connections: 4,
        deadline: Some(QUERY_DEADLINE),
        grace: Duration::from_secs(3),
        inputs: words(TOKENS),
        seed: SEED,
        ..LoadConfig::open(target, rate, seconds)
    }
}

fn ingest(target: &str, capacity: f64, seconds: Duration) -> LoadConfig {
    let requests = (2.0 * capacity * seconds.as_secs_f64()).ceil().max(1.0) as u64;
    LoadConfig {
        lane: Some("ingest".into()),
        grace: Duration::from_secs(30),
        ..super::closed(target, INGEST_CALLERS, requests, seconds)
    }
}

pub async fn measure_row(ctx: &Context, shared: &Shared, capacity_per_s: f64) -> Result<Lanes> {
    require_flag(&ctx.bins, "--ingest-share", " (no lanes)")?;
    let limits = static_limits();
    let share = [format!("--ingest-share={INGEST_SHARE_PERCENT}")];
    let mux = procs::start_mux_with(&ctx.bins, "real-tei-lanes-mux", &shared.tei, &limits, &share).await?;
    let rate = QUERY_FACTOR * capacity_per_s;
    let seconds = ctx.pick(Duration::from_secs(5), Duration::from_secs(12));
    ctx.say(&format!("real tei 6: queries at {rate:.0}/s alone, then beside {INGEST_CALLERS} ingest callers"));
    let alone = Run::from(&measure(queries(&mux.url(), rate, seconds)).await?);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let flood = measure(ingest(&mux.url(), capacity_per_s, MARGIN + seconds + MARGIN));
    let querying = async {
        tokio::time::sleep(MARGIN).await;
        measure(queries(&mux.url(), rate, seconds)).await
    };
    let (flood, (querying, learned)) = tokio::join!(flood, during(mux.admin_addr(), querying));
    let result = Lanes {
        limits,
        ingest_share_percent: INGEST_SHARE_PERCENT,
        rate,
        seconds: seconds.as_secs_f64(),
        alone,
        beside: Run::from(&querying?),
        ingest: Run::from(&flood?),
        learned,
    };
    ctx.say(&format!(
        "real tei 6: query p99 beside ingest ÷ alone {:.2}; {}",
        result.p99_ratio(),
        result.learned.text()
    ));
    Ok(result)
}
