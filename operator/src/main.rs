//! `teifleet-operator`: wiring, read top to bottom.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use teifleet_operator::admin::{self, Health};
use teifleet_operator::controller::{self, Context};
use teifleet_operator::jobs;
use teifleet_operator::leader::LeaseElector;
use teifleet_operator::metrics::Metrics;
use teifleet_operator::render::RenderConfig;
use teifleet_runtime::duration::parse_flag;
use teifleet_runtime::logging::{self, LogFormat};
use teifleet_runtime::shutdown::{self, Signal};
use teifleet_wire::ports;
use tokio_util::sync::CancellationToken;

/// Reconciles EmbeddingPools into GPU-scheduled TEI Deployments fronted by teifleet's multiplexer,
/// and EmbeddingJobs into Jobs of `teifleet-job` workers.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address of the admin HTTP server (/metrics, /healthz, /readyz).
    #[arg(long, env = "TEIFLEET_ADMIN_LISTEN", default_value_t = SocketAddr::from(([0, 0, 0, 0], ports::OPERATOR_ADMIN)))]
    admin_listen: SocketAddr,

    #[arg(long, env = "TEIFLEET_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,

    /// Repository of TEI's images; the tag is picked per GPU architecture.
    #[arg(long, env = "TEIFLEET_TEI_REPOSITORY", default_value = "ghcr.io/huggingface/text-embeddings-inference")]
    tei_repository: String,

    /// TEI release used in image tags (`<arch prefix><version>-grpc`).
    #[arg(long, env = "TEIFLEET_TEI_VERSION", default_value = "1.9")]
    tei_version: String,

    /// Image of the multiplexer sidecar.
    #[arg(long, env = "TEIFLEET_MULTIPLEXER_IMAGE", default_value = concat!("ghcr.io/teifleet/multiplexer:", env!("CARGO_PKG_VERSION")))]
    multiplexer_image: String,

    /// Image of the EmbeddingJob workers (`teifleet-job`), for jobs that name none.
    #[arg(long, env = "TEIFLEET_JOB_IMAGE", default_value = concat!("ghcr.io/teifleet/job:", env!("CARGO_PKG_VERSION")))]
    job_image: String,

    /// How often steady pools are re-checked without a watch event.
    #[arg(long, env = "TEIFLEET_RESYNC_INTERVAL", default_value = "5m", value_parser = parse_flag)]
    resync_interval: Duration,

    /// Elect a leader through a Lease so only one replica acts.
    #[arg(long, env = "TEIFLEET_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,

    #[arg(long, env = "TEIFLEET_LEASE_NAME", default_value = "teifleet-operator")]
    lease_name: String,

    /// Namespace of the Lease; in a cluster, the operator's own namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "teifleet-system")]
    lease_namespace: String,

    #[arg(long, env = "TEIFLEET_LEASE_DURATION", default_value = "15s", value_parser = parse_flag)]
    lease_duration: Duration,

    /// Render a NetworkPolicy for each namespace's activator: its call ports open to the cluster,
    /// its admin port to the operator's namespace, its own and the pools' metrics namespaces.
    #[arg(long, env = "TEIFLEET_ACTIVATOR_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    activator_network_policy: bool,

    /// Replicas of each namespace's activator (at least 1): with two or more, spread over nodes
    /// and under a PodDisruptionBudget, calls for pools at zero are answered while one restarts.
    #[arg(long, env = "TEIFLEET_ACTIVATOR_REPLICAS", default_value_t = 2, value_parser = clap::value_parser!(i32).range(1..))]
    activator_replicas: i32,

    /// This replica's identity in the Lease and in Events; defaults to the host name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// Print every metric the operator exports, one series each with placeholder labels, in
    /// Prometheus' text format, and exit (tools/check_metric_names.py reads it).
    #[arg(long)]
    print_metrics: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.print_metrics {
        print!("{}", teifleet_runtime::metrics::render(&Metrics::every_series().registry)?);
        return Ok(());
    }
    logging::init(args.log_format)?;
    let stop_signal = shutdown::signal()?;
    let identity = args.identity.clone().unwrap_or_else(|| {
        hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "teifleet-operator".into())
    });

    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(stop_signal, shutdown.clone()));

    let metrics = Metrics::new();
    let health = Health::new(metrics.clone());
    let admin_listener = teifleet_runtime::admin::bind(args.admin_listen).await?;
    let admin = tokio::spawn(teifleet_runtime::admin::serve(
        admin_listener,
        admin::routes(&health).into_router(),
        metrics.refusal_counter(),
        shutdown.clone().cancelled_owned(),
    ));

    let client = Client::try_default().await.context("connecting to the Kubernetes API")?;
    client.apiserver_version().await.context("reaching the Kubernetes API server")?;
    health.ready.store(true, Ordering::Relaxed);

    let elector = args.leader_elect.then(|| {
        LeaseElector::new(client.clone(), &args.lease_namespace, &args.lease_name, &identity, args.lease_duration)
    });
    let controller_stop = shutdown.child_token();
    let mut renewal = None;
    if let Some(elector) = &elector {
        tracing::info!(identity = elector.identity(), lease = %args.lease_name, "waiting for leadership");
        if !elector.acquire(&shutdown).await? {
            return Ok(());
        }
        tracing::info!("became leader");
        metrics.set_leader(true);
        let (elector, stop) = (elector.clone(), controller_stop.clone());
        let watch_for = shutdown.clone();
        renewal = Some(tokio::spawn(async move {
            let outcome = elector.keep_renewing(&watch_for).await;
            stop.cancel();
            outcome
        }));
    }

    let reporter = Reporter { controller: "teifleet-operator".into(), instance: Some(identity) };
    let jobs_ctx = Arc::new(jobs::Context {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), reporter.clone()),
        metrics: metrics.clone(),
        image: args.job_image,
        // Each job's progress reader Role is bound to this identity: the operator reads no other
        // ConfigMap.
        operator: jobs::identity::whoami(&client).await,
        status_memo: Default::default(),
    });
    let ctx = Arc::new(Context {
        client: client.clone(),
        render: RenderConfig {
            tei_repository: args.tei_repository,
            tei_version: args.tei_version,
            multiplexer_image: args.multiplexer_image,
            operator_namespace: Some(args.lease_namespace.clone()),
            activator_network_policy: args.activator_network_policy,
            activator_replicas: args.activator_replicas,
        },
        recorder: Recorder::new(client, reporter),
        metrics: metrics.clone(),
        resync: args.resync_interval,
        status_memo: Default::default(),
        reports: Default::default(),
        autoscaler: Default::default(),
        peer_secrets: Default::default(),
    });
    tracing::info!("controller running");
    tokio::join!(
        controller::run(ctx, health.clone(), controller_stop.clone()),
        jobs::run(jobs_ctx, health.clone(), controller_stop),
    );
    metrics.set_leader(false);

    if let Some(renewal) = renewal {
        renewal.await.context("lease renewal task")?.context("leadership ended")?;
    }
    if let Some(elector) = &elector {
        elector.release().await.context("releasing the leader lease")?;
        tracing::info!("released the leader lease");
    }
    shutdown.cancel();
    admin.await.context("admin server task")?.context("admin server")?;
    Ok(())
}

/// Cancels `token` when `signal` arrives.
async fn cancel_on_signal(signal: impl Future<Output = Signal>, token: CancellationToken) {
    let signal = signal.await;
    tracing::info!(%signal, "shutting down");
    token.cancel();
}
