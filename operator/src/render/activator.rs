//! The namespace's activator, rendered while any of its pools may scale to zero
//! (`autoscaling.minReplicas: 0`): a Deployment of the multiplexer in its `activator` role, with an
//! identity that may read EmbeddingPools, EndpointSlices and Services in the namespace (and by
//! name the keyed pools' key Secrets and the TLS pools' certificate Secrets and client CAs) and
//! nothing more;
//! and, for each such pool while it has no ready replica, an EndpointSlice that adds the
//! activator's pods to the pool's Service, so calls reach the activator instead of nothing.
//!
//! Every pool that may scale to zero owns the activator (owner references, none a controller),
//! so it goes with the last of them.
//!
//! The activator runs as `--activator-replicas` pods (2 by default), any of which holds any
//! pool's calls: spread over nodes where the scheduler can, under a PodDisruptionBudget that lets
//! a drain take one at a time, rolled one new pod ready before an old one goes. One that stops
//! keeps serving through its drain delay, long enough for the operator to take it out of the
//! pools' Services at its next look, then answers what it still holds with a retry hint.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Container, PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, ServiceAccount,
    TopologySpreadConstraint,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource as _;
use teifleet_crds::{EmbeddingPool, GROUP, labels};
use teifleet_wire::ports;

use super::RenderConfig;
use super::deployment::{RUN_AS, env_field, multiplexer_in_role, quantities, runtime_default_seccomp};
use super::network_policy::{admin_peers, tcp};
use super::rbac::read_rule;

/// The activator's name: its Deployment, ServiceAccount, Role and RoleBinding.
pub const NAME: &str = "teifleet-activator";
/// What the EndpointSlices the operator writes say manages them (the EndpointSlice controller
/// leaves slices of other managers alone).
const SLICE_MANAGER_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The activator holds calls and forwards bytes; it runs no model.
const REQUESTS: [(&str, &str); 2] = [("cpu", "50m"), ("memory", "64Mi")];
const LIMITS: [(&str, &str); 1] = [("memory", "256Mi")];

/// How long a stopping activator keeps taking and holding calls: the operator takes it out of
/// the pools' EndpointSlices at its next look at each pool (every 10 s for a pool that may scale
/// to zero), and kube-proxy follows within a second or two. Calls held meanwhile are served if
/// their pool becomes ready; at the end those still held are answered with a retry hint.
pub const DRAIN_DELAY_SECONDS: i64 = 15;
/// How long calls it already passed on to a ready replica may then take to finish.
const DRAIN_TIMEOUT_SECONDS: i64 = 30;
/// The kubelet's wait after SIGTERM: the drain delay, the drain and a margin.
const TERMINATION_GRACE_SECONDS: i64 = DRAIN_DELAY_SECONDS + DRAIN_TIMEOUT_SECONDS + 5;
/// A new activator pod counts as available (and an old one may go in a rollout) only after it
/// has been ready this long: time for the operator to add it to the pools' EndpointSlices.
const MIN_READY_SECONDS: i32 = 10;

/// Whether `pool` may scale to zero, and so needs the activator.
pub fn scales_to_zero(pool: &EmbeddingPool) -> bool {
    pool.spec.autoscaling.as_ref().is_some_and(|autoscaling| autoscaling.min_replicas == 0)
}

/// The activator's objects.
pub struct Activator {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub deployment: Deployment,
    /// Lets voluntary disruptions (a node drain) take one activator pod at a time; none for a
    /// single replica, as for a pool's.
    pub pdb: Option<PodDisruptionBudget>,
    /// Present unless the operator runs with `--activator-network-policy=false`.
    pub network_policy: Option<NetworkPolicy>,
}

/// Ports the activator may reach the API server on: 443 where a managed cluster's Service
/// endpoint answers, 6443 where kube-apiserver listens by default. A NetworkPolicy sees the
/// endpoint's port after the Service address is translated, so both are allowed.
const API_SERVER_PORTS: [u16; 2] = [443, 6443];

