use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use teifleet_crds::labels;
use teifleet_wire::ports;

use super::Owner;

fn grpc_port() -> ServicePort {
    ServicePort {
        name: Some("grpc".into()),
        // Clients use the sidecar's own port number, so the Service and the pod agree on one.
        port: i32::from(ports::MULTIPLEXER_GRPC),
        target_port: Some(IntOrString::String("grpc".into())),
        protocol: Some("TCP".into()),
        // Tells meshes and gateways the port speaks cleartext HTTP/2.
        app_protocol: Some("kubernetes.io/h2c".into()),
        ..ServicePort::default()
    }
}

/// TEI's HTTP API and OpenAI's embeddings route, served by the sidecar on a port of its own.
fn http_port() -> ServicePort {
    ServicePort {
        name: Some("http".into()),
        port: i32::from(ports::MULTIPLEXER_HTTP),
        target_port: Some(IntOrString::String("http".into())),
        protocol: Some("TCP".into()),
        app_protocol: Some("http".into()),
        ..ServicePort::default()
    }
}

/// The ClusterIP Service clients point at: `<pool>.<namespace>.svc:50051` for gRPC,
/// `http://<pool>.<namespace>.svc:8000` for TEI's HTTP API and OpenAI's embeddings.
pub(super) fn service(owner: &Owner) -> Service {
    Service {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(owner.selector()),
            ports: Some(vec![grpc_port(), http_port()]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The headless Service: one DNS record per ready pod, for peer discovery and client-side
/// balancing (gRPC pins a connection to one pod behind a ClusterIP).
pub(super) fn peers_service(owner: &Owner) -> Service {
    Service {
        metadata: owner.meta(labels::peers_service_name(&owner.name)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(owner.selector()),
            ports: Some(vec![grpc_port()]),
            publish_not_ready_addresses: Some(false),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
