//! The sections and plots of the Admission v2 scenarios (10 adaptive limit, 11 fairness, 12
//! pushback) and of the lanes (19), from their typed results.

use std::fmt::Write as _;

use teifleet_load::Report;
use teifleet_load::render::codes;

use super::Render;
use super::plots::{Chart, Plots, Series};
use super::table::{Table, figure, text};
use super::words::{backend, limits};
use crate::Result;
use crate::scenarios::adaptive::{self, AdaptiveLimit, BackendResult, CapacityChange, Point};
use crate::scenarios::fairness::{self, Fairness};
use crate::scenarios::lanes::{self, Lanes};
use crate::scenarios::pushback::{Policy, Pushback};
use crate::targets::{number, ratio};

fn point_codes(p: &Point) -> String {
    codes(&Report { codes: p.codes.clone(), ..Report::default() })
}

fn point_row(table: &mut Table<'_>, b: &BackendResult, limit: &str, p: &Point) {
    let best = b.best_static().map_or(f64::NAN, |s| s.point.goodput_rps);
    table.row(&[
        &b.name,
        &limit,
        &format!("{:.0}", p.goodput_rps),
        &format!("{:.3}", ratio(p.goodput_rps, b.capacity.rps)),
        &format!("{:.3}", ratio(p.goodput_rps, best)),
        &format!("{} ms", number(p.ok_p99_ms)),
        &format!("{} ms", number(p.tei_queue_p99_ms)),
        &format!("{} ms", number(p.batch_p50_ms)),
        &point_codes(p),
    ]);
}

fn change(out: &mut String, c: &CapacityChange) {
    let settle = c.settle();
    let _ = writeln!(
        out,
        "\n**Capacity change.** The {} backend ({:.0} req/s) at {:.0} req/s through the adaptive multiplexer, after \
         a warm-up; {:.0} s in, the simulator's device is made {}× slower (`POST /device/slowdown/{}`: half the \
         capacity), and the load goes on {:.0} s. The limit was {:.0} just before the change and ended at {:.0} \
         (median of the last {:.0} s); {}. Over the whole run: goodput {:.0} req/s, TEI queue p99 {} ms ({}).\n",
        c.name,
        c.capacity.rps,
        c.rate,
        c.before_s,
        c.slowdown,
        c.slowdown,
        c.after_s,
        c.limit_before(),
        settle.map_or(f64::NAN, |s| s.final_limit),
        adaptive::FINAL_WINDOW_S,
        match settle {
            Some(s) => format!(
                "it stayed within ±{:.0}% of that from {:.2} s after the change",
                adaptive::SETTLE_BAND * 100.0,
                s.after_s
            ),
            None => format!("it was still moving more than ±{:.0}% at the end", adaptive::SETTLE_BAND * 100.0),
        },
        c.point.goodput_rps,
        number(c.point.tei_queue_p99_ms),
        point_codes(&c.point)
    );
    // One value per second keeps the line short; the plot has every sample.
    let per_second: Vec<String> = c
        .samples
        .iter()
        .filter(|s| s.t_s >= -2.0)
        .scan(f64::NEG_INFINITY, |last, s| {
            let keep = s.t_s - *last >= 0.99;
            if keep {
                *last = s.t_s;
            }
            Some(keep.then(|| format!("{:+.0} s: {:.0}", s.t_s, s.limit)))
        })
        .flatten()
        .collect();
    let _ = writeln!(out, "Limit around the change, about once a second: {}.", per_second.join(", "));
}

fn by_attempt(report: Option<&Report>) -> String {
    match report.and_then(|r| r.retries.as_ref()) {
        Some(t) => t.ok_by_attempt.iter().map(u64::to_string).collect::<Vec<_>>().join(" / "),
        None => "—".into(),
    }
}

