//! Starting a simulator and the handle that controls and stops it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use teifleet_proto::v1::embed_server::EmbedServer;
use teifleet_proto::v1::info_server::InfoServer;
use teifleet_proto::v1::predict_server::PredictServer;
use teifleet_proto::v1::rerank_server::RerankServer;
use teifleet_proto::v1::tokenize_server::TokenizeServer;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::batcher::{self, BatchLimits, Slowdown};
use crate::config::{Fault, SimConfig};
use crate::metrics::Metrics;
use crate::service::{Sim, health_service};
use crate::shared_device::SharedDevice;
use crate::state::State;
use crate::stats::{Counters, Stats};
use crate::{SimError, admin};

/// How long [`SimHandle::shutdown`] lets open calls and connections finish before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// A running simulator. Dropping it stops serving too, without waiting.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    state: Arc<State>,
    tasks: Vec<JoinHandle<()>>,
}

/// Binds the gRPC (and, if configured, admin) ports and serves in the background.
pub async fn start(config: SimConfig) -> Result<SimHandle, SimError> {
    config.validate()?;
    let listener = bind(config.listen).await?;
    let addr = local_addr(&listener, config.listen)?;
    let admin_listener = match config.admin_listen {
        Some(admin) => Some(bind(admin).await?),
        None => None,
    };
    let admin_addr = match (&admin_listener, config.admin_listen) {
        (Some(l), Some(asked)) => Some(local_addr(l, asked)?),
        _ => None,
    };

    let shutdown = CancellationToken::new();
    let counters = Arc::new(Counters::default());
    let metrics = Metrics::new(Arc::clone(&counters))?;
    let limits = BatchLimits::new(&config);
    let slowdown = Arc::new(Slowdown::default());
    let shared = config.shared_device.as_deref().map(SharedDevice::open).transpose()?.map(Arc::new);
    let queue =
        batcher::spawn(limits, shared, Arc::clone(&slowdown), metrics.clone(), Arc::clone(&counters), shutdown.clone());
    let state = Arc::new(State {
        slots: Arc::new(Semaphore::new(config.max_concurrent_requests)),
        config,
        counters,
        fault: watch::Sender::new(Fault::None),
        metrics,
        queue,
        slowdown,
        shutdown: shutdown.clone(),
    });

    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(teifleet_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let sim = Sim::new(Arc::clone(&state));
    let router = tonic::transport::Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .add_service(health_service(sim.clone()))
        .add_service(reflection)
        .add_service(InfoServer::new(sim.clone()))
        .add_service(EmbedServer::new(sim.clone()))
        .add_service(PredictServer::new(sim.clone()))
        .add_service(RerankServer::new(sim.clone()))
        .add_service(TokenizeServer::new(sim));
    let grpc_shutdown = shutdown.clone().cancelled_owned();
    // Without TCP_NODELAY on accepted sockets, Nagle's algorithm and delayed ACKs add ~40 ms to
    // small answers: TEI itself sets it, and so must a faithful simulator.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut tasks = vec![tokio::spawn(async move {
        if let Err(error) = router.serve_with_incoming_shutdown(incoming, grpc_shutdown).await {
            tracing::error!(%error, "gRPC server failed");
        }
    })];
    if let Some(admin_listener) = admin_listener {
        tasks.push(tokio::spawn(admin::serve(admin_listener, Arc::clone(&state), shutdown)));
    }
    tracing::info!(
        %addr,
        admin = admin_addr.map(tracing::field::display),
        model_id = %state.config.model_id,
        device = %state.config.device,
        "TEI simulator serving"
    );
    Ok(SimHandle { addr, admin_addr, state, tasks })
}

/// A stream's receive window: h2's own default (hyper's is 1 MiB), so that what one stream can
/// have waiting unread is bounded by flow control well inside [`CONNECTION_WINDOW`]'s budget.
const STREAM_WINDOW: u32 = 65_535;

/// The connection's receive window. h2 (0.4.16 on) sends GOAWAY `too_many_data_frames` once the
/// DATA frames buffered unread cost more than a budget (0.4.19 on: half of this window), each
/// frame under 256 bytes counted as 256 less its payload: with hyper's 1 MiB, a client streaming
/// 17-byte messages (grpcio in tests/clients/test_streams.py) was cut off when the stream's reader
/// fell ~2,200 messages behind, as it does on a busy machine. Half of this exceeds
/// [`STREAM_WINDOW`] × 255, what one stream's window of 1-byte frames costs, so a single stream,
/// however small its frames and however late it is read, stays within the budget: its client
/// waits on flow control instead.
const CONNECTION_WINDOW: u32 = 64 << 20;

async fn bind(addr: SocketAddr) -> Result<TcpListener, SimError> {
    TcpListener::bind(addr).await.map_err(|source| SimError::Bind { addr, source })
}

fn local_addr(listener: &TcpListener, asked: SocketAddr) -> Result<SocketAddr, SimError> {
    listener.local_addr().map_err(|source| SimError::Bind { addr: asked, source })
}

impl SimHandle {
    /// The gRPC address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin HTTP address actually bound, if one was asked for.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    pub fn stats(&self) -> Stats {
        self.state.counters.snapshot()
    }

    /// Zeroes the counters; `in_flight` keeps counting what still holds a slot.
    pub fn reset_stats(&self) {
        self.state.counters.reset();
    }

    /// Makes the device `factor` times slower from the next batch on (2.0: half the capacity), as
    /// a throttled or shared GPU would be; 1.0 restores it.
    pub fn set_slowdown(&self, factor: f64) {
        self.state.slowdown.set(factor);
    }

    /// Takes effect at once: the next call, health check or stalled request sees it.
    pub fn set_fault(&self, fault: Fault) {
        self.state.set_fault(fault);
    }

    pub fn fault(&self) -> Fault {
        self.state.fault()
    }

    /// Stops serving: pending and stalled requests answer `UNAVAILABLE`, then the servers get a
    /// short grace period before being cut off. The ports are closed when this returns.
    pub async fn shutdown(mut self) {
        self.state.shutdown.cancel();
        for mut task in std::mem::take(&mut self.tasks) {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await.is_err() {
                task.abort();
                // Waiting for the abort makes sure the listener has been dropped.
                let _ = task.await;
            }
        }
        tracing::info!(addr = %self.addr, "TEI simulator stopped");
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.state.shutdown.cancel();
    }
}
