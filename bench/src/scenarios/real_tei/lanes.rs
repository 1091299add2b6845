//! Row 6 of the real-TEI scenario: lanes, as scenario 19 measures them on the simulator. Queries
//! (open-loop Poisson unary Embeds at 0.6 × TEI's capacity, 1 s deadline, no lane header) alone,
//! then the same schedule beside an ingest flood (64 closed-loop callers with
//! `x-teifleet-lane: ingest` and no deadline, started a second before the queries and stopped a
//! second after), through a sidecar with row 1's budget and `--ingest-share 10`. While the queries
//! run beside ingest the sidecar's metrics are read every [`SAMPLE_EVERY`]: the batch-time line it
//! learned from TEI and the places of TEI's next batch that leaves ingest, so the row says why
//! ingest got what it got.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::LoadConfig;
use teifleet_testkit::{http, prom};

use super::{LANES_LIMIT, Run, Shared, TOKENS, static_limits};
use crate::Result;
use crate::procs::{self, MuxLimits};
use crate::scenarios::adaptive::require_flag;
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
const LET_IN: &str = "teifleet_ingest_let_in_total";
/// `teifleet_ingest_let_in_total`'s reasons (docs/metrics.md).
const LET_IN_REASONS: [&str; 6] = ["no_queries", "idle_tei", "stale_count", "empty_next_batch", "places", "floor_turn"];
/// How often the sidecar's metrics are read while the queries run beside ingest.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

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

/// The sidecar's learned batch time and ingest's places while the queries ran beside ingest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Learned {
    /// TEI's batch time as the sidecar's line at the end, ms fixed and ms an input (absent: not
    /// learned, or a sidecar without those metrics).
    pub fixed_ms: Option<f64>,
    pub per_input_ms: Option<f64>,
    /// `teifleet_ingest_places` read every [`SAMPLE_EVERY`]: how many reads, its median, and the
    /// share of reads at 0 (ingest only into an idle TEI).
    pub samples: usize,
    pub places_p50: Option<f64>,
    pub places_zero_share: Option<f64>,
    /// Ingest calls let in flight while the queries ran, by the rule that let them
    /// (`teifleet_ingest_let_in_total`'s `reason`).
    #[serde(default)]
    pub let_in: std::collections::BTreeMap<String, f64>,
}

impl Learned {
    fn text(&self) -> String {
        let line = match (self.fixed_ms, self.per_input_ms) {
            (Some(fixed), Some(per_input)) => {
                format!("TEI's batch time learned as {fixed:.1} ms + {per_input:.1} ms an input")
            }
            _ => "no batch-time line learned".to_owned(),
        };
        let places = match (self.places_p50, self.places_zero_share) {
            (Some(p50), Some(zero)) => format!(
                "{line}; ingest's places in TEI's next batch: median {p50:.0}, 0 in {:.0}% of {} reads",
                zero * 100.0,
                self.samples
            ),
            _ => format!("{line}; ingest's places not read"),
        };
        let let_in: Vec<String> =
            self.let_in.iter().filter(|(_, n)| **n > 0.0).map(|(why, n)| format!("{why} {n:.0}")).collect();
        match let_in.is_empty() {
            true => places,
            false => format!("{places}; ingest let in by {}", let_in.join(", ")),
        }
    }
}

/// The first series of the gauge `name`, if the exposition has one.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && line.split(['{', ' ']).next() == Some(name))
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

/// Reads the sidecar at `admin` every [`SAMPLE_EVERY`] until `stop` fires.
async fn watch(admin: std::net::SocketAddr, stop: tokio::sync::oneshot::Receiver<()>) -> Learned {
    let mut places = Vec::new();
    let (mut first, mut last) = (None, None);
    let reading = async {
        loop {
            if let Some(text) = http::get(admin, "/metrics").await {
                places.extend(gauge(&text, "teifleet_ingest_places"));
                first.get_or_insert_with(|| text.clone());
                last = Some(text);
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    };
    tokio::select! {
        () = reading => {}
        _ = stop => {}
    }
    places.sort_by(f64::total_cmp);
    let ms = |name| last.as_deref().and_then(|text| gauge(text, name)).map(|s| s * 1e3);
    let let_in_by = |text: &Option<String>, why: &str| {
        text.as_deref().map_or(0.0, |text| prom::sum_matching(text, LET_IN, &[("reason", why)]))
    };
    let let_in =
        LET_IN_REASONS.iter().map(|why| ((*why).to_owned(), let_in_by(&last, why) - let_in_by(&first, why))).collect();
    Learned {
        fixed_ms: ms("teifleet_tei_batch_fixed_seconds"),
        per_input_ms: ms("teifleet_tei_batch_per_input_seconds"),
        samples: places.len(),
        places_p50: places.get(places.len() / 2).copied(),
        places_zero_share: (!places.is_empty())
            .then(|| places.iter().filter(|p| **p == 0.0).count() as f64 / places.len() as f64),
        let_in,
    }
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
            Target {
                note: self.learned.text(),
                ..Target::info(
                    scenario,
                    "ingest's places in TEI's next batch while queries came, median",
                    self.learned.places_p50,
                    "",
                )
            },
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
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let querying = async {
        tokio::time::sleep(MARGIN).await;
        let report = measure(queries(&mux.url(), rate, seconds)).await;
        let _ = stop.send(());
        report
    };
    let (flood, querying, learned) = tokio::join!(flood, querying, watch(mux.admin_addr(), stopped));
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
