//! Shared setup for the data-plane tests: a TEI simulator and a multiplexer in front of it, both
//! real gRPC servers on 127.0.0.1.
// Each test binary uses a different part of this module.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use teifleet_multiplexer::admission::Limits;
use teifleet_multiplexer::forward::pools::{PoolSpec, PoolTable};
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::run::server::{self, Running, Settings};
use teifleet_proto::v1::{self, embed_client::EmbedClient};
use teifleet_tei_sim::{SimConfig, SimHandle};
use tonic::transport::Channel;

mod attack_lock;
pub mod attacker;
pub use attack_lock::{AttackTurn, attack_lock};

/// Polls until a condition holds (`until(what, timeout, check)`), panicking after the timeout.
pub use teifleet_testkit::poll::until;
/// The sum of a metric's series that carry the given labels.
pub use teifleet_testkit::prom::sum_matching as metric_sum;
/// The value of a metric line (exact name and labels) in the Prometheus text.
pub use teifleet_testkit::prom::value as metric;

pub const MODEL: &str = "teifleet/sim-embedding";

pub fn limits(in_flight: usize, queued: usize) -> Limits {
    Limits::new(in_flight, queued, Duration::from_secs(5))
}

pub async fn sim(configure: impl FnOnce(&mut SimConfig)) -> SimHandle {
    let mut config = SimConfig::default();
    configure(&mut config);
    teifleet_tei_sim::start(config).await.expect("simulator starts")
}

pub fn spec(name: &str, upstream: SocketAddr, limits: Limits) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        model: Some(MODEL.into()),
        upstream: format!("http://{upstream}"),
        limits: Some(limits),
        remote: false,
        coalesce: false,
        cache: None,
        tenants: Default::default(),
    }
}

/// A multiplexer whose own pool is the first spec.
pub async fn mux_with(specs: Vec<PoolSpec>, settings: Settings) -> (Running, Arc<PoolTable>) {
    mux_keeping_next_batch(specs, settings, false).await
}

/// [`mux_with`], its pools learning TEI's batch from its Info when `next_batch` (as the binary's
/// pools do: off elsewhere, so that TEI counts only the calls a test sends).
pub async fn mux_keeping_next_batch(
    specs: Vec<PoolSpec>,
    settings: Settings,
    next_batch: bool,
) -> (Running, Arc<PoolTable>) {
    let metrics = Metrics::new();
    let table = Arc::new(PoolTable::new(&specs[0].name, metrics.clone()).with_next_batch(next_batch));
    table.sync(specs).expect("pools valid");
    let settings = Settings { health_interval: Duration::from_millis(100), ..settings };
    (server::start(settings, table.clone(), metrics).await.expect("multiplexer starts"), table)
}

pub async fn mux(upstream: SocketAddr, limits: Limits) -> (Running, Arc<PoolTable>) {
    mux_with(vec![spec("pool-a", upstream, limits)], Settings::default()).await
}

pub async fn channel(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.expect("connects")
}

pub async fn embed_client(addr: SocketAddr) -> EmbedClient<Channel> {
    EmbedClient::new(channel(addr).await)
}

/// Sends an Embed call in the background, on a clone of `client`.
pub fn spawn_embed(
    client: &EmbedClient<Channel>,
    request: impl tonic::IntoRequest<v1::EmbedRequest> + Send + 'static,
) -> tokio::task::JoinHandle<Result<tonic::Response<v1::EmbedResponse>, tonic::Status>> {
    let mut client = client.clone();
    tokio::spawn(async move { client.embed(request).await })
}

pub fn embed_request(text: &str) -> v1::EmbedRequest {
    v1::EmbedRequest { inputs: text.into(), normalize: Some(true), ..Default::default() }
}

/// A request with metadata set.
pub fn with_meta<T>(message: T, pairs: &[(&'static str, &str)]) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    for (key, value) in pairs {
        request.metadata_mut().insert(*key, value.parse().unwrap());
    }
    request
}

/// The Prometheus text the multiplexer's `/metrics` would serve.
pub fn metrics_text(running: &Running) -> String {
    teifleet_runtime::metrics::render(&running.metrics.registry).expect("metrics encode")
}

/// How often the multiplexer turned input away at a bound, on `port` for `reason`.
pub fn refused(running: &Running, port: &str, reason: &str) -> f64 {
    metric_sum(&metrics_text(running), "teifleet_refused_input_total", &[("port", port), ("reason", reason)])
}
