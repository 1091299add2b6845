use super::demand::tests::report;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentSpec, DeploymentStatus};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use teifleet_crds::conditions::{DEGRADED, PROGRESSING, READY, TLS_READY, find, reasons};
use teifleet_crds::{CertificateSummary, EmbeddingPool, EmbeddingPoolSpec, GpuType, SidecarTls};

use super::*;

fn now(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

fn pool(replicas: i32, gpu: GpuType) -> EmbeddingPool {
    let mut spec: EmbeddingPoolSpec =
        serde_json::from_value(serde_json::json!({ "model": { "id": "BAAI/bge-small-en-v1.5" } })).unwrap();
    spec.replicas = Some(replicas);
    spec.gpu.type_ = gpu;
    spec.concurrency.max_in_flight = 64;
    spec.concurrency.max_queued = 100;
    let mut pool = EmbeddingPool::new("embed", spec);
    pool.metadata.namespace = Some("ml".into());
    pool.metadata.generation = Some(3);
    pool
}

fn deployment(replicas: i32, ready: i32, updated: i32) -> Deployment {
    Deployment {
        metadata: ObjectMeta::default(),
        spec: Some(DeploymentSpec { replicas: Some(replicas), ..DeploymentSpec::default() }),
        status: Some(DeploymentStatus {
            replicas: Some(replicas),
            ready_replicas: Some(ready),
            updated_replicas: Some(updated),
            ..DeploymentStatus::default()
        }),
    }
}

pub(super) fn unschedulable_pod(message: &str) -> Pod {
    Pod {
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some(message.into()),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        }),
        ..Pod::default()
    }
}

#[test]
fn all_ready_pool_is_ready_and_not_progressing() {
    let status = compute(&pool(2, GpuType::NvidiaL4), Some(&deployment(2, 2, 2)), &[], &[], &now(100));
    assert_eq!(status.observed_generation, Some(3));
    assert_eq!((status.replicas, status.ready_replicas), (2, 2));
    assert_eq!(status.selector.as_deref(), Some("teifleet.dev/pool=embed"));
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", reasons::ALL_REPLICAS_READY));
    assert_eq!(ready.observed_generation, Some(3));
    assert_eq!(find(&status.conditions, PROGRESSING).unwrap().status, "False");
    assert_eq!(find(&status.conditions, DEGRADED).unwrap().status, "False");
    let admission = status.admission.unwrap();
    assert_eq!(
        (admission.in_flight_per_replica, admission.queued_per_replica, admission.split_over_replicas),
        (32, 50, 2)
    );
    let endpoints = status.endpoints.unwrap();
    assert_eq!(endpoints.grpc, "embed.ml.svc:50051");
    assert_eq!(endpoints.http, "http://embed.ml.svc:8000");
    assert!(!endpoints.tls);
    assert_eq!(find(&status.conditions, TLS_READY), None, "no spec.tls, no TLSReady");
}

fn with_tls(mut pool: EmbeddingPool) -> EmbeddingPool {
    pool.spec.tls = Some(serde_json::from_value(serde_json::json!({ "secretName": "embed-tls" })).unwrap());
    pool
}

fn serving(serial: &str, error: Option<&str>) -> SidecarAdmission {
    let serving = CertificateSummary {
        serial: serial.into(),
        subject: "CN=embed.ml.svc".into(),
        not_after: "2027-01-01T00:00:00Z".into(),
    };
    let tls = SidecarTls { serving: Some(serving), client_auth: false, error: error.map(Into::into), expired: false };
    SidecarAdmission { tls: Some(tls), ..report(32, 0, 0, 0.0, 0.0) }
}

#[test]
fn a_tls_pool_shows_https_and_tells_tools_its_ports_speak_tls() {
    let status = compute(&with_tls(pool(2, GpuType::NvidiaL4)), Some(&deployment(2, 2, 2)), &[], &[], &now(100));
    let endpoints = status.endpoints.unwrap();
    assert_eq!(endpoints.grpc, "embed.ml.svc:50051", "the target gRPC clients take, TLS or not");
    assert_eq!(endpoints.http, "https://embed.ml.svc:8000");
    assert!(endpoints.tls);
    let plain = serde_json::to_value(Endpoints::of("embed", "ml", false)).unwrap();
    assert_eq!(plain.get("tls"), None, "a plain pool's endpoints read as before");
}

