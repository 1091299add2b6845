//! Runs the multiplexer: the gRPC server with health and reflection, the admin port, TEI health
//! checks, and graceful draining.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use teifleet_runtime::duration;
use teifleet_runtime::http_server::{self, ConnectionCap, Refused, ServerBounds};
use teifleet_runtime::tls::ServerTls;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;

use crate::activator::PoolNaming;
use crate::admission::memory::{MemoryBudget, MemorySettings};
use crate::forward::Forwarder;
use crate::forward::pools::PoolTable;
use crate::front::Readiness;
use crate::front::grpc::reflection::Reflection;
use crate::front::grpc::server::{self as grpc, Dispatch};
use crate::front::grpc::service::RpcService;
use crate::front::http::HttpSettings;
use crate::front::tei_manager;
use crate::gate::auth::Gate;
use crate::gate::door::{DoorSettings, HoldBounds};
use crate::report::metrics::Metrics;
use crate::run::admin;
use crate::vocab::Protocol;
use crate::vocab::SetupError;
use crate::vocab::rpc;

type Result<T> = std::result::Result<T, SetupError>;

/// How long an idle multiplexer (no call in flight, none arriving) keeps serving after a shutdown
/// request before it stops waiting out the drain delay.
const IDLE_QUIET: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub admin_listen: Option<SocketAddr>,
    /// TEI's HTTP API and OpenAI's embeddings route (`crate::front::http`), beside gRPC; none: off.
    pub http_listen: Option<SocketAddr>,
    pub http: HttpSettings,
    /// The API-key check both fronts run first (`crate::gate::auth`); off unless a source sets keys.
    pub auth: Arc<Gate>,
    /// Written into the hop marker of forwarded requests (the pod name in Kubernetes).
    pub identity: String,
    pub max_message_bytes: usize,
    pub max_concurrent_streams: u32,
    /// Connections older than this get a GOAWAY, so clients behind a ClusterIP rebalance.
    pub max_connection_age: Duration,
    pub max_connection_age_grace: Duration,
    /// After a shutdown request, how long to keep serving while endpoints stop routing here.
    pub drain_delay: Duration,
    /// How long requests in flight may take to finish once draining.
    pub drain_timeout: Duration,
    pub health_interval: Duration,
    /// TEI's Prometheus endpoint, relayed on the admin port (`None`: not relayed).
    pub tei_metrics: Option<http::Uri>,
    /// What one client may make the gRPC and HTTP ports hold.
    pub bounds: InputBounds,
    /// How many of those ports' connections one client address may hold, and how long an idle
    /// one is kept.
    pub connections: ConnectionBounds,
    /// TLS on the gRPC and HTTP ports (plain text while off); a source changes it live. Calls to
    /// `https://` upstreams use the same certificate set (`PoolTable::with_dialer`).
    pub tls: Arc<ServerTls>,
    /// The activator role: a call that names no pool is for the pool of the naming's namespace
    /// whose Service name or address its client dialled (`crate::activator::PoolNaming`, kept
    /// current by the activator's source).
    pub pool_naming: Option<Arc<PoolNaming>>,
    /// The process's memory budget (`crate::admission::memory`).
    pub memory: MemorySettings,
    /// How many calls the pools' doors hold, and how long (`crate::gate::door`).
    pub door: DoorSettings,
    /// Whether gRPC server reflection is served; a source may switch it live.
    pub reflection: Arc<Reflection>,
}

/// Bounds on what one client can make a front hold before admission sees a call. Declared once:
/// these are the binary's flags, and their defaults are [`Default`]'s.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct InputBounds {
    /// Connections open at once on each of the gRPC and HTTP ports; one more is closed at once.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Time to send a request's head (on the gRPC port, a new connection's HTTP/2 preface), and
    /// the longest an HTTP/1.1 keep-alive connection may idle.
    #[arg(long, default_value = "10s", value_parser = duration::parse_flag)]
    pub header_read_timeout: Duration,
    /// Time to send a whole HTTP request body (408 beyond), or a unary gRPC call's request
    /// message once the call is admitted (INVALID_ARGUMENT beyond): a body trickled a byte at a
    /// time holds its connection, its buffer and any permit no longer than this.
    #[arg(long, default_value = "30s", value_parser = duration::parse_flag)]
    pub body_timeout: Duration,
    /// Bytes of one request's headers (HTTP/2's header list, HTTP/1.1's head).
    #[arg(long, default_value_t = 16 * 1024)]
    pub max_header_bytes: usize,
}

impl Default for InputBounds {
    fn default() -> Self {
        crate::vocab::flags::defaults()
    }
}

