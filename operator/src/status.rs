//! What the pool's status should say, computed from what the cluster shows and what the pool's
//! sidecars reported. Pure, so every rule is unit-tested; the controller only asks the sidecars
//! and decides whether to write the result.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use teifleet_crds::conditions::{self, DEGRADED, Observed, PROGRESSING, READY, reasons};
use teifleet_crds::effective::summarize;
use teifleet_crds::gpu::GPU_RESOURCE;
use teifleet_crds::gpu_memory::{self, gib};
use teifleet_crds::{
    AdmissionStatus, ConcurrencySpec, EmbeddingPool, EmbeddingPoolStatus, Endpoints, GpuShareStatus, Share,
    SidecarAdmission, labels, split_budget,
};

mod demand;
mod tls;

pub use demand::demand;
pub use tls::tls_ready;

/// Why some of the pool's pods cannot be scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unschedulable {
    pub pods: usize,
    /// Set when the pool lacks its GPU, and says how.
    pub gpu_shortage: Option<GpuShortage>,
    /// The scheduler's own words, from a pod that shows the reason.
    pub scheduler_message: String,
}

/// How a GPU pool lacks its GPU, read from the scheduler's message. The scheduler checks a node's
/// node affinity before its free resources and reports the first check a node fails, so nodes
/// reported for "Insufficient ..." carry the requested product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuShortage {
    /// No node carries the product (or none that also matches the pool's own node selection):
    /// the scheduler reports only node-affinity mismatches (and taints).
    NoNodeWithProduct,
    /// Nodes of the product exist but none has enough free of the pool's GPU resource
    /// (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb`): the scheduler says
    /// `Insufficient <resource>`.
    AllTaken,
}

/// What one scheduler message says about a GPU pool's GPU, the extended resource `resource`.
fn gpu_shortage(message: &str, resource: &str) -> Option<GpuShortage> {
    let insufficient: Vec<&str> = message
        .split("Insufficient ")
        .skip(1)
        .filter_map(|rest| rest.split([',', ' ']).next())
        .map(|resource| resource.trim_end_matches('.'))
        .collect();
    if insufficient.contains(&resource) {
        Some(GpuShortage::AllTaken)
    } else if insufficient.is_empty() && message.contains("node affinity") {
        Some(GpuShortage::NoNodeWithProduct)
    } else {
        // Nodes of the product exist and have free GPUs but lack CPU or memory, or something
        // else keeps the pods off: not a GPU shortage.
        None
    }
}

/// Finds pods the scheduler gave up on, and whether a shortage of `gpu_resource` (the pool's GPU
/// resource, `None` for a CPU pool) is the reason.
pub fn unschedulable(pods: &[Pod], gpu_resource: Option<&str>) -> Option<Unschedulable> {
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
    // "Insufficient nvidia.com/gpu" on any pod means the GPUs exist and are taken; only then do
    // node-affinity mismatches mean no node of the product exists.
    let shortages: Vec<(GpuShortage, &str)> = match gpu_resource {
        Some(resource) => messages.iter().filter_map(|m| Some((gpu_shortage(m, resource)?, *m))).collect(),
        None => Vec::new(),
    };
    let (gpu_shortage, scheduler_message) = shortages
        .iter()
        .find(|(shortage, _)| *shortage == GpuShortage::AllTaken)
        .or_else(|| shortages.first())
        .map_or((None, *first), |(shortage, message)| (Some(*shortage), *message));
    Some(Unschedulable { pods: messages.len(), gpu_shortage, scheduler_message: scheduler_message.to_owned() })
}

/// The InsufficientGPU message: which GPU or share of one, which node labels offer it, and
/// whether they are missing or taken.
fn insufficient_gpu_message(pool: &EmbeddingPool, stuck: &Unschedulable, shortage: GpuShortage) -> String {
    let gpu = pool.spec.gpu.type_;
    let Some(share) = pool.spec.share() else { return stuck.scheduler_message.clone() };
    let products = match share {
        // As it always read: `nvidia.com/gpu.product in [NVIDIA-L4]`.
        Share::Whole { .. } => {
            format!("{} in [{}]", teifleet_crds::gpu::GPU_PRODUCT_LABEL, gpu.node_products().join(", "))
        }
        _ => share.describe_nodes(gpu),
    };
    let template = &pool.spec.template;
    let narrowed = !template.node_selector.is_empty()
        || template
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .is_some_and(|n| n.required_during_scheduling_ignored_during_execution.is_some());
    let resource = share.resource();
    let why = match (&share, shortage) {
        (Share::Whole { .. }, GpuShortage::NoNodeWithProduct) if narrowed => format!(
            "no node carries {products} and also matches the pool's template.nodeSelector/affinity (gpu.type {gpu})"
        ),
        (Share::Whole { .. }, GpuShortage::NoNodeWithProduct) => format!("no node carries {products} (gpu.type {gpu})"),
        (Share::Whole { count }, GpuShortage::AllTaken) => {
            format!("all {gpu} GPUs are taken: no node with {products} has {count} free {GPU_RESOURCE}")
        }
        (_, GpuShortage::NoNodeWithProduct) => format!(
            "no node offers {} ({resource}): none carries {products}{}",
            share.describe(gpu),
            if narrowed { " and also matches the pool's template.nodeSelector/affinity" } else { "" }
        ),
        (_, GpuShortage::AllTaken) => format!(
            "every {} is taken: no node with {products} has a free {resource}",
            share.describe(gpu).trim_start_matches("a ")
        ),
    };
    format!("{} pod(s) cannot be scheduled: {why}. Scheduler: {}", stuck.pods, stuck.scheduler_message)
}

