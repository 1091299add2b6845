//! The processes a scenario measures: the TEI simulator and the multiplexer (and, for the live
//! limit scenario, the operator), each a separate process on loopback ports, killed when dropped.
//! Separate processes keep the generator's own CPU out of what the servers are charged with.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::http;
use crate::{Error, Result};

/// Where the built binaries and the logs are.
#[derive(Clone, Debug)]
pub struct Bins {
    pub dir: PathBuf,
    pub logs: PathBuf,
}

impl Bins {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn check(&self) -> Result<()> {
        for name in ["tei-sim", "teifleet-multiplexer"] {
            if !self.path(name).is_file() {
                return Err(Error::Process(format!(
                    "{} is missing: build with `cargo build --release -p teifleet-tei-sim -p teifleet-multiplexer -p teifleet-operator`",
                    self.path(name).display()
                )));
            }
        }
        std::fs::create_dir_all(&self.logs).map_err(|source| Error::File {
            what: "creating",
            path: self.logs.clone(),
            source,
        })
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::Process(format!("free port: {e}")))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| Error::Process(format!("free port: {e}")))
}

/// A helper process; killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: std::process::Child,
    pub grpc: u16,
    pub admin: u16,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc)
    }

    fn spawn(
        bins: &Bins,
        name: &str,
        binary: &str,
        args: &[String],
        env: &[(&str, &Path)],
    ) -> Result<std::process::Child> {
        let log_path = bins.logs.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).map_err(|source| Error::File {
            what: "creating",
            path: log_path.clone(),
            source,
        })?;
        let err = log.try_clone().map_err(|source| Error::File { what: "opening", path: log_path, source })?;
        let mut command = Command::new(bins.path(binary));
        command.args(args).stdin(Stdio::null()).stdout(log).stderr(err);
        for (key, value) in env {
            command.env(key, value);
        }
        command.spawn().map_err(|e| Error::Process(format!("starting {binary}: {e}")))
    }

    /// Waits until `ready` holds, failing if the process exits or `timeout` passes.
    async fn wait<F, Fut>(&mut self, timeout: Duration, mut ready: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if ready().await {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::Process(format!("{} exited early ({status}); see its log", self.name)));
            }
            if Instant::now() > deadline {
                return Err(Error::Process(format!("{} not ready after {timeout:?}; see its log", self.name)));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The simulated TEI: its admission limit and its device's service-time model.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct SimModel {
    /// TEI's `--max-concurrent-requests`: beyond it, unary calls fail at once.
    pub max_concurrent_requests: usize,
    /// TEI's `--max-batch-requests`.
    pub max_batch_requests: Option<usize>,
    /// Device time of every batch.
    #[serde(with = "millis")]
    pub fixed_latency: Duration,
    /// Device time per token in the batch.
    #[serde(with = "millis")]
    pub per_token_latency: Duration,
}

mod millis {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1e3)
    }
}

pub async fn start_sim(bins: &Bins, name: &str, model: &SimModel) -> Result<Proc> {
    let (grpc, admin) = (free_port()?, free_port()?);
    let mut args = vec![
        format!("--listen=127.0.0.1:{grpc}"),
        format!("--admin-listen=127.0.0.1:{admin}"),
        format!("--max-concurrent-requests={}", model.max_concurrent_requests),
        format!("--fixed-latency={}us", model.fixed_latency.as_micros()),
        format!("--per-token-latency={}ns", model.per_token_latency.as_nanos()),
    ];
    if let Some(n) = model.max_batch_requests {
        args.push(format!("--max-batch-requests={n}"));
    }
    let child = Proc::spawn(bins, name, "tei-sim", &args, &[])?;
    let mut proc = Proc { name: name.into(), child, grpc, admin };
    proc.wait(Duration::from_secs(10), || async move { http::get(admin, "/healthz").await.is_some() }).await?;
    Ok(proc)
}

/// The multiplexer's static-mode limits.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct MuxLimits {
    pub max_in_flight: usize,
    pub max_queued: usize,
    #[serde(with = "millis")]
    pub queue_timeout: Duration,
    /// HTTP/2 streams per client connection.
    pub max_concurrent_streams: u32,
}

pub async fn start_mux(bins: &Bins, name: &str, upstream: &Proc, limits: &MuxLimits) -> Result<Proc> {
    let (grpc, admin) = (free_port()?, free_port()?);
    let args = vec![
        format!("--listen=127.0.0.1:{grpc}"),
        format!("--admin-listen=127.0.0.1:{admin}"),
        format!("--upstream={}", upstream.url()),
        format!("--max-in-flight={}", limits.max_in_flight),
        format!("--max-queued={}", limits.max_queued),
        format!("--queue-timeout={}ms", limits.queue_timeout.as_millis()),
        format!("--max-concurrent-streams={}", limits.max_concurrent_streams),
        "--drain-delay=0s".into(),
    ];
    let child = Proc::spawn(bins, name, "teifleet-multiplexer", &args, &[])?;
    let mut proc = Proc { name: name.into(), child, grpc, admin };
    proc.wait(Duration::from_secs(15), || async move { http::get(admin, "/readyz").await.is_some() }).await?;
    Ok(proc)
}

/// The multiplexer in Kubernetes mode: pool and limits from the EmbeddingPool in `namespace`.
pub async fn start_sidecar(
    bins: &Bins,
    upstream: &Proc,
    kubeconfig: &Path,
    namespace: &str,
    pool: &str,
) -> Result<Proc> {
    let (grpc, admin) = (free_port()?, free_port()?);
    let args = vec![
        format!("--listen=127.0.0.1:{grpc}"),
        format!("--admin-listen=127.0.0.1:{admin}"),
        format!("--upstream={}", upstream.url()),
        format!("--pool={pool}"),
        format!("--namespace={namespace}"),
        "--drain-delay=0s".into(),
    ];
    let child = Proc::spawn(bins, "sidecar", "teifleet-multiplexer", &args, &[("KUBECONFIG", kubeconfig)])?;
    let mut proc = Proc { name: "sidecar".into(), child, grpc, admin };
    proc.wait(Duration::from_secs(60), || async move { http::get(admin, "/readyz").await.is_some() }).await?;
    Ok(proc)
}

/// The operator, with the admin kubeconfig, leader election on in `lease_namespace`.
pub async fn start_operator(bins: &Bins, kubeconfig: &Path, lease_namespace: &str) -> Result<Proc> {
    let admin = free_port()?;
    let args = vec![
        format!("--admin-listen=127.0.0.1:{admin}"),
        format!("--lease-namespace={lease_namespace}"),
        "--lease-duration=3s".into(),
        "--identity=teifleet-bench".into(),
        "--log-format=pretty".into(),
    ];
    let child = Proc::spawn(bins, "operator", "teifleet-operator", &args, &[("KUBECONFIG", kubeconfig)])?;
    let mut proc = Proc { name: "operator".into(), child, grpc: 0, admin };
    proc.wait(Duration::from_secs(30), || async move { http::get(admin, "/metrics").await.is_some() }).await?;
    Ok(proc)
}
