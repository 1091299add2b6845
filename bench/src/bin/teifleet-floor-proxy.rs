//! `teifleet-floor-proxy`: a bare tonic bytes-proxy (no admission, no routing, no metrics) that
//! forwards every unary call to one upstream. The overhead scenario measures it beside the
//! multiplexer as the floor this machine allows for one gRPC hop.
#![forbid(unsafe_code)]

use std::net::SocketAddr;

use anyhow::Context as _;
use clap::Parser;

/// Forwards unary gRPC calls of any path to --upstream, as raw message bytes.
#[derive(Debug, Parser)]
#[command(name = "teifleet-floor-proxy", version)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:50052", value_name = "ADDR")]
    listen: SocketAddr,
    #[arg(long, default_value = "http://127.0.0.1:8080", value_name = "URL")]
    upstream: String,
    /// Threads serving calls. One, as the multiplexer's default, so the floor is the same runtime
    /// shape without the multiplexer's work: no hand-offs between threads, the cheapest per call.
    #[arg(long, default_value_t = 1, value_name = "N")]
    worker_threads: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = if args.worker_threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.worker_threads).enable_all().build()
    };
    runtime.context("starting the async runtime")?.block_on(async {
        let listener =
            tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        teifleet_bench::floor::serve(listener, &args.upstream).await?;
        Ok(())
    })
}
