//! The sections of the scenarios that load a GPU-like backend past its capacity (2 overload,
//! 3 burst, 4 SLO, 7 shed storm, 9 coalescing), and scenario 2's plots.

use std::fmt::Write as _;

use teifleet_load::render::codes;

use super::Render;
use super::plots::{Chart, Plots, Series};
use super::table::{Table, figure, text};
use super::words::{backend, limits, ms};
use crate::Result;
use crate::procs::Device;
use crate::scenarios::burst::{self, Burst};
use crate::scenarios::coalescing::{self, CoalesceRun, Coalescing};
use crate::scenarios::overload::{self, Overload};
use crate::scenarios::shed_storm::{self, Run, ShedStorm};
use crate::scenarios::slo::Slo;
use crate::targets::ratio;

fn storm_row(table: &mut Table<'_>, name: &str, clients: usize, run: &Run, capacity: f64) {
    let x = &run.report;
    table.row(&[
        &name,
        &clients,
        &format!("{:.1}", x.goodput_rps),
        &format!("{:.3}", ratio(x.goodput_rps, capacity)),
        &format!("{:.0}", x.throughput_rps),
        &run.sheds(),
        &format!("{:.2}", run.cpu.mux_s),
        &format!("{:.2}", run.cpu.sim_s),
        &format!("{:.2}", run.cpu.client_s),
        &codes(x),
    ]);
}

fn coalescing_row(table: &mut Table<'_>, name: &str, run: &CoalesceRun, capacity: f64) {
    let x = &run.report;
    table.row(&[
        &name,
        &format!("{:.0}", x.offered_rps.unwrap_or(0.0)),
        &x.ok,
        &format!("{:.1}", x.goodput_rps),
        &format!("{:.3}", ratio(x.goodput_rps, capacity)),
        &run.tei_calls,
        &format!("{} ({:.1}%)", run.saved(), run.saved_share() * 100.0),
        &run.mux_coalesced.map_or("—".into(), |n| n.to_string()),
        &codes(x),
    ]);
}

fn hottest_share(r: &Coalescing, k: usize) -> f64 {
    teifleet_load::zipf::Zipf::new(r.mix.exponent, r.mix.distinct)
        .map_or(f64::NAN, |z| (0..k).map(|i| z.probability(i)).sum())
}

