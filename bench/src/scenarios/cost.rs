//! Scenario 5, cost: CPU seconds the multiplexer process spends per request (from
//! `/proc/<pid>/stat`), and its resident memory per queued request with 10,000 requests waiting
//! (from `/proc/<pid>/status`), the backend stalled so they stay queued.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::procs::{self, MuxLimits};
use super::{Context, failed_section, fast_model, http, measure, warm_up};
use crate::load::LoadConfig;
use crate::results::Section;
use crate::targets::{Rule, Target};
use crate::{Error, Result, procfs};

const KEY: &str = "cost";
const TITLE: &str = "5. Cost: multiplexer CPU per request and memory per queued request";
const SCENARIO: &str = "5 cost";
const CPU_LIMIT_US: f64 = 40.0;
const RSS_LIMIT_BYTES: f64 = 4096.0;
const QUEUED: usize = 10_000;

pub fn planned_targets() -> Vec<Target> {
    vec![
        Target::new(SCENARIO, "CPU per request", None, Rule::AtMost, CPU_LIMIT_US, "µs"),
        Target::new(SCENARIO, "RSS per queued request", None, Rule::AtMost, RSS_LIMIT_BYTES, "bytes"),
    ]
}

pub async fn run(ctx: &Context) -> Section {
    let cpu = match cpu_per_request(ctx).await {
        Ok(cpu) => cpu,
        Err(e) => return failed_section(KEY, TITLE, &e, planned_targets()),
    };
    let rss = match rss_per_queued(ctx).await {
        Ok(rss) => rss,
        Err(e) => return failed_section(KEY, TITLE, &e, planned_targets()),
    };
    let mut markdown = String::new();
    let _ = writeln!(
        markdown,
        "**CPU.** The multiplexer runs as its own process in front of the ~1 ms simulated TEI (maxInFlight 64, so \
         nothing waits); {} requests of 16 tokens, open loop at {:.0} req/s over 4 connections, all admitted. \
         CPU = utime + stime of the multiplexer's process over the run, from /proc/{{pid}}/stat; the simulator's \
         own process (a gRPC server without the second hop) is shown for scale.\n",
        cpu.requests, cpu.rate
    );
    let _ = writeln!(markdown, "| process | CPU s | requests | µs per request | CPU s per 1,000 requests |");
    let _ = writeln!(markdown, "| --- | ---: | ---: | ---: | ---: |");
    for (name, secs) in [("multiplexer", cpu.mux_cpu_s), ("simulator (for scale)", cpu.sim_cpu_s)] {
        let per = secs / cpu.requests as f64;
        let _ = writeln!(markdown, "| {name} | {secs:.3} | {} | {:.1} | {:.4} |", cpu.requests, per * 1e6, per * 1e3);
    }
    let _ = writeln!(
        markdown,
        "\n**Memory.** A fresh multiplexer (maxInFlight 4, maxQueued {}, queueTimeout 120 s) in front of a simulator \
         told to stall, so admitted calls never finish; {} closed-loop clients over 16 connections, so {QUEUED} \
         wait in the queue. RSS from /proc/{{pid}}/status (VmRSS), idle (after a warm-up) and with the queue full.\n",
        QUEUED + 100,
        QUEUED + 4
    );
    let _ = writeln!(
        markdown,
        "| RSS idle | RSS with {QUEUED} queued | queued (from /metrics) | bytes per queued request |"
    );
    let _ = writeln!(markdown, "| ---: | ---: | ---: | ---: |");
    let _ = writeln!(
        markdown,
        "| {:.1} MiB | {:.1} MiB | {} | {:.0} |",
        rss.idle as f64 / 1048576.0,
        rss.loaded as f64 / 1048576.0,
        rss.queued,
        rss.per_queued
    );
    let targets = vec![
        Target::at_most(SCENARIO, "CPU per request", cpu.mux_cpu_s / cpu.requests as f64 * 1e6, CPU_LIMIT_US, "µs")
            .note_if_not_passed(
                "each call is decoded, re-encoded and sent over a second HTTP/2 connection; forwarding the raw \
                 message bytes (a pass-through codec) would save the protobuf work, and a lighter metrics path \
                 (one histogram update per call instead of four) the rest",
            ),
        Target::at_most(SCENARIO, "RSS per queued request", rss.per_queued, RSS_LIMIT_BYTES, "bytes").note_if_not_passed(
            "a queued call holds its decoded request, its HTTP/2 stream state and buffers and its task; keeping the \
             undecoded bytes instead of the message, and smaller per-stream HTTP/2 windows, would shrink it",
        ),
    ];
    Section {
        key: KEY.into(),
        title: TITLE.into(),
        markdown,
        data: json!({ "cpu": cpu, "memory": rss }),
        targets,
        plots: vec![],
    }
}

