//! The processes a scenario measures: the TEI simulator, the multiplexer, the floor proxy (and,
//! for the live-limit scenario, the operator), each a separate process on loopback ports, killed
//! when dropped. Separate processes keep the generator's own CPU out of what the servers are
//! charged with, and let `/proc` and valgrind measure each one alone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_testkit::http;
use teifleet_testkit::net::{free_port, loopback};
use teifleet_testkit::process::ChildGuard;

use crate::floor::Stack;
use crate::{Error, Result};

/// Where the built binaries and the logs are.
#[derive(Clone, Debug)]
pub struct Bins {
    pub dir: PathBuf,
    pub logs: PathBuf,
}

/// The binaries every scenario needs (the operator only for live limits, checked there).
const REQUIRED: [&str; 2] = ["tei-sim", "teifleet-multiplexer"];

impl Bins {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn check(&self) -> Result<()> {
        for name in REQUIRED {
            if !self.path(name).is_file() {
                return Err(Error::Process(format!(
                    "{} is missing: build with `cargo build --release -p teifleet-tei-sim -p teifleet-multiplexer \
                     -p teifleet-operator -p teifleet-bench`",
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

    /// What the built binaries can do, read from their `--help`: flags that other parts of the
    /// tree may not have yet, so a scenario needing one can say so instead of failing to start.
    pub fn features(&self) -> Features {
        // The multiplexer's flags are its modes'; `static` has every serving flag.
        let help = |name: &str| {
            let mode: &[&str] = if name == "teifleet-multiplexer" { &["static"] } else { &[] };
            Command::new(self.path(name))
                .args(mode)
                .arg("--help")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let (sim, mux) = (help("tei-sim"), help("teifleet-multiplexer"));
        Features {
            sim_spin: sim.contains("--device"),
            mux_coalesce: mux.contains("--coalesce"),
            mux_tls: mux.contains("--tls-cert"),
            floor_proxy: self.path(FLOOR).is_file(),
            haproxy: haproxy_program().is_some(),
            valgrind: Command::new("valgrind").arg("--version").output().is_ok_and(|o| o.status.success()),
        }
    }
}

/// Optional capabilities of this build and machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    /// `tei-sim --device spin`: device time burns CPU instead of sleeping.
    pub sim_spin: bool,
    /// `teifleet-multiplexer --coalesce`: identical in-flight unary calls share one upstream call.
    pub mux_coalesce: bool,
    /// `teifleet-multiplexer --tls-cert/--tls-key`: its gRPC and HTTP ports serve TLS.
    #[serde(default)]
    pub mux_tls: bool,
    /// `teifleet-floor-proxy` is built.
    pub floor_proxy: bool,
    /// valgrind is installed (instruction counts).
    pub valgrind: bool,
    /// HAProxy is installed (the TCP and h2 floors beside the floor proxy).
    #[serde(default)]
    pub haproxy: bool,
}

/// Why the HAProxy rows are missing when it is not installed.
pub const HAPROXY_MISSING: &str = "haproxy is not installed: bench/run.sh installs Debian's package when run as root \
                                   (apt-get install haproxy)";

const FLOOR: &str = "teifleet-floor-proxy";

/// How to start one process.
struct Launch<'a> {
    name: &'a str,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(&'a str, &'a Path)>,
}

/// A helper process on loopback ports; killed when dropped.
#[derive(Debug)]
pub struct Proc {
    guard: ChildGuard,
    pub grpc: u16,
    pub admin: u16,
    /// Its gRPC port serves TLS ([`start_mux_tls`]).
    tls: bool,
}

impl Proc {
    fn spawn(bins: &Bins, launch: Launch<'_>, grpc: u16, admin: u16) -> Result<Self> {
        let log = bins.logs.join(format!("{}.log", launch.name));
        // One log per run: the guard appends.
        let _ = std::fs::remove_file(&log);
        let mut command = Command::new(&launch.program);
        command.args(&launch.args);
        for (key, value) in launch.env {
            command.env(key, value);
        }
        Ok(Self { guard: ChildGuard::spawn_logged(launch.name, command, log)?, grpc, admin, tls: false })
    }

    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    /// `http://127.0.0.1:PORT`, or `https://` for a process serving TLS.
    pub fn url(&self) -> String {
        match self.tls {
            true => format!("https://127.0.0.1:{}", self.grpc),
            false => url_of(self.grpc),
        }
    }

    pub fn admin_addr(&self) -> SocketAddr {
        loopback(self.admin)
    }

    /// Waits until the admin port answers `path` with 200.
    async fn ready_at(&mut self, path: &str, timeout: Duration) -> Result<()> {
        let addr = loopback(self.admin);
        Ok(self.guard.wait_ready(timeout, || async move { http::get(addr, path).await.is_some() }).await?)
    }

    /// Asks the process to exit (SIGTERM) and waits up to `grace`; a process that does not go is
    /// killed. True when it exited on its own.
    pub fn terminate(mut self, grace: Duration) -> bool {
        // The wait blocks this thread; let the runtime move other tasks elsewhere meanwhile.
        tokio::task::block_in_place(|| self.guard.terminate(grace)).is_some()
    }
}

/// How the simulated device spends a batch's time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Sleeps (a GPU: the host's CPU is free meanwhile); tokio's timer rounds up to 1 ms ticks.
    #[default]
    Sleep,
    /// Burns CPU for the whole time (a CPU backend, or a precise ~1 ms device).
    Spin,
}

/// The simulated TEI: its admission limit and its device's service-time model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
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
    pub device: Device,
}

impl SimModel {
    /// The model as this build can run it: a spinning device falls back to sleeping when the
    /// simulator has no `--device` flag yet (the result records which one ran).
    pub fn supported(self, features: Features) -> Self {
        match self.device {
            Device::Spin if !features.sim_spin => Self { device: Device::Sleep, ..self },
            _ => self,
        }
    }
}

/// Durations as milliseconds in JSON, the unit the tables use.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1e3)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        Ok(Duration::try_from_secs_f64(ms / 1e3).unwrap_or_default())
    }
}

pub async fn start_sim(bins: &Bins, name: &str, model: &SimModel) -> Result<Proc> {
    start_sim_with(bins, name, model, &[]).await
}

/// The simulator with flags beyond [`SimModel`] appended as given (`--shared-device=PATH`).
pub async fn start_sim_with(bins: &Bins, name: &str, model: &SimModel, extra: &[String]) -> Result<Proc> {
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
    // Only passed when spinning, so a simulator without the flag still runs the sleeping model.
    if model.device == Device::Spin {
        args.push("--device=spin".into());
    }
    args.extend(extra.iter().cloned());
    let launch = Launch { name, program: bins.path("tei-sim"), args, env: vec![] };
    let mut proc = Proc::spawn(bins, launch, grpc, admin)?;
    proc.ready_at("/healthz", Duration::from_secs(10)).await?;
    Ok(proc)
}

/// The multiplexer's static-mode limits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MuxLimits {
    pub max_in_flight: usize,
    pub max_queued: usize,
    #[serde(with = "millis")]
    pub queue_timeout: Duration,
    /// HTTP/2 streams per client connection.
    pub max_concurrent_streams: u32,
    /// Identical in-flight unary calls share one upstream call (`--coalesce`).
    #[serde(default)]
    pub coalesce: bool,
}