impl InputBounds {
    fn http_server(&self, connections: &ConnectionBounds, max_concurrent_streams: u32) -> ServerBounds {
        ServerBounds {
            max_connections: self.max_connections,
            max_connections_per_peer: connections.max_connections_per_peer,
            idle_timeout: connections.idle_connection_timeout,
            header_read_timeout: self.header_read_timeout,
            max_headers: 100,
            max_header_bytes: self.max_header_bytes,
            max_concurrent_streams,
            probe_slots: 0,
            probe_paths: &[],
        }
    }
}

/// What one client address may hold of the gRPC and HTTP ports' connections, and for how long
/// unused. Declared once: these are the binary's flags, and their defaults are [`Default`]'s.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct ConnectionBounds {
    /// Connections open at once from one client address on each of the gRPC and HTTP ports; one
    /// more from it is closed at once. A quarter of `--max-connections` by default: one client
    /// cannot lock the others out, and many clients behind one address (a node's SNAT, an
    /// ingress) still fit. Siblings and the activator connect once each.
    #[arg(long, default_value_t = 256)]
    pub max_connections_per_peer: usize,
    /// How long a connection with no call open is kept on the gRPC and HTTP ports: an HTTP/2
    /// connection then gets a GOAWAY (clients reconnect when they next call), an HTTP/1.1
    /// keep-alive one is closed. Longer than the keepalive PINGs' interval, so a client's pool
    /// of connections survives a quiet spell; short enough that abandoned ones give back their
    /// places within a minute.
    #[arg(long, default_value = "30s", value_parser = duration::parse_flag)]
    pub idle_connection_timeout: Duration,
}

impl Default for ConnectionBounds {
    fn default() -> Self {
        crate::vocab::flags::defaults()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: None,
            http_listen: None,
            http: HttpSettings::default(),
            auth: Arc::new(Gate::off()),
            identity: "teifleet-multiplexer".into(),
            max_message_bytes: 4 * 1024 * 1024,
            max_concurrent_streams: 256,
            max_connection_age: Duration::from_secs(300),
            max_connection_age_grace: Duration::from_secs(30),
            drain_delay: Duration::ZERO,
            drain_timeout: Duration::from_secs(30),
            health_interval: Duration::from_secs(2),
            tei_metrics: None,
            bounds: InputBounds::default(),
            connections: ConnectionBounds::default(),
            tls: Arc::new(ServerTls::off()),
            pool_naming: None,
            memory: MemorySettings::default(),
            door: DoorSettings::default(),
            reflection: Arc::default(),
        }
    }
}

/// A started multiplexer.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: Option<SocketAddr>,
    pub http_addr: Option<SocketAddr>,
    pub forwarder: Arc<Forwarder>,
    pub readiness: Arc<Readiness>,
    pub metrics: Metrics,
    /// The process's memory budget, every front's bodies, doors and answers charged to it.
    pub memory: Arc<MemoryBudget>,
    stop: CancellationToken,
    task: JoinHandle<Result<()>>,
}

impl Running {
    /// Drains and stops: not ready at once, serving for the drain delay, then refusing new calls
    /// while calls in flight finish (up to the drain timeout).
    pub async fn shutdown(self) -> Result<()> {
        self.stop.cancel();
        self.wait().await
    }

    /// A token that starts the same drain when cancelled (for signal handlers).
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Waits until the server has stopped by itself or through the stop token.
    pub async fn wait(self) -> Result<()> {
        self.task.await.map_err(|e| SetupError::Task { task: "the server", reason: e.to_string() })?
    }
}