/// The activator's NetworkPolicy: its gRPC and HTTP ports take calls from anywhere in the cluster
/// (it stands in for the pools' Services); its admin port only from the peers a pool's own admin
/// port admits (the namespace, the operator's, the owners' metrics namespaces). Out, it reaches
/// DNS, the API server (it watches pools, EndpointSlices and Services) and the pools' sidecars, to
/// which it hands the calls it held; nothing else.
fn network_policy(meta: &ObjectMeta, owners: &[&EmbeddingPool], config: &RenderConfig) -> NetworkPolicy {
    let mut admin_from: Vec<NetworkPolicyPeer> = Vec::new();
    for peer in owners.iter().flat_map(|pool| admin_peers(pool, config)) {
        if !admin_from.contains(&peer) {
            admin_from.push(peer);
        }
    }
    let calls = NetworkPolicyIngressRule {
        from: None,
        ports: Some(vec![tcp(ports::MULTIPLEXER_GRPC), tcp(ports::MULTIPLEXER_HTTP)]),
    };
    let admin = NetworkPolicyIngressRule { from: Some(admin_from), ports: Some(vec![tcp(ports::MULTIPLEXER_ADMIN)]) };
    let dns = NetworkPolicyEgressRule {
        to: None,
        ports: Some(
            ["UDP", "TCP"]
                .into_iter()
                .map(|protocol| NetworkPolicyPort {
                    port: Some(IntOrString::Int(53)),
                    protocol: Some(protocol.into()),
                    ..NetworkPolicyPort::default()
                })
                .collect(),
        ),
    };
    let api_server = NetworkPolicyEgressRule { to: None, ports: Some(API_SERVER_PORTS.map(tcp).to_vec()) };
    let pools = NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([
                    (labels::COMPONENT_LABEL.into(), "embedding-server".into()),
                    (labels::PART_OF_LABEL.into(), labels::PART_OF.into()),
                ])),
                ..LabelSelector::default()
            }),
            ..NetworkPolicyPeer::default()
        }]),
        ports: Some(vec![tcp(ports::MULTIPLEXER_GRPC), tcp(ports::MULTIPLEXER_HTTP)]),
    };
    NetworkPolicy {
        metadata: meta.clone(),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some(selector()), ..LabelSelector::default() }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![calls, admin]),
            egress: Some(vec![dns, api_server, pools]),
        }),
    }
}

/// The labels that select the activator's pods.
fn selector() -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::COMPONENT_LABEL.into(), labels::ACTIVATOR_COMPONENT.into()),
        (labels::PART_OF_LABEL.into(), labels::PART_OF.into()),
    ])
}

fn pod_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::NAME_LABEL.into(), "teifleet-multiplexer".into()),
        (labels::COMPONENT_LABEL.into(), labels::ACTIVATOR_COMPONENT.into()),
        (labels::PART_OF_LABEL.into(), labels::PART_OF.into()),
        (labels::MANAGED_BY_LABEL.into(), labels::MANAGER.into()),
    ])
}

fn meta(namespace: &str, owners: &[&EmbeddingPool]) -> ObjectMeta {
    ObjectMeta {
        name: Some(NAME.into()),
        namespace: Some(namespace.into()),
        labels: Some(pod_labels()),
        owner_references: Some(owners.iter().filter_map(|pool| pool.owner_ref(&())).collect()),
        ..ObjectMeta::default()
    }
}

/// Spreads the activator's pods over nodes where the scheduler can (a node lost takes one, not
/// all); a cluster of one node still runs them all. Nodes only: a zone constraint would leave
/// every node unscored, and the pods unspread, on a cluster whose nodes carry no zone label.
fn spread() -> Vec<TopologySpreadConstraint> {
    vec![TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "kubernetes.io/hostname".into(),
        when_unsatisfiable: "ScheduleAnyway".into(),
        label_selector: Some(LabelSelector { match_labels: Some(selector()), ..LabelSelector::default() }),
        ..TopologySpreadConstraint::default()
    }]
}

