//! `teifleet-multiplexer`: the tei.v1 front with admission control. Where its pools and limits
//! come from is said first, as a subcommand:
//!
//! - `kubernetes` (the sidecar the operator renders): the pool and namespace from
//!   `TEIFLEET_POOL` and `TEIFLEET_NAMESPACE`, limits from the watched EmbeddingPools;
//! - `static` (tests, demos, gateways): one pool whose budget the flags give;
//! - `file --config FILE`: several pools from a YAML file, re-read when it changes;
//! - `activator` (the operator runs it beside pools that scale to zero): holds calls for pools
//!   with no ready replica until one is, then passes them on.
//!
//! Every mode takes the same serving flags after it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use teifleet_crds::{ConcurrencySpec, TenantWeight, labels};
use teifleet_multiplexer::forward::pools::{PoolSpec, PoolTable};
use teifleet_multiplexer::forward::upstream::Dialer;
use teifleet_multiplexer::front::grpc::reflection::Reflection;
use teifleet_multiplexer::front::http::HttpSettings;
use teifleet_multiplexer::gate::auth::{Gate, Grant, Policy};
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::run::server::{self, ConnectionBounds, InputBounds, Settings};
use teifleet_multiplexer::sources::tls_files::TlsFiles;
use teifleet_multiplexer::sources::{self, budget};
use teifleet_multiplexer::transport::tls::{Certificates, PoolCertificates};
use teifleet_runtime::logging::{self, LogFormat};
use teifleet_runtime::tls::ServerTls;
use teifleet_runtime::{duration, shutdown};
use teifleet_wire::ports;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(version, about = "Speaks TEI's tei.v1 gRPC API in front of TEI, with per-pool admission control.")]
struct Cli {
    #[command(subcommand)]
    source: Source,
}

/// Where the pools and their limits come from.
#[derive(Subcommand, Debug)]
enum Source {
    /// The sidecar the operator renders: its pool, its TEI and its share of the pool's budget from
    /// the namespace's EmbeddingPools, followed live.
    Kubernetes {
        /// The pool this sidecar serves.
        #[arg(long, env = labels::ENV_POOL)]
        pool: String,
        /// Namespace of the EmbeddingPools to watch.
        #[arg(long, env = labels::ENV_NAMESPACE)]
        namespace: String,
        /// The Secret holding the pool's peer key (the operator creates it): spills between
        /// replicas carry it, and a spill claimed without it is a client's call like any other.
        #[arg(long)]
        peer_secret: Option<String>,
        #[command(flatten)]
        upstream: Upstream,
        #[command(flatten)]
        serve: Serve,
    },
    /// One pool whose whole budget the flags give.
    Static {
        #[command(flatten)]
        pool: StaticPool,
        #[command(flatten)]
        upstream: Upstream,
        #[command(flatten)]
        serve: Serve,
    },
    /// The namespace's activator (the operator runs it beside pools that scale to zero): holds
    /// a call for a pool with no ready replica until one is, then passes it on to one.
    Activator {
        /// Namespace of the EmbeddingPools to hold calls for.
        #[arg(long, env = labels::ENV_NAMESPACE)]
        namespace: String,
        /// Calls held at once for one pool at zero; one more is refused with a retry hint.
        #[arg(long, default_value_t = teifleet_multiplexer::activator::DEFAULT_MAX_HELD_PER_POOL)]
        max_held_per_pool: u32,
        #[command(flatten)]
        serve: Serve,
    },
    /// Several pools from a YAML file, re-read when it changes (API keys from a file beside it).
    File {
        /// The pools' YAML (see `sources::file`).
        #[arg(long)]
        config: PathBuf,
        /// A file holding the peer key (at least 32 characters, the same for every process that
        /// shares a cache store): it seals what the caches write to their shared stores.
        #[arg(long)]
        peer_key_file: Option<PathBuf>,
        #[command(flatten)]
        serve: Serve,
    },
}

#[derive(clap::Args, Debug)]
struct Upstream {
    /// The TEI this replica fronts.
    #[arg(long, default_value_t = format!("http://127.0.0.1:{}", ports::TEI_GRPC))]
    upstream: String,
}

