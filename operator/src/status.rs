//! What the pool's status should say, computed from what the cluster shows. Pure, so every
//! condition rule is unit-tested; the controller only decides whether to write the result.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use teifleet_crds::conditions::{self, DEGRADED, Observed, PROGRESSING, READY, reasons};
use teifleet_crds::gpu::{GPU_PRODUCT_LABEL, GPU_RESOURCE};
use teifleet_crds::{AdmissionStatus, EmbeddingPool, EmbeddingPoolStatus, labels, split_budget};

/// Why some of the pool's pods cannot be scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unschedulable {
    pub pods: usize,
    /// The scheduler says a GPU of the requested product is missing or full.
    pub for_lack_of_gpu: bool,
    /// The scheduler's own words, from one of the pods.
    pub scheduler_message: String,
}

/// Finds pods the scheduler gave up on, and whether a GPU shortage is the reason.
pub fn unschedulable(pods: &[Pod], gpu_pool: bool) -> Option<Unschedulable> {
    let messages: Vec<&str> = pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let conditions = pod.status.as_ref()?.conditions.as_ref()?;
            conditions
                .iter()
                .find(|c| {
                    c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
                })
                .map(|c| c.message.as_deref().unwrap_or(""))
        })
        .collect();
    let first = messages.first()?;
    // "Insufficient nvidia.com/gpu" means the GPUs are taken; a node-affinity mismatch means no
    // node of the requested product exists at all. Either way the pool lacks its GPU.
    let for_lack_of_gpu = gpu_pool
        && messages.iter().any(|m| m.contains(&format!("Insufficient {GPU_RESOURCE}")) || m.contains("node affinity"));
    Some(Unschedulable { pods: messages.len(), for_lack_of_gpu, scheduler_message: (*first).to_owned() })
}

/// Computes the full status. `now` stamps conditions that changed status.
pub fn compute(pool: &EmbeddingPool, deployment: Option<&Deployment>, pods: &[Pod], now: &Time) -> EmbeddingPoolStatus {
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let dep_status = deployment.and_then(|d| d.status.clone()).unwrap_or_default();
    let desired = pool.spec.replicas.or_else(|| deployment.and_then(|d| d.spec.as_ref()?.replicas)).unwrap_or(1);
    let ready = dep_status.ready_replicas.unwrap_or(0);
    let updated = dep_status.updated_replicas.unwrap_or(0);
    let replicas = dep_status.replicas.unwrap_or(0);
    let gpu = pool.spec.gpu.type_;

    let stuck = unschedulable(pods, gpu.is_gpu());
    let deadline_exceeded = dep_status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing" && c.status == "False" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    let rolled_out = updated >= desired && replicas <= desired && ready >= desired;

    let insufficient_gpu = stuck.as_ref().filter(|s| s.for_lack_of_gpu).map(|s| {
        format!(
            "{} pod(s) cannot be scheduled: no node has {} free {gpu} GPU(s) ({GPU_PRODUCT_LABEL} in [{}]). Scheduler: {}",
            s.pods,
            pool.spec.gpu.count,
            gpu.node_products().join(", "),
            s.scheduler_message,
        )
    });

    let ready_condition = if desired == 0 {
        Observed::new(READY, true, reasons::SCALED_TO_ZERO, "the pool is scaled to zero replicas")
    } else if let Some(message) = &insufficient_gpu {
        Observed::new(READY, false, reasons::INSUFFICIENT_GPU, message.clone())
    } else if ready >= desired {
        Observed::new(READY, true, reasons::ALL_REPLICAS_READY, format!("{ready}/{desired} replicas ready"))
    } else {
        let mut message = format!("{ready}/{desired} replicas ready");
        if let Some(s) = &stuck {
            message.push_str(&format!("; {} pod(s) unschedulable: {}", s.pods, s.scheduler_message));
        }
        Observed::new(READY, false, reasons::REPLICAS_NOT_READY, message)
    };

    let progressing_condition = if deadline_exceeded {
        Observed::new(
            PROGRESSING,
            false,
            reasons::PROGRESS_DEADLINE_EXCEEDED,
            "the Deployment exceeded its progress deadline",
        )
    } else if rolled_out {
        Observed::new(
            PROGRESSING,
            false,
            reasons::ROLLOUT_COMPLETE,
            format!("{updated}/{desired} replicas run the current template"),
        )
    } else {
        Observed::new(
            PROGRESSING,
            true,
            reasons::ROLLING_OUT,
            format!("{updated}/{desired} replicas updated, {ready} ready"),
        )
    };

    let degraded_condition = match (&insufficient_gpu, deadline_exceeded) {
        (Some(message), _) => Observed::new(DEGRADED, true, reasons::INSUFFICIENT_GPU, message.clone()),
        (None, true) => Observed::new(
            DEGRADED,
            true,
            reasons::PROGRESS_DEADLINE_EXCEEDED,
            "the Deployment exceeded its progress deadline",
        ),
        (None, false) => Observed::new(DEGRADED, false, reasons::AS_EXPECTED, "no problem detected"),
    };

    let previous = pool.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let generation = pool.metadata.generation;
    let shares = split_budget(&pool.spec.concurrency, ready, desired);
    EmbeddingPoolStatus {
        observed_generation: generation,
        replicas,
        ready_replicas: ready,
        updated_replicas: updated,
        selector: Some(labels::pool_selector(name)),
        admission: Some(AdmissionStatus {
            in_flight_per_replica: shares.in_flight_per_replica,
            queued_per_replica: shares.queued_per_replica,
            split_over_replicas: shares.split_over,
        }),
        conditions: conditions::merge(
            previous,
            vec![ready_condition, progressing_condition, degraded_condition],
            generation,
            now,
        ),
    }
}

#[cfg(test)]
mod tests;