fn mux_args(grpc: u16, admin: u16, upstream: &Proc, limits: &MuxLimits) -> Vec<String> {
    let mut args = vec![
        "static".into(),
        format!("--listen=127.0.0.1:{grpc}"),
        format!("--admin-listen=127.0.0.1:{admin}"),
        format!("--upstream={}", upstream.url()),
        format!("--max-in-flight={}", limits.max_in_flight),
        format!("--max-queued={}", limits.max_queued),
        format!("--queue-timeout={}ms", limits.queue_timeout.as_millis()),
        format!("--max-concurrent-streams={}", limits.max_concurrent_streams),
        "--drain-delay=0s".into(),
        // Every load generator here connects from 127.0.0.1, where a cluster's callers come from many
        // pods: the per-address cap (256 by default) would otherwise refuse the HTTP/1.1 storms'
        // 512 connections. The port's own cap, 1,024, still holds.
        "--max-connections-per-peer=1024".into(),
    ];
    if limits.coalesce {
        args.push("--coalesce".into());
    }
    args
}

pub async fn start_mux(bins: &Bins, name: &str, upstream: &Proc, limits: &MuxLimits) -> Result<Proc> {
    let (grpc, admin) = (free_port()?, free_port()?);
    let args = mux_args(grpc, admin, upstream, limits);
    let launch = Launch { name, program: bins.path("teifleet-multiplexer"), args, env: vec![] };
    let mut proc = Proc::spawn(bins, launch, grpc, admin)?;
    proc.ready_at("/readyz", Duration::from_secs(15)).await?;
    Ok(proc)
}

