//! Scenario 2, overload (a TEI-on-GPU queueing write-up's lesson, and an embedding semaphore
//! test's): open-loop Poisson load at 0.5×, 1×, 2×, 5× and 10× the backend's measured capacity,
//! direct to the backend (TEI's own admission only) and through the multiplexer's admission
//! control, with the same arrival schedule on both sides.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};

use super::{Context, Measurement, Scenario, direct_then_mux, gpu_model, measure, sim_and_mux, words};
use crate::Result;
use crate::floor::Stack;
use crate::procs::{self, Device, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target};

const FACTORS: [f64; 5] = [0.5, 1.0, 2.0, 5.0, 10.0];
pub const OVERLOADED: [f64; 3] = [2.0, 5.0, 10.0];
/// Every request's gRPC deadline: clients that wait longer have given up anyway.
pub const DEADLINE: Duration = Duration::from_secs(1);
pub const GOODPUT_LIMIT: f64 = 0.97;
pub const SHED_LIMIT_MS: f64 = 1.0;
/// The shed p99 ÷ the memo floor's p99 in the same seconds, at most: what refusing adds to the
/// cheapest answer this machine gives, judged on any machine.
pub const SHED_FLOOR_LIMIT: f64 = 1.25;
/// Calls a second to the memo floor beside each overloaded point's calls through the multiplexer.
const FLOOR_RATE: f64 = 200.0;

/// The backend's measured capacity and batch (service) time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// OK answers per second with the backend saturated.
    pub rps: f64,
    /// TEI inference time of a full batch (p50), ms.
    #[serde(with = "crate::targets::nan_as_null")]
    pub batch_ms: f64,
    /// In flight while measuring.
    pub concurrency: usize,
}

/// Saturates the backend directly (closed loop, `concurrency` in flight) and reads its rate.
pub async fn measure_capacity(ctx: &Context, sim: &Proc, tokens: usize, concurrency: usize) -> Result<Capacity> {
    let config = LoadConfig {
        connections: 4,
        inputs: words(tokens),
        duration: Duration::from_secs(60),
        ..LoadConfig::closed(sim.url(), concurrency, ctx.pick(1500, 4000))
    };
    let report = measure(config).await?;
    Ok(Capacity { rps: report.goodput_rps, batch_ms: report.tei_inference.map_or(f64::NAN, |s| s.p50_ms), concurrency })
}

