//! Scenario 2, overload (seeds 000 and 003): open-loop Poisson load at 0.5×, 1×, 2×, 5× and 10×
//! the backend's measured capacity, direct to the backend (TEI's own admission only) and through
//! the multiplexer's admission control, with the same arrival schedule on both sides.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::procs::{self, MuxLimits, Proc};
use super::{Context, failed_section, gpu_model, measure, ms, warm_up};
use crate::Result;
use crate::load::LoadConfig;
use crate::plots::{self, Chart, Series};
use crate::report::Report;
use crate::results::Section;
use crate::targets::{Rule, Target};

const KEY: &str = "overload";
const TITLE: &str = "2. Overload: goodput and latency from 0.5× to 10× capacity (seeds 000, 003)";
const SCENARIO: &str = "2 overload";
const FACTORS: [f64; 5] = [0.5, 1.0, 2.0, 5.0, 10.0];
const OVERLOADED: [f64; 3] = [2.0, 5.0, 10.0];
/// Every request's gRPC deadline: clients that wait longer have given up anyway.
const DEADLINE: Duration = Duration::from_secs(1);

/// The backend's measured capacity and batch (service) time.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Capacity {
    /// OK answers per second with the backend saturated.
    pub rps: f64,
    /// TEI inference time of a full batch (p50), ms.
    pub batch_ms: f64,
}

/// Saturates the backend directly (closed loop, 8× its batch in flight) and reads its rate.
pub async fn measure_capacity(ctx: &Context, sim: &Proc, tokens: usize) -> Result<Capacity> {
    let config = LoadConfig {
        connections: 4,
        tokens: crate::inputs::Tokens::Fixed(tokens),
        ..LoadConfig::closed(sim.url(), 64, ctx.pick(1500, 4000))
    };
    let report = measure(config).await?;
    Ok(Capacity { rps: report.goodput_rps, batch_ms: report.tei_inference.map_or(f64::NAN, |s| s.p50_ms) })
}

pub fn mux_limits() -> MuxLimits {
    // Two batches in flight (one running, the next one prepared), a queue TEI drains in ~0.4 s.
    MuxLimits {
        max_in_flight: 16,
        max_queued: 128,
        queue_timeout: Duration::from_millis(500),
        max_concurrent_streams: 1024,
    }
}

pub fn planned_targets() -> Vec<Target> {
    let mut targets = Vec::new();
    for f in OVERLOADED {
        targets.push(Target::new(SCENARIO, &format!("goodput at {f}×"), None, Rule::AtLeast, 0.97, "× capacity"));
        targets.push(Target::new(SCENARIO, &format!("admitted p99 at {f}×"), None, Rule::AtMost, f64::NAN, "ms"));
        targets.push(Target::new(SCENARIO, &format!("shed p99 at {f}×"), None, Rule::AtMost, 1.0, "ms"));
        targets.push(Target::new(SCENARIO, &format!("TEI queue p99 at {f}×"), None, Rule::AtMost, f64::NAN, "ms"));
    }
    targets
}

pub async fn run(ctx: &Context) -> Section {
    match measure_all(ctx).await {
        Ok(section) => section,
        Err(e) => failed_section(KEY, TITLE, &e, planned_targets()),
    }
}

struct Row {
    factor: f64,
    direct: Report,
    mux: Report,
}

fn shed_fraction(r: &Report) -> f64 {
    r.failed_fraction()
}