impl Render for AdaptiveLimit {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Three simulated backends, 16-token Embeds, each driven open loop (Poisson) at {}× its measured capacity \
             with a {} s deadline, the same schedule for every multiplexer run on it: static limits {} and one \
             `--adaptive` configuration, the same on every backend (ceiling `--max-in-flight {}`), all with the same \
             queue ({}). Each run starts a fresh multiplexer, warms up at the load ({:.0} s; the adaptive runs {:.0} s, \
             since their limit starts at a quarter of the ceiling and has to find its level, which the static runs \
             were given), then measures {:.0} s. The adaptive limit is `teifleet_limit_in_flight` from the \
             multiplexer's `/metrics`, sampled every {} ms; \"found after\" is when it came within ±{:.0}% (or ±2 calls) of \
             where it ended, for good.\n",
            adaptive::LOAD_FACTOR,
            adaptive::DEADLINE.as_secs(),
            self.backends
                .first()
                .map(|b| b.statics.iter().map(|s| s.limit.to_string()).collect::<Vec<_>>().join(", "))
                .unwrap_or_default(),
            adaptive::CEILING,
            limits(&self.limits).replace(&format!("maxInFlight {}, ", self.limits.max_in_flight), ""),
            self.warm_up_s,
            self.adaptive_warm_up_s,
            self.seconds,
            adaptive::SAMPLE_EVERY.as_millis(),
            adaptive::SETTLE_BAND * 100.0
        );
        let mut table = Table::new(
            out,
            &[
                text("backend"),
                text("model"),
                figure("capacity"),
                figure("batch p50"),
                figure("offered/s"),
                figure("best static"),
                figure("adaptive ended near"),
                figure("found after"),
            ],
        );
        for b in &self.backends {
            table.row(&[
                &b.name,
                &backend(&b.model),
                &format!("{:.0} req/s", b.capacity.rps),
                &format!("{} ms", number(b.capacity.batch_ms)),
                &format!("{:.0}", b.rate),
                &b.best_static().map_or("—".into(), |s| s.limit.to_string()),
                &format!("{:.0}", b.final_limit()),
                &b.found_after_s().map_or("not within the run".into(), |t| format!("{t:.1} s")),
            ]);
        }
        out.push('\n');
        let mut table = Table::new(
            out,
            &[
                text("backend"),
                text("limit"),
                figure("goodput/s"),
                figure("÷ capacity"),
                figure("÷ best static"),
                figure("OK p99"),
                figure("TEI queue p99"),
                figure("batch p50"),
                text("codes"),
            ],
        );
        for b in &self.backends {
            for s in &b.statics {
                point_row(&mut table, b, &s.limit.to_string(), &s.point);
            }
            point_row(&mut table, b, &format!("**adaptive** (→ {:.0})", b.final_limit()), &b.adaptive);
        }
        match (&self.change, &self.change_missing) {
            (Some(c), _) => change(out, c),
            (None, why) => {
                let _ = writeln!(out, "\n**Capacity change.** Not measured: {}.", why.as_deref().unwrap_or("unknown"));
            }
        }
    }

    /// The limit over time on each backend, goodput against the static limit, and the limit
    /// around the capacity change.
    fn plots(&self, plots: &mut Plots<'_>) -> Result<()> {
        let over_time = self
            .backends
            .iter()
            .map(|b| Series {
                name: format!("{} (best static {})", b.name, b.best_static().map_or(0, |s| s.limit)),
                points: b.limit.iter().map(|s| (s.t_s, s.limit)).collect(),
            })
            .collect();
        let chart = Chart {
            title: "Adaptive in-flight limit over time (warm-up, then the measured run)",
            x_label: "seconds from the start of the load",
            y_label: "teifleet_limit_in_flight",
            log_y: true,
            log_x: false,
        };
        plots.draw("adaptive-limit", chart, over_time)?;
        let goodput = self
            .backends
            .iter()
            .map(|b| Series {
                name: format!("{} (adaptive: {:.3})", b.name, ratio(b.adaptive.goodput_rps, b.capacity.rps)),
                points: b
                    .statics
                    .iter()
                    .map(|s| (s.limit as f64, ratio(s.point.goodput_rps, b.capacity.rps)))
                    .collect(),
            })
            .collect();
        let chart = Chart {
            title: "Goodput vs static in-flight limit (the adaptive run's in the legend)",
            x_label: "static --max-in-flight",
            y_label: "goodput / capacity",
            log_y: false,
            log_x: true,
        };
        plots.draw("adaptive-goodput", chart, goodput)?;
        if let Some(c) = &self.change {
            let series = vec![Series {
                name: format!("{} backend, device {}× slower from t = 0", c.name, c.slowdown),
                points: c.samples.iter().map(|s| (s.t_s, s.limit)).collect(),
            }];
            let chart = Chart {
                title: "Adaptive limit around a capacity halving",
                x_label: "seconds from the change",
                y_label: "teifleet_limit_in_flight",
                log_y: false,
                log_x: false,
            };
            plots.draw("adaptive-change", chart, series)?;
        }
        Ok(())
    }
}

