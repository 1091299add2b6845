//! `teifleet-floor-proxy`: a bare proxy (no admission, no routing, no metrics) that forwards every
//! unary call to one upstream, on tonic (the multiplexer's stack) or on `h2` alone. The overhead
//! and cost scenarios measure it beside the multiplexer as the floors this machine allows for one
//! gRPC hop; with `--stack memo` it answers repeated calls from memory, the cache scenario's floor.
#![forbid(unsafe_code)]

use std::net::SocketAddr;

use anyhow::Context as _;
use clap::Parser;
use teifleet_bench::floor::Stack;

/// Forwards unary gRPC calls of any path to --upstream, as they came (`--stack memo`: answers a
/// call seen before from memory).
#[derive(Debug, Parser)]
#[command(name = "teifleet-floor-proxy", version)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:50052", value_name = "ADDR")]
    listen: SocketAddr,
    #[arg(long, default_value = "http://127.0.0.1:8080", value_name = "URL")]
    upstream: String,
    /// What it is built on.
    #[arg(long, value_enum, default_value = "tonic")]
    stack: Stack,
}

// One thread, as the multiplexer's default, so the floor has the same runtime shape without the
// multiplexer's work: no hand-offs between threads, the cheapest per call.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Stopping on SIGTERM returns from `main`, as the multiplexer does: an instrumented build
    // (tools/pgo.sh) writes its profile only when the process exits normally.
    let stop = teifleet_runtime::shutdown::signal()?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    tokio::select! {
        served = teifleet_bench::floor::serve(args.stack, listener, &args.upstream) => served?,
        _ = stop => {}
    }
    Ok(())
}