/// The multiplexer with flags beyond [`MuxLimits`] appended as given (`--adaptive`,
/// `--tenant=a=1`): the admission v2 scenarios' options, kept out of the limits every other
/// scenario spells out.
pub async fn start_mux_with(
    bins: &Bins,
    name: &str,
    upstream: &Proc,
    limits: &MuxLimits,
    extra: &[String],
) -> Result<Proc> {
    start_mux_on(bins, name, free_port()?, upstream, limits, extra).await
}

/// A free loopback port for a process started later: replicas of one pool name each other's
/// multiplexer (`--sibling URL`), so every one's gRPC port is picked before any of them starts.
pub fn pick_port() -> Result<u16> {
    Ok(free_port()?)
}

/// The gRPC URL a process started on `port` will have.
pub fn url_of(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// [`start_mux_with`] on a gRPC port picked beforehand ([`pick_port`]).
pub async fn start_mux_on(
    bins: &Bins,
    name: &str,
    grpc: u16,
    upstream: &Proc,
    limits: &MuxLimits,
    extra: &[String],
) -> Result<Proc> {
    let admin = free_port()?;
    let mut args = mux_args(grpc, admin, upstream, limits);
    args.extend(extra.iter().cloned());
    let launch = Launch { name, program: bins.path("teifleet-multiplexer"), args, env: vec![] };
    let mut proc = Proc::spawn(bins, launch, grpc, admin)?;
    proc.ready_at("/readyz", Duration::from_secs(15)).await?;
    Ok(proc)
}

/// Characters of a pool's peer key, as the operator writes one (32 random bytes in base64url).
pub const PEER_KEY_LEN: usize = 43;

/// A fresh peer key for the replicas of one pool (`--peer-key-file`, the same file for each), written
/// beside the logs as `<name>-peer-key` (replaced by each run: nothing is left in the system's temp
/// dir). A bench key, drawn from the clock and the process id: it proves spills between processes
/// this run started, nothing more.
pub fn write_peer_key(bins: &Bins, name: &str) -> Result<PathBuf> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut state = (nanos as u64) ^ (u64::from(std::process::id()) << 32);
    let key: String = (0..PEER_KEY_LEN)
        .map(|_| {
            // SplitMix64.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            char::from(ALPHABET[((z ^ (z >> 31)) % 64) as usize])
        })
        .collect();
    let dir = &bins.logs;
    std::fs::create_dir_all(dir).map_err(|source| Error::File { what: "creating", path: dir.clone(), source })?;
    let path = dir.join(format!("{name}-peer-key"));
    std::fs::write(&path, &key).map_err(|source| Error::File { what: "writing", path: path.clone(), source })?;
    Ok(path)
}