#[test]
fn tls_ready_follows_the_sidecars_and_leaves_with_spec_tls() {
    let mut tls_pool = with_tls(pool(2, GpuType::NvidiaL4));
    let ready = deployment(2, 2, 2);
    let unknown = compute(&tls_pool, Some(&ready), &[], &[], &now(100));
    let condition = find(&unknown.conditions, TLS_READY).unwrap();
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("Unknown", reasons::NO_REPORTS));
    assert_eq!(condition.observed_generation, Some(3));
    assert_eq!(unknown.conditions.last(), Some(condition), "after Ready, Progressing and Degraded");

    tls_pool.status = Some(unknown);
    let served = [serving("0A", None), serving("0A", None)];
    let first = compute(&tls_pool, Some(&ready), &[], &served, &now(200));
    let condition = find(&first.conditions, TLS_READY).unwrap();
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", reasons::CERTIFICATE_SERVED));
    assert_eq!(condition.last_transition_time, now(200));

    // The next certificate arrives: the message says so, the transition time stays.
    tls_pool.status = Some(first);
    let rotating = compute(&tls_pool, Some(&ready), &[], &[serving("0B", None), serving("0A", None)], &now(300));
    let condition = find(&rotating.conditions, TLS_READY).unwrap();
    assert!(condition.message.starts_with("rotating: "), "{}", condition.message);
    assert_eq!(condition.last_transition_time, now(200));

    tls_pool.status = Some(rotating);
    let broken = [serving("0B", Some("tls.key does not match tls.crt")), serving("0B", None)];
    let invalid = compute(&tls_pool, Some(&ready), &[], &broken, &now(400));
    let condition = find(&invalid.conditions, TLS_READY).unwrap();
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", reasons::CERTIFICATE_INVALID));
    assert_eq!(condition.last_transition_time, now(400));
    assert_eq!(find(&invalid.conditions, READY).unwrap().status, "True", "the last good certificate serves");

    tls_pool.status = Some(invalid);
    tls_pool.spec.tls = None;
    let plain = compute(&tls_pool, Some(&ready), &[], &broken, &now(500));
    assert_eq!(find(&plain.conditions, TLS_READY), None);
}

#[test]
fn taken_gpus_are_insufficient_gpu_saying_they_are_taken() {
    let pods = [unschedulable_pod(
        "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector. \
         preemption: 0/4 nodes are available: 2 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling.",
    )];
    let status = compute(&pool(3, GpuType::NvidiaH100_80gb), Some(&deployment(3, 2, 3)), &pods, &[], &now(100));
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reasons::INSUFFICIENT_GPU));
    assert!(
        ready.message.starts_with(
            "1 pod(s) cannot be scheduled: all nvidia-h100-80gb GPUs are taken: no node with \
             nvidia.com/gpu.product in [NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe] has 1 free nvidia.com/gpu. \
             Scheduler: 0/4 nodes are available: 2 Insufficient nvidia.com/gpu"
        ),
        "{}",
        ready.message
    );
    assert!(!ready.message.contains("no node carries"), "{}", ready.message);
    let degraded = find(&status.conditions, DEGRADED).unwrap();
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", reasons::INSUFFICIENT_GPU));
    assert_eq!(degraded.message, ready.message);
    // Shares follow the replicas that are actually ready.
    assert_eq!(status.admission.unwrap().in_flight_per_replica, 32);
}

#[test]
fn no_node_of_the_product_is_insufficient_gpu_saying_no_node_carries_it() {
    let pods = [unschedulable_pod("0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.")];
    let mut a100 = pool(1, GpuType::NvidiaA100_80gb);
    a100.spec.gpu.count = 2;
    let status = compute(&a100, Some(&deployment(1, 0, 1)), &pods, &[], &now(100));
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reasons::INSUFFICIENT_GPU));
    assert_eq!(
        ready.message,
        "1 pod(s) cannot be scheduled: no node carries nvidia.com/gpu.product in \
         [NVIDIA-A100-SXM4-80GB, NVIDIA-A100-80GB-PCIe] (gpu.type nvidia-a100-80gb). \
         Scheduler: 0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
    );
    assert!(!ready.message.contains("taken"), "{}", ready.message);
}