/// The activator's PodDisruptionBudget: one pod at a time, when it runs more than one.
fn pdb(meta: &ObjectMeta, replicas: i32) -> Option<PodDisruptionBudget> {
    (replicas > 1).then(|| PodDisruptionBudget {
        metadata: meta.clone(),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector { match_labels: Some(selector()), ..LabelSelector::default() }),
            // Evicting an already-unhealthy pod never costs availability.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    })
}

/// The activator of `namespace`, owned by `owners` (the pools that may scale to zero, by name);
/// `None` when there are none. It is placed where the first of them may run (its node selector
/// and tolerations), without its GPUs.
pub fn render(namespace: &str, owners: &[&EmbeddingPool], config: &RenderConfig) -> Option<Activator> {
    let placement = &owners.first()?.spec.template;
    let meta = meta(namespace, owners);
    let replicas = config.activator_replicas.max(1);
    let resources = ResourceRequirements {
        requests: Some(quantities(REQUESTS)),
        limits: Some(quantities(LIMITS)),
        ..ResourceRequirements::default()
    };
    let mut args =
        vec![format!("--drain-delay={DRAIN_DELAY_SECONDS}s"), format!("--drain-timeout={DRAIN_TIMEOUT_SECONDS}s")];
    // The activator answers for every pool at zero on one port: no reflection there if any of
    // them keeps it from callers without a key. (A pool's own sidecars follow its spec live.)
    if owners.iter().any(|pool| !pool.spec.grpc_reflection()) {
        args.push("--grpc-reflection=false".to_owned());
    }
    let container = Container {
        env: Some(vec![
            env_field(labels::ENV_NAMESPACE, "metadata.namespace"),
            env_field(labels::ENV_POD_NAME, "metadata.name"),
        ]),
        ..multiplexer_in_role("activator", "activator", args, config, resources)
    };
    let pod = PodSpec {
        service_account_name: Some(NAME.into()),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..PodSecurityContext::default()
        }),
        containers: vec![container],
        tolerations: Some(placement.tolerations.clone()).filter(|t| !t.is_empty()),
        node_selector: Some(placement.node_selector.clone()).filter(|s| !s.is_empty()),
        image_pull_secrets: Some(placement.image_pull_secrets.clone()).filter(|s| !s.is_empty()),
        topology_spread_constraints: Some(spread()),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        ..PodSpec::default()
    };
    let deployment = Deployment {
        metadata: meta.clone(),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            // A new pod ready (and in the pools' slices) before an old one goes.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            min_ready_seconds: Some(MIN_READY_SECONDS),
            selector: LabelSelector { match_labels: Some(selector()), ..LabelSelector::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(pod_labels()), ..ObjectMeta::default() }),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    // Services: a pool's ClusterIP names the pool of a call whose client dialled the address
    // rather than the pool's name (the activator stands in behind that address at zero).
    let mut rules = vec![
        read_rule(GROUP, "embeddingpools"),
        read_rule("discovery.k8s.io", "endpointslices"),
        read_rule("", "services"),
    ];
    // The key Secrets of the pools it holds calls for, by name: a call without one of a pool's
    // keys is refused before it is held (or wakes the pool). Watched with a field selector on the
    // name, which the API server authorizes as a request for that one Secret.
    // And the TLS Secrets and client CAs (Secret or ConfigMap) of the pools with `spec.tls`, the
    // same way: it serves each such pool's certificate, and calls its replicas with it.
    let mut secrets: BTreeSet<String> =
        owners.iter().filter_map(|pool| Some(pool.spec.auth.as_ref()?.secret_name.clone())).collect();
    let mut config_maps = BTreeSet::new();
    for tls in owners.iter().filter_map(|pool| pool.spec.tls.as_ref()) {
        secrets.insert(tls.secret_name.clone());
        let client_ca = tls.client_ca.as_ref();
        secrets.extend(client_ca.and_then(|ca| ca.secret_name.clone()));
        config_maps.extend(client_ca.and_then(|ca| ca.config_map_name.clone()));
    }
    for (resource, names) in [("secrets", secrets), ("configmaps", config_maps)] {
        if !names.is_empty() {
            rules.push(PolicyRule { resource_names: Some(names.into_iter().collect()), ..read_rule("", resource) });
        }
    }
    let role = Role { metadata: meta.clone(), rules: Some(rules) };
    let role_binding = RoleBinding {
        metadata: meta.clone(),
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: NAME.into() },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: NAME.into(),
            namespace: Some(namespace.into()),
            ..Subject::default()
        }]),
    };
    let network_policy = config.activator_network_policy.then(|| network_policy(&meta, owners, config));
    let pdb = pdb(&meta, replicas);
    let service_account = ServiceAccount { metadata: meta, ..ServiceAccount::default() };
    Some(Activator { service_account, role, role_binding, deployment, pdb, network_policy })
}

/// The name of the EndpointSlice that sends `pool`'s Service to the activator.
pub fn slice_name(pool: &str) -> String {
    format!("{pool}-{}", labels::ACTIVATOR_COMPONENT)
}