/// A test CA's certificate and a server certificate it signed for 127.0.0.1 and localhost, as the
/// PEM files the multiplexer's `--tls-cert`/`--tls-key` and a client's CA bundle read.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA bundle clients trust.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// A fresh CA and server certificate, written beside the logs as `<name>-{ca,cert,key}.pem`
    /// (replaced by each run: nothing is left in the system's temp dir).
    pub fn write(bins: &Bins, name: &str) -> Result<Self> {
        let authority = teifleet_testkit::certs::Authority::new("teifleet bench CA");
        let issued = authority.server(&["127.0.0.1", "localhost"]);
        let dir = &bins.logs;
        std::fs::create_dir_all(dir).map_err(|source| Error::File { what: "creating", path: dir.clone(), source })?;
        let files = Self {
            cert: dir.join(format!("{name}-cert.pem")),
            key: dir.join(format!("{name}-key.pem")),
            ca: dir.join(format!("{name}-ca.pem")),
        };
        for (path, pem) in
            [(&files.cert, &issued.chain_pem), (&files.key, &issued.key_pem), (&files.ca, &authority.pem)]
        {
            std::fs::write(path, pem).map_err(|source| Error::File { what: "writing", path: path.clone(), source })?;
        }
        Ok(files)
    }

    /// The multiplexer's flags serving TLS with these files.
    pub fn mux_args(&self) -> Vec<String> {
        vec![format!("--tls-cert={}", self.cert.display()), format!("--tls-key={}", self.key.display())]
    }
}

/// The multiplexer of [`start_mux`] with its gRPC port serving TLS (`--tls-cert`, `--tls-key`:
/// rustls, ALPN h2/http1.1, TLS 1.3 tickets and a session cache); its [`Proc::url`] is
/// `https://`. Every other flag is the same, so a plaintext one beside it differs only in TLS.
pub async fn start_mux_tls(
    bins: &Bins,
    name: &str,
    upstream: &Proc,
    limits: &MuxLimits,
    files: &TlsFiles,
) -> Result<Proc> {
    let mut proc = start_mux_with(bins, name, upstream, limits, &files.mux_args()).await?;
    proc.tls = true;
    Ok(proc)
}

/// The multiplexer run by `valgrind --tool=callgrind`, which writes its instruction counts to
/// `out` when the process exits. Startup under valgrind takes seconds.
pub async fn start_mux_callgrind(
    bins: &Bins,
    name: &str,
    upstream: &Proc,
    limits: &MuxLimits,
    out: &Path,
) -> Result<Proc> {
    let (grpc, admin) = (free_port()?, free_port()?);
    let mut args = vec![
        "--tool=callgrind".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
        bins.path("teifleet-multiplexer").display().to_string(),
    ];
    args.extend(mux_args(grpc, admin, upstream, limits));
    let launch = Launch { name, program: "valgrind".into(), args, env: vec![] };
    let mut proc = Proc::spawn(bins, launch, grpc, admin)?;
    proc.ready_at("/readyz", Duration::from_secs(120)).await?;
    Ok(proc)
}

/// The floor proxy in front of `upstream`.
pub async fn start_floor(bins: &Bins, name: &str, upstream: &Proc, stack: Stack) -> Result<Proc> {
    let grpc = free_port()?;
    let args = vec![
        format!("--listen=127.0.0.1:{grpc}"),
        format!("--upstream={}", upstream.url()),
        format!("--stack={}", stack.flag()),
    ];
    let launch = Launch { name, program: bins.path(FLOOR), args, env: vec![] };
    let mut proc = Proc::spawn(bins, launch, grpc, 0)?;
    // It connects upstream before it binds, so accepting a connection means ready.
    let ready = || async move { tokio::net::TcpStream::connect(loopback(grpc)).await.is_ok() };
    proc.guard.wait_ready(Duration::from_secs(10), ready).await?;
    Ok(proc)
}

/// How HAProxy forwards: the two floors it gives a hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HaproxyMode {
    /// `mode tcp`: bytes spliced between two TCP connections, no HTTP/2 parsed; the least an extra
    /// hop (two more sockets and wake-ups) costs.
    Tcp,
    /// `mode http` with `proto h2` on both sides (h2c): every frame decoded and re-encoded, one
    /// stream per call; what the best L7 proxy costs.
    H2,
}