/// One pool's budget, as `spec.concurrency` spells it.
#[derive(clap::Args, Debug)]
struct StaticPool {
    /// The pool's name.
    #[arg(long, default_value = "default")]
    pool: String,
    /// Inputs in flight to TEI at once.
    #[arg(long)]
    max_in_flight: i32,
    /// Inputs allowed to wait.
    #[arg(long, default_value_t = 64)]
    max_queued: i32,
    /// Longest wait in the queue (500ms, 2s, 1m30s).
    #[arg(long, default_value = "2s")]
    queue_timeout: String,
    /// Model the pool serves, for x-teifleet-model routing.
    #[arg(long)]
    model: Option<String>,
    /// Identical unary inference calls in flight share one upstream call.
    #[arg(long)]
    coalesce: bool,
    /// Estimated tokens allowed in flight (a second budget beside --max-in-flight).
    #[arg(long)]
    max_in_flight_tokens: Option<i64>,
    /// The in-flight limit finds itself from TEI's queue and batch times, with --max-in-flight as
    /// its ceiling.
    #[arg(long)]
    adaptive: bool,
    /// A tenant's weight, as NAME=WEIGHT (repeat for several); others weigh 1.
    #[arg(long = "tenant", value_parser = parse_tenant)]
    tenants: Vec<TenantWeight>,
    /// Percent of admissions the `ingest` lane keeps while queries would take them all (their
    /// queue stands; 0 to 50; 0: no floor).
    #[arg(long, default_value_t = i32::from(teifleet_multiplexer::admission::DEFAULT_INGEST_SHARE))]
    ingest_share: i32,
    /// Percent of the in-flight limit the `ingest` lane leaves to queries while they come (0 to
    /// 50; 0: ingest takes every place queries leave; unset: learned from TEI's batch times).
    #[arg(long)]
    query_reserve: Option<i32>,
    /// Percent of the time calls may keep TEI busy while more queue (1 to 100; unset: no cap): a
    /// pool's share of a time-sliced GPU, e.g. 25 for one of 4 replicas.
    #[arg(long)]
    device_time_cap: Option<i32>,
    /// Percent of a time-sliced GPU that is this replica's share (1 to 100; unset: not shared),
    /// e.g. 25 for one of 4 replicas: its TEI time is capped at it while a neighbour is busy on
    /// the device, read from TEI's batch times, and not while the device is quiet. An explicit
    /// --device-time-cap caps always instead.
    #[arg(long)]
    gpu_share: Option<i64>,
    /// Another replica of this pool, as its multiplexer's gRPC URL (repeat for several): calls
    /// spill there when this replica's budget is full and it has room. Each replica runs with the
    /// same flags, so the pool's budget is each replica's times the replicas.
    #[arg(long = "sibling")]
    siblings: Vec<String>,
    /// A file holding the pool's peer key (the same on every replica, at least 32 characters):
    /// spills to --sibling carry it, and a spill claimed without it is a client's call.
    #[arg(long)]
    peer_key_file: Option<PathBuf>,
    /// The highest priority a tenant identified by a client certificate may ask for, as
    /// NAME=PRIORITY (repeat for several); others get `standard` at most.
    #[arg(long = "tenant-max-priority", value_parser = parse_ceiling)]
    ceilings: Vec<(String, teifleet_multiplexer::admission::Priority)>,
    /// The lane (query, ingest) a tenant identified by a client certificate takes when its call
    /// names none, as NAME=LANE (repeat for several).
    #[arg(long = "tenant-lane", value_parser = parse_lane)]
    lanes: Vec<(String, teifleet_multiplexer::admission::Lane)>,
}

impl StaticPool {
    /// What tenants identified by a client certificate are granted.
    fn grants(&self) -> BTreeMap<String, Grant> {
        let mut grants: BTreeMap<String, Grant> = BTreeMap::new();
        for (tenant, priority) in &self.ceilings {
            grants.entry(tenant.clone()).or_default().max_priority = Some(*priority);
        }
        for (tenant, lane) in &self.lanes {
            grants.entry(tenant.clone()).or_default().lane = Some(*lane);
        }
        grants
    }

