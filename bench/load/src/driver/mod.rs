//! The load generator: connections, one request, the open and the closed loop.

mod attempt;
mod call;
mod closed;
mod connect;
mod open;
mod tei_http;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use call::CallSpec;
pub use connect::{Dialer, check_loopback, connect, connect_spread, is_tls};

use crate::arrivals::Arrivals;
use crate::inputs::{Inputs, Tokens};
use crate::progress::Progress;
use crate::report::{Report, RunInfo};
use crate::retry::RetryPolicy;
use crate::sink::Sink;
use crate::tls::TlsClient;
use crate::{Error, Result};

/// How requests are issued.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// Precomputed arrivals at `rate` per second, each sent when due whatever happened before.
    Open { rate: f64, arrivals: Arrivals },
    /// `concurrency` workers, each sending its next request when the previous one is answered.
    Closed { concurrency: usize },
}

/// How requests reach the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// tei.v1 gRPC over HTTP/2 connections.
    #[default]
    Grpc,
    /// TEI's HTTP API (`POST /embed`, `GET /info`) over HTTP/1.1 keep-alive connections: the
    /// multiplexer's HTTP front, or a TEI serving HTTP.
    Http,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Grpc => "grpc",
            Self::Http => "http",
        })
    }
}

/// One connection a request can go out on: an HTTP/2 channel, a new HTTP/2 connection per call
/// (made when the call starts, closed when it ends), or the HTTP/1.1 client whose pool opens a
/// connection per request in flight (shared: its pool is the point).
#[derive(Clone, Debug)]
pub(crate) enum Connection {
    Grpc(Channel),
    PerCall(std::sync::Arc<Dialer>),
    Http(std::sync::Arc<tei_http::HttpClient>),
}

/// Which RPC each request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `tei.v1.Embed/Embed`.
    Embed,
    /// One `tei.v1.Embed/EmbedStream` call carrying `batch` messages; the call is the request.
    EmbedStream { batch: usize },
    /// `tei.v1.Info/Info`: no input and no device time, so what it measures is the path itself.
    Info,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embed => f.write_str("Embed"),
            Self::EmbedStream { batch } => write!(f, "EmbedStream of {batch}"),
            Self::Info => f.write_str("Info"),
        }
    }
}

/// One run, bounded by `requests` and `duration` (whichever comes first), then `grace` for the
/// last answers.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub target: String,
    /// Further targets beside `target` (gRPC only): connection k goes to the k-th of `target` and
    /// these in turn, so requests spread over several servers round robin, as a client balancing
    /// over a pool's replicas would. Empty: every connection goes to `target`.
    pub more_targets: Vec<String>,
    /// gRPC (default) or TEI's HTTP API.
    pub protocol: Protocol,
    /// PEM CA bundle trusted for `https://` targets (gRPC in TLS); required by them, refused
    /// without one.
    pub ca_cert: Option<PathBuf>,
    /// gRPC: every call opens a connection of its own when it starts and closes it when it ends,
    /// so its latency holds the TCP (and TLS) handshakes; TLS connections resume the run's
    /// sessions. Off: `connections` long-lived connections carry every call.
    pub connection_per_call: bool,
    pub mode: Mode,
    pub requests: u64,
    pub duration: Duration,
    pub connections: usize,
    pub call: Call,
    pub inputs: Inputs,
    pub deadline: Option<Duration>,
    pub priority: Option<String>,
    /// `x-teifleet-tenant` of every request: whose share of the queue it is counted in.
    pub tenant: Option<String>,
    /// `x-teifleet-pool` of every request: the pool it is for (needed through an activator
    /// reached by address, which cannot tell the pool from the name dialled).
    pub pool: Option<String>,
    /// `x-teifleet-lane` of every request: `query` (interactive) or `ingest` (bulk work that takes
    /// the room queries leave). Without it the multiplexer picks (unary calls are queries).
    pub lane: Option<String>,
    /// Retries of refused calls; without it, a refusal is the call's answer.
    pub retry: Option<RetryPolicy>,
    /// Seeds the Poisson schedule and the draws of a query mix.
    pub seed: u64,
    /// How long to wait for answers after the last send; still-open requests are then cancelled
    /// and counted as `UNFINISHED`.
    pub grace: Duration,
    pub progress: bool,
}