#[derive(Debug, serde::Serialize)]
struct Cpu {
    requests: u64,
    rate: f64,
    mux_cpu_s: f64,
    sim_cpu_s: f64,
}

async fn cpu_per_request(ctx: &Context) -> Result<Cpu> {
    let sim = procs::start_sim(&ctx.bins, "cost-sim", &fast_model()).await?;
    let limits = MuxLimits {
        max_in_flight: 64,
        max_queued: 1024,
        queue_timeout: Duration::from_secs(2),
        max_concurrent_streams: 1024,
    };
    let mux = procs::start_mux(&ctx.bins, "cost-mux", &sim, &limits).await?;
    warm_up(&mux.url(), 4).await?;
    let ticks = procfs::ticks_per_second();
    let rate = 1000.0;
    let duration = ctx.pick(Duration::from_secs(4), Duration::from_secs(15));
    ctx.say(&format!("cost: CPU of the multiplexer at {rate} req/s for {} s", duration.as_secs()));
    let (mux0, sim0) = (procfs::cpu_time(mux.pid(), ticks)?, procfs::cpu_time(sim.pid(), ticks)?);
    let report = measure(LoadConfig { connections: 4, ..LoadConfig::open(mux.url(), rate, duration) }).await?;
    let (mux1, sim1) = (procfs::cpu_time(mux.pid(), ticks)?, procfs::cpu_time(sim.pid(), ticks)?);
    if report.ok == 0 {
        return Err(Error::Process("no request succeeded through the multiplexer".into()));
    }
    Ok(Cpu {
        requests: report.sent,
        rate,
        mux_cpu_s: (mux1 - mux0).as_secs_f64(),
        sim_cpu_s: (sim1 - sim0).as_secs_f64(),
    })
}

#[derive(Debug, serde::Serialize)]
struct Rss {
    idle: u64,
    loaded: u64,
    queued: u64,
    per_queued: f64,
}

async fn rss_per_queued(ctx: &Context) -> Result<Rss> {
    let sim = procs::start_sim(&ctx.bins, "rss-sim", &fast_model()).await?;
    let limits = MuxLimits {
        max_in_flight: 4,
        max_queued: QUEUED + 100,
        queue_timeout: Duration::from_secs(120),
        max_concurrent_streams: 1024,
    };
    let mux = procs::start_mux(&ctx.bins, "rss-mux", &sim, &limits).await?;
    warm_up(&mux.url(), 4).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = procfs::rss_bytes(mux.pid())?;
    http::post(sim.admin, "/fault/stall")
        .await
        .ok_or_else(|| Error::Process("could not stall the simulator".into()))?;

    ctx.say(&format!("cost: RSS of the multiplexer with {QUEUED} queued requests"));
    let config = LoadConfig {
        connections: 16,
        duration: Duration::from_secs(60),
        grace: Duration::from_secs(60),
        ..LoadConfig::closed(mux.url(), QUEUED + 4, (QUEUED + 4) as u64)
    };
    let load = tokio::spawn(async move { measure(config).await });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut queued = 0.0;
    while Instant::now() < deadline {
        if let Some(text) = http::get(mux.admin, "/metrics").await {
            queued = http::metric_sum(&text, "teifleet_queued");
            if queued >= QUEUED as f64 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let allocations settle, then read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let loaded = procfs::rss_bytes(mux.pid())?;
    http::post(sim.admin, "/fault/clear").await;
    let report = load.await.map_err(|e| Error::Process(format!("load task: {e}")))??;
    if queued < 1.0 {
        return Err(Error::Process(format!(
            "nothing queued at the multiplexer (codes: {})",
            crate::render::codes(&report)
        )));
    }
    let queued = queued as u64;
    Ok(Rss { idle, loaded, queued, per_queued: loaded.saturating_sub(idle) as f64 / queued as f64 })
}