/// Binds and starts serving `pools`, whose own pool is `pools.own_name()`.
pub async fn start(settings: Settings, pools: Arc<PoolTable>, metrics: Metrics) -> Result<Running> {
    let bind = |addr: SocketAddr| move |error| SetupError::Bind { addr, error };
    let listener = TcpListener::bind(settings.listen).await.map_err(bind(settings.listen))?;
    let grpc_addr = listener.local_addr().map_err(bind(settings.listen))?;
    let admin_listener = match settings.admin_listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(bind(addr))?),
        None => None,
    };
    let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    let http_listener = match settings.http_listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(bind(addr))?),
        None => None,
    };
    let http_addr = http_listener.as_ref().and_then(|l| l.local_addr().ok());

    let forwarder =
        Arc::new(Forwarder::new(pools.clone(), metrics.clone(), &settings.identity, settings.max_message_bytes));
    let readiness =
        Arc::new(Readiness { pools: pools.clone(), upstream_serving: Default::default(), accepting: true.into() });
    let stop = CancellationToken::new();
    let (reporter, health_service) = tonic_health::server::health_reporter();

    let helpers = CancellationToken::new();
    if let Some(listener) = admin_listener {
        let router = admin::router(
            &metrics,
            readiness.clone(),
            settings.tls.clone(),
            forwarder.activity().clone(),
            settings.tei_metrics.clone(),
        );
        let (metrics, helpers) = (metrics.clone(), helpers.clone());
        tokio::spawn(async move { admin::serve(listener, router, &metrics, helpers).await });
    }
    tokio::spawn(check_upstream(readiness.clone(), reporter.clone(), settings.health_interval, helpers.clone()));

    // Both reflection versions, as TEI serves them: grpcurl and ghz still speak v1alpha. Always
    // registered; `settings.reflection` says whether a call reaches them.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            // tei-manager's package, with tei.v1 (which it imports) inside it.
            .register_encoded_file_descriptor_set(teifleet_proto::TEI_MULTIPLEXER_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1().map_err(|e| SetupError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(|e| SetupError::Reflection(e.to_string()))?;
    let routes = tonic::service::Routes::new(health_service).add_service(reflection_v1).add_service(reflection_v1alpha);
    let (gate, body_timeout) = (settings.auth.clone(), settings.bounds.body_timeout);
    let memory = metrics.memory_budget(settings.memory.budget());
    forwarder.pools.set_memory(memory.clone())?;
    tracing::info!(
        memory_limit = settings.memory.limit(),
        memory_budget = memory.budget(),
        "memory budget for requests before admission"
    );
    let door = Arc::new(HoldBounds::new(&settings.door, memory.clone()));
    // tei-manager's API beside tei.v1, its wrapped RPCs served by tei.v1's own rows.
    let tei_manager = tei_manager::Context {
        forwarder: forwarder.clone(),
        gate: gate.clone(),
        memory: memory.clone(),
        message_timeout: body_timeout,
        max_message: settings.max_message_bytes,
        max_client_batch_size: settings.http.max_client_batch_size,
    };
    let routes = routes.add_service(tei_manager::TeiManager::new(tei_manager, |rpc| {
        RpcService::new(rpc, forwarder.clone(), gate.clone(), body_timeout, door.clone())
    }));
    let dispatch = Dispatch::new(
        |rpc| RpcService::new(rpc, forwarder.clone(), gate.clone(), body_timeout, door.clone()),
        routes,
        settings.pool_naming.clone(),
        memory.clone(),
        Arc::new(metrics.refusal_counter(Protocol::Grpc.as_str())),
        settings.reflection.clone(),
    );
    let h2_bounds = grpc::Bounds {
        max_concurrent_streams: settings.max_concurrent_streams,
        max_header_list_bytes: u32::try_from(settings.bounds.max_header_bytes).unwrap_or(u32::MAX),
        // Clients cancel freely under overload (that is the point of deadlines); h2's default of
        // 20 resets before the server accepts them would close the whole connection, failing
        // every other call on it. Bounded still, against rapid-reset floods.
        max_pending_accept_reset_streams: settings.max_concurrent_streams as usize,
        keepalive_interval: Duration::from_secs(30),
        keepalive_timeout: Duration::from_secs(10),
        max_connection_age: settings.max_connection_age,
        max_connection_age_grace: settings.max_connection_age_grace,
        idle_timeout: settings.connections.idle_connection_timeout,
    };

    let server_stop = CancellationToken::new();
    // Nagle's algorithm meets delayed ACKs and adds ~40 ms to every small answer.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let bounds = &settings.bounds;
    let refused: Refused = Arc::new(metrics.refusal_counter(Protocol::Grpc.as_str()));
    let per_peer = settings.connections.max_connections_per_peer;
    let cap = ConnectionCap::new(bounds.max_connections, per_peer, bounds.header_read_timeout, refused.clone());
    let incoming =
        crate::front::grpc::connections::bounded(incoming, cap, bounds.max_connections, settings.tls.clone(), refused);
    let server = tokio::spawn(grpc::serve(incoming, dispatch, h2_bounds, server_stop.clone()));
    // The HTTP front shares the forwarder, so it drains with gRPC: refused once draining starts,
    // its calls in flight finished within the same drain timeout.
    let http_server = http_listener.map(|listener| {
        let mut app = crate::front::http::router(
            forwarder.clone(),
            readiness.clone(),
            settings.http.clone(),
            settings.auth.clone(),
            settings.bounds.body_timeout,
            memory.clone(),
            door.clone(),
        );
        if let Some(naming) = settings.pool_naming.clone() {
            app = app.layer(axum::middleware::from_fn_with_state(naming, name_pool_from_authority));
        }
        let stopped = server_stop.clone().cancelled_owned();
        // Small: an HTTP/2 stream is one whole request, its body buffered, where a gRPC stream's
        // call waits at the door or in the queue before its body is read.
        let bounds = settings.bounds.http_server(&settings.connections, settings.http.http_max_concurrent_streams);
        let (refused, tls) = (metrics.refusal_counter(Protocol::Http.as_str()), Some(settings.tls.clone()));
        tokio::spawn(async move { http_server::serve_tls(listener, app, &bounds, tls, refused, stopped).await })
    });
    // One line with every bound address (http_addr: the HTTP front, TEI's HTTP API and OpenAI
    // embeddings): a caller that asked for port 0 (tests/clients/run.sh, the multiplexer's process
    // tests) reads its ports from it once it appears, every listener bound.
    tracing::info!(
        %grpc_addr,
        admin_addr = admin_addr.map(tracing::field::display),
        http_addr = http_addr.map(tracing::field::display),
        pool = pools.own_name(),
        "multiplexer serving"
    );

    let task = {
        let (stop, readiness, forwarder) = (stop.clone(), readiness.clone(), forwarder.clone());
        let activations = pools.activations().cloned();
        tokio::spawn(async move {
            stop.cancelled().await;
            tracing::info!("draining: not ready, then refusing new calls and finishing in-flight ones");
            readiness.accepting.store(false, Ordering::Relaxed);
            set_serving(&reporter, false).await;
            match &activations {
                // The operator takes an activator out of the pools' Services at its next look at
                // them, not when the pod stops being ready: calls may arrive, on new connections
                // too, for the whole delay, idle or not. Those held meanwhile are served if their
                // pool becomes ready.
                Some(_) => tokio::time::sleep(settings.drain_delay).await,
                None => wait_out_drain_delay(&forwarder, settings.drain_delay).await,
            }
            forwarder.start_draining();
            server_stop.cancel();
            if let Some(activations) = &activations {
                // Every call still held is answered UNAVAILABLE with a retry hint, on connections
                // now closing: the client's retry reaches another activator replica.
                tracing::info!("the activator stops holding calls: those held are answered with a retry hint");
                activations.stop_holding();
            }
            let both = async {
                if let Some(http_server) = http_server {
                    match http_server.await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(error = %e, "the HTTP front failed"),
                        Err(e) => tracing::warn!(error = %e, "the HTTP front failed"),
                    }
                }
                server.await
            };
            let outcome = match tokio::time::timeout(settings.drain_timeout, both).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(SetupError::Task { task: "the gRPC server", reason: e.to_string() }),
                Err(_) => {
                    tracing::warn!(
                        timeout_ms = settings.drain_timeout.as_millis() as u64,
                        "calls still in flight after the drain timeout"
                    );
                    Ok(())
                }
            };
            helpers.cancel();
            outcome
        })
    };
    Ok(Running { grpc_addr, admin_addr, http_addr, forwarder, readiness, metrics, memory, stop, task })
}

