//! Scenario 19, lanes (issue 32: bulk work beside queries): one GPU-like simulated TEI behind one
//! multiplexer with scenario 2's limits and `--ingest-share 10`; the backend's capacity C measured
//! direct first. Queries are open-loop Poisson unary Embeds with a 1 s deadline and no lane header
//! (so `query`); ingest is a closed loop of 64 callers sending unary Embeds with
//! `x-teifleet-lane: ingest` and no deadline, as fast as they are answered, which keeps ingest
//! waiting at the multiplexer all the time. Three runs, one after the other:
//!
//! 1. queries at 0.6 C alone, for their p99 without a neighbour;
//! 2. the same schedule beside the ingest client;
//! 3. queries at 1.5 C beside the ingest client (the excess shed by the deadline);
//! 4. the queue keeps its word: 32 closed-loop ingest callers with a 10 s deadline alone, every
//!    one of which fits the queue, so none may be refused and the pool stays busy.
//!
//! While queries and ingest run together, the multiplexer's `teifleet_lane_admissions_total` is
//! read when the query schedule starts and again when it ends: that window's admissions per lane
//! are what each lane got while the other competed (the ingest client starts a second earlier and
//! stops a second later, so its own ramp and drain stay outside).
//!
//! Targets: the queries' p99 beside ingest ≤ 1.25 × alone; ingest's admissions per second ≥ 0.9 ×
//! what the queries leave of C; at 1.5 C, ingest's share of the admissions ≥ 0.9 × its floor
//! share; no ingest call answered other than OK, in either run beside queries; the patient
//! callers of run 4 refused nothing and got ≥ 0.97 × C.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};
use teifleet_testkit::{http, prom};

use super::adaptive::require_flag;
use super::learned::{Learned, during};
use super::overload::{Capacity, DEADLINE, measure_capacity, mux_limits};
use super::{Context, Measurement, Scenario, gpu_model, measure, warm_up, words};
use crate::procs::{self, Device, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result};

/// The queries' rate beside ingest, × capacity: room left for ingest.
pub const LIGHT_FACTOR: f64 = 0.6;
/// The queries' rate when they overload the pool, × capacity.
pub const OVERLOAD_FACTOR: f64 = 1.5;
/// The multiplexer's `--ingest-share` (its default, said explicitly so the result records it).
pub const INGEST_SHARE_PERCENT: u8 = 10;
/// The queries' p99 beside ingest, at most this × their p99 alone.
pub const P99_LIMIT: f64 = 1.25;
/// Ingest's admissions per second, at least this × the capacity the queries leave.
pub const INGEST_GOODPUT_LIMIT: f64 = 0.9;
/// Ingest's share of the admissions under query overload, at least this × the floor share. The
/// floor owes ingest exactly one turn in ten while ingest waits (it always does here); what a
/// window of about C × seconds admissions can miss is a turn at each edge, under 2% of the ~130
/// turns of a quick run's 4 s, so a tenth is room for that and for the counters' two reads, not
/// for a floor that gives less.
pub const FLOOR_TOLERANCE: f64 = 0.9;
/// Closed-loop ingest callers: four times maxInFlight, so ingest always has calls waiting for
/// every permit the queries leave (and all of them fit the lane's queue, maxQueued 128).
pub const INGEST_CALLERS: usize = 64;
const INGEST_CONNECTIONS: usize = 4;
/// Run 4's closed-loop ingest callers (issue 32's reproduction: 32 workers, a 10 s deadline):
/// twice maxInFlight, all of them within the lane's queue, each call served in well under a
/// second, so none has a reason to be refused.
pub const PATIENT_CALLERS: usize = 32;
pub const PATIENT_DEADLINE: Duration = Duration::from_secs(10);
/// Run 4's goodput, at least this × capacity: the queue holds what TEI cannot take yet, so TEI
/// is never idle for want of a call.
pub const PATIENT_GOODPUT_LIMIT: f64 = 0.97;
const QUERY_CONNECTIONS: usize = 4;
/// The ingest client starts this long before the queries (its queue fills) and stops this long
/// after them, so the window sees it at its steady state.
const INGEST_MARGIN: Duration = Duration::from_secs(1);
const TOKENS: usize = 16;
const LIGHT_SEED: u64 = 190;
const OVERLOAD_SEED: u64 = 191;
const INGEST_SEED: u64 = 192;
const ADMISSIONS: &str = "teifleet_lane_admissions_total";

