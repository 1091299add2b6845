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
    /// The activator's admin route answering the calls it holds per pool as JSON
    /// (`teifleet_crds::ActivatorReport`): how the operator learns that a pool at zero is called.
    pub const ACTIVATIONS_PATH: &str = "/activations";
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
    /// What every teifleet header's name starts with.
    pub const PREFIX: &str = "x-teifleet-";
    /// `critical`, `standard` (default) or `sheddable`.
    pub const PRIORITY: &str = "x-teifleet-priority";
    /// Route to the pool of this name.
    pub const POOL: &str = "x-teifleet-pool";
    /// Route to a pool serving this model.
    pub const MODEL: &str = "x-teifleet-model";
    /// The tenant a call is accounted to, for fair sharing within a priority.
    pub const TENANT: &str = "x-teifleet-tenant";
    /// `query` (default: interactive calls, served first) or `ingest` (bulk work: takes the room
    /// queries leave, keeps a floor share, waits rather than being refused).
    pub const LANE: &str = "x-teifleet-lane";
    /// Set on a request one multiplexer forwards to another pool's, naming the forwarder.
    pub const FORWARDED_BY: &str = "x-teifleet-forwarded-by";
    /// Set on a call one sidecar spills to a sibling replica of its own pool, naming the sender:
    /// the sibling admits it only if it has room at once, and never spills it again.
    pub const SPILLED_FROM: &str = "x-teifleet-spilled-from";
    /// On a call one sidecar spills to a sibling: the pool's peer key, which proves the call comes
    /// from a sibling (the operator's per-pool Secret). Without it, `x-teifleet-spilled-from` is a
    /// client's claim and is ignored. Never passed on to TEI or beyond the sibling.
    pub const PEER_KEY: &str = "x-teifleet-peer-key";
    /// In the trailers of a spilled call the sibling had no room for: the sender serves the call
    /// itself instead (it is not an answer for the caller).
    pub const SPILL_REFUSED: &str = "x-teifleet-spill-refused";
    /// ORCA's per-call load report on gRPC answers (gRPC A51): a serialized
    /// `xds.data.orca.v3.OrcaLoadReport`, in the trailers.
    pub const ENDPOINT_LOAD_METRICS_BIN: &str = "endpoint-load-metrics-bin";
    /// The same report on HTTP answers, in Envoy's text form (`TEXT key=value,...`).
    pub const ENDPOINT_LOAD_METRICS: &str = "endpoint-load-metrics";
    /// gRPC's deadline header.
    pub const GRPC_TIMEOUT: &str = "grpc-timeout";
    /// gRPC's standard retry hint, sent in the trailers of shed requests.
    pub const RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
    /// An HTTP caller's time budget in milliseconds (gRPC callers use `grpc-timeout`).
    pub const TIMEOUT_MS: &str = "x-teifleet-timeout-ms";
    /// What a request routed to another pool carries to that pool's sidecar: its key, urgency,
    /// tenant and destination. gRPC calls pass all their metadata on; HTTP requests, which
    /// become gRPC calls, carry these headers.
    pub const CARRIED_TO_PEERS: [&str; 6] = ["authorization", PRIORITY, LANE, TENANT, POOL, MODEL];
}

#[cfg(test)]
mod tests {
    use super::headers::*;

    #[test]
    fn every_teifleet_header_starts_with_the_prefix() {
        for name in
            [PRIORITY, LANE, POOL, MODEL, TENANT, FORWARDED_BY, SPILLED_FROM, PEER_KEY, SPILL_REFUSED, TIMEOUT_MS]
        {
            assert!(name.starts_with(PREFIX), "{name}");
        }
    }
}