impl Render for Overload {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Backend: {}. Inputs of 16 tokens. **Measured capacity: {:.1} req/s** (closed loop, {} in flight, direct); \
             **batch (service) time p50: {} ms**.\n\n\
             Multiplexer: {}. Load: open loop, Poisson, {} s per point, 8 connections, every request with a {} s \
             deadline; the same schedule (seed) direct and through the multiplexer. Goodput counts OK answers within \
             the deadline, over first send to last answer. \"shed\" is every non-OK answer; its p99 is timed from the \
             actual send (the generator's own send lateness is in the JSON). Limits: admitted p99 ≤ queueTimeout + \
             2 × service = {:.1} ms; TEI queue p99 ≤ 2 × batch time = {:.1} ms.\n",
            backend(&self.backend),
            self.capacity.rps,
            self.capacity.concurrency,
            ms(self.capacity.batch_ms),
            limits(&self.limits),
            self.seconds_per_point,
            overload::DEADLINE.as_secs(),
            self.admitted_limit_ms(),
            self.queue_limit_ms()
        );
        let mut table = Table::new(
            out,
            &[
                figure("load"),
                text("setup"),
                figure("offered/s"),
                figure("goodput/capacity"),
                figure("OK p50"),
                figure("OK p99"),
                figure("shed"),
                figure("shed p99 (sent→)"),
                figure("TEI queue p99"),
                text("codes"),
            ],
        );
        for row in &self.rows {
            for (name, x) in [("direct", &row.direct), ("multiplexer", &row.mux)] {
                table.row(&[
                    &format!("{}×", row.factor),
                    &name,
                    &format!("{:.0}", x.offered_rps.unwrap_or(0.0)),
                    &format!("{:.3}", x.goodput_rps / self.capacity.rps),
                    &format!("{} ms", ms(x.latency_ok.p50_ms)),
                    &format!("{} ms", ms(x.latency_ok.p99_ms)),
                    &format!("{:.1}%", x.failed_fraction() * 100.0),
                    &format!("{} ms", ms(x.response_failed.p99_ms)),
                    &format!("{} ms", ms(x.tei_queue.map_or(f64::NAN, |s| s.p99_ms))),
                    &codes(x),
                ]);
            }
        }
        let _ = writeln!(
            out,
            "\nDirect, `CANCELLED` is the backend's gRPC server ending calls at their deadline (tonic answers \
             `CANCELLED: Timeout expired`); `RESOURCE_EXHAUSTED` is TEI's own refusal once its {} slots are taken. \
             Through the multiplexer, `RESOURCE_EXHAUSTED` is its refusal: queue full or the deadline out of reach \
             (on arrival), or a wait that ran out (after queueing); the shed p99 column tells which.",
            self.backend.max_concurrent_requests
        );
    }

    /// OK p99 and goodput against the offered load, direct and through the multiplexer.
    fn plots(&self, plots: &mut Plots<'_>) -> Result<()> {
        let series = |f: &dyn Fn(&teifleet_load::Report) -> f64| {
            vec![
                Series {
                    name: "direct (TEI's own admission)".into(),
                    points: self.rows.iter().map(|row| (row.factor, f(&row.direct))).collect(),
                },
                Series {
                    name: "through the multiplexer".into(),
                    points: self.rows.iter().map(|row| (row.factor, f(&row.mux))).collect(),
                },
            ]
        };
        let latency = Chart {
            title: "p99 latency of OK answers vs offered load",
            x_label: "offered load (× measured capacity)",
            y_label: "p99 latency (ms)",
            log_y: true,
            log_x: true,
        };
        plots.draw("overload-latency", latency, series(&|x| x.latency_ok.p99_ms))?;
        let goodput = Chart {
            title: "Goodput (OK within the 1 s deadline) vs offered load",
            x_label: "offered load (× measured capacity)",
            y_label: "goodput / capacity",
            log_y: false,
            log_x: true,
        };
        plots.draw("overload-goodput", goodput, series(&|x| x.goodput_rps / self.capacity.rps))
    }
}

impl Render for Burst {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Closed loop, {} clients over {} HTTP/2 connections, {} requests of {} tokens, no deadline. Backend: {}, so \
             it queues the whole burst as the auto-batching proxy's TEI did. Multiplexer: {} (the default queueTimeout). \
             Latency columns are of all answers (sheds included) unless marked OK. Throughput compared is OK answers \
             per second.\n",
            burst::CONCURRENCY,
            burst::CONNECTIONS,
            self.requests,
            burst::TOKENS,
            backend(&self.backend),
            limits(&self.limits)
        );
        let mut table = Table::new(
            out,
            &[
                text("setup"),
                figure("requests"),
                figure("OK/s"),
                figure("answers/s"),
                figure("OK"),
                figure("shed"),
                figure("p50"),
                figure("p90"),
                figure("p99"),
                figure("OK p99"),
                figure("max"),
                text("codes"),
            ],
        );
        for (name, x) in [("direct (TEI)", &self.direct), ("through the multiplexer", &self.mux)] {
            table.row(&[
                &name,
                &x.sent,
                &format!("{:.1}", x.goodput_rps),
                &format!("{:.1}", x.throughput_rps),
                &x.ok,
                &format!("{:.1}%", x.failed_fraction() * 100.0),
                &format!("{} ms", ms(x.latency.p50_ms)),
                &format!("{} ms", ms(x.latency.p90_ms)),
                &format!("{} ms", ms(x.latency.p99_ms)),
                &format!("{} ms", ms(x.latency_ok.p99_ms)),
                &format!("{} ms", ms(x.latency.max_ms)),
                &codes(x),
            ]);
        }
        let _ = writeln!(
            out,
            "\nThe auto-batching proxy (laptop GPU, 2 tokens, 2,048 concurrent): TEI 8,528 req/s, p99 1,640 ms; the \
             proxy 11,232 req/s, p99 239 ms."
        );
    }
}