impl Render for Fairness {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Backend: {}; **measured capacity {:.1} req/s**. Multiplexer: {}, tenants `{}` and `{}` of weight 1, one \
             priority. Tenant A (`x-teifleet-tenant: {}`) sends {}× capacity over 8 connections while tenant B sends \
             {}× capacity over 2, open loop (Poisson), {:.0} s, 1 s deadline, as two tasks at once; B alone first, same \
             schedule. The same two loads direct to TEI for comparison. Latency columns are of all answers.\n",
            backend(&self.backend),
            self.capacity.rps,
            limits(&self.limits),
            fairness::FLOOD,
            fairness::LIGHT,
            fairness::FLOOD,
            fairness::FLOOD_FACTOR,
            fairness::LIGHT_FACTOR,
            self.seconds
        );
        let mut table = Table::new(
            out,
            &[
                text("run"),
                text("tenant"),
                figure("offered/s"),
                figure("sent"),
                figure("OK in time"),
                figure("÷ sent"),
                figure("goodput/s"),
                figure("p50"),
                figure("p99"),
                text("codes"),
            ],
        );
        let mut row = |run: &str, tenant: &str, x: &Report| {
            table.row(&[
                &run,
                &tenant,
                &format!("{:.0}", x.offered_rps.unwrap_or(f64::NAN)),
                &x.sent,
                &x.ok_in_time,
                &format!("{:.3}", ratio(x.ok_in_time as f64, x.sent as f64)),
                &format!("{:.1}", x.goodput_rps),
                &format!("{} ms", number(x.latency.p50_ms)),
                &format!("{} ms", number(x.latency.p99_ms)),
                &codes(x),
            ]);
        };
        row("multiplexer, B alone", "B", &self.light_alone);
        row("multiplexer, together", "A", &self.mux.flood);
        row("multiplexer, together", "B", &self.mux.light);
        row("direct to TEI, together", "A", &self.direct.flood);
        row("direct to TEI, together", "B", &self.direct.light);
        let _ = writeln!(
            out,
            "\nTotal goodput through the multiplexer: {:.1} req/s = {:.3} × capacity (direct: {:.3}). B's p99 beside the \
             flood ÷ alone: {:.2}×.",
            self.mux.total_goodput_rps(),
            ratio(self.mux.total_goodput_rps(), self.capacity.rps),
            ratio(self.direct.total_goodput_rps(), self.capacity.rps),
            self.light_p99_ratio()
        );
        new_user(out, self);
    }
}