/// The activator's step naming each request's pool from the name or address its client dialled
/// (or the pool whose client CA checked its certificate), and refusing a request for a pool with
/// mutual TLS that did not come with a certificate checked for it.
async fn name_pool_from_authority(
    axum::extract::State(naming): axum::extract::State<Arc<PoolNaming>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let uri = request.uri().clone();
    let client = crate::gate::auth::certified(request.extensions()).cloned();
    match naming.name_pool_for(request.headers_mut(), &uri, client.as_ref()) {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            crate::front::http::error::HttpError::Call(refused).into_response(crate::front::http::error::Flavor::Tei)
        }
    }
}

/// Keeps serving through the drain delay while endpoints stop routing here; a multiplexer that
/// has had no call in flight or arriving for [`IDLE_QUIET`] stops waiting early.
async fn wait_out_drain_delay(forwarder: &Forwarder, drain_delay: Duration) {
    let until = tokio::time::Instant::now() + drain_delay;
    let quiet = IDLE_QUIET.min(drain_delay);
    while tokio::time::Instant::now() < until {
        if forwarder.activity().idle_for() >= quiet {
            tracing::info!("idle: no calls in flight or arriving, stopping now");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50).min(drain_delay)).await;
    }
}

async fn set_serving(reporter: &HealthReporter, serving: bool) {
    let status = if serving { tonic_health::ServingStatus::Serving } else { tonic_health::ServingStatus::NotServing };
    reporter.set_service_status("", status).await;
    for service in rpc::services() {
        reporter.set_service_status(service, status).await;
    }
}

/// Polls the own pool's TEI with standard gRPC health checks and mirrors the result (and the
/// rest of readiness) into this server's own health service.
async fn check_upstream(
    readiness: Arc<Readiness>,
    reporter: HealthReporter,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut last = None;
    loop {
        let serving = crate::run::admin::check_tei(&readiness.pools).await.is_ok();
        readiness.upstream_serving.store(serving, Ordering::Relaxed);
        let ready = readiness.ready().is_ok();
        if last != Some(ready) {
            set_serving(&reporter, ready).await;
            match readiness.ready() {
                Ok(()) => tracing::info!(ready, "readiness changed"),
                Err(reason) => tracing::info!(ready, reason, "readiness changed"),
            }
            last = Some(ready);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