#[test]
fn tainted_nodes_beside_no_node_of_the_product_still_mean_none_carries_it() {
    // A control-plane node fails on its taint before node affinity is checked.
    let pods = [unschedulable_pod(
        "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, \
         2 node(s) didn't match Pod's node affinity/selector.",
    )];
    let status = compute(&pool(1, GpuType::NvidiaL4), Some(&deployment(1, 0, 1)), &pods, &[], &now(100));
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!(ready.reason, reasons::INSUFFICIENT_GPU);
    assert!(ready.message.contains("no node carries nvidia.com/gpu.product in [NVIDIA-L4]"), "{}", ready.message);
}

#[test]
fn no_node_of_the_product_names_the_pools_own_node_selection() {
    let pods = [unschedulable_pod("0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.")];
    let mut zoned = pool(1, GpuType::NvidiaL4);
    zoned.spec.template.node_selector.insert("topology.kubernetes.io/zone".into(), "us-east-1a".into());
    let status = compute(&zoned, Some(&deployment(1, 0, 1)), &pods, &[], &now(100));
    let ready = find(&status.conditions, READY).unwrap();
    assert!(
        ready.message.contains(
            "no node carries nvidia.com/gpu.product in [NVIDIA-L4] and also matches the pool's template.nodeSelector/affinity"
        ),
        "{}",
        ready.message
    );
}

#[test]
fn any_pod_seeing_taken_gpus_makes_them_taken() {
    // One pod was last evaluated before the GPU node joined, another after.
    let pods = [
        unschedulable_pod("0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."),
        unschedulable_pod(
            "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node affinity/selector.",
        ),
    ];
    let stuck = unschedulable(&pods, Some("nvidia.com/gpu")).unwrap();
    assert_eq!(stuck.pods, 2);
    assert_eq!(stuck.gpu_shortage, Some(GpuShortage::AllTaken));
    assert!(stuck.scheduler_message.starts_with("0/5 nodes"), "{}", stuck.scheduler_message);
}

#[test]
fn gpu_nodes_short_of_cpu_are_not_a_gpu_shortage() {
    // The node of the product passed node affinity and has a free GPU, but not the CPU asked for.
    let pods = [unschedulable_pod(
        "0/4 nodes are available: 1 Insufficient cpu, 3 node(s) didn't match Pod's node affinity/selector.",
    )];
    let status = compute(&pool(1, GpuType::NvidiaH100_80gb), Some(&deployment(1, 0, 1)), &pods, &[], &now(100));
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!(ready.reason, reasons::REPLICAS_NOT_READY);
    assert!(ready.message.contains("1 Insufficient cpu"), "{}", ready.message);
    assert_eq!(find(&status.conditions, DEGRADED).unwrap().status, "False");
}

#[test]
fn cpu_pool_unschedulable_for_cpu_is_not_a_gpu_problem() {
    let pods = [unschedulable_pod("0/4 nodes are available: 4 Insufficient cpu.")];
    let status = compute(&pool(1, GpuType::Cpu), Some(&deployment(1, 0, 1)), &pods, &[], &now(100));
    let ready = find(&status.conditions, READY).unwrap();
    assert_eq!(ready.reason, reasons::REPLICAS_NOT_READY);
    assert!(ready.message.contains("Insufficient cpu"));
    assert_eq!(find(&status.conditions, DEGRADED).unwrap().status, "False");
}

#[test]
fn rollout_in_progress_is_progressing() {
    let status = compute(&pool(2, GpuType::NvidiaL4), Some(&deployment(2, 1, 1)), &[], &[], &now(100));
    let progressing = find(&status.conditions, PROGRESSING).unwrap();
    assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("True", reasons::ROLLING_OUT));
    assert_eq!(find(&status.conditions, READY).unwrap().reason, reasons::REPLICAS_NOT_READY);
}

