//! A scenario's setup and rounds: the backends it measures against, the multiplexer limits it
//! starts with, and the loops that drive load at them (once, warmed up, or in interleaved rounds).

use std::time::Duration;

use teifleet_load::inputs::{Inputs, Tokens};
use teifleet_load::{LoadConfig, Report};

use super::Context;
use crate::Result;
use crate::procs::{self, Device, Features, MuxLimits, Proc, SimModel};

/// The GPU-like backend of the overload, burst, SLO, storm and coalescing scenarios: TEI batching
/// at most 8 requests per device batch, 20 ms per batch plus 20 µs per token (a small embedding
/// model on a modest GPU, slowed so that 10× its capacity is still a load this 2-core machine
/// can offer).
pub fn gpu_model(max_concurrent_requests: usize, device: Device) -> SimModel {
    SimModel {
        max_concurrent_requests,
        max_batch_requests: Some(8),
        fixed_latency: Duration::from_millis(20),
        per_token_latency: Duration::from_micros(20),
        device,
    }
}

/// The fast backend of the cost and live-limit scenarios: about 1 ms per call on a sleeping
/// device (its timer ticks in milliseconds, so a batch takes at least ~1 ms) that leaves the CPU
/// to the processes being measured.
pub fn fast_model() -> SimModel {
    SimModel {
        max_concurrent_requests: 512,
        max_batch_requests: None,
        fixed_latency: Duration::ZERO,
        per_token_latency: Duration::from_micros(1),
        device: Device::Sleep,
    }
}

/// The backend of the overhead and stream scenarios: 1 ms + 1 µs/token per batch, spent spinning
/// so it is exact (a sleeping device rounds to timer ticks, and a closed loop phase-locks to
/// them, which hides or inflates a hop's microseconds). Without a spinning simulator, the fast
/// model.
pub fn precise_model(features: Features) -> SimModel {
    if !features.sim_spin {
        return fast_model();
    }
    SimModel { fixed_latency: Duration::from_millis(1), device: Device::Spin, ..fast_model() }
}

/// Multiplexer limits under which admission never waits: what a hop costs, without a queue.
pub fn unhurried_limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: 64,
        max_queued: 256,
        queue_timeout: Duration::from_secs(2),
        max_concurrent_streams: 256,
        coalesce: false,
    }
}

/// Runs one load, quietly.
pub async fn measure(config: LoadConfig) -> Result<Report> {
    Ok(teifleet_load::run(&LoadConfig { progress: false, ..config }).await?)
}

/// Runs one load, quietly, on a runtime of its own (one thread): the clients of another workload,
/// as another process's would be. Loads measured side by side in one runtime share its two
/// worker threads, so a flood's client work (encoding, decoding, timers for a thousand calls a
/// second) delays when the runtime gets to a light load's answers, and its latency grows by
/// time no server spent (scenario 17's light pools beside a flood at 5× a pool's share).
pub async fn measure_apart(config: LoadConfig) -> Result<Report> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::Error::Process(format!("a runtime for a load apart: {e}")))?;
    std::thread::Builder::new()
        .name("load-apart".into())
        .spawn(move || {
            let _ = done_tx.send(runtime.block_on(measure(config)));
        })
        .map_err(|e| crate::Error::Process(format!("a thread for a load apart: {e}")))?;
    done_rx.await.map_err(|_| crate::Error::Process("a load run apart ended without a report".into()))?
}

/// A short closed-loop warm-up so connections, allocators and the simulator's batcher are warm
/// before anything is measured.
pub async fn warm_up(target: &str, connections: usize) -> Result<()> {
    let config = LoadConfig { connections, ..LoadConfig::closed(target, 4, 200) };
    measure(config).await.map(|_| ())
}

/// Inputs of `tokens` words.
pub fn words(tokens: usize) -> Inputs {
    Inputs::Words(Tokens::Fixed(tokens))
}

/// Runs `config(target)` against every target `rounds` times, rotating which goes first in each
/// round, so slow drift on the machine favours none. Returns one report per round, per target.
pub async fn interleaved(
    targets: &[String],
    rounds: usize,
    config: impl Fn(&str) -> LoadConfig,
) -> Result<Vec<Vec<Report>>> {
    let mut out = vec![Vec::with_capacity(rounds); targets.len()];
    for round in 0..rounds {
        for k in 0..targets.len() {
            let side = (round + k) % targets.len();
            out[side].push(measure(config(&targets[side])).await?);
        }
    }
    Ok(out)
}

