use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use teifleet_crds::{EmbeddingPool, labels};
use teifleet_wire::ports;

use super::Owner;

/// What meshes and gateways are told a port speaks (`appProtocol`). Kubernetes defines
/// `kubernetes.io/h2c` for cleartext HTTP/2 only; under TLS both ports speak the IANA service
/// `https` (HTTP over TLS, HTTP/2 chosen by ALPN), which tells a mesh to pass the bytes through
/// rather than read them as plain HTTP.
struct AppProtocols {
    grpc: &'static str,
    http: &'static str,
}

impl AppProtocols {
    fn of(pool: &EmbeddingPool) -> Self {
        if pool.spec.tls.is_some() {
            Self { grpc: "https", http: "https" }
        } else {
            Self { grpc: "kubernetes.io/h2c", http: "http" }
        }
    }
}

fn grpc_port(app_protocol: &str) -> ServicePort {
    ServicePort {
        name: Some("grpc".into()),
        // Clients use the sidecar's own port number, so the Service and the pod agree on one.
        port: i32::from(ports::MULTIPLEXER_GRPC),
        target_port: Some(IntOrString::String("grpc".into())),
        protocol: Some("TCP".into()),
        app_protocol: Some(app_protocol.into()),
        ..ServicePort::default()
    }
}

/// TEI's HTTP API and OpenAI's embeddings route, served by the sidecar on a port of its own.
fn http_port(app_protocol: &str) -> ServicePort {
    ServicePort {
        name: Some("http".into()),
        port: i32::from(ports::MULTIPLEXER_HTTP),
        target_port: Some(IntOrString::String("http".into())),
        protocol: Some("TCP".into()),
        app_protocol: Some(app_protocol.into()),
        ..ServicePort::default()
    }
}

/// The ClusterIP Service clients point at: `<pool>.<namespace>.svc:50051` for gRPC,
/// `http://<pool>.<namespace>.svc:8000` for TEI's HTTP API and OpenAI's embeddings (both over
/// TLS with `spec.tls`).
pub(super) fn service(owner: &Owner, pool: &EmbeddingPool) -> Service {
    let app_protocols = AppProtocols::of(pool);
    Service {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(owner.selector()),
            ports: Some(vec![grpc_port(app_protocols.grpc), http_port(app_protocols.http)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The headless Service: one DNS record per ready pod, for peer discovery and client-side
/// balancing (gRPC pins a connection to one pod behind a ClusterIP).
pub(super) fn peers_service(owner: &Owner, pool: &EmbeddingPool) -> Service {
    Service {
        metadata: owner.meta(labels::peers_service_name(&owner.name)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(owner.selector()),
            ports: Some(vec![grpc_port(AppProtocols::of(pool).grpc)]),
            publish_not_ready_addresses: Some(false),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
