//! Keeps a namespace's activator (`render::activator`) in step with its pools, and a pool that
//! may scale to zero routed to it while it has no ready replica: the activator's pods are added to
//! the pool's Service (an EndpointSlice of the operator's) before the pool's last replica goes,
//! and taken out once a replica is ready again.
//!
//! The activator runs several pods, none special: every ready one that is not being deleted is in
//! each such pool's slice, every one is asked for the calls it holds (summed per pool, see
//! `Reports::held_calls`), and one being deleted leaves the slices at the pool's next look, while
//! it still serves its drain delay.

use std::net::IpAddr;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};
use teifleet_crds::{EmbeddingPool, labels};

use crate::Result;
use crate::controller::{Context, apply, delete_if_present};
use crate::render::activator::{self, NAME, scales_to_zero};
use crate::sidecars::run_by;

/// Brings the namespace's activator and `pool`'s route to it to what they should be: the
/// activator's ready pods (`activator_pods`, listed when `pool` may scale to zero) behind the
/// pool's Service while it needs them.
pub async fn reconcile(
    ctx: &Context,
    pool: &EmbeddingPool,
    namespace: &str,
    deployment: &Deployment,
    activator_pods: &[Pod],
) -> Result<()> {
    let client = &ctx.client;
    let pools = Api::<EmbeddingPool>::namespaced(client.clone(), namespace).list(&ListParams::default()).await?;
    let mut owners: Vec<&EmbeddingPool> =
        pools.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none() && scales_to_zero(p)).collect();
    owners.sort_by_key(|p| p.name_any());
    let (had_activator, ours) = match activator::render(namespace, &owners, &ctx.render) {
        Some(objects) => {
            apply(client, namespace, &objects.service_account).await?;
            apply(client, namespace, &objects.role).await?;
            apply(client, namespace, &objects.role_binding).await?;
            // Before its pods, as a pool's own.
            match &objects.network_policy {
                Some(policy) => drop(apply(client, namespace, policy).await?),
                None => delete_if_present::<NetworkPolicy>(client, namespace, NAME).await?,
            }
            let applied = apply(client, namespace, &objects.deployment).await?;
            match &objects.pdb {
                Some(pdb) => drop(apply(client, namespace, pdb).await?),
                None => delete_if_present::<PodDisruptionBudget>(client, namespace, NAME).await?,
            }
            (true, run_by_activator(ctx, namespace, &applied, activator_pods).await?)
        }
        None => (remove(ctx, namespace).await?, Vec::new()),
    };
    // Only the activator's own pods are asked for held calls and put behind a pool's Service:
    // a pod that merely carries its labels gets neither the pool's calls nor a say in its scale.
    ctx.reports.ask_activators(namespace, &ours);
    // Without an activator in the namespace no pool's Service can be routed to one: nothing to
    // take down, and no request spent finding that out.
    if had_activator {
        route(ctx, pool, namespace, deployment, &ours).await?;
    }
    Ok(())
}

/// The pods among `pods` that the activator's Deployment (`applied`) runs.
async fn run_by_activator(ctx: &Context, namespace: &str, applied: &Deployment, pods: &[Pod]) -> Result<Vec<Pod>> {
    let Some(uid) = applied.metadata.uid.as_deref() else { return Ok(Vec::new()) };
    if pods.is_empty() {
        return Ok(Vec::new());
    }
    let replica_sets = Api::<ReplicaSet>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default().labels(&labels::activator_selector()))
        .await?
        .items;
    Ok(run_by(pods, &replica_sets, uid))
}