impl HaproxyMode {
    pub fn label(self) -> &'static str {
        match self {
            Self::Tcp => "HAProxy TCP",
            Self::H2 => "HAProxy h2",
        }
    }

    /// The mode in file and process names.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::H2 => "h2",
        }
    }
}

/// The HAProxy binary: on PATH, or in /usr/sbin (Debian's place, off a user's PATH).
pub fn haproxy_program() -> Option<PathBuf> {
    ["haproxy", "/usr/sbin/haproxy"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| Command::new(p).arg("-v").output().is_ok_and(|o| o.status.success()))
}

/// The configuration of one HAProxy in front of `upstream_port`. One thread (`nbthread 1`), as
/// the multiplexer's default `--worker-threads 1` and the floor proxy: the same CPU to work with.
/// No `log` lines, so nothing is logged; timeouts far beyond any run, so no idle connection is
/// closed mid-scenario.
pub fn haproxy_config(mode: HaproxyMode, listen: u16, upstream_port: u16) -> String {
    let (mode, proto) = match mode {
        HaproxyMode::Tcp => ("tcp", ""),
        HaproxyMode::H2 => ("http", " proto h2"),
    };
    let mut lines = vec![
        "global".to_owned(),
        "    nbthread 1".into(),
        "    maxconn 4096".into(),
        "defaults".into(),
        format!("    mode {mode}"),
        "    timeout connect 5s".into(),
        "    timeout client 1h".into(),
        "    timeout server 1h".into(),
        "    timeout http-keep-alive 1h".into(),
        "    timeout tunnel 1h".into(),
        "frontend fe".into(),
        format!("    bind 127.0.0.1:{listen}{proto}"),
        "    default_backend be".into(),
        "backend be".into(),
    ];
    if mode == "http" {
        // One pooled upstream connection shared by every call, as the floor proxy's channel.
        lines.push("    http-reuse always".into());
    }
    lines.push(format!("    server upstream 127.0.0.1:{upstream_port}{proto}"));
    lines.join("\n") + "\n"
}

/// HAProxy in `mode` in front of `upstream`, in the foreground (`-db`: no daemon and no
/// master-worker, so the process started is the one that forwards and its `/proc` CPU is all of
/// it), its configuration in a directory of its own under the temp dir.
pub async fn start_haproxy(bins: &Bins, name: &str, upstream: &Proc, mode: HaproxyMode) -> Result<Proc> {
    let program = haproxy_program().ok_or_else(|| Error::Process(HAPROXY_MISSING.into()))?;
    let grpc = free_port()?;
    // Beside its log, replaced by each run: nothing is left in the system's temp dir.
    let dir = &bins.logs;
    std::fs::create_dir_all(dir).map_err(|source| Error::File { what: "creating", path: dir.clone(), source })?;
    let config = dir.join(format!("{name}.cfg"));
    std::fs::write(&config, haproxy_config(mode, grpc, upstream.grpc)).map_err(|source| Error::File {
        what: "writing",
        path: config.clone(),
        source,
    })?;
    let args = vec!["-db".to_owned(), "-f".to_owned(), config.display().to_string()];
    let launch = Launch { name, program, args, env: vec![] };
    let mut proc = Proc::spawn(bins, launch, grpc, 0)?;
    let ready = || async move { tokio::net::TcpStream::connect(loopback(grpc)).await.is_ok() };
    proc.guard.wait_ready(Duration::from_secs(10), ready).await?;
    Ok(proc)
}