#[test]
fn progress_deadline_exceeded_is_degraded() {
    let mut dep = deployment(2, 1, 2);
    dep.status.as_mut().unwrap().conditions = Some(vec![DeploymentCondition {
        type_: "Progressing".into(),
        status: "False".into(),
        reason: Some("ProgressDeadlineExceeded".into()),
        ..DeploymentCondition::default()
    }]);
    let status = compute(&pool(2, GpuType::NvidiaL4), Some(&dep), &[], &[], &now(100));
    assert_eq!(find(&status.conditions, DEGRADED).unwrap().reason, reasons::PROGRESS_DEADLINE_EXCEEDED);
    assert_eq!(find(&status.conditions, PROGRESSING).unwrap().status, "False");
}

#[test]
fn scaled_to_zero_is_ready() {
    let status = compute(&pool(0, GpuType::NvidiaL4), Some(&deployment(0, 0, 0)), &[], &[], &now(100));
    assert_eq!(find(&status.conditions, READY).unwrap().reason, reasons::SCALED_TO_ZERO);
}

#[test]
fn recomputing_a_steady_status_is_identical() {
    let mut steady = pool(2, GpuType::NvidiaL4);
    let first = compute(&steady, Some(&deployment(2, 2, 2)), &[], &[], &now(100));
    steady.status = Some(first.clone());
    let second = compute(&steady, Some(&deployment(2, 2, 2)), &[], &[], &now(500));
    assert_eq!(first, second, "a steady pool must not produce a status write");
}

#[test]
fn every_pool_shows_its_demand_and_only_an_adaptive_one_its_limits_in_force() {
    let reports = [report(32, 32, 5, 0.5, 0.0), report(32, 8, 0, 0.0, 0.0)];
    let status = compute(&pool(2, GpuType::NvidiaL4), Some(&deployment(2, 2, 2)), &[], &reports, &now(100));
    let demand = status.demand.unwrap();
    assert_eq!((demand.replicas_reporting, demand.in_flight, demand.queued), (2, 40, 5));
    assert_eq!((demand.utilization_percent, demand.refused_per_second), (63, 0.5));
    assert_eq!(status.admission.unwrap().effective, None, "a static pool's limits are its shares");

    let mut adaptive = pool(2, GpuType::NvidiaL4);
    adaptive.spec.concurrency.adaptive = true;
    let status = compute(&adaptive, Some(&deployment(2, 2, 2)), &[], &reports, &now(100));
    assert_eq!(status.admission.unwrap().effective.unwrap().total_in_flight, 64);
    assert!(status.demand.is_some());

    let silent = compute(&adaptive, Some(&deployment(2, 2, 2)), &[], &[], &now(100));
    assert_eq!((silent.demand, silent.admission.unwrap().effective), (None, None));
}

#[test]
fn a_steady_load_with_jittering_rates_produces_no_status_write() {
    let mut steady = pool(2, GpuType::NvidiaL4);
    let first = [report(32, 30, 2, 600.0 / 60.0, 0.0), report(32, 30, 1, 0.0, 0.0)];
    let status = compute(&steady, Some(&deployment(2, 2, 2)), &[], &first, &now(100));
    steady.status = Some(status.clone());
    // A refusal more in the minute: the rounded rate, and so the status, stay as they were.
    let second = [report(32, 30, 2, 601.0 / 60.0, 0.0), report(32, 30, 1, 0.0, 0.0)];
    assert_eq!(compute(&steady, Some(&deployment(2, 2, 2)), &[], &second, &now(130)), status);
    // Twice the refusals is news.
    let third = [report(32, 30, 2, 20.0, 0.0), report(32, 30, 1, 0.0, 0.0)];
    assert_ne!(compute(&steady, Some(&deployment(2, 2, 2)), &[], &third, &now(160)), status);
}

#[test]
fn unschedulable_ignores_terminating_pods() {
    let mut pod = unschedulable_pod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.");
    pod.metadata.deletion_timestamp = Some(now(1));
    assert_eq!(unschedulable(&[pod], Some("nvidia.com/gpu")), None);
}