/// Removes the namespace's activator, if it has one, once no pool there scales to zero; says
/// whether it had one.
async fn remove(ctx: &Context, namespace: &str) -> Result<bool> {
    let client = &ctx.client;
    if Api::<Deployment>::namespaced(client.clone(), namespace).get_opt(NAME).await?.is_none() {
        return Ok(false);
    }
    tracing::info!(%namespace, "no pool scales to zero here any more: removing the activator");
    delete_if_present::<Deployment>(client, namespace, NAME).await?;
    delete_if_present::<PodDisruptionBudget>(client, namespace, NAME).await?;
    delete_if_present::<NetworkPolicy>(client, namespace, NAME).await?;
    delete_if_present::<RoleBinding>(client, namespace, NAME).await?;
    delete_if_present::<Role>(client, namespace, NAME).await?;
    delete_if_present::<ServiceAccount>(client, namespace, NAME).await?;
    Ok(true)
}

/// Whether `pool`'s Service needs the activator: it may scale to zero, and has no ready
/// replica, or is about to have none.
fn needs_activator(pool: &EmbeddingPool, deployment: &Deployment) -> bool {
    let desired = deployment.spec.as_ref().and_then(|spec| spec.replicas).unwrap_or(1);
    let ready = deployment.status.as_ref().and_then(|status| status.ready_replicas).unwrap_or(0);
    scales_to_zero(pool) && (desired == 0 || ready == 0)
}

fn ready_addresses(pods: &[Pod]) -> Vec<IpAddr> {
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && crate::sidecars::is_ready(pod))
        .filter_map(|pod| pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok())
        .collect()
}

async fn route(
    ctx: &Context,
    pool: &EmbeddingPool,
    namespace: &str,
    deployment: &Deployment,
    pods: &[Pod],
) -> Result<()> {
    let name = pool.name_any();
    if !needs_activator(pool, deployment) {
        return delete_if_present::<EndpointSlice>(&ctx.client, namespace, &activator::slice_name(&name)).await;
    }
    match activator::slice(pool, &ready_addresses(pods)) {
        Some(slice) => apply(&ctx.client, namespace, &slice).await.map(drop),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pool_at_zero_or_going_there_is_routed_to_the_activator() {
        let pool: EmbeddingPool = serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
            "metadata": { "name": "bge", "namespace": "ml" },
            "spec": { "model": { "id": "org/m" }, "concurrency": { "maxInFlight": 8, "maxInFlightPerReplica": 4 },
                      "autoscaling": { "minReplicas": 0, "maxReplicas": 2 } },
        }))
        .unwrap();
        let deployment = |replicas: i32, ready: i32| -> Deployment {
            serde_json::from_value(json!({ "spec": { "replicas": replicas, "selector": {}, "template": {} },
                                           "status": { "readyReplicas": ready } }))
            .unwrap()
        };
        assert!(needs_activator(&pool, &deployment(0, 0)), "at zero");
        assert!(needs_activator(&pool, &deployment(0, 1)), "its last replica is going");
        assert!(needs_activator(&pool, &deployment(1, 0)), "starting from zero");
        assert!(!needs_activator(&pool, &deployment(1, 1)), "a replica is ready");
        let mut fixed = pool.clone();
        fixed.spec.autoscaling.as_mut().unwrap().min_replicas = 1;
        assert!(!needs_activator(&fixed, &deployment(1, 0)), "never at zero: no activator");
    }

    #[test]
    fn every_ready_activator_pod_not_being_deleted_is_behind_a_pool_at_zero() {
        let pod = |ip: &str, ready: &str, deleting: bool| -> Pod {
            let mut pod: Pod = serde_json::from_value(json!({
                "metadata": { "name": format!("teifleet-activator-{ip}") },
                "status": { "podIP": ip, "conditions": [{ "type": "Ready", "status": ready }] },
            }))
            .unwrap();
            if deleting {
                pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            }
            pod
        };
        let pods = [
            pod("10.0.0.1", "True", false),
            pod("10.0.0.2", "True", false),
            pod("10.0.0.3", "True", false),
            pod("10.0.0.4", "False", false),
            pod("10.0.0.5", "True", true),
        ];
        let addresses: Vec<String> = ready_addresses(&pods).iter().map(ToString::to_string).collect();
        assert_eq!(addresses, ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "not the unready one, nor the one stopping");
    }
}