/// The multiplexer of [`start_mux_with`] taking up to `connections` connections on each of its
/// ports, all of them from one address (the load generator's 127.0.0.1): the real-TEI scenario's
/// 2,048 HTTP/1.1 callers each hold a connection, beyond the default `--max-connections` 1,024.
pub async fn start_mux_wide(
    bins: &Bins,
    name: &str,
    upstream: &Proc,
    limits: &MuxLimits,
    connections: usize,
    extra: &[String],
) -> Result<Proc> {
    let (grpc, admin) = (free_port()?, free_port()?);
    let mut args: Vec<String> = mux_args(grpc, admin, upstream, limits)
        .into_iter()
        .map(|a| {
            if a.starts_with("--max-connections-per-peer=") {
                format!("--max-connections-per-peer={connections}")
            } else {
                a
            }
        })
        .collect();
    args.push(format!("--max-connections={connections}"));
    args.extend(extra.iter().cloned());
    let launch = Launch { name, program: bins.path("teifleet-multiplexer"), args, env: vec![] };
    let mut proc = Proc::spawn(bins, launch, grpc, admin)?;
    proc.ready_at("/readyz", Duration::from_secs(15)).await?;
    Ok(proc)
}

/// A real Hugging Face TEI, as `../shared/tools/real-tei.sh` builds it (TEI 1.9.3 on the CPU, the
/// candle backend, all-MiniLM-L6-v2): `${TEIFLEET_CACHE:-$HOME/.cache/teifleet}/real-tei`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RealTeiCache {
    pub root: PathBuf,
}

/// The model the cache holds (384 dimensions).
pub const REAL_TEI_MODEL: &str = "all-MiniLM-L6-v2";

impl RealTeiCache {
    /// The cache where the script puts it.
    pub fn from_env() -> Self {
        let base = std::env::var_os("TEIFLEET_CACHE").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache").join("teifleet")
        });
        Self { root: base.join("real-tei") }
    }

    /// TEI's gRPC server (tei.v1).
    pub fn grpc_router(&self) -> PathBuf {
        self.root.join("bin/text-embeddings-router-grpc")
    }

    /// TEI's HTTP server (`/embed`, `/info`, ...).
    pub fn http_router(&self) -> PathBuf {
        self.root.join("bin/text-embeddings-router-http")
    }

    pub fn model(&self) -> PathBuf {
        self.root.join("models").join(REAL_TEI_MODEL)
    }

    /// Why the gRPC router or the model cannot be run (the scenario is skipped with it); `None`
    /// when both are there.
    pub fn missing(&self) -> Option<String> {
        let grpc = self.grpc_router();
        let weights = self.model().join("model.safetensors");
        let absent: Vec<String> =
            [&grpc, &weights].into_iter().filter(|p| !p.is_file()).map(|p| p.display().to_string()).collect();
        (!absent.is_empty()).then(|| {
            format!(
                "no real TEI cache ({} missing): build it with `TEI_SRC_MIRROR=<snapshots> ../shared/tools/real-tei.sh` \
                 (docs/benchmarks.md, Real TEI; about 45 min), or set TEIFLEET_CACHE",
                absent.join(", ")
            )
        })
    }
}

/// Attempts at starting a real TEI whose port was taken meanwhile: TEI cannot be told to pick
/// a port and report it, so it gets one picked here, which another process may bind first.
const REAL_TEI_ATTEMPTS: usize = 3;

/// How long a real TEI may take to load its model and warm up before it logs `Ready`.
const REAL_TEI_READY: Duration = Duration::from_secs(120);

