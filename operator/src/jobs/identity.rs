//! Who the operator is, as an RBAC subject: each job's `<job>-progress-reader` RoleBinding names
//! it, so the operator reads that job's progress ConfigMap and no other ConfigMap of the cluster.
//! Asked of the API server (a SelfSubjectReview, which every authenticated user may make), so it
//! holds in the chart's Deployment and for an operator run with any kubeconfig alike.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::rbac::v1::Subject;
use kube::api::PostParams;
use kube::{Api, Client};

/// How the API server names a ServiceAccount as a user.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// The RBAC subject of the user `username`: its ServiceAccount for
/// `system:serviceaccount:<namespace>:<name>`, else the user itself.
pub fn subject_of(username: &str) -> Subject {
    let account = username.strip_prefix(SERVICE_ACCOUNT_PREFIX).and_then(|rest| rest.split_once(':'));
    match account {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(namespace.into()),
            ..Subject::default()
        },
        _ => Subject {
            kind: "User".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            name: username.into(),
            ..Subject::default()
        },
    }
}

/// The operator's own subject, or `None` (with a warning) where the API server does not say: jobs
/// then run, and their status shows no progress unless the operator may read ConfigMaps anyway.
pub async fn whoami(client: &Client) -> Option<Subject> {
    let review = SelfSubjectReview::default();
    match Api::<SelfSubjectReview>::all(client.clone()).create(&PostParams::default(), &review).await {
        Ok(review) => {
            let username = review.status.and_then(|status| status.user_info).and_then(|user| user.username);
            match username.filter(|name| !name.is_empty()) {
                Some(name) => Some(subject_of(&name)),
                None => {
                    tracing::warn!("the API server did not say who the operator is: EmbeddingJobs show no progress");
                    None
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, "asking the API server who the operator is failed: EmbeddingJobs show no progress");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_account_is_bound_as_one_and_anyone_else_as_a_user() {
        let account = subject_of("system:serviceaccount:teifleet-system:teifleet-operator");
        assert_eq!(
            (account.kind.as_str(), account.name.as_str(), account.namespace.as_deref(), account.api_group),
            ("ServiceAccount", "teifleet-operator", Some("teifleet-system"), None)
        );
        let admin = subject_of("kubernetes-admin");
        assert_eq!(
            (admin.kind.as_str(), admin.name.as_str(), admin.namespace, admin.api_group.as_deref()),
            ("User", "kubernetes-admin", None, Some("rbac.authorization.k8s.io"))
        );
        assert_eq!(subject_of("system:serviceaccount:broken").kind, "User", "not a ServiceAccount's name");
    }
}
