//! `teifleet-batch`: OpenAI's Files and Batches API for embeddings, each batch an EmbeddingJob.
#![forbid(unsafe_code)]

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use teifleet_batch::auth::{Keys, RELOAD_EVERY};
use teifleet_batch::cli::Args;
use teifleet_batch::cluster::KubeCluster;
use teifleet_batch::server::{self, AppState};
use teifleet_runtime::logging::{self, LogFormat};
use teifleet_runtime::shutdown;

#[derive(Parser, Debug)]
#[command(version, about = "OpenAI's Files and Batches API for embeddings, on teifleet's EmbeddingJobs.")]
struct Cli {
    #[command(flatten)]
    args: Args,
    #[arg(long, env = "TEIFLEET_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,
}

fn main() -> anyhow::Result<()> {
    let Cli { args, log_format } = Cli::parse();
    logging::init(log_format)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let stop = shutdown::signal()?;
    let (store, jobs) = args.store(|name| std::env::var(name).ok())?;
    let keys = match &args.api_keys_dir {
        Some(dir) => Keys::watch(dir.clone(), RELOAD_EVERY)?,
        None => Keys::open_to_all(),
    };
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    let cluster = Arc::new(KubeCluster::new(client, &args.namespace));
    let state = AppState::new(store, keys, cluster, args.limits(), jobs);
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(listen = %args.listen, namespace = %args.namespace, store = %args.store, "teifleet-batch serving");
    server::serve(listener, server::router(state), async move {
        let signal = stop.await;
        tracing::info!(%signal, "stopping");
    })
    .await
    .context("serving")
}