/// Scenario 11's runs as a new user meets them (`fairness_defaults`).
fn new_user(out: &mut String, f: &Fairness) {
    use crate::scenarios::fairness_defaults as defaults;
    if f.new_user.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n**As a new user meets it.** Multiplexer: {}, static mode, tenants named by the header alone (then B given \
         weight {}). A sends {}× capacity over {} connections with {:.0} s deadlines; B sends {}× capacity over {} \
         callers with a {:.0} s deadline; B alone first through the same multiplexer.\n",
        limits(&defaults::limits()),
        defaults::LIGHT_WEIGHT,
        fairness::FLOOD_FACTOR,
        defaults::FLOOD_CONNECTIONS,
        defaults::FLOOD_DEADLINE.as_secs_f64(),
        fairness::LIGHT_FACTOR,
        defaults::LIGHT_CALLERS,
        crate::scenarios::overload::DEADLINE.as_secs_f64(),
    );
    let mut table = Table::new(
        out,
        &[
            text("setting"),
            text("run"),
            text("tenant"),
            figure("sent"),
            figure("OK in time"),
            figure("÷ sent"),
            figure("goodput/s"),
            figure("p50"),
            figure("p99"),
            text("codes"),
        ],
    );
    for run in &f.new_user {
        let setting = run.setting();
        for (name, tenant, x) in
            [("B alone", "B", &run.light_alone), ("together", "A", &run.mux.flood), ("together", "B", &run.mux.light)]
        {
            table.row(&[
                &setting,
                &name,
                &tenant,
                &x.sent,
                &x.ok_in_time,
                &format!("{:.3}", ratio(x.ok_in_time as f64, x.sent as f64)),
                &format!("{:.1}", x.goodput_rps),
                &format!("{} ms", number(x.latency.p50_ms)),
                &format!("{} ms", number(x.latency.p99_ms)),
                &codes(x),
            ]);
        }
    }
    for run in &f.new_user {
        let _ = writeln!(
            out,
            "\n{}: B's p99 beside the flood ÷ alone {:.2}×; total goodput {:.1} req/s = {:.3} × capacity.",
            run.setting(),
            run.light_p99_ratio(),
            run.mux.total_goodput_rps(),
            ratio(run.mux.total_goodput_rps(), f.capacity.rps)
        );
    }
}

impl Render for Pushback {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Backend: {}. Multiplexer: {}. {} callers over 8 connections send one 16-token Embed each, all at once, \
             with a {:.0} s deadline over all attempts (the time budget). (a) retries as gRPC's retry policy does: a \
             `grpc-retry-pushback-ms` ≥ 0 is waited exactly (and resets the backoff), a negative one stops, without \
             one the jittered backoff applies; (b) waits a full-jitter exponential backoff and ignores the hint. Both \
             retry `RESOURCE_EXHAUSTED` and `UNAVAILABLE`, {}. {} round(s), the order rotating; the targets use the \
             median over rounds.\n",
            backend(&self.backend),
            limits(&self.limits),
            self.clients,
            self.budget_ms / 1e3,
            self.policy.to_string().replace("pushback retry, ", ""),
            self.rounds.len()
        );
        let mut table = Table::new(
            out,
            &[
                text("policy"),
                figure("round"),
                figure("succeeded"),
                figure("at the 1st attempt"),
                figure("after a retry"),
                figure("attempts"),
                figure("hints p50 / p99"),
                figure("last answer"),
                text("codes"),
            ],
        );
        for policy in Policy::ALL {
            for (round, x) in self.runs(policy).into_iter().enumerate() {
                let (first, retried, attempts, hints) = match &x.retries {
                    Some(t) => (
                        t.ok_first(),
                        t.ok_retried().to_string(),
                        t.attempts.to_string(),
                        if t.hint.count > 0 {
                            format!("{:.0} / {:.0} ms", t.hint.p50_ms, t.hint.p99_ms)
                        } else {
                            "—".into()
                        },
                    ),
                    None => (x.ok, "—".into(), x.sent.to_string(), "—".into()),
                };
                table.row(&[
                    &policy.label(),
                    &(round + 1),
                    &x.ok_in_time,
                    &first,
                    &retried,
                    &attempts,
                    &hints,
                    &format!("{:.2} s", x.elapsed_s),
                    &codes(x),
                ]);
            }
        }
        let _ = writeln!(
            out,
            "\nMedian successes: (a) {:.0}, (b) {:.0}, without retrying {:.0}; (a) ÷ (b) = {:.2}. \"last answer\" is \
             when the run's last call ended: how long the retries kept coming.",
            self.median_successes(Policy::Pushback),
            self.median_successes(Policy::Jitter),
            self.median_successes(Policy::NoRetry),
            self.gain()
        );
        let _ = writeln!(
            out,
            "\nOK answers by attempt (first round): (a) {}; (b) {}.",
            by_attempt(self.runs(Policy::Pushback).first().copied()),
            by_attempt(self.runs(Policy::Jitter).first().copied())
        );
    }
}