async fn measure_all(ctx: &Context) -> Result<Section> {
    let model = gpu_model(512);
    let sim = procs::start_sim(&ctx.bins, "overload-sim", &model).await?;
    let limits = mux_limits();
    let mux = procs::start_mux(&ctx.bins, "overload-mux", &sim, &limits).await?;
    warm_up(&sim.url(), 8).await?;
    warm_up(&mux.url(), 8).await?;
    ctx.say("overload: measuring the backend's capacity");
    let capacity = measure_capacity(ctx, &sim, 16).await?;
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
        ctx.say(&format!("overload: {factor}× = {rate:.0} req/s direct"));
        let direct = measure(config(sim.url())).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("overload: {factor}× = {rate:.0} req/s through the multiplexer"));
        let through = measure(config(mux.url())).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        rows.push(Row { factor: *factor, direct, mux: through });
    }

    let admitted_limit = limits.queue_timeout.as_secs_f64() * 1e3 + 2.0 * capacity.batch_ms;
    let queue_limit = 2.0 * capacity.batch_ms;
    let mut targets = Vec::new();
    for row in rows.iter().filter(|r| OVERLOADED.contains(&r.factor)) {
        let f = row.factor;
        let m = &row.mux;
        let tei_queue = m.tei_queue.map_or(f64::NAN, |s| s.p99_ms);
        targets.push(
            Target::at_least(SCENARIO, &format!("goodput at {f}×"), m.goodput_rps / capacity.rps, 0.97, "× capacity")
                .note_if_not_passed(
                    "TEI idles between batches: raise maxInFlight so the next batch is always prepared while one runs",
                ),
        );
        targets.push(
            Target::at_most(SCENARIO, &format!("admitted p99 at {f}×"), m.latency_ok.p99_ms, admitted_limit, "ms")
                .note_if_not_passed(
                    "shorten queueTimeout or maxQueued so no admitted call waits longer than the bound",
                ),
        );
        targets.push(
            Target::at_most(SCENARIO, &format!("shed p99 at {f}×"), m.response_failed.p99_ms, 1.0, "ms")
                .note_if_not_passed(
                    "refusals wait for CPU behind the generator and the backend on this 2-core machine; \
                 a core of its own for the multiplexer, or refusing in the HTTP/2 layer before decoding the \
                 request, would bring them under 1 ms",
                ),
        );
        targets.push(
            Target::at_most(SCENARIO, &format!("TEI queue p99 at {f}×"), tei_queue, queue_limit, "ms")
                .note_if_not_passed("lower maxInFlight towards one batch so fewer calls wait inside TEI"),
        );
    }

    let mut table = String::new();
    let _ = writeln!(
        table,
        "| load | setup | offered/s | goodput/capacity | OK p50 | OK p99 | shed | shed p99 (sent→) | TEI queue p99 | codes |"
    );
    let _ = writeln!(table, "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for row in &rows {
        for (name, r) in [("direct", &row.direct), ("multiplexer", &row.mux)] {
            let _ = writeln!(
                table,
                "| {}× | {name} | {:.0} | {:.3} | {} ms | {} ms | {:.1}% | {} ms | {} ms | {} |",
                row.factor,
                r.offered_rps.unwrap_or(0.0),
                r.goodput_rps / capacity.rps,
                ms(r.latency_ok.p50_ms),
                ms(r.latency_ok.p99_ms),
                shed_fraction(r) * 100.0,
                ms(r.response_failed.p99_ms),
                ms(r.tei_queue.map_or(f64::NAN, |s| s.p99_ms)),
                crate::render::codes(r)
            );
        }
    }

    let series = |f: &dyn Fn(&Report) -> f64| {
        vec![
            Series {
                name: "direct (TEI's own admission)".into(),
                points: rows.iter().map(|r| (r.factor, f(&r.direct))).collect(),
            },
            Series {
                name: "through the multiplexer".into(),
                points: rows.iter().map(|r| (r.factor, f(&r.mux))).collect(),
            },
        ]
    };
    let (latency_path, latency_file) = ctx.plot_path("overload-latency");
    plots::line_chart(
        &latency_path,
        &Chart {
            title: "p99 latency of OK answers vs offered load",
            x_label: "offered load (× measured capacity)",
            y_label: "p99 latency (ms)",
            log_y: true,
            log_x: true,
        },
        &series(&|r| r.latency_ok.p99_ms),
    )?;
    let (goodput_path, goodput_file) = ctx.plot_path("overload-goodput");
    plots::line_chart(
        &goodput_path,
        &Chart {
            title: "Goodput (OK within the 1 s deadline) vs offered load",
            x_label: "offered load (× measured capacity)",
            y_label: "goodput / capacity",
            log_y: false,
            log_x: true,
        },
        &series(&|r| r.goodput_rps / capacity.rps),
    )?;

    let mut markdown = String::new();
    let _ = writeln!(
        markdown,
        "Backend: simulated TEI, batches of at most {} requests, device time {} ms + {} µs/token per batch, \
         `--max-concurrent-requests {}` (TEI's default). Inputs of 16 tokens. **Measured capacity: {:.1} req/s** \
         (closed loop, 64 in flight, direct); **batch (service) time p50: {:.2} ms**.\n\n\
         Multiplexer: maxInFlight {}, maxQueued {}, queueTimeout {} ms. Load: open loop, Poisson, {} s per point, \
         8 connections, every request with a {} s deadline; the same schedule (seed) direct and through the \
         multiplexer. Goodput counts OK answers within the deadline, over first send to last answer. \
         \"shed\" is every non-OK answer; its p99 is timed from the actual send (the generator's own send lateness \
         is reported separately in the JSON). Limits: admitted p99 ≤ queueTimeout + 2 × service = {:.1} ms; \
         TEI queue p99 ≤ 2 × batch time = {:.1} ms.\n",
        model.max_batch_requests.unwrap_or(0),
        model.fixed_latency.as_millis(),
        model.per_token_latency.as_micros(),
        model.max_concurrent_requests,
        capacity.rps,
        capacity.batch_ms,
        limits.max_in_flight,
        limits.max_queued,
        limits.queue_timeout.as_millis(),
        duration.as_secs(),
        DEADLINE.as_secs(),
        admitted_limit,
        queue_limit
    );
    markdown.push_str(&table);
    let _ = writeln!(
        markdown,
        "\nDirect, `CANCELLED` is the backend's gRPC server ending calls at their deadline (tonic answers \
         `CANCELLED: Timeout expired`); `RESOURCE_EXHAUSTED` is TEI's own refusal once its {} slots are taken. \
         Through the multiplexer, `RESOURCE_EXHAUSTED` is its refusal (queue full, or the deadline cannot be met), \
         answered at once.",
        model.max_concurrent_requests
    );
    let data_rows: Vec<_> =
        rows.iter().map(|r| json!({ "factor": r.factor, "direct": r.direct, "multiplexer": r.mux })).collect();
    Ok(Section {
        key: KEY.into(),
        title: TITLE.into(),
        markdown,
        data: json!({ "backend": model, "multiplexer": limits, "capacity": capacity, "rows": data_rows }),
        targets,
        plots: vec![latency_file, goodput_file],
    })
}