impl LoadConfig {
    /// A closed-loop run of `requests` at `concurrency`, 16-token inputs, one connection.
    pub fn closed(target: impl Into<String>, concurrency: usize, requests: u64) -> Self {
        Self {
            target: target.into(),
            more_targets: Vec::new(),
            protocol: Protocol::Grpc,
            ca_cert: None,
            connection_per_call: false,
            mode: Mode::Closed { concurrency },
            requests,
            duration: Duration::from_secs(300),
            connections: 1,
            call: Call::Embed,
            inputs: Inputs::Words(Tokens::Fixed(16)),
            deadline: None,
            priority: None,
            tenant: None,
            pool: None,
            lane: None,
            retry: None,
            seed: 1,
            grace: Duration::from_secs(30),
            progress: false,
        }
    }

    /// An open-loop Poisson run at `rate` for `duration`.
    pub fn open(target: impl Into<String>, rate: f64, duration: Duration) -> Self {
        let requests = (rate * duration.as_secs_f64()).ceil() as u64 + 1;
        Self { mode: Mode::Open { rate, arrivals: Arrivals::Poisson }, duration, ..Self::closed(target, 1, requests) }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidArgument(why));
        for target in self.targets() {
            check_loopback(target)?;
        }
        match self.mode {
            Mode::Open { rate, .. } if !(rate.is_finite() && rate > 0.0) => {
                return bad(format!("--rate must be a positive number, not {rate}"));
            }
            Mode::Closed { concurrency: 0 } => return bad("--concurrency must be at least 1".into()),
            _ => {}
        }
        if self.requests == 0 {
            return bad("--requests must be at least 1".into());
        }
        if self.duration.is_zero() {
            return bad("--duration must be positive".into());
        }
        if self.connections == 0 {
            return bad("--connections must be at least 1".into());
        }
        if self.connections < self.targets().count() {
            return bad(format!(
                "--connections {} cannot reach {} targets: give each target a connection at least",
                self.connections,
                self.targets().count()
            ));
        }
        let tls_targets = self.targets().filter(|t| is_tls(t)).count();
        if tls_targets > 0 && self.ca_cert.is_none() {
            return bad("https:// targets need --ca-cert: the CA bundle to trust".into());
        }
        if tls_targets == 0 && self.ca_cert.is_some() {
            return bad("--ca-cert is for https:// targets".into());
        }
        if self.protocol == Protocol::Http && tls_targets > 0 {
            return bad("https:// targets need --protocol grpc: the HTTP client speaks plaintext only".into());
        }
        if self.protocol == Protocol::Http && self.connection_per_call {
            return bad("--connection-per-call needs --protocol grpc".into());
        }
        if self.protocol == Protocol::Http && !self.more_targets.is_empty() {
            return bad("several --target need --protocol grpc: HTTP requests use one client's pool".into());
        }
        if self.call == (Call::EmbedStream { batch: 0 }) {
            return bad("--stream-batch must be at least 1".into());
        }
        if self.protocol == Protocol::Http && matches!(self.call, Call::EmbedStream { .. }) {
            return bad("--stream-batch needs --protocol grpc: TEI's HTTP API has no streams".into());
        }
        if let Some(p) = &self.priority
            && !matches!(p.as_str(), "critical" | "standard" | "sheddable")
        {
            return bad(format!("--priority must be critical, standard or sheddable, not {p:?}"));
        }
        if let Some(t) = &self.tenant
            && (t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()))
        {
            return bad(format!("--tenant must be a non-empty name of visible ASCII characters, not {t:?}"));
        }
        if let Some(p) = &self.pool
            && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_graphic()))
        {
            return bad(format!("--pool must be a non-empty name of visible ASCII characters, not {p:?}"));
        }
        if let Some(l) = &self.lane
            && !matches!(l.as_str(), "query" | "ingest")
        {
            return bad(format!("--lane must be query or ingest, not {l:?}"));
        }
        if let Some(retry) = &self.retry {
            retry.validate()?;
        }
        Ok(())
    }

    /// `target`, then `more_targets`: where connections go, in turn.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.target.as_str()).chain(self.more_targets.iter().map(String::as_str))
    }

    pub fn info(&self) -> RunInfo {
        let (mode, arrivals, rate, concurrency) = match &self.mode {
            Mode::Open { rate, arrivals } => ("open", Some(format!("{arrivals:?}").to_lowercase()), Some(*rate), None),
            Mode::Closed { concurrency } => ("closed", None, None, Some(*concurrency)),
        };
        RunInfo {
            target: self.targets().collect::<Vec<_>>().join(", "),
            protocol: self.protocol.to_string(),
            mode: mode.into(),
            arrivals,
            rate,
            concurrency,
            connections: self.connections,
            connection_per_call: self.connection_per_call,
            call: self.call.to_string(),
            inputs: match self.call {
                Call::Info => "none".into(),
                Call::Embed | Call::EmbedStream { .. } => self.inputs.to_string(),
            },
            deadline_ms: self.deadline.map(|d| d.as_secs_f64() * 1e3),
            priority: self.priority.clone(),
            tenant: self.tenant.clone(),
            pool: self.pool.clone(),
            lane: self.lane.clone(),
            retry: self.retry.map(|r| r.to_string()),
        }
    }
}

