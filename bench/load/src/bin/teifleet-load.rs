//! `teifleet-load`: drives a tei.v1 endpoint (TEI, the simulator, or the multiplexer) open or
//! closed loop and reports codes, throughput, goodput, latency percentiles, send lateness and
//! TEI's own timing split. Failed requests are data: the exit code is 0 whatever they answered,
//! and non-zero only for usage or connection errors.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use teifleet_load::arrivals::Arrivals;
use teifleet_load::inputs::{Inputs, QueryMix, Tokens};
use teifleet_load::retry::{RetryMode, RetryPolicy};
use teifleet_load::{Call, LoadConfig, Mode, Protocol, render};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LoopMode {
    /// Requests sent on a precomputed schedule at --rate; latency from the scheduled time.
    Open,
    /// --concurrency workers, each sending when its previous request is answered.
    Closed,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Wire {
    /// tei.v1 gRPC over HTTP/2.
    Grpc,
    /// TEI's HTTP API over HTTP/1.1 keep-alive connections: POST /embed, GET /info (the
    /// multiplexer's --http-listen port). Answers are counted under the gRPC code their status
    /// stands for (429 as RESOURCE_EXHAUSTED, 504 as DEADLINE_EXCEEDED, ...).
    Http,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ArrivalKind {
    Poisson,
    Constant,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Rpc {
    /// tei.v1.Embed/Embed (or EmbedStream with --stream-batch).
    Embed,
    /// tei.v1.Info/Info: no input, no device time.
    Info,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Retry {
    /// gRPC's retry policy: wait exactly the grpc-retry-pushback-ms a refusal carries (a
    /// negative one stops retrying), otherwise exponential backoff with full jitter; at most 5
    /// attempts, as gRPC caps them.
    Pushback,
    /// Exponential backoff with full jitter, ignoring the server's hint.
    Jitter,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Lane {
    Query,
    Ingest,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Priority {
    Critical,
    Standard,
    Sheddable,
}

/// Load generator for tei.v1 gRPC endpoints (TEI, tei-sim, teifleet-multiplexer) and TEI's HTTP
/// API, loopback only.
///
/// Open loop (default): each request is sent at its precomputed time whether or not earlier ones
/// returned, and its latency is measured from that time (no coordinated omission). Closed loop:
/// a fixed number of requests in flight. A run stops at --requests or --duration, whichever
/// comes first, then waits up to --grace for the last answers.
#[derive(Debug, Parser)]
#[command(name = "teifleet-load", version)]
struct Args {
    /// Endpoint, e.g. http://127.0.0.1:50051, or https://127.0.0.1:50051 for gRPC in TLS (with
    /// --ca-cert; loopback addresses only). gRPC: repeat it to
    /// spread the connections over several endpoints in turn (connection k to the k-th mod their
    /// number), as a client balancing over a pool's replicas; --connections 1 with one --target
    /// pins every request to one connection, as a client behind a ClusterIP Service is.
    #[arg(long, value_name = "URL", required = true)]
    target: Vec<String>,
    /// How requests reach the target.
    #[arg(long, value_enum, default_value = "grpc")]
    protocol: Wire,
    /// PEM CA bundle to trust for https:// targets (a sidecar started with --tls-cert): the only
    /// roots trusted. One TLS client configuration serves the whole run, so new connections
    /// resume earlier sessions.
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// gRPC: open a new connection for every call (its TCP and TLS handshakes in its latency) and
    /// close it after; TLS connections resume the run's sessions. --connections then only
    /// spreads calls over the --target endpoints.
    #[arg(long)]
    connection_per_call: bool,
    #[arg(long, value_enum, default_value = "open")]
    mode: LoopMode,
    /// Open loop: requests per second.
    #[arg(long, default_value_t = 100.0, value_name = "R")]
    rate: f64,
    /// Open loop: inter-arrival distribution.
    #[arg(long, value_enum, default_value = "poisson")]
    arrivals: ArrivalKind,
    /// Closed loop: requests kept in flight.
    #[arg(long, default_value_t = 1, value_name = "N")]
    concurrency: usize,
    /// Most requests to send.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    requests: u64,
    /// Longest time to keep sending (e.g. 10s, 1m).
    #[arg(long, default_value = "60s", value_parser = teifleet_wire::duration::parse, value_name = "DUR")]
    duration: Duration,
    /// gRPC: HTTP/2 connections, requests spread over them round robin (and the connections over
    /// the --target endpoints). HTTP: unused (a connection per request in flight, kept alive and
    /// reused).
    #[arg(long, default_value_t = 1, value_name = "N")]
    connections: usize,
    /// The RPC each request makes.
    #[arg(long, value_enum, default_value = "embed")]
    rpc: Rpc,
    /// Input size of every request, in tokens (words); with --zipf, of every query.
    #[arg(long, default_value_t = 16, value_name = "N", conflicts_with = "tokens_mix")]
    tokens: usize,
    /// Input sizes cycled request by request, e.g. 2,16,128,512.
    #[arg(long, value_name = "LIST", conflicts_with = "zipf")]
    tokens_mix: Option<Tokens>,
    /// Distinct queries with Zipf popularity, EXPONENT:DISTINCT (e.g. 1.1:1000): hot queries
    /// repeat, as in real query logs. Draws are seeded by --seed.
    #[arg(long, value_name = "S:N")]
    zipf: Option<QueryMix>,
    /// Deadline of each request (sent as grpc-timeout, or x-teifleet-timeout-ms over HTTP, and
    /// enforced client-side too); goodput
    /// counts only OK answers within it, from the scheduled time.
    #[arg(long, value_parser = teifleet_wire::duration::parse, value_name = "DUR")]
    deadline: Option<Duration>,
    /// x-teifleet-priority header of each request.
    #[arg(long, value_enum)]
    priority: Option<Priority>,
    /// x-teifleet-tenant header of each request: the tenant whose fair share it is counted in.
    #[arg(long, value_name = "NAME")]
    tenant: Option<String>,
    /// x-teifleet-pool header of each request: the pool it is for (routing in a multiplexer that
    /// fronts several, or through an activator reached by address).
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    /// x-teifleet-lane header of each request: `ingest` for bulk work that takes the room queries
    /// leave; without it the multiplexer picks (unary calls are queries).
    #[arg(long, value_enum)]
    lane: Option<Lane>,
    /// Retry refused calls (RESOURCE_EXHAUSTED, UNAVAILABLE) within the call's deadline.
    #[arg(long, value_enum)]
    retry: Option<Retry>,
    /// With --retry: attempts per call, the first included.
    #[arg(long, default_value_t = 5, value_name = "N", requires = "retry")]
    max_attempts: u32,
    /// With --retry: the first backoff's bound (a wait is drawn from 0 up to it).
    #[arg(long, default_value = "100ms", value_parser = teifleet_wire::duration::parse, value_name = "DUR", requires = "retry")]
    initial_backoff: Duration,
    /// With --retry: the largest backoff bound.
    #[arg(long, default_value = "2s", value_parser = teifleet_wire::duration::parse, value_name = "DUR", requires = "retry")]
    max_backoff: Duration,
    /// With --retry: how much the backoff bound grows per retry.
    #[arg(long, default_value_t = 2.0, value_name = "F", requires = "retry")]
    backoff_multiplier: f64,
    /// Stream mode: each request is one EmbedStream call carrying N messages.
    #[arg(long, value_name = "N", conflicts_with = "rpc")]
    stream_batch: Option<usize>,
    /// Seed of the Poisson schedule and of the --zipf draws (same seed, same traffic).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// After the last send, how long to wait for answers before cancelling what is left
    /// (counted as UNFINISHED).
    #[arg(long, default_value = "30s", value_parser = teifleet_wire::duration::parse, value_name = "DUR")]
    grace: Duration,
    /// Also write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also write the report as Markdown to FILE.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// No table on stdout and no progress bar.
    #[arg(long)]
    quiet: bool,
}

fn config(args: &Args) -> LoadConfig {
    let mode = match args.mode {
        LoopMode::Open => Mode::Open {
            rate: args.rate,
            arrivals: match args.arrivals {
                ArrivalKind::Poisson => Arrivals::Poisson,
                ArrivalKind::Constant => Arrivals::Constant,
            },
        },
        LoopMode::Closed => Mode::Closed { concurrency: args.concurrency },
    };
    let priority = args.priority.map(|p| match p {
        Priority::Critical => "critical",
        Priority::Standard => "standard",
        Priority::Sheddable => "sheddable",
    });
    let call = match (args.rpc, args.stream_batch) {
        (Rpc::Info, _) => Call::Info,
        (Rpc::Embed, Some(batch)) => Call::EmbedStream { batch },
        (Rpc::Embed, None) => Call::Embed,
    };
    let inputs = match (&args.zipf, &args.tokens_mix) {
        (Some(mix), _) => Inputs::Queries(QueryMix { tokens: args.tokens, ..*mix }),
        (None, Some(mix)) => Inputs::Words(mix.clone()),
        (None, None) => Inputs::Words(Tokens::Fixed(args.tokens)),
    };
    let retry = args.retry.map(|mode| RetryPolicy {
        mode: match mode {
            Retry::Pushback => RetryMode::Pushback,
            Retry::Jitter => RetryMode::Jitter,
        },
        max_attempts: args.max_attempts,
        initial_backoff: args.initial_backoff,
        max_backoff: args.max_backoff,
        multiplier: args.backoff_multiplier,
    });
    let (target, more_targets) = match args.target.split_first() {
        Some((first, rest)) => (first.clone(), rest.to_vec()),
        None => (String::new(), Vec::new()),
    };
    LoadConfig {
        target,
        more_targets,
        protocol: match args.protocol {
            Wire::Grpc => Protocol::Grpc,
            Wire::Http => Protocol::Http,
        },
        ca_cert: args.ca_cert.clone(),
        connection_per_call: args.connection_per_call,
        mode,
        requests: args.requests,
        duration: args.duration,
        connections: args.connections,
        call,
        inputs,
        deadline: args.deadline,
        priority: priority.map(str::to_owned),
        tenant: args.tenant.clone(),
        pool: args.pool.clone(),
        lane: args.lane.map(|l| match l {
            Lane::Query => "query".to_owned(),
            Lane::Ingest => "ingest".to_owned(),
        }),
        retry,
        seed: args.seed,
        grace: args.grace,
        progress: !args.quiet,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("teifleet-load: {error:#}");
            // 2 for usage mistakes, as clap does for bad flags; 1 for everything else.
            let usage = matches!(error.downcast_ref(), Some(teifleet_load::Error::InvalidArgument(_)));
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<()> {
    let config = config(args);
    let report = teifleet_load::run(&config).await?;
    if !args.quiet {
        print!("{}", render::human(&report));
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, render::markdown(&report)).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
