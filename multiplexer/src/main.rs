//! `teifleet-multiplexer`: the tei.v1 front with admission control.
//!
//! Kubernetes mode (the sidecar the operator renders): the pool and namespace come from
//! `TEIFLEET_POOL` and `TEIFLEET_NAMESPACE`, and limits from the watched EmbeddingPools.
//! Static mode (tests, demos, gateways): `--max-in-flight` and friends for one pool, or
//! `--config FILE` for several, re-read when the file changes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use teifleet_crds::labels;
use teifleet_multiplexer::admission::Limits;
use teifleet_multiplexer::auth::{Gate, Policy};
use teifleet_multiplexer::metrics::Metrics;
use teifleet_multiplexer::pools::{PoolSpec, PoolTable};
use teifleet_multiplexer::server::{self, Settings};
use teifleet_multiplexer::sources;
use teifleet_runtime::logging::{self, LogFormat};
use teifleet_runtime::{duration, shutdown};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(version, about = "Speaks TEI's tei.v1 gRPC API in front of TEI, with per-pool admission control.")]
struct Args {
    /// gRPC address clients connect to.
    #[arg(long, default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Admin HTTP address (/metrics, /healthz, /readyz).
    #[arg(long, default_value = "0.0.0.0:9090")]
    admin_listen: SocketAddr,
    /// HTTP address of TEI's HTTP API and OpenAI's embeddings route, e.g. 0.0.0.0:8000 (what the
    /// operator renders into every pool pod). Off unless given: tests and benchmarks start several
    /// multiplexers on one host with only their gRPC and admin ports, and a fixed default port
    /// would collide.
    #[arg(long, default_value = "off", value_parser = parse_listen)]
    http_listen: Listen,
    /// HTTP front: largest request body in bytes (TEI's --payload-limit).
    #[arg(long, default_value_t = teifleet_multiplexer::http::DEFAULT_PAYLOAD_LIMIT)]
    payload_limit: usize,
    /// HTTP front: inputs sent upstream under one permit; larger batches are split and
    /// reassembled in order (TEI's --max-client-batch-size, which TEI refuses beyond).
    #[arg(long, default_value_t = teifleet_multiplexer::http::DEFAULT_MAX_CLIENT_BATCH_SIZE)]
    max_client_batch_size: usize,
    /// HTTP front: most inputs in one request; more are answered 413 before anything is queued.
    #[arg(long, default_value_t = teifleet_multiplexer::http::DEFAULT_MAX_REQUEST_INPUTS)]
    max_request_inputs: usize,
    /// HTTP front: what a request that sets no `truncate` gets (TEI's --auto-truncate, which its
    /// HTTP routes follow and its gRPC API ignores).
    #[arg(long, action = clap::ArgAction::Set, default_value_t = teifleet_crds::TEI_DEFAULT_AUTO_TRUNCATE)]
    auto_truncate: bool,
    /// The TEI this replica fronts.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    upstream: String,
    /// TEI's Prometheus endpoint, relayed on the admin port at /upstream/metrics (TEI serves it on
    /// the pod's loopback only). Default: TEI's --prometheus-port on this pod's loopback; `off`:
    /// not relayed.
    #[arg(long)]
    tei_metrics: Option<String>,

    /// Pool name (Kubernetes mode reads it from the operator-set environment).
    #[arg(long, env = labels::ENV_POOL)]
    pool: Option<String>,
    /// Namespace of the EmbeddingPools to watch (Kubernetes mode).
    #[arg(long, env = labels::ENV_NAMESPACE)]
    namespace: Option<String>,
    /// Static mode: requests allowed in flight to TEI at once.
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Static mode: requests allowed to wait.
    #[arg(long, default_value_t = 64)]
    max_queued: usize,
    /// Static mode: longest wait in the queue (500ms, 2s, 1m30s).
    #[arg(long, default_value = "2s", value_parser = duration::parse_flag)]
    queue_timeout: Duration,
    /// Static mode: model the pool serves, for x-teifleet-model routing.
    #[arg(long)]
    model: Option<String>,
    /// Static mode: identical unary inference calls in flight share one upstream call.
    #[arg(long)]
    coalesce: bool,
    /// Static mode: estimated tokens allowed in flight (a second budget beside --max-in-flight).
    #[arg(long)]
    max_in_flight_tokens: Option<usize>,
    /// Static mode: the in-flight limit finds itself from TEI's queue and batch times, with
    /// --max-in-flight as its ceiling.
    #[arg(long)]
    adaptive: bool,
    /// Static mode: a tenant's weight, as NAME=WEIGHT (repeat for several); others weigh 1.
    #[arg(long = "tenant", value_parser = parse_tenant)]
    tenants: Vec<(String, u32)>,
    /// Static mode with several pools, from a YAML file that is re-read when it changes.
    #[arg(long, conflicts_with = "max_in_flight")]
    config: Option<PathBuf>,

    /// Name in the hop marker of forwarded requests.
    #[arg(long, env = labels::ENV_POD_NAME, default_value = "teifleet-multiplexer")]
    identity: String,
    /// Largest request or response message, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    max_message_bytes: usize,
    /// Concurrent HTTP/2 streams per client connection.
    #[arg(long, default_value_t = 256)]
    max_concurrent_streams: u32,
    /// Connections are closed (GOAWAY) after this age so clients rebalance across replicas.
    #[arg(long, default_value = "5m", value_parser = duration::parse_flag)]
    max_connection_age: Duration,
    #[arg(long, default_value = "30s", value_parser = duration::parse_flag)]
    max_connection_age_grace: Duration,
    /// On SIGTERM, keep serving this long (while endpoints stop routing here) before draining.
    #[arg(long, default_value = "5s", value_parser = duration::parse_flag)]
    drain_delay: Duration,
    /// How long in-flight calls may take to finish once draining.
    #[arg(long, default_value = "30s", value_parser = duration::parse_flag)]
    drain_timeout: Duration,
    #[arg(long, value_enum, default_value = "json")]
    log_format: LogFormat,
    /// Threads serving calls. One is the most efficient per call (no hand-offs between threads)
    /// and serves well over ten thousand calls a second; more only help a gateway in front of
    /// many TEIs.
    #[arg(long, env = "TEIFLEET_WORKER_THREADS", default_value_t = 1)]
    worker_threads: usize,
}