impl Render for Lanes {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Backend: {}; **measured capacity {:.1} req/s** (batch {} ms). Multiplexer: {}, `--ingest-share {}`. \
             Queries: open loop (Poisson), 16-token Embeds, {:.0} s deadline, no lane header (so `query`), {:.0} s per \
             run. Ingest: {} callers in a closed loop, 16-token Embeds with `x-teifleet-lane: ingest` and no deadline, \
             starting a second before the queries and stopping a second after. Runs: queries at {}× capacity alone; \
             the same schedule beside ingest; queries at {}× beside ingest. *Admitted/s* is each lane's \
             `teifleet_lane_admissions_total{{outcome=\"admitted\"}}` over the query schedule's span (read from the \
             multiplexer when it starts and when it ends); latencies are of all answers, from the due time (ingest: \
             from the send).\n",
            backend(&self.backend),
            self.capacity.rps,
            number(self.capacity.batch_ms),
            limits(&self.limits),
            self.ingest_share_percent,
            crate::scenarios::overload::DEADLINE.as_secs_f64(),
            self.seconds,
            self.ingest_callers,
            lanes::LIGHT_FACTOR,
            lanes::OVERLOAD_FACTOR
        );
        let mut table = Table::new(
            out,
            &[
                text("run"),
                text("lane"),
                figure("offered/s"),
                figure("sent"),
                figure("OK"),
                figure("admitted/s"),
                figure("share of admissions"),
                figure("p50"),
                figure("p99"),
                figure("TEI queue p99"),
                text("codes"),
            ],
        );
        let mut row = |run: &str, lane: &str, x: &Report, admitted: Option<(f64, f64)>| {
            let (rps, share) = match admitted {
                Some((rps, share)) => (format!("{rps:.0}"), format!("{share:.3}")),
                None => ("—".into(), "—".into()),
            };
            table.row(&[
                &run,
                &lane,
                &x.offered_rps.map_or("closed loop".into(), |r| format!("{r:.0}")),
                &x.sent,
                &x.ok,
                &rps,
                &share,
                &format!("{} ms", number(x.latency.p50_ms)),
                &format!("{} ms", number(x.latency.p99_ms)),
                &x.tei_queue.map_or("—".into(), |s| format!("{} ms", number(s.p99_ms))),
                &codes(x),
            ]);
        };
        row(&format!("queries at {}× alone", lanes::LIGHT_FACTOR), "query", &self.alone, None);
        for run in [&self.light, &self.overload] {
            let name = format!("queries at {}× beside ingest", run.factor);
            let w = &run.window;
            row(&name, "query", &run.queries, Some((w.query_rps(), 1.0 - w.ingest_share())));
            row(&name, "ingest", &run.ingest, Some((w.ingest_rps(), w.ingest_share())));
        }
        let patient = format!(
            "{} ingest callers, {:.0} s deadline, alone",
            lanes::PATIENT_CALLERS,
            lanes::PATIENT_DEADLINE.as_secs_f64()
        );
        row(&patient, "ingest", &self.patient, None);
        let _ = writeln!(
            out,
            "\nQueries at {}×: p99 {} ms beside ingest ÷ {} ms alone = {:.2}×. Ingest admitted {:.0}/s of the {:.0}/s \
             the queries (goodput {:.0}/s) left of the capacity: {:.3}×; both lanes {:.3}× capacity. Queries at {}×: \
             ingest {:.3} of the admissions against a floor of {:.2} ({:.2}× the floor), the queries' goodput {:.3}× \
             capacity; ingest calls not answered OK in either run: {}. The queue keeps its word: {} closed-loop \
             ingest callers with a {:.0} s deadline, alone, got {:.3}× capacity with {} calls not answered OK.",
            lanes::LIGHT_FACTOR,
            number(self.light.queries.latency.p99_ms),
            number(self.alone.latency.p99_ms),
            self.p99_ratio(),
            self.light.window.ingest_rps(),
            self.left_rps(),
            self.light.queries.goodput_rps,
            self.ingest_goodput_ratio(),
            ratio(self.light.window.query_rps() + self.light.window.ingest_rps(), self.capacity.rps),
            lanes::OVERLOAD_FACTOR,
            self.overload.window.ingest_share(),
            self.floor_share(),
            self.floor_ratio(),
            ratio(self.overload.queries.goodput_rps, self.capacity.rps),
            self.ingest_not_ok(),
            lanes::PATIENT_CALLERS,
            lanes::PATIENT_DEADLINE.as_secs_f64(),
            self.patient_goodput_ratio(),
            self.patient_not_ok()
        );
    }
}