impl Render for Slo {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "The scenario-2 backend (capacity {:.1} req/s, batch {} ms) and multiplexer ({}). SLO: p99 ≤ {} ms, i.e. at \
             least 99% of the requests sent come back OK within {} ms of their scheduled time (the SLO is also their \
             deadline). {} probes of {} s each between {:.0} and {:.0} req/s, open loop, Poisson, 4 connections.\n",
            self.capacity.rps,
            ms(self.capacity.batch_ms),
            limits(&self.limits),
            self.slo_ms,
            self.slo_ms,
            self.direct.probes.len(),
            self.seconds_per_probe,
            self.range.0,
            self.range.1
        );
        let mut table = Table::new(
            out,
            &[
                text("setup"),
                figure("highest rate within SLO"),
                figure("× capacity"),
                text("probes (rate: share in SLO)"),
            ],
        );
        for (name, search) in [("direct", &self.direct), ("through the multiplexer", &self.mux)] {
            let list: Vec<String> = search.probes.iter().map(|p| format!("{:.0}: {:.3}", p.rate, p.in_slo)).collect();
            table.row(&[
                &name,
                &format!("{:.1} req/s", search.best),
                &format!("{:.3}", search.best / self.capacity.rps),
                &list.join(", "),
            ]);
        }
        let _ = writeln!(
            out,
            "\nNo target is stated for this scenario; the ratio multiplexer/direct is {:.3}.",
            self.ratio()
        );
    }
}

impl Render for ShedStorm {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Backend: {}, on the same 2 cores as the client and the multiplexer. Multiplexer: {}. Closed loops over \
             {} connections, 16-token Embeds, {:.0} s each, no deadline: {} clients direct (the capacity: the device \
             always has its next batch), {} through the multiplexer (its CPU per served call, nothing shed), then {} \
             through the multiplexer, each resending the moment it is refused, the same over {} connections, the \
             same with a {} s deadline per call on {} connections (patient: they wait at the door), and with a \
             {} ms deadline (three queue timeouts: told at once, as every call with a deadline was before), then \
             direct again; the capacity is the mean of the two direct runs. CPU from `/proc/<pid>/stat`; the client \
             is this benchmark's own process.\n",
            backend(&self.backend),
            limits(&self.limits),
            shed_storm::CONNECTIONS,
            self.seconds,
            shed_storm::CAPACITY_CLIENTS,
            shed_storm::CAPACITY_CLIENTS,
            shed_storm::STORM_CLIENTS,
            shed_storm::FEWER_CONNECTIONS,
            shed_storm::STORM_DEADLINE.as_secs(),
            shed_storm::DEADLINE_CONNECTIONS.map(|c| c.to_string()).join(", "),
            shed_storm::SHORT_DEADLINE.as_millis()
        );
        let mut table = Table::new(
            out,
            &[
                text("run"),
                figure("clients"),
                figure("OK/s"),
                figure("÷ capacity"),
                figure("answers/s"),
                figure("refused"),
                figure("mux CPU s"),
                figure("sim CPU s"),
                figure("client CPU s"),
                text("codes"),
            ],
        );
        let capacity = self.capacity_rps();
        storm_row(&mut table, "direct (capacity)", shed_storm::CAPACITY_CLIENTS, &self.capacity, capacity);
        storm_row(&mut table, "multiplexer", shed_storm::CAPACITY_CLIENTS, &self.served, capacity);
        storm_row(&mut table, "multiplexer, storm", shed_storm::STORM_CLIENTS, &self.storm, capacity);
        if let Some(fewer) = &self.storm_fewer_connections {
            let label = format!("multiplexer, storm on {} connections", shed_storm::FEWER_CONNECTIONS);
            storm_row(&mut table, &label, shed_storm::STORM_CLIENTS, fewer, capacity);
        }
        for storm in &self.deadline_storms {
            let label = format!(
                "multiplexer, storm with a {} s deadline, on {} connections",
                shed_storm::STORM_DEADLINE.as_secs(),
                storm.connections
            );
            storm_row(&mut table, &label, shed_storm::STORM_CLIENTS, &storm.run, capacity);
        }
        if let Some(short) = &self.short_deadline_storm {
            let label = format!(
                "multiplexer, storm with a {} ms deadline (told at once), on {} connections",
                shed_storm::SHORT_DEADLINE.as_millis(),
                shed_storm::CONNECTIONS
            );
            storm_row(&mut table, &label, shed_storm::STORM_CLIENTS, short, capacity);
        }
        if let Some(http) = &self.http_storm {
            let label = "multiplexer, storm over HTTP/1.1 (a connection per caller, no deadline)";
            storm_row(&mut table, label, shed_storm::STORM_CLIENTS, http, capacity);
        }
        if let Some(after) = &self.capacity_after {
            storm_row(&mut table, "direct (capacity, again)", shed_storm::CAPACITY_CLIENTS, after, capacity);
        }
        let _ = writeln!(
            out,
            "\nThe multiplexer's CPU: **{:.0} µs per served call, {:.0} µs per shed** (the storm's CPU less its served \
             calls at the served rate, over the refusals). The client spent {:.0} µs per answer in the storm, and the \
             simulator got {:.0}% less CPU than while serving {} clients.",
            self.mux_us_per_served(),
            self.mux_us_per_shed(),
            self.client_us_per_answer(),
            self.device_cpu_lost() * 100.0,
            shed_storm::CAPACITY_CLIENTS
        );
        if self.backend.device == Device::Sleep {
            let _ = writeln!(
                out,
                "\nThis run's simulator has no `--device spin`: its device slept, so it did not compete for CPU and the \
                 goodput target is skipped."
            );
        }
    }
}