/// An address to listen on, or none.
#[derive(Clone, Debug)]
struct Listen(Option<SocketAddr>);

fn parse_listen(text: &str) -> Result<Listen, String> {
    match text {
        "off" | "" => Ok(Listen(None)),
        addr => addr.parse().map(|a| Listen(Some(a))).map_err(|e| format!("{addr:?}: {e} (or `off`)")),
    }
}

fn parse_tenant(text: &str) -> Result<(String, u32), String> {
    let (name, weight) = text.split_once('=').ok_or("expected NAME=WEIGHT, e.g. search=3")?;
    let weight: u32 = weight.parse().map_err(|_| format!("weight {weight:?} is not a whole number"))?;
    if name.is_empty() || weight == 0 {
        return Err("the name must not be empty and the weight at least 1".into());
    }
    Ok((name.to_owned(), weight))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = if args.worker_threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.worker_threads).enable_all().build()
    };
    runtime.context("starting the async runtime")?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    logging::init(args.log_format)?;
    // Installed first, so a SIGTERM during start-up is not lost.
    let shutdown = shutdown::signal()?;

    let metrics = Metrics::new();
    let helpers = CancellationToken::new();
    // The API-key gate of the own pool; its keys come from the same source as the pools.
    let gate_for = |pool: &str, policy| Gate::new(pool, &metrics.registry, policy).map(Arc::new);
    let (table, gate) = if let Some(path) = &args.config {
        let loaded = sources::file::load(path).context("reading --config")?;
        let gate = gate_for(&loaded.default, sources::file::policy(loaded.keys_file.as_deref())?)?;
        let table = Arc::new(PoolTable::new(&loaded.default, metrics.clone()));
        table.sync(loaded.pools)?;
        let interval = Duration::from_secs(1);
        tokio::spawn(sources::file::watch(path.clone(), table.clone(), gate.clone(), interval, helpers.clone()));
        (table, gate)
    } else if let Some(max_in_flight) = args.max_in_flight {
        let name = args.pool.clone().unwrap_or_else(|| "default".into());
        let gate = gate_for(&name, Policy::Off)?;
        let table = Arc::new(PoolTable::new(&name, metrics.clone()));
        table.sync(vec![PoolSpec {
            name,
            model: args.model.clone(),
            upstream: args.upstream.clone(),
            limits: Some(Limits {
                max_in_flight_tokens: args.max_in_flight_tokens,
                adaptive: args.adaptive,
                ..Limits::new(max_in_flight, args.max_queued, args.queue_timeout)
            }),
            remote: false,
            coalesce: args.coalesce,
            tenants: args.tenants.iter().cloned().collect(),
        }])?;
        (table, gate)
    } else if let (Some(pool), Some(namespace)) = (&args.pool, &args.namespace) {
        let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
        // Calls wait for the pool's spec.auth to be known: it may name keys.
        let gate = gate_for(pool, Policy::Waiting)?;
        let table = Arc::new(PoolTable::new(pool, metrics.clone()));
        tokio::spawn(sources::kubernetes::watch(
            client,
            namespace.clone(),
            pool.clone(),
            args.upstream.clone(),
            table.clone(),
            gate.clone(),
            helpers.clone(),
        ));
        (table, gate)
    } else {
        bail!(
            "give --max-in-flight (static mode), --config FILE, or run where TEIFLEET_POOL and TEIFLEET_NAMESPACE are set"
        );
    };

    let settings = Settings {
        listen: args.listen,
        admin_listen: Some(args.admin_listen),
        http_listen: args.http_listen.0,
        http: teifleet_multiplexer::http::HttpSettings {
            payload_limit: args.payload_limit,
            max_client_batch_size: args.max_client_batch_size.max(1),
            max_request_inputs: args.max_request_inputs.max(1),
            auto_truncate: args.auto_truncate,
        },
        auth: gate,
        identity: args.identity,
        max_message_bytes: args.max_message_bytes,
        max_concurrent_streams: args.max_concurrent_streams,
        max_connection_age: args.max_connection_age,
        max_connection_age_grace: args.max_connection_age_grace,
        drain_delay: args.drain_delay,
        drain_timeout: args.drain_timeout,
        tei_metrics: tei_metrics_url(args.tei_metrics.as_deref())?,
        ..Settings::default()
    };
    let running = server::start(settings, table, metrics).await?;
    let stop = running.stop_token();
    tokio::spawn(async move {
        let signal = shutdown.await;
        tracing::info!(%signal, "shutdown requested");
        stop.cancel();
    });
    running.wait().await?;
    helpers.cancel();
    Ok(())
}

/// Where TEI's metrics are relayed from: `--tei-metrics`, TEI's metrics port on this pod's
/// loopback by default, or nowhere (`off`).
fn tei_metrics_url(flag: Option<&str>) -> anyhow::Result<Option<http::Uri>> {
    let url = match flag {
        Some("off") => return Ok(None),
        Some(url) => url.to_owned(),
        None => format!("http://127.0.0.1:{}/metrics", teifleet_wire::ports::TEI_METRICS),
    };
    Ok(Some(url.parse().with_context(|| format!("--tei-metrics {url:?} is not a URL"))?))
}