/// What each replica takes of a GPU, and the memory it gives against what the model needs.
fn gpu_share_status(pool: &EmbeddingPool, share: &Share) -> GpuShareStatus {
    let gpu = pool.spec.gpu.type_;
    GpuShareStatus {
        share: share.short(),
        resource: format!("{}: {}", share.resource(), share.resource_count()),
        memory: share.memory_mib(gpu).map(gib),
        model_memory: gpu_memory::need(&pool.spec).map(|need| format!("{} ({})", gib(need.mib()), need.explain())),
    }
}

/// Computes the full status from the pool, its Deployment and pods, and the `reports` of the
/// sidecars that answered (see `sidecars`). `now` stamps conditions that changed status, and
/// tells whether a certificate the sidecars serve has expired (`TLSReady`).
pub fn compute(
    pool: &EmbeddingPool,
    deployment: Option<&Deployment>,
    pods: &[Pod],
    reports: &[SidecarAdmission],
    now: &Time,
) -> EmbeddingPoolStatus {
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let dep_status = deployment.and_then(|d| d.status.clone()).unwrap_or_default();
    let desired = pool.spec.replicas.or_else(|| deployment.and_then(|d| d.spec.as_ref()?.replicas)).unwrap_or(1);
    let ready = dep_status.ready_replicas.unwrap_or(0);
    let updated = dep_status.updated_replicas.unwrap_or(0);
    let replicas = dep_status.replicas.unwrap_or(0);
    let share = pool.spec.share();
    let stuck = unschedulable(pods, share.as_ref().map(Share::resource).as_deref());
    let too_big = gpu_memory::shortfall(&pool.spec);
    let deadline_exceeded = dep_status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing" && c.status == "False" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    let rolled_out = updated >= desired && replicas <= desired && ready >= desired;

    let insufficient_gpu = stuck.as_ref().and_then(|s| Some(insufficient_gpu_message(pool, s, s.gpu_shortage?)));

    let ready_condition = if let Some(shortfall) = &too_big {
        Observed::new(READY, false, reasons::INSUFFICIENT_GPU_MEMORY, shortfall.message.clone())
    } else if desired == 0 {
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
        _ if too_big.is_some() => Observed::new(
            DEGRADED,
            true,
            reasons::INSUFFICIENT_GPU_MEMORY,
            too_big.as_ref().map(|shortfall| shortfall.message.clone()).unwrap_or_default(),
        ),
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
    // A share of a GPU caps each replica's in-flight share by default (and so the adaptive
    // limit's ceiling): `EmbeddingPoolSpec::in_flight_per_replica_cap`.
    let budget = ConcurrencySpec {
        max_in_flight_per_replica: pool.spec.in_flight_per_replica_cap(),
        ..pool.spec.concurrency.clone()
    };
    let shares = split_budget(&budget, ready, desired);
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
            // Only an adaptive pool's limits differ from the shares above.
            effective: if pool.spec.concurrency.adaptive { summarize(reports) } else { None },
        }),
        demand: demand(reports),
        gpu: share.map(|share| gpu_share_status(pool, &share)),
        // The autoscaler's decision (`autoscale::Decision`), which the controller sets.
        autoscaling: None,
        endpoints: pool
            .metadata
            .namespace
            .as_deref()
            .map(|namespace| Endpoints::of(name, namespace, pool.spec.tls.is_some())),
        conditions: conditions::merge(
            previous,
            [ready_condition, progressing_condition, degraded_condition]
                .into_iter()
                .chain(tls_ready(pool, reports, now.0))
                .collect(),
            generation,
            now,
        ),
    }
}

#[cfg(test)]
mod sharing_tests;
#[cfg(test)]
mod tests;
