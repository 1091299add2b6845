//! The names and numbers teifleet's parts must agree on, defined once: ports and request metadata.
//! No dependencies, so the load generator can use them without linking Kubernetes.
#![forbid(unsafe_code)]

pub mod duration;

/// Ports, as the operator renders them into pods and Services and as the binaries default to.
pub mod ports {
    /// The multiplexer's gRPC port: what the pool Services target and clients call.
    pub const MULTIPLEXER_GRPC: u16 = 50051;
    /// The multiplexer's admin port: `/metrics`, `/healthz`, `/readyz`.
    pub const MULTIPLEXER_ADMIN: u16 = 9090;
    /// The multiplexer's HTTP port: TEI's HTTP API and OpenAI's embeddings route, translated to
    /// `tei.v1` calls under the same admission as gRPC's.
    pub const MULTIPLEXER_HTTP: u16 = 8000;
    /// TEI's gRPC port inside the pod (TEI's `--port`).
    pub const TEI_GRPC: u16 = 8080;
    /// TEI's Prometheus port (TEI's `--prometheus-port`).
    pub const TEI_METRICS: u16 = 9000;
    /// The operator's admin port: `/metrics`, `/healthz`, `/readyz`.
    pub const OPERATOR_ADMIN: u16 = 8080;
}

/// What the sidecar's admin port tells the operator.
pub mod sidecar_admin {
    /// The sidecar's admin route answering its pool's admission state as JSON
    /// (`teifleet_crds::SidecarAdmission`): the limit in force, the ceiling, what is in flight and
    /// queued. The operator sums the answers into an adaptive pool's status.
    pub const ADMISSION_PATH: &str = "/admission";
}

/// How the kubelet learns TEI's health. TEI listens on the pod's loopback only (so nothing can call
/// it around the multiplexer), out of reach of the kubelet's probes; the sidecar asks TEI in its
/// place and answers on its admin port.
pub mod tei_health {
    /// The sidecar's admin route that asks TEI's gRPC health service: 200 while TEI says
    /// SERVING, 503 with the reason otherwise.
    pub const PATH: &str = "/upstream/healthz";
    /// How long the sidecar waits for TEI's answer. The probes the operator renders wait longer,
    /// so a slow TEI gets a 503 that says why instead of a probe timeout.
    pub const CHECK_TIMEOUT_SECONDS: u64 = 1;
    /// The sidecar's admin route relaying TEI's own Prometheus metrics (`te_*`), which TEI serves
    /// on the pod's loopback (`--prometheus-port`) where no scraper can reach them.
    pub const METRICS_PATH: &str = "/upstream/metrics";
}

/// Request and response metadata (gRPC metadata, HTTP headers).
pub mod headers {
    /// `critical`, `standard` (default) or `sheddable`.
    pub const PRIORITY: &str = "x-teifleet-priority";
    /// Route to the pool of this name.
    pub const POOL: &str = "x-teifleet-pool";
    /// Route to a pool serving this model.
    pub const MODEL: &str = "x-teifleet-model";
    /// The tenant a call is accounted to, for fair sharing within a priority.
    pub const TENANT: &str = "x-teifleet-tenant";
    /// Set on a request one multiplexer forwards to another pool's, naming the forwarder.
    pub const FORWARDED_BY: &str = "x-teifleet-forwarded-by";
    /// gRPC's deadline header.
    pub const GRPC_TIMEOUT: &str = "grpc-timeout";
    /// gRPC's standard retry hint, sent in the trailers of shed requests.
    pub const RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
    /// An HTTP caller's time budget in milliseconds (gRPC callers use `grpc-timeout`).
    pub const TIMEOUT_MS: &str = "x-teifleet-timeout-ms";
    /// What a request routed to another pool carries to that pool's sidecar: its key, urgency,
    /// tenant and destination. gRPC calls pass all their metadata on; HTTP requests, which
    /// become gRPC calls, carry these headers.
    pub const CARRIED_TO_PEERS: [&str; 5] = ["authorization", PRIORITY, TENANT, POOL, MODEL];
}
