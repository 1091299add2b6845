use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use teifleet_crds::EmbeddingPool;

use super::{Owner, desired_replicas};

/// Lets voluntary disruptions (node drains) take one replica at a time. A single replica gets no
/// budget: there is nothing to keep serving while it moves. A pool whose replica count is left to
/// an autoscaler gets one, since autoscaled pools run several replicas.
pub(super) fn pdb(owner: &Owner, pool: &EmbeddingPool) -> Option<PodDisruptionBudget> {
    if desired_replicas(pool).is_some_and(|replicas| replicas <= 1) {
        return None;
    }
    Some(PodDisruptionBudget {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector { match_labels: Some(owner.selector()), ..LabelSelector::default() }),
            // Evicting an already-unhealthy pod never costs availability.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    })
}