/// A real TEI router (`program`: [`RealTeiCache::grpc_router`] or [`RealTeiCache::http_router`]) serving
/// the cache's model on loopback, offline, in float32, as the script's smoke test runs it; its
/// port in [`Proc::grpc`] (the HTTP router's too: [`Proc::url`] is then its HTTP base URL), no
/// admin port. `max_concurrent_requests` is TEI's own admission limit (its default is 512).
/// Ready when its log says `Ready`; started again on other ports when it could not bind.
pub async fn start_real_tei(
    bins: &Bins,
    name: &str,
    program: &Path,
    cache: &RealTeiCache,
    max_concurrent_requests: usize,
) -> Result<Proc> {
    let mut last = String::new();
    for _ in 0..REAL_TEI_ATTEMPTS {
        // Its Prometheus port (9000 by default) too: two TEIs run side by side here.
        let (port, metrics) = (pick_port()?, pick_port()?);
        let args = vec![
            "--model-id".to_owned(),
            cache.model().display().to_string(),
            "--dtype=float32".into(),
            "--hostname=127.0.0.1".into(),
            format!("--port={port}"),
            format!("--prometheus-port={metrics}"),
            format!("--max-concurrent-requests={max_concurrent_requests}"),
            format!("--uds-path={}", bins.logs.join(format!("{name}.sock")).display()),
        ];
        let launch =
            Launch { name, program: program.to_path_buf(), args, env: vec![("HF_HUB_OFFLINE", Path::new("1"))] };
        let mut proc = Proc::spawn(bins, launch, port, 0)?;
        let log = bins.logs.join(format!("{name}.log"));
        let ready = || {
            let log = log.clone();
            async move { std::fs::read_to_string(&log).is_ok_and(|text| text.contains("Ready")) }
        };
        match proc.guard.wait_ready(REAL_TEI_READY, ready).await {
            Ok(()) => return Ok(proc),
            Err(error) => {
                let text = proc.guard.log_text();
                if !(text.contains("Address already in use") || text.contains("os error 98")) {
                    return Err(error.into());
                }
                last = error.to_string();
            }
        }
    }
    Err(Error::Process(format!("{name} could not bind a port in {REAL_TEI_ATTEMPTS} attempts: {last}")))
}

/// The embedding-job worker (`teifleet-job run`), scenario 20's client.
pub const JOB: &str = "teifleet-job";

/// The `teifleet-job` binary: in the bins dir, or beside the plain release build's binaries
/// (`target/release`) when the bins dir is the profile-guided one, which holds only the
/// multiplexer and the floor proxy.
pub fn job_program(bins: &Bins, repo_root: &Path) -> Result<PathBuf> {
    [bins.path(JOB), repo_root.join("target/release").join(JOB)].into_iter().find(|p| p.is_file()).ok_or_else(|| {
        Error::Process(format!(
            "{} is missing: build it with `cargo build --release --locked -p teifleet-job`",
            bins.path(JOB).display()
        ))
    })
}

/// One `teifleet-job run` worker, its output in `<name>.log` beside the others; killed (SIGKILL)
/// when dropped.
#[derive(Debug)]
pub struct JobWorker {
    guard: ChildGuard,
}

impl JobWorker {
    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    /// How it ended, if it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.guard.exit_status()
    }

    /// Waits until it exits, polling every 10 ms (a scenario times the job to its last exit).
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        loop {
            if let Some(status) = self.guard.exit_status() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL, as a node that goes or an OOM kill ends a pod: nothing is flushed.
    pub fn kill(&mut self) {
        tokio::task::block_in_place(|| self.guard.kill());
    }

    /// Its log's last line (its summary, or why it failed).
    pub fn last_line(&self) -> String {
        self.guard.log_text().lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().to_owned()
    }
}