/// The EndpointSlice adding the activator's ready pods (`addresses`) to `pool`'s Service, on the
/// Service's port names, owned by the pool.
pub fn slice(pool: &EmbeddingPool, addresses: &[IpAddr]) -> Option<EndpointSlice> {
    let name = pool.metadata.name.clone()?;
    let port = |port_name: &str, number: u16| EndpointPort {
        name: Some(port_name.into()),
        port: Some(i32::from(number)),
        protocol: Some("TCP".into()),
        ..EndpointPort::default()
    };
    Some(EndpointSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(&name)),
            namespace: pool.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (SERVICE_NAME_LABEL.into(), name.clone()),
                (SLICE_MANAGER_LABEL.into(), labels::MANAGER.into()),
                (labels::POOL_LABEL.into(), name),
            ])),
            owner_references: Some(vec![pool.controller_owner_ref(&())?]),
            ..ObjectMeta::default()
        },
        address_type: if addresses.iter().any(IpAddr::is_ipv6) { "IPv6".into() } else { "IPv4".into() },
        endpoints: addresses
            .iter()
            .map(|address| Endpoint {
                addresses: vec![address.to_string()],
                conditions: Some(EndpointConditions { ready: Some(true), ..EndpointConditions::default() }),
                ..Endpoint::default()
            })
            .collect(),
        ports: Some(vec![port("grpc", ports::MULTIPLEXER_GRPC), port("http", ports::MULTIPLEXER_HTTP)]),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(name: &str, min_replicas: i32) -> EmbeddingPool {
        serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
            "metadata": { "name": name, "namespace": "ml", "uid": format!("uid-{name}") },
            "spec": { "model": { "id": "org/m" },
                      "concurrency": { "maxInFlight": 8, "maxInFlightPerReplica": 4 },
                      "autoscaling": { "minReplicas": min_replicas, "maxReplicas": 2 },
                      "template": { "nodeSelector": { "pool": "cpu" } } },
        }))
        .unwrap()
    }

    #[test]
    fn the_activator_is_owned_by_every_pool_that_scales_to_zero_and_reads_only_pools_slices_and_services() {
        let (a, b) = (pool("a", 0), pool("b", 0));
        assert!(scales_to_zero(&a) && !scales_to_zero(&pool("c", 1)));
        assert!(render("ml", &[], &RenderConfig::default()).is_none(), "no such pool: no activator");
        let activator = render("ml", &[&a, &b], &RenderConfig::default()).unwrap();
        let owners = activator.deployment.metadata.owner_references.unwrap();
        assert_eq!(owners.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(owners.iter().all(|o| o.controller.is_none()), "no pool controls it alone");
        let rules = activator.role.rules.unwrap();
        let resources: Vec<String> = rules.iter().flat_map(|r| r.resources.clone().unwrap()).collect();
        assert_eq!(resources, ["embeddingpools", "endpointslices", "services"]);
        assert!(rules.iter().all(|r| r.verbs == ["get", "list", "watch"]));
        let pod = activator.deployment.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()["pool"], "cpu", "placed where the pool may run");
        assert_eq!(pod.containers[0].args.as_ref().unwrap()[0], "activator");
        assert!(pod.containers[0].resources.as_ref().unwrap().limits.as_ref().unwrap().get("nvidia.com/gpu").is_none());
    }

    #[test]
    fn the_activator_runs_two_replicas_spread_rolled_one_at_a_time_under_a_budget_unless_told_otherwise() {
        let a = pool("a", 0);
        let activator = render("ml", &[&a], &RenderConfig::default()).unwrap();
        let spec = activator.deployment.spec.unwrap();
        assert_eq!(spec.replicas, Some(2));
        let rolling = spec.strategy.unwrap().rolling_update.unwrap();
        assert_eq!(
            (rolling.max_surge, rolling.max_unavailable),
            (Some(IntOrString::Int(1)), Some(IntOrString::Int(0)))
        );
        let pod = spec.template.spec.unwrap();
        let spread = pod.topology_spread_constraints.unwrap();
        assert!(spread.iter().any(|c| c.topology_key == "kubernetes.io/hostname"));
        assert!(spread.iter().all(|c| c.when_unsatisfiable == "ScheduleAnyway"), "soft: one node still runs them");
        let args = pod.containers[0].args.clone().unwrap();
        assert!(args.contains(&format!("--drain-delay={DRAIN_DELAY_SECONDS}s")), "{args:?}");
        assert!(pod.termination_grace_period_seconds.unwrap() > DRAIN_DELAY_SECONDS + DRAIN_TIMEOUT_SECONDS);
        let pdb = activator.pdb.expect("a budget for two").spec.unwrap();
        assert_eq!(pdb.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(pdb.selector.unwrap().match_labels.unwrap(), selector(), "the activator's pods alone");

        let three = RenderConfig { activator_replicas: 3, ..RenderConfig::default() };
        assert_eq!(render("ml", &[&a], &three).unwrap().deployment.spec.unwrap().replicas, Some(3));
        let one = RenderConfig { activator_replicas: 1, ..RenderConfig::default() };
        let single = render("ml", &[&a], &one).unwrap();
        assert_eq!(single.deployment.spec.unwrap().replicas, Some(1));
        assert!(single.pdb.is_none(), "one pod: nothing to keep while it moves");
    }

    #[test]
    fn the_activator_serves_no_reflection_while_a_pool_it_stands_in_for_keeps_it_from_callers_without_a_key() {
        let args = |owners: &[&EmbeddingPool]| {
            let pod = render("ml", owners, &RenderConfig::default()).unwrap().deployment.spec.unwrap().template.spec;
            pod.unwrap().containers[0].args.clone().unwrap()
        };
        let off = "--grpc-reflection=false".to_owned();
        let open = pool("b", 0);
        assert!(!args(&[&open]).contains(&off), "served, as TEI serves it");
        let mut keyed = pool("a", 0);
        keyed.spec.auth = Some(serde_json::from_value(json!({ "secretName": "a-keys" })).unwrap());
        assert!(args(&[&keyed, &open]).contains(&off), "a keyed pool: off by default");
        keyed.spec.grpc = Some(serde_json::from_value(json!({ "reflection": true })).unwrap());
        assert!(!args(&[&keyed, &open]).contains(&off), "unless the pool asks for it");
        let mut closed = pool("c", 0);
        closed.spec.grpc = Some(serde_json::from_value(json!({ "reflection": false })).unwrap());
        assert!(args(&[&open, &closed]).contains(&off));
    }

    #[test]
    fn the_activator_reads_by_name_the_key_secrets_of_the_keyed_pools_it_holds_calls_for() {
        let mut keyed = pool("a", 0);
        keyed.spec.auth = Some(serde_json::from_value(json!({ "secretName": "a-keys" })).unwrap());
        let activator = render("ml", &[&keyed, &pool("b", 0)], &RenderConfig::default()).unwrap();
        let rules = activator.role.rules.unwrap();
        let secrets: Vec<&PolicyRule> =
            rules.iter().filter(|r| r.resources.as_deref() == Some(&["secrets".to_owned()][..])).collect();
        assert_eq!(secrets.len(), 1, "{rules:?}");
        assert_eq!(secrets[0].resource_names.as_deref(), Some(&["a-keys".to_owned()][..]));
        assert_eq!(secrets[0].verbs, ["get", "list", "watch"]);
    }

    #[test]
    fn the_activator_reads_by_name_the_tls_secrets_and_client_cas_of_the_tls_pools_it_holds_calls_for() {
        let mut keyed = pool("a", 0);
        keyed.spec.auth = Some(serde_json::from_value(json!({ "secretName": "a-keys" })).unwrap());
        keyed.spec.tls = Some(serde_json::from_value(json!({ "secretName": "a-tls" })).unwrap());
        let mut mutual = pool("b", 0);
        mutual.spec.tls = Some(
            serde_json::from_value(json!({ "secretName": "b-tls", "clientCA": { "configMapName": "clients" } }))
                .unwrap(),
        );
        let mut by_secret = pool("c", 0);
        by_secret.spec.tls = Some(
            serde_json::from_value(json!({ "secretName": "c-tls", "clientCA": { "secretName": "a-tls" } })).unwrap(),
        );
        let activator = render("ml", &[&keyed, &mutual, &by_secret, &pool("d", 0)], &RenderConfig::default()).unwrap();
        let rules = activator.role.rules.unwrap();
        let named = |resource: &str| -> Vec<String> {
            let found: Vec<&PolicyRule> =
                rules.iter().filter(|r| r.resources.as_deref() == Some(&[resource.to_owned()][..])).collect();
            assert_eq!(found.len(), 1, "{resource}: {rules:?}");
            assert_eq!(found[0].verbs, ["get", "list", "watch"]);
            found[0].resource_names.clone().unwrap()
        };
        assert_eq!(named("secrets"), ["a-keys", "a-tls", "b-tls", "c-tls"], "each name once");
        assert_eq!(named("configmaps"), ["clients"]);
    }

    #[test]
    fn the_slice_adds_the_activators_pods_to_the_pools_service_on_its_port_names() {
        let slice = slice(&pool("a", 0), &["10.0.0.9".parse().unwrap()]).unwrap();
        let labels = slice.metadata.labels.unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "a");
        assert_eq!(labels[SLICE_MANAGER_LABEL], labels::MANAGER);
        assert_eq!(slice.endpoints[0].addresses, ["10.0.0.9"]);
        let ports: Vec<_> = slice.ports.unwrap().into_iter().map(|p| (p.name.unwrap(), p.port.unwrap())).collect();
        assert_eq!(ports, [("grpc".to_owned(), 50051), ("http".to_owned(), 8000)]);
    }
}