    fn concurrency(&self) -> ConcurrencySpec {
        ConcurrencySpec {
            max_in_flight: self.max_in_flight,
            max_queued: self.max_queued,
            queue_timeout: self.queue_timeout.clone(),
            max_in_flight_tokens: self.max_in_flight_tokens,
            adaptive: self.adaptive,
            tenants: self.tenants.clone(),
            ingest_share: Some(self.ingest_share),
            query_reserve: self.query_reserve,
            device_time_cap: self.device_time_cap,
            ..ConcurrencySpec::default()
        }
    }
}

/// How every mode serves.
#[derive(clap::Args, Debug)]
struct Serve {
    /// gRPC address clients connect to.
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], ports::MULTIPLEXER_GRPC)))]
    listen: SocketAddr,
    /// Admin HTTP address (/metrics, /healthz, /readyz).
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], ports::MULTIPLEXER_ADMIN)))]
    admin_listen: SocketAddr,
    /// HTTP address of TEI's HTTP API and OpenAI's embeddings route, e.g. 0.0.0.0:8000 (what the
    /// operator renders into every pool pod). Off unless given: tests and benchmarks start several
    /// multiplexers on one host with only their gRPC and admin ports, and a fixed default port
    /// would collide.
    #[arg(long, default_value = "off", value_parser = parse_listen)]
    http_listen: Listen,
    #[command(flatten)]
    http: HttpSettings,
    #[command(flatten)]
    bounds: InputBounds,
    #[command(flatten)]
    connections: ConnectionBounds,
    /// The process's memory budget for requests before admission.
    #[command(flatten)]
    memory: teifleet_multiplexer::admission::memory::MemorySettings,
    /// How many calls the pools' doors hold, and how long.
    #[command(flatten)]
    door: teifleet_multiplexer::gate::door::DoorSettings,
    /// TLS from files (`static` and `file` modes; in `kubernetes` mode the pool's spec.tls).
    #[command(flatten)]
    tls: TlsFiles,
    /// TEI's Prometheus endpoint, relayed on the admin port at /upstream/metrics (TEI serves it on
    /// the pod's loopback only). Default: TEI's --prometheus-port on this pod's loopback; `off`:
    /// not relayed.
    #[arg(long)]
    tei_metrics: Option<String>,
    /// gRPC server reflection (`grpc.reflection.v1` and `v1alpha`, what `grpcurl list` asks),
    /// answered without a key; `false`: reflection calls are UNIMPLEMENTED. Default: served. In
    /// kubernetes mode the pool's spec.grpc.reflection decides, live (off while the pool is unseen).
    #[arg(long, action = clap::ArgAction::Set)]
    grpc_reflection: Option<bool>,
    /// Beside a static limit of about one of TEI's batches, let TEI's queue hold its next batch
    /// (`Info.max_batch_requests`, learned from TEI), so TEI never idles between batches; `false`:
    /// exactly the limit in flight. Nothing changes for a TEI that batches by tokens alone, a
    /// limit of two batches or more, or the adaptive limit.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    next_batch_ready: bool,
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

fn parse_ceiling(text: &str) -> Result<(String, teifleet_multiplexer::admission::Priority), String> {
    let (name, priority) = text.split_once('=').ok_or("expected NAME=PRIORITY, e.g. search=critical")?;
    let priority = priority.parse().map_err(|e| format!("{e}"))?;
    if name.is_empty() {
        return Err("the name must not be empty".into());
    }
    Ok((name.to_owned(), priority))
}

fn parse_lane(text: &str) -> Result<(String, teifleet_multiplexer::admission::Lane), String> {
    let (name, lane) = text.split_once('=').ok_or("expected NAME=LANE, e.g. indexer=ingest")?;
    let lane = lane.parse().map_err(|e| format!("{e}"))?;
    if name.is_empty() {
        return Err("the name must not be empty".into());
    }
    Ok((name.to_owned(), lane))
}