#[cfg(test)]
mod tests {
    use teifleet_load::retry::{RetryMode, RetryPolicy};

    use super::*;
    use crate::procs::Device;
    use crate::render::markdown;
    use crate::results::{Outcome, Results, Section};
    use crate::scenarios::adaptive::{LimitSample, StaticPoint};
    use crate::scenarios::fairness::Pair;
    use crate::scenarios::overload::{Capacity, mux_limits};
    use crate::scenarios::{Scenario, gpu_model};

    fn point(goodput_rps: f64) -> Point {
        Point { goodput_rps, tei_queue_p99_ms: 12.0, batch_p50_ms: 6.5, ..Point::default() }
    }

    fn adaptive_section() -> Section {
        let (name, model) = adaptive::backends().remove(0);
        let limit = (0..24).map(|i| LimitSample { t_s: f64::from(i) * 0.25, limit: if i < 2 { 64.0 } else { 9.0 } });
        let backend = BackendResult {
            name,
            model,
            capacity: Capacity { rps: 630.0, batch_ms: 6.5, concurrency: 16 },
            rate: 945.0,
            statics: vec![StaticPoint { limit: 4, point: point(320.0) }, StaticPoint { limit: 8, point: point(620.0) }],
            adaptive: point(615.0),
            limit: limit.collect(),
        };
        let change = CapacityChange {
            name: "medium".into(),
            model: adaptive::backends().remove(1).1,
            capacity: Capacity { rps: 590.0, batch_ms: 26.6, concurrency: 64 },
            rate: 885.0,
            before_s: 3.0,
            after_s: 8.0,
            slowdown: 2.0,
            samples: (-12..32).map(|i| LimitSample { t_s: f64::from(i) * 0.25, limit: 32.0 }).collect(),
            point: point(380.0),
        };
        Section::measured(
            Scenario::AdaptiveLimit,
            Outcome::AdaptiveLimit(Box::new(AdaptiveLimit {
                limits: adaptive::limits(adaptive::CEILING),
                warm_up_s: 1.0,
                adaptive_warm_up_s: 8.0,
                seconds: 2.0,
                backends: vec![backend],
                change: Some(change),
                change_missing: None,
            })),
        )
    }

    fn report(sent: u64, ok_in_time: u64, goodput_rps: f64) -> Report {
        Report { sent, ok_in_time, ok: ok_in_time, goodput_rps, offered_rps: Some(70.0), ..Report::default() }
    }

    fn fairness_section() -> Section {
        Section::measured(
            Scenario::Fairness,
            Outcome::Fairness(Box::new(Fairness {
                backend: gpu_model(512, Device::Sleep),
                limits: mux_limits(),
                capacity: Capacity { rps: 325.0, batch_ms: 23.0, concurrency: 64 },
                seconds: 3.0,
                light_alone: report(200, 200, 70.0),
                mux: Pair { flood: report(4900, 800, 258.0), light: report(200, 199, 69.0) },
                direct: Pair { flood: report(4900, 480, 120.0), light: report(200, 14, 4.0) },
                new_user: Vec::new(),
            })),
        )
    }