/// Admissions of each lane at the multiplexer over the query schedule's span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub seconds: f64,
    pub query: f64,
    pub ingest: f64,
}

impl Window {
    pub fn query_rps(&self) -> f64 {
        ratio(self.query, self.seconds)
    }

    pub fn ingest_rps(&self) -> f64 {
        ratio(self.ingest, self.seconds)
    }

    /// Ingest's share of both lanes' admissions.
    pub fn ingest_share(&self) -> f64 {
        ratio(self.ingest, self.query + self.ingest)
    }
}

/// Queries and the ingest client at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Beside {
    /// The queries' rate, × capacity.
    pub factor: f64,
    pub queries: Report,
    pub ingest: Report,
    pub window: Window,
    /// What the sidecar learned of TEI's batches and how it let ingest in, while the queries ran.
    #[serde(default)]
    pub learned: Learned,
}

impl Beside {
    /// Ingest calls not answered OK: refused, failed, cut off or never answered.
    pub fn ingest_not_ok(&self) -> u64 {
        self.ingest.sent.saturating_sub(self.ingest.ok)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lanes {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub ingest_share_percent: u8,
    pub capacity: Capacity,
    /// Each query schedule's length.
    pub seconds: f64,
    pub ingest_callers: usize,
    /// Queries at [`LIGHT_FACTOR`] alone through the multiplexer.
    pub alone: Report,
    /// The same schedule beside ingest.
    pub light: Beside,
    /// Queries at [`OVERLOAD_FACTOR`] beside ingest.
    pub overload: Beside,
    /// [`PATIENT_CALLERS`] closed-loop ingest callers with [`PATIENT_DEADLINE`], alone.
    pub patient: Report,
}

const P99: &str = "query p99 beside ingest ÷ alone, queries at 0.6× capacity";
const INGEST_GOODPUT: &str = "ingest admitted/s ÷ capacity the queries leave, queries at 0.6×";
const FLOOR: &str = "ingest's share of admissions ÷ its floor share, queries at 1.5×";
const INGEST_LOST: &str = "ingest calls refused or lost, queries at 0.6× and 1.5×";
const PATIENT_REFUSED: &str = "calls refused to 32 closed-loop ingest callers with a 10 s deadline";
const PATIENT_GOODPUT: &str = "goodput of 32 closed-loop ingest callers with a 10 s deadline ÷ capacity";

impl Lanes {
    pub fn p99_ratio(&self) -> f64 {
        ratio(self.light.queries.latency.p99_ms, self.alone.latency.p99_ms)
    }

    /// Capacity minus the queries' goodput beside ingest, per second.
    pub fn left_rps(&self) -> f64 {
        self.capacity.rps - self.light.queries.goodput_rps
    }

    pub fn ingest_goodput_ratio(&self) -> f64 {
        ratio(self.light.window.ingest_rps(), self.left_rps())
    }

    pub fn floor_share(&self) -> f64 {
        f64::from(self.ingest_share_percent) / 100.0
    }

    pub fn floor_ratio(&self) -> f64 {
        ratio(self.overload.window.ingest_share(), self.floor_share())
    }

    pub fn ingest_not_ok(&self) -> u64 {
        self.light.ingest_not_ok() + self.overload.ingest_not_ok()
    }

    /// Run 4's calls not answered OK.
    pub fn patient_not_ok(&self) -> u64 {
        self.patient.sent.saturating_sub(self.patient.ok)
    }

    pub fn patient_goodput_ratio(&self) -> f64 {
        ratio(self.patient.goodput_rps, self.capacity.rps)
    }
}

fn queries(target: String, rate: f64, duration: Duration, seed: u64) -> LoadConfig {
    LoadConfig {
        connections: QUERY_CONNECTIONS,
        deadline: Some(DEADLINE),
        grace: Duration::from_secs(3),
        inputs: words(TOKENS),
        seed,
        ..LoadConfig::open(target, rate, duration)
    }
}

/// An ingest client: `callers` in a closed loop for `duration`, with `deadline` (the lanes' runs
/// give none). Bounded in requests too, at twice what the backend could serve meanwhile.
fn ingest(target: String, capacity: f64, duration: Duration, callers: usize, deadline: Option<Duration>) -> LoadConfig {
    let requests = (2.0 * capacity * duration.as_secs_f64()).ceil() as u64;
    LoadConfig {
        connections: INGEST_CONNECTIONS,
        inputs: words(TOKENS),
        lane: Some("ingest".into()),
        deadline,
        duration,
        seed: INGEST_SEED,
        ..LoadConfig::closed(target, callers, requests)
    }
}

/// Both lanes' admissions so far, from the multiplexer's metrics (one read, so the two agree).
async fn admissions(admin: SocketAddr) -> Result<(f64, f64)> {
    let text = http::get(admin, "/metrics")
        .await
        .ok_or_else(|| Error::Process(format!("the multiplexer's metrics at {admin} could not be read")))?;
    let admitted = |lane| prom::sum_matching(&text, ADMISSIONS, &[("lane", lane), ("outcome", "admitted")]);
    Ok((admitted("query"), admitted("ingest")))
}

/// Queries at `factor` × capacity beside the ingest client, and the window's admissions.
async fn beside(mux: &Proc, capacity: f64, factor: f64, duration: Duration, seed: u64) -> Result<Beside> {
    let pushing = measure(ingest(mux.url(), capacity, INGEST_MARGIN + duration + INGEST_MARGIN, INGEST_CALLERS, None));
    let querying = async {
        tokio::time::sleep(INGEST_MARGIN).await;
        let start = tokio::time::Instant::now();
        let before = admissions(mux.admin_addr()).await?;
        let window_end = async {
            tokio::time::sleep_until(start + duration).await;
            let after = admissions(mux.admin_addr()).await;
            (after, start.elapsed())
        };
        let measuring = during(mux.admin_addr(), measure(queries(mux.url(), factor * capacity, duration, seed)));
        let ((report, learned), (after, elapsed)) = tokio::join!(measuring, window_end);
        let after = after?;
        let window = Window { seconds: elapsed.as_secs_f64(), query: after.0 - before.0, ingest: after.1 - before.1 };
        Ok::<_, Error>((report?, window, learned))
    };
    let (ingest, querying) = tokio::join!(pushing, querying);
    let (queries, window, learned) = querying?;
    Ok(Beside { factor, queries, ingest: ingest?, window, learned })
}

impl Measurement for Lanes {
    const KEY: &'static str = "lanes";
    const TITLE: &'static str = "Lanes: ingest beside queries at 0.6× and 1.5× capacity";

    async fn run(ctx: &Context) -> Result<Self> {
        require_flag(&ctx.bins, "--ingest-share", " (no lanes)")?;
        let backend = gpu_model(512, Device::Sleep);
        let sim = procs::start_sim(&ctx.bins, "lanes-sim", &backend).await?;
        let limits = mux_limits();
        let share = [format!("--ingest-share={INGEST_SHARE_PERCENT}")];
        let mux = procs::start_mux_with(&ctx.bins, "lanes-mux", &sim, &limits, &share).await?;
        warm_up(&sim.url(), 8).await?;
        warm_up(&mux.url(), 8).await?;
        ctx.say("lanes: measuring the backend's capacity");
        let capacity = measure_capacity(ctx, &sim, TOKENS, 64).await?;
        let duration = ctx.pick(Duration::from_secs(4), Duration::from_secs(15));
        let light_rate = LIGHT_FACTOR * capacity.rps;
        ctx.say(&format!("lanes: capacity {:.1} req/s; queries alone at {light_rate:.0} req/s", capacity.rps));
        let alone = measure(queries(mux.url(), light_rate, duration, LIGHT_SEED)).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("lanes: the same queries beside {INGEST_CALLERS} ingest callers"));
        let light = beside(&mux, capacity.rps, LIGHT_FACTOR, duration, LIGHT_SEED).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!(
            "lanes: queries at {:.0} req/s beside {INGEST_CALLERS} ingest callers",
            OVERLOAD_FACTOR * capacity.rps
        ));
        let overload = beside(&mux, capacity.rps, OVERLOAD_FACTOR, duration, OVERLOAD_SEED).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("lanes: {PATIENT_CALLERS} closed-loop ingest callers with a 10 s deadline, alone"));
        let patient =
            measure(ingest(mux.url(), capacity.rps, duration, PATIENT_CALLERS, Some(PATIENT_DEADLINE))).await?;
        ctx.say(&format!(
            "lanes: query p99 {:.1} ms alone, {:.1} ms beside ingest; ingest {:.0}/s beside 0.6×, {:.3} of the \
             admissions at 1.5×",
            alone.latency.p99_ms,
            light.queries.latency.p99_ms,
            light.window.ingest_rps(),
            overload.window.ingest_share()
        ));
        Ok(Lanes {
            backend,
            limits,
            ingest_share_percent: INGEST_SHARE_PERCENT,
            capacity,
            seconds: duration.as_secs_f64(),
            ingest_callers: INGEST_CALLERS,
            alone,
            light,
            overload,
            patient,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Lanes.label();
        let tei_queue_p99 = |r: &Report| r.tei_queue.map_or(f64::NAN, |s| s.p99_ms);
        let (light, overload) = (&self.light, &self.overload);
        vec![
            Target::at_most(&scenario, P99, self.p99_ratio(), P99_LIMIT, "×").note_if_not_passed(format!(
                "the queries' p99 was {:.1} ms beside ingest and {:.1} ms alone (p50 {:.1} and {:.1} ms), batches \
                 taking {:.1} ms; their p99 in TEI's own queue (TEI's Metadata) {:.1} ms beside ingest and {:.1} ms \
                 alone. A query takes the next permit that frees ahead of every waiting ingest call, but ingest \
                 holds all {} permits: TEI's running batch and the next one, prepared in TEI's first-come queue. \
                 Permits free a batch at a time, when the running batch ends; the query then waits in TEI's queue \
                 for the prepared batch of ingest, which starts first, and then for its own. Ingest leaves a few \
                 permits free while queries come (admission's query room), so the first queries of each batch time \
                 ride the next batch; those beyond the room still wait a batch more. A larger room would cost \
                 ingest the places of the queries that do not come, which TEI runs empty",
                light.queries.latency.p99_ms,
                self.alone.latency.p99_ms,
                light.queries.latency.p50_ms,
                self.alone.latency.p50_ms,
                self.capacity.batch_ms,
                tei_queue_p99(&light.queries),
                tei_queue_p99(&self.alone),
                self.limits.max_in_flight
            )),
            Target::at_least(&scenario, INGEST_GOODPUT, self.ingest_goodput_ratio(), INGEST_GOODPUT_LIMIT, "×")
                .note_if_not_passed(format!(
                    "ingest was admitted {:.0}/s of the {:.0}/s the queries ({:.0}/s) left of the capacity ({:.0}/s): \
                     TEI idled between batches while ingest waited, or the multiplexer kept permits from it",
                    light.window.ingest_rps(),
                    self.left_rps(),
                    light.queries.goodput_rps,
                    self.capacity.rps
                )),
            Target::at_least(&scenario, FLOOR, self.floor_ratio(), FLOOR_TOLERANCE, "×").note_if_not_passed(format!(
                "ingest got {:.0} of {:.0} admissions ({:.3}) against a floor of {:.2}: the floor should owe waiting \
                 ingest the next turn after {} queries pass it",
                overload.window.ingest,
                overload.window.query + overload.window.ingest,
                overload.window.ingest_share(),
                self.floor_share(),
                (100 - u32::from(self.ingest_share_percent)) / u32::from(self.ingest_share_percent.max(1))
            )),
            Target::at_most(&scenario, INGEST_LOST, self.ingest_not_ok() as f64, 0.0, "calls").note_if_not_passed(
                format!(
                    "ingest without a deadline should wait for its turn, never be refused: at 0.6×: {}; at 1.5×: {}",
                    teifleet_load::render::codes(&light.ingest),
                    teifleet_load::render::codes(&overload.ingest)
                ),
            ),
            Target::at_most(&scenario, PATIENT_REFUSED, self.patient_not_ok() as f64, 0.0, "calls").note_if_not_passed(
                format!(
                    "every one of these calls fits the queue and would be served within its deadline: {}",
                    teifleet_load::render::codes(&self.patient)
                ),
            ),
            Target::at_least(&scenario, PATIENT_GOODPUT, self.patient_goodput_ratio(), PATIENT_GOODPUT_LIMIT, "×")
                .note_if_not_passed(format!(
                    "{:.0} OK/s against a capacity of {:.0}/s: TEI idled while callers waited",
                    self.patient.goodput_rps, self.capacity.rps
                )),
            Target::info(
                &scenario,
                "query p50 beside ingest ÷ alone, queries at 0.6× capacity",
                Some(ratio(light.queries.latency.p50_ms, self.alone.latency.p50_ms)),
                "×",
            ),
            Target::info(
                &scenario,
                "both lanes' admitted/s ÷ capacity, queries at 0.6× beside ingest",
                Some(ratio(light.window.query_rps() + light.window.ingest_rps(), self.capacity.rps)),
                "×",
            ),
            light
                .learned
                .places_row(&scenario, "ingest's places in TEI's next batch, queries at 0.6× beside ingest, median"),
            Target::info(
                &scenario,
                "query goodput ÷ capacity, queries at 1.5× beside ingest",
                Some(ratio(overload.queries.goodput_rps, self.capacity.rps)),
                "×",
            ),
        ]
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Lanes.label();
        vec![
            Target::new(&scenario, P99, None, Rule::AtMost, P99_LIMIT, "×"),
            Target::new(&scenario, INGEST_GOODPUT, None, Rule::AtLeast, INGEST_GOODPUT_LIMIT, "×"),
            Target::new(&scenario, FLOOR, None, Rule::AtLeast, FLOOR_TOLERANCE, "×"),
            Target::new(&scenario, INGEST_LOST, None, Rule::AtMost, 0.0, "calls"),
            Target::new(&scenario, PATIENT_REFUSED, None, Rule::AtMost, 0.0, "calls"),
            Target::new(&scenario, PATIENT_GOODPUT, None, Rule::AtLeast, PATIENT_GOODPUT_LIMIT, "×"),
        ]
    }
}

/// A result for the tests of the targets and the renderer.
#[cfg(test)]
pub(crate) mod example {
    use teifleet_load::summary::Summary;