/// Runs the load described by `config` and reports. Fails only when the target cannot be reached
/// or the configuration is unusable; failed requests are part of the report.
pub async fn run(config: &LoadConfig) -> Result<Report> {
    config.validate()?;
    // One client configuration for the whole run: its session store is what later connections
    // resume from.
    let tls = config.ca_cert.as_deref().map(TlsClient::from_file).transpose()?;
    let channels: Vec<Connection> = match config.protocol {
        Protocol::Grpc if config.connection_per_call => per_call(config, tls.as_ref()).await?,
        Protocol::Grpc => {
            let targets: Vec<&str> = config.targets().collect();
            connect_spread(&targets, config.connections, tls.as_ref())
                .await?
                .into_iter()
                .map(Connection::Grpc)
                .collect()
        }
        Protocol::Http => {
            // One client: its pool shares the connections among all requests.
            let client = tei_http::client();
            tei_http::check(&client, &tei_http::Routes::new(&config.target)?).await?;
            vec![Connection::Http(std::sync::Arc::new(client))]
        }
    };
    let spec = CallSpec::new(config)?;
    let sink = std::sync::Arc::new(Sink::default());
    let total = match &config.mode {
        Mode::Open { .. } => None,
        Mode::Closed { .. } => Some(config.requests),
    };
    let progress = config.progress.then(|| Progress::start(sink.clone(), total, config.duration));

    let start = Instant::now();
    let outcome = match &config.mode {
        Mode::Open { rate, arrivals } => open::run(config, *rate, *arrivals, channels, spec, sink.clone(), start).await,
        Mode::Closed { concurrency } => closed::run(config, *concurrency, channels, spec, sink.clone(), start).await,
    };
    if let Some(progress) = progress {
        progress.stop().await;
    }
    let sink = std::sync::Arc::try_unwrap(sink).map_err(|_| Error::Internal("load tasks outlived the run".into()))?;
    let sent = sink.sent.load(Ordering::Relaxed);
    let (mut recorder, last) = sink.into_parts();
    recorder.unfinished(outcome.unfinished);
    let elapsed = last.map_or(Duration::ZERO, |last| last.saturating_duration_since(outcome.first_due));
    let mut report = recorder.finish(config.info(), sent, elapsed, outcome.schedule_span);
    report.tls = tls.map(|tls| tls.handshakes());
    Ok(report)
}

/// A dialer per connection slot, over the targets in turn; each target is reached once first, so
/// one that cannot be is an error of the run rather than a failure of every call (and a TLS
/// target's first session is in the store before the first call).
async fn per_call(config: &LoadConfig, tls: Option<&TlsClient>) -> Result<Vec<Connection>> {
    let dialers = config.targets().map(|t| Dialer::new(t, tls).map(std::sync::Arc::new)).collect::<Result<Vec<_>>>()?;
    for dialer in &dialers {
        drop(dialer.connect().await?);
    }
    Ok((0..config.connections).map(|k| Connection::PerCall(dialers[k % dialers.len()].clone())).collect())
}

/// What a loop tells [`run`] besides the answers.
pub(crate) struct LoopOutcome {
    pub(crate) first_due: Instant,
    pub(crate) unfinished: u64,
    pub(crate) schedule_span: Option<Duration>,
}