fn parse_tenant(text: &str) -> Result<TenantWeight, String> {
    let (name, weight) = text.split_once('=').ok_or("expected NAME=WEIGHT, e.g. search=3")?;
    let weight: i32 = weight.parse().map_err(|_| format!("weight {weight:?} is not a whole number"))?;
    if name.is_empty() || weight < 1 {
        return Err("the name must not be empty and the weight at least 1".into());
    }
    Ok(TenantWeight { name: name.to_owned(), weight, max_priority: None, lane: None })
}

impl Source {
    fn serve(&self) -> &Serve {
        match self {
            Self::Kubernetes { serve, .. }
            | Self::Static { serve, .. }
            | Self::File { serve, .. }
            | Self::Activator { serve, .. } => serve,
        }
    }
}

fn main() -> anyhow::Result<()> {
    let source = Cli::parse().source;
    let threads = source.serve().worker_threads;
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()
    };
    runtime.context("starting the async runtime")?.block_on(run(source))
}

async fn run(source: Source) -> anyhow::Result<()> {
    logging::init(source.serve().log_format)?;
    // Installed first, so a SIGTERM during start-up is not lost.
    let shutdown = shutdown::signal()?;

    let metrics = Metrics::new();
    let helpers = CancellationToken::new();
    let certificates = Arc::new(Certificates::new(&metrics.registry)?);
    let dialer = Dialer::new(certificates.tls().clone());
    let tls_files = source.serve().tls.clone();
    let allow_plaintext_routes = tls_files.allow_plaintext_routes;
    let next_batch_ready = source.serve().next_batch_ready;
    if tls_files.enabled() {
        if matches!(source, Source::Kubernetes { .. } | Source::Activator { .. }) {
            anyhow::bail!(
                "--tls-cert is for the static and file modes: in kubernetes mode the pool's spec.tls sets TLS, and the activator serves each pool's own"
            );
        }
        let loaded = tls_files.load(&certificates)?;
        let certificates = certificates.clone();
        tokio::spawn(tls_files.watch(loaded, certificates, Duration::from_secs(1), helpers.clone()));
    }
    let kubernetes = matches!(source, Source::Kubernetes { .. });
    let reflection_flag = source.serve().grpc_reflection;
    if kubernetes && reflection_flag.is_some() {
        anyhow::bail!(
            "--grpc-reflection is for the other modes: in kubernetes mode the pool's spec.grpc.reflection sets it"
        );
    }
    // In kubernetes mode, off until the pool says (a pool with keys keeps it off).
    let reflection = Arc::new(Reflection::new(reflection_flag.unwrap_or(!kubernetes)));
    // The API-key gate of the own pool; its keys come from the same source as the pools.
    let gate_for = |pool: &str, policy| Gate::new(pool, &metrics.registry, policy).map(Arc::new);
    let mut pool_naming = None;
    let mut activator_tls = None;
    let (table, gate, serve) = match source {
        Source::Activator { namespace, max_held_per_pool, serve } => {
            let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
            // Each pool with spec.tls its own certificate, picked by the name its client asks for;
            // plain text on the same ports for a client that opens in plain text.
            let pool_certificates = Arc::new(PoolCertificates::new(namespace.clone(), &certificates));
            activator_tls = Some(Arc::new(ServerTls::by_server_name(pool_certificates.clone())));
            let activations = teifleet_multiplexer::activator::Activations::new(max_held_per_pool)
                .with_certificates(pool_certificates.clone());
            let table = Arc::new(PoolTable::activator(metrics.clone(), Arc::new(activations)));
            // Read by both fronts for each call, kept by the watch from the pools' Services.
            let naming = Arc::new(teifleet_multiplexer::activator::PoolNaming::new(namespace));
            let watch =
                sources::activator::watch(client, naming.clone(), table.clone(), pool_certificates, helpers.clone());
            tokio::spawn(watch);
            pool_naming = Some(naming);
            // Keys are the pools' sidecars' to check: a call carries its key to them.
            (table, Arc::new(Gate::off()), serve)
        }
        Source::File { config, peer_key_file, serve } => {
            let loaded = sources::file::load(&config).context("reading --config")?;
            let gate = gate_for(&loaded.default, sources::file::policy(loaded.keys_file.as_deref())?)?;
            gate.set_grants(loaded.grants.clone());
            let table = Arc::new(
                PoolTable::with_dialer(&loaded.default, metrics.clone(), dialer).with_next_batch(next_batch_ready),
            );
            table.allow_plaintext_routes(allow_plaintext_routes);
            if let Some(path) = &peer_key_file {
                sources::peer::load_file(path, table.siblings())?;
            }
            table.sync(loaded.pools)?;
            let interval = Duration::from_secs(1);
            tokio::spawn(sources::file::watch(config, table.clone(), gate.clone(), interval, helpers.clone()));
            (table, gate, serve)
        }
        Source::Static { pool, upstream, serve } => {
            let concurrency = pool.concurrency();
            let limits = budget::whole(&concurrency)
                .and_then(|limits| budget::with_gpu_share(limits, pool.gpu_share))
                .map_err(|reason| anyhow::anyhow!("the pool's budget: {reason}"))?;
            let gate = gate_for(&pool.pool, Policy::Off)?;
            gate.set_grants(pool.grants());
            let table =
                Arc::new(PoolTable::with_dialer(&pool.pool, metrics.clone(), dialer).with_next_batch(next_batch_ready));
            table.sync(vec![PoolSpec {
                name: pool.pool.clone(),
                model: pool.model.clone(),
                upstream: upstream.upstream,
                limits: Some(limits),
                remote: false,
                coalesce: pool.coalesce,
                tenants: budget::tenants(&concurrency),
                cache: None,
            }])?;
            table.siblings().sync(&pool.siblings)?;
            if let Some(path) = &pool.peer_key_file {
                sources::peer::load_file(path, table.siblings())?;
            }
            (table, gate, serve)
        }
        Source::Kubernetes { pool, namespace, peer_secret, upstream, serve } => {
            let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
            // Calls wait for the pool's spec.auth to be known: it may name keys.
            let gate = gate_for(&pool, Policy::Waiting)?;
            // Nothing is served in plain text before the pool's spec.tls is known.
            certificates.tls().wait();
            // Siblings are reached by pod IP and verified as the pool Service their certificate names.
            dialer.name_ip_peers(Some(format!("{pool}.{namespace}.svc")));
            let table =
                Arc::new(PoolTable::with_dialer(&pool, metrics.clone(), dialer).with_next_batch(next_batch_ready));
            let (serves_tls, pool_serves_tls) = tokio::sync::watch::channel(false);
            let siblings = sources::siblings::watch(
                client.clone(),
                namespace.clone(),
                pool.clone(),
                serve.identity.clone(),
                table.siblings().clone(),
                pool_serves_tls,
                helpers.clone(),
            );
            tokio::spawn(siblings);
            if let Some(secret) = peer_secret {
                let siblings = table.siblings().clone();
                tokio::spawn(sources::peer::watch(
                    client.clone(),
                    namespace.clone(),
                    secret,
                    siblings,
                    helpers.clone(),
                ));
            }
            let own = sources::kubernetes::OwnPool {
                name: pool,
                upstream: upstream.upstream,
                gate: gate.clone(),
                certificates: certificates.clone(),
                serves_tls,
                reflection: reflection.clone(),
            };
            tokio::spawn(sources::kubernetes::watch(client, namespace, own, table.clone(), helpers.clone()));
            (table, gate, serve)
        }
    };

    let settings = Settings {
        listen: serve.listen,
        admin_listen: Some(serve.admin_listen),
        http_listen: serve.http_listen.0,
        http: serve.http,
        bounds: serve.bounds,
        connections: serve.connections,
        memory: serve.memory,
        door: serve.door,
        auth: gate,
        identity: serve.identity,
        max_message_bytes: serve.max_message_bytes,
        max_concurrent_streams: serve.max_concurrent_streams,
        max_connection_age: serve.max_connection_age,
        max_connection_age_grace: serve.max_connection_age_grace,
        drain_delay: serve.drain_delay,
        drain_timeout: serve.drain_timeout,
        tei_metrics: tei_metrics_url(serve.tei_metrics.as_deref())?,
        tls: activator_tls.unwrap_or_else(|| certificates.tls().clone()),
        pool_naming,
        reflection,
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