    fn pushback_section() -> Section {
        let retried = |ok: u64, by: Vec<u64>| Report {
            ok_in_time: ok,
            ok,
            sent: 300,
            retries: Some(teifleet_load::report::Retries { attempts: 1400, ok_by_attempt: by, ..Default::default() }),
            ..Report::default()
        };
        Section::measured(
            Scenario::Pushback,
            Outcome::Pushback(Box::new(Pushback {
                backend: gpu_model(512, Device::Sleep),
                limits: crate::scenarios::pushback::limits(),
                clients: 300,
                budget_ms: 3000.0,
                policy: RetryPolicy::new(RetryMode::Pushback, 5),
                rounds: vec![[
                    Report { ok_in_time: 6, ok: 6, sent: 300, ..Report::default() },
                    retried(38, vec![6, 8, 6, 6, 12]),
                    retried(66, vec![6, 4, 5, 16, 35]),
                ]],
            })),
        )
    }

    #[test]
    fn the_admission_sections_show_their_tables_and_verdicts() {
        let results = Results {
            date: "2026-01-02".into(),
            mode: "quick".into(),
            sections: vec![adaptive_section(), fairness_section(), pushback_section()],
            ..Results::default()
        };
        let text = markdown(&results, &[vec![], vec![], vec![]]);
        assert!(text.contains("## 10. Adaptive limit"), "{text}");
        assert!(text.contains("| fast | **adaptive** (→ 9) | 615 | 0.976 | 0.992 |"), "{text}");
        assert!(text.contains("| 945 | 8 | 9 | 0.5 s |"), "{text}");
        assert!(text.contains("The limit was 32 just before the change and ended at 32"), "{text}");
        assert!(text.contains("| 10 adaptive limit | limit settled after capacity halved | 0 s |"), "{text}");
        assert!(text.contains("| multiplexer, together | B | 70 | 200 | 199 | 0.995 |"), "{text}");
        assert!(text.contains("| 11 fairness | B's goodput ÷ what B sends, A flooding | 0.995 × |"), "{text}");
        assert!(text.contains("| (a) gRPC retry policy, waits the pushback hint | 1 | 38 | 6 | 32 | 1400 |"), "{text}");
        assert!(text.contains("OK answers by attempt (first round): (a) 6 / 8 / 6 / 6 / 12"), "{text}");
        assert!(
            text.contains("| 12 pushback | successes, pushback ÷ jittered backoff | 0.576 × | ≥ 1.00 × | **FAIL** |"),
            "{text}"
        );
    }

    #[test]
    fn the_lanes_section_shows_each_lane_of_each_run_and_the_ratios() {
        let text = crate::scenarios::lanes::example::result(48.0, 150.0, 0).body();
        assert!(text.contains("**measured capacity 350.0 req/s** (batch 23.0 ms)"), "{text}");
        assert!(text.contains("`--ingest-share 10`"), "{text}");
        assert!(
            text.contains("| queries at 0.6× alone | query | 210 | 840 | 840 | — | — | 30.0 ms | 40.0 ms |"),
            "{text}"
        );
        assert!(text.contains("| queries at 0.6× beside ingest | query | 210 | 840 | 840 | 210 | 0.612 |"), "{text}");
        assert!(
            text.contains("| queries at 0.6× beside ingest | ingest | closed loop | 700 | 700 | 133 | 0.388 |"),
            "{text}"
        );
        assert!(
            text.contains("| queries at 1.5× beside ingest | ingest | closed loop | 200 | 200 | 38 | 0.107 |"),
            "{text}"
        );
        assert!(text.contains("p99 48.0 ms beside ingest ÷ 40.0 ms alone = 1.20×"), "{text}");
        assert!(text.contains("Ingest admitted 133/s of the 140/s"), "{text}");
        assert!(text.contains("(1.07× the floor)"), "{text}");
    }

    #[test]
    fn the_adaptive_section_draws_its_three_plots() {
        let dir = std::env::temp_dir().join(format!("teifleet-bench-admission-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = crate::render::plots_of(&adaptive_section(), &dir, "x").unwrap();
        assert_eq!(files, vec!["x-adaptive-limit.svg", "x-adaptive-goodput.svg", "x-adaptive-change.svg"]);
        assert!(std::fs::read_to_string(dir.join(&files[0])).unwrap().contains("best static 8"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
