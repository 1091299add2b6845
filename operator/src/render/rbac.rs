//! The sidecars' identity: they may read EmbeddingPools (their own budget, and peers for routing)
//! and the EndpointSlices of their siblings, and, by name, the pool's peer Secret (the key that
//! proves a spilled call comes from a sibling) and the Secrets and ConfigMap the pool names for
//! them to read: its API keys (`spec.auth`), its certificate (`spec.tls`) and the CA bundle of
//! mutual TLS (`spec.tls.clientCA`). Nothing more: every rule here is one the sidecar's watches
//! (multiplexer/src/sources) use. Other pools are reached by their Services' DNS names, so the
//! sidecar never reads a Service.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use teifleet_crds::{EmbeddingPool, GROUP, labels};

use super::Owner;

const READ: [&str; 3] = ["get", "list", "watch"];

pub(super) fn service_account(owner: &Owner) -> ServiceAccount {
    ServiceAccount { metadata: owner.meta(labels::sidecar_account_name(&owner.name)), ..ServiceAccount::default() }
}

pub(super) fn read_rule(group: &str, resource: &str) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: READ.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

pub(super) fn role(owner: &Owner, pool: &EmbeddingPool) -> Role {
    let mut rules = vec![read_rule(GROUP, "embeddingpools"), read_rule("discovery.k8s.io", "endpointslices")];
    // The sidecar lists and watches each object with a field selector on its name, which the API
    // server authorizes as a request for that one name, so resourceNames holds for list and watch too.
    let (mut secrets, config_maps) = named_reads(pool);
    secrets.insert(labels::peer_secret_name(&owner.name));
    for (resource, names) in [("secrets", secrets), ("configmaps", config_maps)] {
        if !names.is_empty() {
            rules.push(PolicyRule { resource_names: Some(names.into_iter().collect()), ..read_rule("", resource) });
        }
    }
    Role { metadata: owner.meta(labels::sidecar_account_name(&owner.name)), rules: Some(rules) }
}

/// The Secrets and the ConfigMaps the sidecars read by name, each set sorted, so one Secret named
/// twice (a certificate whose `ca.crt` is also the client CA bundle) is one name in the rule.
fn named_reads(pool: &EmbeddingPool) -> (BTreeSet<String>, BTreeSet<String>) {
    let spec = &pool.spec;
    let client_ca = spec.tls.as_ref().and_then(|tls| tls.client_ca.as_ref());
    let secrets = spec
        .auth
        .as_ref()
        .map(|auth| &auth.secret_name)
        .into_iter()
        .chain(spec.tls.as_ref().map(|tls| &tls.secret_name))
        .chain(client_ca.and_then(|ca| ca.secret_name.as_ref()))
        .cloned()
        .collect();
    let config_maps = client_ca.and_then(|ca| ca.config_map_name.clone()).into_iter().collect();
    (secrets, config_maps)
}

pub(super) fn role_binding(owner: &Owner) -> RoleBinding {
    account_role_binding(owner, labels::sidecar_account_name(&owner.name))
}

/// Binds the Role `name` to the owner's ServiceAccount of the same name.
pub(crate) fn account_role_binding(owner: &Owner, name: String) -> RoleBinding {
    RoleBinding {
        metadata: owner.meta(name.clone()),
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: name.clone() },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(owner.namespace.clone()),
            ..Subject::default()
        }]),
    }
}
