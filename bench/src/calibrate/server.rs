//! The two servers measured: a real TEI gRPC router and the simulator, each a child process on a
//! loopback port of its own, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use teifleet_proto::v1::InfoRequest;
use teifleet_proto::v1::info_client::InfoClient;
use tokio::process::{Child, Command};
use tonic::transport::Channel;

/// Ports taken by someone else between our probe and the server's bind are retried this often.
const BIND_ATTEMPTS: usize = 5;
/// TEI loads and warms the model before it logs "Ready": seconds on a busy 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// A server child process and where it listens.
pub struct Server {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// A real TEI: `<tei>/bin/text-embeddings-router-grpc` serving `<tei>/models/all-MiniLM-L6-v2`
    /// in float32, offline. TEI cannot bind port 0, so a free port is picked, and picked again if
    /// it was taken before TEI bound it.
    pub async fn real_tei(tei: &Path, model: &str, logs: &Path) -> anyhow::Result<Self> {
        let program = tei.join("bin/text-embeddings-router-grpc");
        let model_dir = tei.join("models").join(model);
        for attempt in 1..=BIND_ATTEMPTS {
            let (port, metrics_port) = (free_port()?, free_port()?);
            let log = logs.join(format!("real-tei-{port}.log"));
            let mut command = Command::new(&program);
            command
                .env("HF_HUB_OFFLINE", "1")
                .arg("--model-id")
                .arg(&model_dir)
                .args(["--dtype", "float32", "--hostname", "127.0.0.1"])
                .args(["--port", &port.to_string(), "--prometheus-port", &metrics_port.to_string()]);
            let child = spawn_logged(command, &log).with_context(|| format!("starting {}", program.display()))?;
            let mut server = Self { child, port, log };
            match server.wait_for_log("Ready").await {
                Ok(()) => return Ok(server),
                Err(e) if attempt < BIND_ATTEMPTS && server.log_says("in use") => {
                    eprintln!("real TEI could not bind port {port} ({e}); trying another");
                }
                Err(e) => return Err(e),
            }
        }
        bail!("real TEI could not bind a port in {BIND_ATTEMPTS} attempts")
    }

    /// The simulator with `args` (a profile, flags), on a free port; ready when Info answers.
    pub async fn sim(program: &Path, args: &[String], logs: &Path) -> anyhow::Result<Self> {
        for attempt in 1..=BIND_ATTEMPTS {
            let (port, admin) = (free_port()?, free_port()?);
            let log = logs.join(format!("tei-sim-{port}.log"));
            let mut command = Command::new(program);
            command
                .arg(format!("--listen=127.0.0.1:{port}"))
                .arg(format!("--admin-listen=127.0.0.1:{admin}"))
                .args(args);
            let child = spawn_logged(command, &log).with_context(|| format!("starting {}", program.display()))?;
            let mut server = Self { child, port, log };
            match server.wait_for_info().await {
                Ok(()) => return Ok(server),
                Err(e) if attempt < BIND_ATTEMPTS && server.log_says("cannot listen") => {
                    eprintln!("tei-sim could not bind port {port} ({e}); trying another");
                }
                Err(e) => return Err(e),
            }
        }
        bail!("tei-sim could not bind a port in {BIND_ATTEMPTS} attempts")
    }

    pub async fn channel(&self) -> anyhow::Result<Channel> {
        Ok(Channel::from_shared(self.url())?.connect().await?)
    }

    fn log_says(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|text| text.contains(needle))
    }

    async fn wait_for_log(&mut self, needle: &str) -> anyhow::Result<()> {
        let until = tokio::time::Instant::now() + READY_TIMEOUT;
        while tokio::time::Instant::now() < until {
            if self.log_says(needle) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("exited with {status} before logging {needle:?}; see {}", self.log.display());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("not {needle:?} after {READY_TIMEOUT:?}; see {}", self.log.display())
    }

    async fn wait_for_info(&mut self) -> anyhow::Result<()> {
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::time::Instant::now() < until {
            if let Ok(channel) = self.channel().await
                && InfoClient::new(channel).info(InfoRequest {}).await.is_ok()
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("exited with {status}; see {}", self.log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("no Info answer after 20 s; see {}", self.log.display())
    }

    /// Stops the server (SIGKILL: nothing of its state is kept) and reaps it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

fn spawn_logged(mut command: Command, log: &Path) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    Ok(command.stdin(Stdio::null()).stdout(out).stderr(err).kill_on_drop(true).spawn()?)
}

/// A port free on loopback right now (the kernel's pick); the caller binds it soon after.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// CPU time (user + system) a process has used so far, from /proc/<pid>/stat.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}
