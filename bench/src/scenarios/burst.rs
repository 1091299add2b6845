//! Scenario 3, burst (seed 004's table): 20,000 tiny requests from 2,048 closed-loop clients,
//! direct to the backend and through the multiplexer.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::json;

use super::procs::{self, MuxLimits};
use super::{Context, failed_section, gpu_model, measure, ms, warm_up};
use crate::Result;
use crate::inputs::Tokens;
use crate::load::LoadConfig;
use crate::results::Section;
use crate::targets::{Rule, Target};

const KEY: &str = "burst";
const TITLE: &str = "3. Burst: 2,048 concurrent clients, tiny inputs (seed 004)";
const SCENARIO: &str = "3 burst";
const CONCURRENCY: usize = 2048;

pub fn planned_targets() -> Vec<Target> {
    vec![
        Target::new(SCENARIO, "throughput (OK/s) vs direct", None, Rule::AtLeast, 1.0, "×"),
        Target::new(SCENARIO, "p99 vs direct", None, Rule::AtMost, 0.25, "×"),
    ]
}

pub async fn run(ctx: &Context) -> Section {
    match measure_all(ctx).await {
        Ok(section) => section,
        Err(e) => failed_section(KEY, TITLE, &e, planned_targets()),
    }
}

async fn measure_all(ctx: &Context) -> Result<Section> {
    // TEI admits the whole burst here (seed 004's TEI answered all 20,000), so "direct" is a TEI
    // queue 2,048 deep rather than instant refusals.
    let model = gpu_model(4096);
    let sim = procs::start_sim(&ctx.bins, "burst-sim", &model).await?;
    // The README's default queueTimeout; a queue that holds the whole burst.
    let limits = MuxLimits {
        max_in_flight: 16,
        max_queued: CONCURRENCY,
        queue_timeout: Duration::from_secs(2),
        max_concurrent_streams: 1024,
    };
    let mux = procs::start_mux(&ctx.bins, "burst-mux", &sim, &limits).await?;
    warm_up(&sim.url(), 16).await?;
    warm_up(&mux.url(), 16).await?;
    let requests = ctx.pick(4000, 20_000);
    let config = |target: String| LoadConfig {
        connections: 16,
        tokens: Tokens::Fixed(2),
        duration: Duration::from_secs(240),
        ..LoadConfig::closed(target, CONCURRENCY, requests)
    };
    ctx.say(&format!("burst: {requests} requests at concurrency {CONCURRENCY}, direct"));
    let direct = measure(config(sim.url())).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctx.say(&format!("burst: {requests} requests at concurrency {CONCURRENCY}, through the multiplexer"));
    let through = measure(config(mux.url())).await?;

    let throughput_ratio = through.goodput_rps / direct.goodput_rps;
    let p99_ratio = through.latency.p99_ms / direct.latency.p99_ms;
    let targets = vec![
        Target::at_least(SCENARIO, "throughput (OK/s) vs direct", throughput_ratio, 1.0, "×").note_if_not_passed(
            "both sides drive the same device, so OK/s can at best tie, and a gap of a few tenths of a percent \
                 is within run-to-run noise; probably the run's end, where the last queued calls time out after \
                 the device has nothing left to do. Serving the newest waiters first (below) would also remove it",
        ),
        Target::at_most(SCENARIO, "p99 vs direct", p99_ratio, 0.25, "×").note_if_not_passed(
            "in a closed loop every client waits for the same device, so by Little's law the mean wait is \
             clients ÷ throughput (≈ 2,048 ÷ capacity) whoever holds the queue; FIFO with a 2 s queueTimeout \
             serves calls just before they time out. Serving the newest waiters first while a queue stands \
             (adaptive LIFO, as CoDel-style proxies do) would answer most calls within a few batch times and \
             shed the old ones; a shorter queueTimeout or client deadlines also cut p99, at the price of more sheds",
        ),
    ];

    let mut table = String::new();
    let _ =
        writeln!(table, "| setup | requests | OK/s | answers/s | OK | shed | p50 | p90 | p99 | OK p99 | max | codes |");
    let _ = writeln!(table, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for (name, r) in [("direct (TEI)", &direct), ("through the multiplexer", &through)] {
        let _ = writeln!(
            table,
            "| {name} | {} | {:.1} | {:.1} | {} | {:.1}% | {} ms | {} ms | {} ms | {} ms | {} ms | {} |",
            r.sent,
            r.goodput_rps,
            r.throughput_rps,
            r.ok,
            r.failed_fraction() * 100.0,
            ms(r.latency.p50_ms),
            ms(r.latency.p90_ms),
            ms(r.latency.p99_ms),
            ms(r.latency_ok.p99_ms),
            ms(r.latency.max_ms),
            crate::render::codes(r)
        );
    }
    let mut markdown = String::new();
    let _ = writeln!(
        markdown,
        "Closed loop, {CONCURRENCY} clients over 16 HTTP/2 connections, {requests} requests of 2 tokens, no deadline. \
         Backend: the scenario-2 simulated TEI with `--max-concurrent-requests 4096`, so it queues the whole \
         burst as seed 004's TEI did. Multiplexer: maxInFlight {}, maxQueued {}, queueTimeout {} s (the \
         default). Latency columns are of all answers (sheds included) unless marked OK. Throughput compared is OK answers per second.\n",
        limits.max_in_flight,
        limits.max_queued,
        limits.queue_timeout.as_secs()
    );
    markdown.push_str(&table);
    let _ = writeln!(
        markdown,
        "\nSeed 004 (XPS laptop GPU, 2 tokens, 2,048 concurrent): TEI 8,528 req/s, p99 1,640 ms; their batching \
         proxy 11,232 req/s, p99 239 ms."
    );
    let data = json!({ "backend": model, "multiplexer": limits, "direct": direct, "through": through,
        "throughput_ratio": throughput_ratio, "p99_ratio": p99_ratio });
    Ok(Section { key: KEY.into(), title: TITLE.into(), markdown, data, targets, plots: vec![] })
}