pub fn mux_limits() -> MuxLimits {
    // Two batches in flight (one running, the next one prepared), a queue TEI drains in ~0.4 s.
    MuxLimits {
        max_in_flight: 16,
        max_queued: 128,
        queue_timeout: Duration::from_millis(500),
        max_concurrent_streams: 1024,
        coalesce: false,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OverloadRow {
    pub factor: f64,
    pub direct: Report,
    pub mux: Report,
    /// At an overloaded point, calls to a bare tonic server answering from memory
    /// ([`crate::floor::memo`]) sent in the same seconds as those through the multiplexer: the
    /// machine's floor for an answer that needs no backend (none without `teifleet-floor-proxy`).
    #[serde(default)]
    pub floor: Option<Report>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overload {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub capacity: Capacity,
    pub seconds_per_point: u64,
    pub rows: Vec<OverloadRow>,
}

impl Overload {
    /// queueTimeout + 2 × service time: the longest an admitted call should take.
    pub fn admitted_limit_ms(&self) -> f64 {
        self.limits.queue_timeout.as_secs_f64() * 1e3 + 2.0 * self.capacity.batch_ms
    }

    /// 2 × batch time: TEI's own queue holds at most the next batch.
    pub fn queue_limit_ms(&self) -> f64 {
        2.0 * self.capacity.batch_ms
    }
}

/// Why refusals were slow: refused after waiting (the median refusal is slow too), or refused at
/// once but late for CPU (only the tail is).
fn shed_note(m: &Report) -> String {
    let (p50, p99) = (m.response_failed.p50_ms, m.response_failed.p99_ms);
    if p50 > SHED_LIMIT_MS {
        format!(
            "refusals took {p50:.1} ms at the median and {p99:.0} ms at p99 from the send: calls are being refused \
             after waiting in the queue (its timeout, or a queue discipline that drops old waiters), not on \
             arrival. Refusing on arrival the calls that cannot be served in time (the wait estimate against the \
             queue) keeps refusals at a fraction of a millisecond"
        )
    } else {
        format!(
            "the median refusal took {p50:.2} ms but p99 {p99:.1} ms: refusals wait for CPU behind the generator \
             and the backend on this 2-core machine; a core of its own for the multiplexer, or refusing in the \
             HTTP/2 layer before reading the request, would bring the tail under 1 ms"
        )
    }
}

/// The shed p99 at `f`× against the absolute limit. Where a bare tonic server answering from
/// memory in the same seconds is itself over the limit, no server meets it on this machine: SKIP
/// with both figures, and the row against the floor judges what refusing adds.
fn shed_p99(scenario: &str, f: f64, m: &Report, floor: Option<&Report>) -> Target {
    let target = Target::at_most(scenario, &format!("shed p99 at {f}×"), m.response_failed.p99_ms, SHED_LIMIT_MS, "ms");
    match floor {
        Some(floor) if target.verdict == crate::targets::Verdict::Fail && floor.latency_ok.p99_ms > SHED_LIMIT_MS => {
            target.skip_because(format!(
                "this machine's floor is over the limit: a bare tonic server answering from memory, in the same \
                 seconds, had p99 {:.3} ms (the refusals {:.3} ms, p50 {:.3} ms); see the row against the floor",
                floor.latency_ok.p99_ms, m.response_failed.p99_ms, m.response_failed.p50_ms
            ))
        }
        _ => target.note_if_not_passed(shed_note(m)),
    }
}

impl Measurement for Overload {
    const KEY: &'static str = "overload";
    const TITLE: &'static str = "Overload: goodput and latency from 0.5× to 10× capacity";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = gpu_model(512, Device::Sleep);
        let limits = mux_limits();
        let (sim, mux) = sim_and_mux(ctx, "overload", &backend, &limits, 8).await?;
        let floor = match ctx.features.floor_proxy {
            true => {
                let floor = procs::start_floor(&ctx.bins, "overload-floor-memo", &sim, Stack::Memo).await?;
                // Its one text asked once: from then on every call is answered from memory.
                measure(LoadConfig { inputs: words(16), ..LoadConfig::closed(floor.url(), 1, 4) }).await?;
                Some(floor)
            }
            false => None,
        };
        ctx.say("overload: measuring the backend's capacity");
        let capacity = measure_capacity(ctx, &sim, 16, 64).await?;
        ctx.say(&format!("overload: capacity {:.1} req/s, batch {:.2} ms", capacity.rps, capacity.batch_ms));

        let duration = ctx.pick(Duration::from_secs(3), Duration::from_secs(15));
        let mut rows = Vec::new();
        for (i, factor) in FACTORS.iter().enumerate() {
            let rate = factor * capacity.rps;
            let config = |target: String| LoadConfig {
                connections: 8,
                deadline: Some(DEADLINE),
                grace: Duration::from_secs(5),
                seed: 100 + i as u64,
                ..LoadConfig::open(target, rate, duration)
            };
            let what = format!("overload: {factor}× = {rate:.0} req/s");
            let (direct, through, floor) = match (&floor, OVERLOADED.contains(factor)) {
                (Some(floor), true) => {
                    ctx.say(&format!("{what} direct"));
                    let direct = measure(config(sim.url())).await?;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    ctx.say(&format!("{what} through the multiplexer, the memo floor beside"));
                    let beside = LoadConfig {
                        connections: 4,
                        inputs: words(16),
                        deadline: Some(DEADLINE),
                        seed: 200 + i as u64,
                        ..LoadConfig::open(floor.url(), FLOOR_RATE, duration)
                    };
                    let (through, floor) = tokio::join!(measure(config(mux.url())), measure(beside));
                    (direct, through?, Some(floor?))
                }
                _ => {
                    let (direct, through) = direct_then_mux(ctx, &what, &sim, &mux, config).await?;
                    (direct, through, None)
                }
            };
            tokio::time::sleep(Duration::from_secs(1)).await;
            rows.push(OverloadRow { factor: *factor, direct, mux: through, floor });
        }
        Ok(Overload { backend, limits, capacity, seconds_per_point: duration.as_secs(), rows })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Overload.label();
        let mut targets = Vec::new();
        for row in self.rows.iter().filter(|r| OVERLOADED.contains(&r.factor)) {
            let (f, m) = (row.factor, &row.mux);
            let tei_queue = m.tei_queue.map_or(f64::NAN, |s| s.p99_ms);
            targets.push(
                Target::at_least(
                    &scenario,
                    &format!("goodput at {f}×"),
                    m.goodput_rps / self.capacity.rps,
                    GOODPUT_LIMIT,
                    "× capacity",
                )
                .note_if_not_passed(
                    "TEI idles between batches: raise maxInFlight so the next batch is always prepared while one runs",
                ),
            );
            targets.push(
                Target::at_most(
                    &scenario,
                    &format!("admitted p99 at {f}×"),
                    m.latency_ok.p99_ms,
                    self.admitted_limit_ms(),
                    "ms",
                )
                .note_if_not_passed(
                    "shorten queueTimeout or maxQueued so no admitted call waits longer than the bound",
                ),
            );
            targets.push(shed_p99(&scenario, f, m, row.floor.as_ref()));
            if let Some(floor) = &row.floor {
                let name = format!("shed p99 ÷ a bare tonic memo's p99, same seconds, at {f}×");
                let ratio = crate::targets::ratio(m.response_failed.p99_ms, floor.latency_ok.p99_ms);
                targets.push(Target::at_most(&scenario, &name, ratio, SHED_FLOOR_LIMIT, "×").note_if_not_passed(
                    format!(
                        "shed p99 {:.3} ms, the memo's {:.3} ms ({} calls at {FLOOR_RATE}/s)",
                        m.response_failed.p99_ms, floor.latency_ok.p99_ms, floor.sent
                    ),
                ));
                targets.push(Target::info(
                    &scenario,
                    &format!("a bare tonic memo's p99 beside {f}×"),
                    Some(floor.latency_ok.p99_ms),
                    "ms",
                ));
            }
            targets.push(
                Target::at_most(&scenario, &format!("TEI queue p99 at {f}×"), tei_queue, self.queue_limit_ms(), "ms")
                    .note_if_not_passed("lower maxInFlight towards one batch so fewer calls wait inside TEI"),
            );
        }
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Overload.label();
        let mut targets = Vec::new();
        for f in OVERLOADED {
            let t = |name: String, rule, limit, unit| Target::new(&scenario, &name, None, rule, limit, unit);
            targets.push(t(format!("goodput at {f}×"), Rule::AtLeast, GOODPUT_LIMIT, "× capacity"));
            targets.push(t(format!("admitted p99 at {f}×"), Rule::AtMost, f64::NAN, "ms"));
            targets.push(t(format!("shed p99 at {f}×"), Rule::AtMost, SHED_LIMIT_MS, "ms"));
            targets.push(t(
                format!("shed p99 ÷ a bare tonic memo's p99, same seconds, at {f}×"),
                Rule::AtMost,
                SHED_FLOOR_LIMIT,
                "×",
            ));
            targets.push(t(format!("TEI queue p99 at {f}×"), Rule::AtMost, f64::NAN, "ms"));
        }
        targets
    }
}

#[cfg(test)]
mod tests {
    use teifleet_load::summary::Summary;

    use super::*;
    use crate::targets::Verdict;

    fn result(shed_p50_ms: f64, shed_p99_ms: f64) -> Overload {
        let mux = Report {
            goodput_rps: 330.0,
            latency_ok: Summary { p99_ms: 400.0, ..Summary::default() },
            response_failed: Summary { p50_ms: shed_p50_ms, p99_ms: shed_p99_ms, ..Summary::default() },
            tei_queue: Some(Summary { p99_ms: 20.0, ..Summary::default() }),
            ..Report::default()
        };
        Overload {
            backend: gpu_model(512, Device::Sleep),
            limits: mux_limits(),
            capacity: Capacity { rps: 330.0, batch_ms: 24.0, concurrency: 64 },
            seconds_per_point: 3,
            rows: vec![OverloadRow { factor: 2.0, direct: Report::default(), mux, floor: None }],
        }
    }

    #[test]
    fn limits_follow_the_measured_batch_and_the_queue_timeout() {
        let r = result(0.3, 0.6);
        assert_eq!(r.admitted_limit_ms(), 548.0);
        assert_eq!(r.queue_limit_ms(), 48.0);
        let verdicts: Vec<Verdict> = r.targets().iter().map(|t| t.verdict).collect();
        assert_eq!(verdicts, vec![Verdict::Pass; 4]);
    }

    #[test]
    fn a_slow_refusal_is_judged_against_the_floor_when_the_floor_is_over_the_limit() {
        let mut r = result(0.3, 3.0);
        let floor = |p99_ms| Report { latency_ok: Summary { p99_ms, ..Summary::default() }, ..Report::default() };
        r.rows[0].floor = Some(floor(2.8));
        let targets = r.targets();
        assert_eq!(targets[2].verdict, Verdict::Skip, "{}", targets[2].note);
        assert!(targets[2].note.contains("2.800"), "{}", targets[2].note);
        assert_eq!(targets[3].verdict, Verdict::Pass, "3.0 / 2.8 is within {SHED_FLOOR_LIMIT}×");
        // A floor within the limit leaves a slow refusal failing, and so does its ratio.
        r.rows[0].floor = Some(floor(0.5));
        let targets = r.targets();
        assert_eq!((targets[2].verdict, targets[3].verdict), (Verdict::Fail, Verdict::Fail));
    }

    #[test]
    fn a_slow_refusal_says_whether_it_waited_first() {
        let waited = result(300.0, 360.0).targets();
        assert!(waited[2].note.contains("after waiting in the queue"), "{}", waited[2].note);
        let starved = result(0.3, 5.0).targets();
        assert!(starved[2].note.contains("wait for CPU"), "{}", starved[2].note);
    }
}
