//! `teifleet-fake-gpu-plugin`: advertises fake GPUs to the kubelet of the local cluster's real node
//! (tests/cluster/node-up.sh starts it beside the kubelet).
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use teifleet_fake_gpu_plugin::{Config, DEFAULT_PLUGIN_DIR, DEFAULT_RESOURCE, run};
use teifleet_runtime::logging::{self, LogFormat};
use teifleet_runtime::shutdown;

/// A kubelet device plugin advertising COUNT fake, always healthy GPUs of RESOURCE (each as
/// REPLICAS devices when shared); the kubelet schedules, counts and allocates them like real
/// GPUs. Allocate sets NVIDIA_VISIBLE_DEVICES to the GPUs behind the devices.
#[derive(Debug, Parser)]
#[command(name = "teifleet-fake-gpu-plugin", version)]
struct Args {
    /// The extended resource to advertise.
    #[arg(long, default_value = DEFAULT_RESOURCE, value_name = "RESOURCE")]
    resource_name: String,
    /// How many GPUs.
    #[arg(long, default_value_t = 2, value_name = "COUNT")]
    count: usize,
    /// Advertise each GPU as N devices, as NVIDIA's plugin does when it shares GPUs by
    /// time-slicing or MPS (IDs <PREFIX>-<gpu>::<replica>); pair it with the node labels
    /// nvidia.com/gpu.sharing-strategy and nvidia.com/gpu.replicas that GPU Feature Discovery sets.
    #[arg(long, default_value_t = 1, value_name = "N")]
    replicas: usize,
    /// Device IDs are <PREFIX>-0, <PREFIX>-1, ...
    #[arg(long, default_value = "fake-gpu", value_name = "PREFIX")]
    id_prefix: String,
    /// The kubelet's device-plugin directory (where kubelet.sock is).
    #[arg(long, default_value = DEFAULT_PLUGIN_DIR, value_name = "DIR")]
    plugin_dir: PathBuf,
    /// The plugin's socket file name in the plugin directory.
    #[arg(long, default_value = "teifleet-fake-gpu.sock", value_name = "NAME")]
    socket_name: String,
    #[arg(long, default_value = "pretty", value_name = "json|pretty")]
    log_format: LogFormat,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    logging::init(args.log_format)?;
    let stop = shutdown::signal()?;
    let config = Config::shared(
        &args.resource_name,
        args.count,
        args.replicas,
        &args.id_prefix,
        &args.plugin_dir,
        &args.socket_name,
    );
    tracing::info!(resource = %config.resource_name, devices = %config.device_ids.join(","), dir = %args.plugin_dir.display(), "starting");
    run(config, async move {
        let signal = stop.await;
        tracing::info!(%signal, "shutting down");
    })
    .await
    .context("the fake GPU device plugin failed")
}