    use super::*;

    pub(crate) fn report(sent: u64, ok: u64, goodput_rps: f64, p50_ms: f64, p99_ms: f64) -> Report {
        Report {
            sent,
            answered: sent,
            ok,
            ok_in_time: ok,
            goodput_rps,
            offered_rps: Some(goodput_rps),
            latency: Summary { p50_ms, p99_ms, ..Summary::default() },
            codes: [("OK".to_owned(), ok)]
                .into_iter()
                .chain((sent > ok).then(|| ("RESOURCE_EXHAUSTED".to_owned(), sent - ok)))
                .collect(),
            ..Report::default()
        }
    }

    /// The ingest client's report: a closed loop offers no rate of its own.
    fn closed_loop(report: Report) -> Report {
        Report { offered_rps: None, ..report }
    }

    /// Capacity 350/s; queries' p99 40 ms alone and `beside_p99_ms` beside ingest; ingest given
    /// `overload_ingest` of 1,400 admissions at 1.5×.
    pub(crate) fn result(beside_p99_ms: f64, overload_ingest: f64, ingest_refused: u64) -> Lanes {
        Lanes {
            backend: gpu_model(512, Device::Sleep),
            limits: mux_limits(),
            ingest_share_percent: INGEST_SHARE_PERCENT,
            capacity: Capacity { rps: 350.0, batch_ms: 23.0, concurrency: 64 },
            seconds: 4.0,
            ingest_callers: INGEST_CALLERS,
            alone: report(840, 840, 210.0, 30.0, 40.0),
            light: Beside {
                factor: LIGHT_FACTOR,
                queries: report(840, 840, 210.0, 35.0, beside_p99_ms),
                ingest: closed_loop(report(700, 700, 120.0, 500.0, 700.0)),
                window: Window { seconds: 4.0, query: 840.0, ingest: 532.0 },
                learned: Learned::default(),
            },
            overload: Beside {
                factor: OVERLOAD_FACTOR,
                queries: report(2100, 1300, 315.0, 400.0, 600.0),
                ingest: closed_loop(report(200 + ingest_refused, 200, 40.0, 1500.0, 2500.0)),
                window: Window { seconds: 4.0, query: 1400.0 - overload_ingest, ingest: overload_ingest },
                learned: Learned::default(),
            },
            patient: closed_loop(report(1380, 1380 - ingest_refused, 345.0 - ingest_refused as f64, 90.0, 95.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::example::result;
    use super::*;
    use crate::targets::Verdict;

    #[test]
    fn queries_are_judged_against_themselves_alone_and_ingest_against_what_they_leave() {
        let t = result(48.0, 150.0, 0).targets();
        assert_eq!(t.len(), 10);
        assert!((t[0].measured.unwrap() - 1.2).abs() < 1e-9);
        assert_eq!(t[0].verdict, Verdict::Pass);
        // 532 admissions in 4 s = 133/s of the 350 − 210 = 140/s left.
        assert!((t[1].measured.unwrap() - 133.0 / 140.0).abs() < 1e-9);
        assert_eq!(t[1].verdict, Verdict::Pass);
        // 150 of 1,400 admissions against a floor of a tenth.
        assert!((t[2].measured.unwrap() - 150.0 / 1400.0 / 0.1).abs() < 1e-9);
        assert_eq!(t[2].verdict, Verdict::Pass);
        assert_eq!((t[3].measured, t[3].verdict), (Some(0.0), Verdict::Pass));
        assert_eq!((t[4].measured, t[4].verdict), (Some(0.0), Verdict::Pass));
        assert!((t[5].measured.unwrap() - 345.0 / 350.0).abs() < 1e-9);
        assert_eq!(t[5].verdict, Verdict::Pass);
        assert!((t[6].measured.unwrap() - 35.0 / 30.0).abs() < 1e-9);
        assert!((t[7].measured.unwrap() - (210.0 + 133.0) / 350.0).abs() < 1e-9);
        assert_eq!(t[8].verdict, Verdict::Info);
        assert_eq!(t[8].measured, None, "no places read");
        assert_eq!(t[9].verdict, Verdict::Info);
        assert_eq!(Lanes::planned_targets().len(), 6);
    }

    #[test]
    fn a_slow_query_tail_a_starved_ingest_and_a_refused_ingest_call_fail() {
        let t = result(60.0, 112.0, 3).targets();
        assert_eq!(t[0].verdict, Verdict::Fail);
        assert!(t[0].note.contains("60.0 ms beside ingest and 40.0 ms alone"), "{}", t[0].note);
        // 112 of 1,400 = 0.08, 0.8 of the floor.
        assert_eq!(t[2].verdict, Verdict::Fail);
        assert!(t[2].note.contains("after 9 queries pass it"), "{}", t[2].note);
        assert_eq!((t[3].measured, t[3].verdict), (Some(3.0), Verdict::Fail));
        assert!(t[3].note.contains("RESOURCE_EXHAUSTED"), "{}", t[3].note);
        // Three of the patient callers refused: 342/s of 350.
        assert_eq!((t[4].measured, t[4].verdict), (Some(3.0), Verdict::Fail));
        assert!((t[5].measured.unwrap() - 342.0 / 350.0).abs() < 1e-9);
    }

    #[test]
    fn a_window_without_admissions_cannot_pass() {
        let empty = Window::default();
        assert!(empty.ingest_share().is_nan() && empty.ingest_rps().is_nan());
    }
}
