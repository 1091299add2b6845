//! `tei-sim`: a stand-in for a TEI gRPC server, for local runs and end-to-end tests.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use teifleet_runtime::duration::parse_flag;
use teifleet_runtime::logging::{self, LogFormat};
use teifleet_runtime::shutdown;
use teifleet_tei_sim::{Device, Fault, SimConfig};

/// Simulates Hugging Face Text Embeddings Inference over TEI's gRPC API (tei.v1): admission,
/// batching on a simulated device, deterministic embeddings, faults and TEI-named metrics.
#[derive(Debug, Parser)]
#[command(name = "tei-sim", version)]
struct Args {
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    listen: SocketAddr,
    /// Admin HTTP listen address: GET /stats, POST /stats/reset, POST /fault/{fail,stall,clear},
    /// GET /metrics, GET /healthz, GET /readyz.
    #[arg(long, default_value = "127.0.0.1:9000", value_name = "ADDR")]
    admin_listen: SocketAddr,
    /// Requests admitted at once; a unary call beyond this fails with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 512, value_name = "N")]
    max_concurrent_requests: usize,
    /// Token budget of one device batch, and the longest input accepted without truncation.
    #[arg(long, default_value_t = 16384, value_name = "N")]
    max_batch_tokens: usize,
    /// Cap on requests per device batch (no cap when absent).
    #[arg(long, value_name = "N")]
    max_batch_requests: Option<usize>,
    /// Most texts accepted in one Rerank call.
    #[arg(long, default_value_t = 32, value_name = "N")]
    max_client_batch_size: usize,
    /// Device time of every batch, e.g. 2ms.
    #[arg(long, default_value = "2ms", value_parser = parse_flag, value_name = "DUR")]
    fixed_latency: Duration,
    /// Device time added per token in the batch, e.g. 20us.
    #[arg(long, default_value = "20us", value_parser = parse_flag, value_name = "DUR")]
    per_token_latency: Duration,
    /// How a batch's device time is spent: sleep (a GPU: no CPU used) or spin (TEI on a CPU: the
    /// device time is burnt as CPU time of one thread, so a busy machine slows the device).
    #[arg(long, default_value = "sleep", value_name = "sleep|spin")]
    device: Device,
    /// Length of the returned embeddings.
    #[arg(long, default_value_t = 384, value_name = "N")]
    dimensions: usize,
    /// Model id reported by Info.
    #[arg(long, default_value = "teifleet/sim-embedding", value_name = "ID")]
    model_id: String,
    /// Fault to start with: none, fail or stall.
    #[arg(long, default_value = "none", value_name = "FAULT")]
    fault: Fault,
    /// Log lines as json or pretty (to stderr; RUST_LOG filters, default info).
    #[arg(long, value_enum, default_value = "pretty")]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    logging::init(args.log_format)?;
    let stop_signal = shutdown::signal()?;
    let config = SimConfig {
        listen: args.listen,
        admin_listen: Some(args.admin_listen),
        max_concurrent_requests: args.max_concurrent_requests,
        max_batch_tokens: args.max_batch_tokens,
        max_batch_requests: args.max_batch_requests,
        max_client_batch_size: args.max_client_batch_size,
        fixed_latency: args.fixed_latency,
        per_token_latency: args.per_token_latency,
        device: args.device,
        dimensions: args.dimensions,
        model_id: args.model_id,
    };
    let sim = teifleet_tei_sim::start(config).await.context("starting the simulator")?;
    sim.set_fault(args.fault);
    let signal = stop_signal.await;
    tracing::info!(%signal, "shutting down");
    sim.shutdown().await;
    Ok(())
}
