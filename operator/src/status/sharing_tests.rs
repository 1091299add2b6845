//! Status of pools that ask for a share of a GPU: the share in status, InsufficientGPU naming the
//! share and the labels that offer it, a model too large for its share, and the per-replica cap
//! that follows the slice.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use teifleet_crds::conditions::{DEGRADED, READY, find, reasons};
use teifleet_crds::{EmbeddingPool, EmbeddingPoolSpec, GpuShareStatus};

use super::compute;
use super::tests::unschedulable_pod;

fn pool(model: &str, gpu: serde_json::Value) -> EmbeddingPool {
    let spec: EmbeddingPoolSpec = serde_json::from_value(serde_json::json!({
        "model": { "id": model },
        "gpu": gpu,
        "replicas": 1,
        "concurrency": { "maxInFlight": 64 },
    }))
    .unwrap();
    let mut pool = EmbeddingPool::new("small", spec);
    pool.metadata.namespace = Some("ml".into());
    pool.metadata.generation = Some(1);
    pool
}

fn time_sliced(replicas: i32) -> serde_json::Value {
    serde_json::json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing", "replicas": replicas } })
}

fn deployment(replicas: i32, ready: i32) -> Deployment {
    Deployment {
        spec: Some(DeploymentSpec { replicas: Some(replicas), ..DeploymentSpec::default() }),
        status: Some(DeploymentStatus {
            replicas: Some(replicas),
            ready_replicas: Some(ready),
            updated_replicas: Some(replicas),
            ..DeploymentStatus::default()
        }),
        ..Deployment::default()
    }
}

fn now() -> Time {
    Time(Timestamp::from_second(1_800_000_000).unwrap())
}

#[test]
fn status_shows_the_share_its_memory_and_the_models_need() {
    let status = compute(&pool("BAAI/bge-small-en-v1.5", time_sliced(4)), Some(&deployment(1, 1)), &[], &[], &now());
    let gpu = status.gpu.unwrap();
    assert_eq!((gpu.share.as_str(), gpu.resource.as_str()), ("1/4 time-slicing", "nvidia.com/gpu: 1"));
    assert_eq!(gpu.memory.as_deref(), Some("5.6 GiB"));
    assert!(gpu.model_memory.unwrap().starts_with("0.6 GiB (estimated: "));
    assert_eq!(find(&status.conditions, READY).unwrap().reason, reasons::ALL_REPLICAS_READY);
    // The slice caps what one replica lets in: 4096 batch tokens over 128.
    assert_eq!(status.admission.unwrap().in_flight_per_replica, 32);

    let whole =
        compute(&pool("m", serde_json::json!({ "type": "nvidia-l4" })), Some(&deployment(1, 1)), &[], &[], &now());
    assert_eq!(
        whole.gpu,
        Some(GpuShareStatus {
            share: "1 GPU".into(),
            resource: "nvidia.com/gpu: 1".into(),
            memory: Some("22.5 GiB".into()),
            model_memory: None,
        })
    );
    assert_eq!(whole.admission.unwrap().in_flight_per_replica, 64, "whole GPUs keep their share");
}

#[test]
fn taken_shares_name_the_share_and_the_resource() {
    let pods = [unschedulable_pod(
        "0/6 nodes are available: 1 Insufficient nvidia.com/gpu.shared, 5 node(s) didn't match Pod's node affinity/selector.",
    )];
    let gpu = serde_json::json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing", "replicas": 4, "renameByDefault": true } });
    let status = compute(&pool("BAAI/bge-small-en-v1.5", gpu), Some(&deployment(1, 0)), &pods, &[], &now());
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!(ready.reason, reasons::INSUFFICIENT_GPU);
    assert_eq!(
        ready.message,
        "1 pod(s) cannot be scheduled: every 1/4 time-slicing share of one nvidia-l4 is taken: no node with \
         nvidia.com/gpu.product=NVIDIA-L4, nvidia.com/gpu.sharing-strategy=time-slicing, nvidia.com/gpu.replicas=4 \
         has a free nvidia.com/gpu.shared. Scheduler: 0/6 nodes are available: 1 Insufficient nvidia.com/gpu.shared, \
         5 node(s) didn't match Pod's node affinity/selector."
    );
}

#[test]
fn a_profile_no_node_offers_is_named() {
    let pods = [unschedulable_pod("0/6 nodes are available: 6 node(s) didn't match Pod's node affinity/selector.")];
    let gpu = serde_json::json!({ "type": "nvidia-h100-80gb", "sharing": { "strategy": "mig", "profile": "2g.20gb" } });
    let status = compute(&pool("BAAI/bge-small-en-v1.5", gpu), Some(&deployment(1, 0)), &pods, &[], &now());
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!(ready.reason, reasons::INSUFFICIENT_GPU);
    assert!(
        ready.message.starts_with(
            "1 pod(s) cannot be scheduled: no node offers a MIG 2g.20gb instance of one nvidia-h100-80gb \
             (nvidia.com/mig-2g.20gb): none carries nvidia.com/gpu.product in [NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe], \
             nvidia.com/mig.strategy=mixed, nvidia.com/mig-2g.20gb.count."
        ),
        "{}",
        ready.message
    );
}

#[test]
fn a_model_larger_than_its_share_is_reported_with_both_figures() {
    let mut pool = pool("my-org/private", time_sliced(4));
    pool.spec.model.gpu_memory = Some(Quantity("8Gi".into()));
    // The operator renders no pod for it (replicas 0).
    let status = compute(&pool, Some(&deployment(0, 0)), &[], &[], &now());
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reasons::INSUFFICIENT_GPU_MEMORY));
    assert_eq!(
        ready.message,
        "my-org/private needs 8.0 GiB of GPU memory (declared in spec.model.gpuMemory) but a 1/4 time-slicing share \
         of one nvidia-l4 gives 5.6 GiB: ask for a larger share (fewer replicas per GPU, a larger MIG profile or whole GPUs)"
    );
    let degraded = find(&status.conditions, DEGRADED).unwrap();
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", reasons::INSUFFICIENT_GPU_MEMORY));
}
