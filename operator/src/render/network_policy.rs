//! The pool's NetworkPolicy: only the sidecar's ports take connections. TEI already listens on the
//! pod's loopback only; this closes the pods further where the network plugin enforces policies.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use teifleet_crds::EmbeddingPool;
use teifleet_wire::ports;

use super::{Owner, RenderConfig};

/// The label the API server sets on every namespace (Kubernetes 1.21 and later): its name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

pub(super) fn tcp(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    }
}

/// Who may reach the admin port: every pod of the pool's namespace, of the operator's (it asks
/// the sidecars for their admission), and of the namespaces the spec selects (where Prometheus
/// runs).
pub(super) fn admin_peers(pool: &EmbeddingPool, config: &RenderConfig) -> Vec<NetworkPolicyPeer> {
    // A peer with only a pod selector stays within the policy's own namespace.
    let own_namespace =
        NetworkPolicyPeer { pod_selector: Some(LabelSelector::default()), ..NetworkPolicyPeer::default() };
    let selected =
        pool.spec.network_policy.metrics_namespace_selector.clone().map(|namespaces| NetworkPolicyPeer {
            namespace_selector: Some(namespaces),
            ..NetworkPolicyPeer::default()
        });
    let operator = config.operator_namespace.as_ref().map(|namespace| NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some([(NAMESPACE_NAME_LABEL.to_owned(), namespace.clone())].into()),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    });
    std::iter::once(own_namespace).chain(operator).chain(selected).collect()
}

/// Calls reach the sidecar's gRPC and HTTP ports from anywhere (in-cluster clients, gateways,
/// other pools' sidecars, the activator, and the pool's own sidecars spilling calls to a sibling's
/// gRPC port); its admin port only from the peers above; nothing else reaches the pods.
/// Egress stays open: TEI downloads models and the sidecar watches the API server. `None` when
/// the pool turns it off.
pub(super) fn network_policy(owner: &Owner, pool: &EmbeddingPool, config: &RenderConfig) -> Option<NetworkPolicy> {
    if !pool.spec.network_policy.enabled {
        return None;
    }
    let clients = NetworkPolicyIngressRule {
        from: None,
        ports: Some(vec![tcp(ports::MULTIPLEXER_GRPC), tcp(ports::MULTIPLEXER_HTTP)]),
    };
    let admin = NetworkPolicyIngressRule {
        from: Some(admin_peers(pool, config)),
        ports: Some(vec![tcp(ports::MULTIPLEXER_ADMIN)]),
    };
    Some(NetworkPolicy {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some(owner.selector()), ..LabelSelector::default() }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![clients, admin]),
            egress: None,
        }),
    })
}
