//! The sidecars' identity: they may read EmbeddingPools (their own budget, and peers for routing)
//! and the Services and EndpointSlices routing needs, and, for a pool with `spec.auth`, the one
//! Secret holding its API keys. Nothing more.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use teifleet_crds::{EmbeddingPool, GROUP, labels};

use super::Owner;

const READ: [&str; 3] = ["get", "list", "watch"];

pub(super) fn service_account(owner: &Owner) -> ServiceAccount {
    ServiceAccount { metadata: owner.meta(labels::sidecar_account_name(&owner.name)), ..ServiceAccount::default() }
}

fn read_rule(group: &str, resource: &str) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: READ.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

pub(super) fn role(owner: &Owner, pool: &EmbeddingPool) -> Role {
    let mut rules = vec![
        read_rule(GROUP, "embeddingpools"),
        read_rule("", "services"),
        read_rule("discovery.k8s.io", "endpointslices"),
    ];
    // The sidecar lists and watches the Secret with a field selector on its name, which the API
    // server authorizes as a request for that one name, so resourceNames holds for list and watch too.
    if let Some(auth) = &pool.spec.auth {
        rules.push(PolicyRule { resource_names: Some(vec![auth.secret_name.clone()]), ..read_rule("", "secrets") });
    }
    Role { metadata: owner.meta(labels::sidecar_account_name(&owner.name)), rules: Some(rules) }
}

pub(super) fn role_binding(owner: &Owner) -> RoleBinding {
    let name = labels::sidecar_account_name(&owner.name);
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