/// Starts `program` (from [`job_program`]) as `teifleet-job run` with `args`.
pub fn start_job_worker(bins: &Bins, name: &str, program: &Path, args: &[String]) -> Result<JobWorker> {
    let log = bins.logs.join(format!("{name}.log"));
    let _ = std::fs::remove_file(&log);
    let mut command = Command::new(program);
    command.arg("run").args(args);
    Ok(JobWorker { guard: ChildGuard::spawn_logged(name, command, log)? })
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
        "kubernetes".into(),
        format!("--listen=127.0.0.1:{grpc}"),
        format!("--admin-listen=127.0.0.1:{admin}"),
        format!("--upstream={}", upstream.url()),
        format!("--pool={pool}"),
        format!("--namespace={namespace}"),
        "--drain-delay=0s".into(),
    ];
    let launch = Launch {
        name: "sidecar",
        program: bins.path("teifleet-multiplexer"),
        args,
        env: vec![("KUBECONFIG", kubeconfig)],
    };
    let mut proc = Proc::spawn(bins, launch, grpc, admin)?;
    proc.ready_at("/readyz", Duration::from_secs(60)).await?;
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
    let launch = Launch {
        name: "operator",
        program: bins.path("teifleet-operator"),
        args,
        env: vec![("KUBECONFIG", kubeconfig)],
    };
    let mut proc = Proc::spawn(bins, launch, 0, admin)?;
    proc.ready_at("/metrics", Duration::from_secs(30)).await?;
    Ok(proc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_falls_back_to_sleep_without_the_flag() {
        let spin = SimModel {
            max_concurrent_requests: 8,
            max_batch_requests: None,
            fixed_latency: Duration::from_millis(1),
            per_token_latency: Duration::ZERO,
            device: Device::Spin,
        };
        assert_eq!(spin.supported(Features::default()).device, Device::Sleep);
        let with = Features { sim_spin: true, ..Features::default() };
        assert_eq!(spin.supported(with).device, Device::Spin);
    }

    #[test]
    fn models_round_trip_through_json_in_milliseconds() {
        let limits = MuxLimits {
            max_in_flight: 16,
            max_queued: 128,
            queue_timeout: Duration::from_millis(500),
            max_concurrent_streams: 1024,
            coalesce: true,
        };
        let json = serde_json::to_value(limits).unwrap();
        assert_eq!(json["queue_timeout"], 500.0);
        assert_eq!(serde_json::from_value::<MuxLimits>(json).unwrap(), limits);
    }

    #[test]
    fn tls_files_are_written_beside_the_logs_and_named_in_the_flags() {
        let logs = std::env::temp_dir().join(format!("teifleet-bench-tls-{}", std::process::id()));
        let bins = Bins { dir: logs.clone(), logs: logs.clone() };
        let files = TlsFiles::write(&bins, "t").unwrap();
        let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap();
        assert!(read(&files.cert).contains("BEGIN CERTIFICATE") && read(&files.ca).contains("BEGIN CERTIFICATE"));
        assert!(read(&files.key).contains("PRIVATE KEY"));
        let args = files.mux_args();
        assert_eq!(args[0], format!("--tls-cert={}", logs.join("t-cert.pem").display()));
        assert_eq!(args[1], format!("--tls-key={}", logs.join("t-key.pem").display()));
        std::fs::remove_dir_all(logs).unwrap();
    }

    #[test]
    fn a_peer_key_file_holds_43_base64url_characters() {
        let logs = std::env::temp_dir().join(format!("teifleet-bench-peer-{}", std::process::id()));
        let bins = Bins { dir: logs.clone(), logs: logs.clone() };
        let path = write_peer_key(&bins, "p").unwrap();
        assert_eq!(path, logs.join("p-peer-key"));
        let key = std::fs::read_to_string(&path).unwrap();
        assert_eq!(key.len(), PEER_KEY_LEN);
        assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{key}");
        std::fs::remove_dir_all(logs).unwrap();
    }

    #[test]
    fn haproxy_configs_forward_tcp_or_h2c_on_one_thread() {
        let tcp = haproxy_config(HaproxyMode::Tcp, 1000, 2000);
        assert!(tcp.contains("mode tcp") && tcp.contains("nbthread 1"), "{tcp}");
        assert!(tcp.contains("bind 127.0.0.1:1000\n") && tcp.contains("server upstream 127.0.0.1:2000\n"), "{tcp}");
        assert!(!tcp.contains("log"), "{tcp}");
        let h2 = haproxy_config(HaproxyMode::H2, 1000, 2000);
        assert!(h2.contains("mode http") && h2.contains("http-reuse always"), "{h2}");
        assert!(h2.contains("bind 127.0.0.1:1000 proto h2") && h2.contains("127.0.0.1:2000 proto h2"), "{h2}");
    }
}