impl Render for Coalescing {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Backend: {}; **measured capacity {:.1} req/s**. Load: open loop, Poisson, {} × capacity = {:.0} req/s for \
             {:.0} s over 8 connections, 1 s deadline; queries drawn from {} distinct texts of {} tokens with Zipf \
             popularity (s = {}: the hottest is {:.0}% of the traffic, the 10 hottest {:.0}%), the same draws and \
             schedule in both runs. Multiplexer: {}, then the same with `--coalesce`. TEI calls are the simulator's \
             own count (`/stats`); an answer that needed no TEI call of its own shared one.\n",
            backend(&self.backend),
            self.capacity.rps,
            coalescing::LOAD_FACTOR,
            self.rate,
            self.seconds,
            self.mix.distinct,
            self.mix.tokens,
            self.mix.exponent,
            hottest_share(self, 1) * 100.0,
            hottest_share(self, 10) * 100.0,
            limits(&self.limits)
        );
        let mut table = Table::new(
            out,
            &[
                text("setup"),
                figure("offered/s"),
                figure("OK"),
                figure("goodput/s"),
                figure("÷ capacity"),
                figure("TEI calls"),
                figure("answers without a TEI call"),
                figure("joined (mux metric)"),
                text("codes"),
            ],
        );
        coalescing_row(&mut table, "multiplexer", &self.without, self.capacity.rps);
        match (&self.with, &self.with_missing) {
            (Some(w), _) => coalescing_row(&mut table, "multiplexer --coalesce", w, self.capacity.rps),
            (None, why) => {
                let why = format!("not measured: {}", why.as_deref().unwrap_or("unknown"));
                table.row(&[&"multiplexer --coalesce", &why, &"", &"", &"", &"", &"", &"", &""]);
            }
        }
        let _ = writeln!(
            out,
            "\nWhy the target is goodput ≥ {}× without coalescing: without it the multiplexer holds goodput at capacity \
             and sheds the rest of the 2×. Under this mix a call finds an identical one among the 16 in flight upstream \
             about a third of the time, which would allow ≈ 1.5× (more if queued calls are joined too), and the offered \
             2× is the ceiling; {}× is a floor any working coalescer clears with room for run-to-run noise.",
            coalescing::GAIN_LIMIT,
            coalescing::GAIN_LIMIT
        );
    }
}