/// The setup most scenarios share: a simulator with `backend` and a multiplexer with `limits` in
/// front of it, named `<name>-sim` and `<name>-mux` (their logs' names), both warmed up over
/// `connections`. Returns (simulator, multiplexer).
pub async fn sim_and_mux(
    ctx: &Context,
    name: &str,
    backend: &SimModel,
    limits: &MuxLimits,
    connections: usize,
) -> Result<(Proc, Proc)> {
    let sim = procs::start_sim(&ctx.bins, &format!("{name}-sim"), backend).await?;
    let mux = procs::start_mux(&ctx.bins, &format!("{name}-mux"), &sim, limits).await?;
    warm_up(&sim.url(), connections).await?;
    warm_up(&mux.url(), connections).await?;
    Ok((sim, mux))
}

/// The comparison most rows are made of: one load direct to the simulator, a second's pause, then
/// the same load through the multiplexer. `what` starts both progress lines. Returns (direct,
/// through the multiplexer).
pub async fn direct_then_mux(
    ctx: &Context,
    what: &str,
    sim: &Proc,
    mux: &Proc,
    config: impl Fn(String) -> LoadConfig,
) -> Result<(Report, Report)> {
    ctx.say(&format!("{what} direct"));
    let direct = measure(config(sim.url())).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctx.say(&format!("{what} through the multiplexer"));
    let through = measure(config(mux.url())).await?;
    Ok((direct, through))
}

/// A pool of `n` replicas as scenario 15 starts them: each a simulator with `backend` (and
/// `sim_extra` flags) behind its own multiplexer with `limits`, naming the other replicas'
/// multiplexers with `--sibling` (every gRPC port picked before any of them starts), `mux_extra`
/// flags appended to each (the same on every replica, as a pool's pods are), named
/// `<name>-sim<i>` and `<name>-mux<i>`. Each simulator and multiplexer is warmed up with a few
/// batches. Returns (simulators, multiplexers), replica 1 first.
pub async fn sibling_pool(
    ctx: &Context,
    name: &str,
    n: usize,
    backend: &SimModel,
    sim_extra: &[String],
    limits: &MuxLimits,
    mux_extra: &[String],
) -> Result<(Vec<Proc>, Vec<Proc>)> {
    sibling_pool_with(ctx, name, n, backend, sim_extra, limits, |_| mux_extra.to_vec()).await
}

/// [`sibling_pool`] whose replicas also serve TEI's HTTP API, each multiplexer's HTTP front on a
/// port of its own; returns the HTTP fronts' URLs too, replica 1 first.
pub async fn sibling_pool_serving_http(
    ctx: &Context,
    name: &str,
    n: usize,
    backend: &SimModel,
    sim_extra: &[String],
    limits: &MuxLimits,
    mux_extra: &[String],
) -> Result<(Vec<Proc>, Vec<Proc>, Vec<String>)> {
    let ports = (0..n).map(|_| procs::pick_port()).collect::<Result<Vec<u16>>>()?;
    let with_http = |i: usize| {
        let mut extra = mux_extra.to_vec();
        extra.push(format!("--http-listen=127.0.0.1:{}", ports[i]));
        extra
    };
    let (sims, muxes) = sibling_pool_with(ctx, name, n, backend, sim_extra, limits, with_http).await?;
    Ok((sims, muxes, ports.iter().map(|port| format!("http://127.0.0.1:{port}")).collect()))
}

/// [`sibling_pool`], replica i's multiplexer started with `mux_extra(i)`.
async fn sibling_pool_with(
    ctx: &Context,
    name: &str,
    n: usize,
    backend: &SimModel,
    sim_extra: &[String],
    limits: &MuxLimits,
    mux_extra: impl Fn(usize) -> Vec<String>,
) -> Result<(Vec<Proc>, Vec<Proc>)> {
    let bins = &ctx.bins;
    let mut sims = Vec::with_capacity(n);
    for i in 1..=n {
        sims.push(procs::start_sim_with(bins, &format!("{name}-sim{i}"), backend, sim_extra).await?);
    }
    let ports = (0..n).map(|_| procs::pick_port()).collect::<Result<Vec<u16>>>()?;
    let mut muxes = Vec::with_capacity(n);
    for (i, sim) in sims.iter().enumerate() {
        let mut extra: Vec<String> = ports
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, port)| format!("--sibling={}", procs::url_of(*port)))
            .collect();
        extra.extend(mux_extra(i));
        muxes.push(procs::start_mux_on(bins, &format!("{name}-mux{}", i + 1), ports[i], sim, limits, &extra).await?);
    }
    for target in sims.iter().chain(&muxes) {
        measure(LoadConfig { inputs: words(16), ..LoadConfig::closed(target.url(), 8, 48) }).await?;
    }
    Ok((sims, muxes))
}
