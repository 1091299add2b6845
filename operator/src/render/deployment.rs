//! The TEI Deployment: the `tei` container on the right GPU nodes with the image built for that
//! GPU, and the `multiplexer` sidecar every client request passes through.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Affinity, NodeSelectorRequirement, NodeSelectorTerm, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};
use teifleet_crds::gpu::{GPU_PRODUCT_LABEL, GPU_RESOURCE};
use teifleet_crds::{EmbeddingPool, labels};

use super::services::GRPC_PORT;
use super::{Owner, RenderConfig, typed};
use crate::Result;

/// TEI's gRPC port inside the pod; only the sidecar and the kubelet's probes use it.
pub const TEI_GRPC_PORT: i32 = 8080;
const TEI_METRICS_PORT: i32 = 9000;
const MULTIPLEXER_ADMIN_PORT: i32 = 9090;
/// TEI's `--max-concurrent-requests` unless the spec says otherwise. The multiplexer is the real
/// limiter; TEI's limit is only a guard, set high so budget edits never have to change TEI's
/// arguments (which would restart the pods). TEI's own default, 512, would be hit by ordinary
/// budgets.
const TEI_DEFAULT_MAX_CONCURRENT: i32 = 2048;
/// Unprivileged uid/gid the pods run as (the restricted Pod Security Standard forbids root).
const RUN_AS: i64 = 1000;

/// The replica count the operator applies, or `None` when an autoscaler owns it.
pub fn desired_replicas(pool: &EmbeddingPool) -> Option<i32> {
    pool.spec.replicas
}

/// The TEI image for the pool: `spec.tei.image`, else the gRPC build for the GPU architecture.
pub fn tei_image(pool: &EmbeddingPool, config: &RenderConfig) -> String {
    if let Some(image) = &pool.spec.tei.image {
        return image.clone();
    }
    let prefix = pool.spec.gpu.type_.architecture().tag_prefix();
    format!("{}:{prefix}{}-grpc", config.tei_repository, config.tei_version)
}

/// TEI's own concurrency limit. It stays at least twice the largest share a replica can get, so
/// TEI never refuses work the multiplexer admitted. It depends only on the spec, not on how many
/// replicas are ready, and only budgets above 1024 per replica raise it (restarting the pods).
pub fn tei_max_concurrent_requests(pool: &EmbeddingPool) -> i32 {
    let budget = &pool.spec.concurrency;
    let largest_share = budget.max_in_flight_per_replica.unwrap_or(budget.max_in_flight).min(budget.max_in_flight);
    let configured = pool.spec.tei.max_concurrent_requests.unwrap_or(TEI_DEFAULT_MAX_CONCURRENT);
    configured.max(largest_share.saturating_mul(2))
}

fn tei_args(pool: &EmbeddingPool) -> Vec<String> {
    let spec = &pool.spec;
    let mut args = vec![
        format!("--model-id={}", spec.model.id),
        format!("--port={TEI_GRPC_PORT}"),
        format!("--prometheus-port={TEI_METRICS_PORT}"),
        format!("--max-concurrent-requests={}", tei_max_concurrent_requests(pool)),
    ];
    if let Some(revision) = &spec.model.revision {
        args.push(format!("--revision={revision}"));
    }
    if let Some(dtype) = spec.model.dtype {
        args.push(format!("--dtype={}", enum_name(&dtype)));
    }
    if let Some(pooling) = spec.model.pooling {
        args.push(format!("--pooling={}", enum_name(&pooling)));
    }
    if let Some(tokens) = spec.tei.max_batch_tokens {
        args.push(format!("--max-batch-tokens={tokens}"));
    }
    if let Some(size) = spec.tei.max_client_batch_size {
        args.push(format!("--max-client-batch-size={size}"));
    }
    args.extend(spec.tei.extra_args.iter().cloned());
    args
}

/// The API spelling of a serde enum value.
fn enum_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        _ => String::new(),
    }
}

fn tei_resources(pool: &EmbeddingPool) -> ResourceRequirements {
    let mut resources = pool.spec.template.resources.clone().unwrap_or_default();
    if pool.spec.gpu.type_.is_gpu() {
        let gpus = Quantity(pool.spec.gpu.count.to_string());
        // Extended resources must have requests equal to limits.
        resources.limits.get_or_insert_default().insert(GPU_RESOURCE.into(), gpus.clone());
        resources.requests.get_or_insert_default().insert(GPU_RESOURCE.into(), gpus);
    }
    resources
}

/// The user's affinity with the GPU product requirement added to every required node term, so
/// user terms narrow the choice of GPU nodes but can never escape it.
fn affinity(pool: &EmbeddingPool) -> Option<Affinity> {
    let gpu = pool.spec.gpu.type_;
    let mut affinity = pool.spec.template.affinity.clone();
    if !gpu.is_gpu() {
        return affinity;
    }
    let product = NodeSelectorRequirement {
        key: GPU_PRODUCT_LABEL.into(),
        operator: "In".into(),
        values: Some(gpu.node_products().iter().map(|p| (*p).to_owned()).collect()),
    };
    let node_affinity = affinity.get_or_insert_default().node_affinity.get_or_insert_default();
    let required = node_affinity.required_during_scheduling_ignored_during_execution.get_or_insert_default();
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions.get_or_insert_default().push(product.clone());
    }
    affinity
}

fn tolerations(pool: &EmbeddingPool) -> Vec<Toleration> {
    let mut tolerations = Vec::new();
    if pool.spec.gpu.type_.is_gpu() {
        // GPU node pools are commonly tainted so only GPU workloads land on them.
        tolerations.push(Toleration {
            key: Some(GPU_RESOURCE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        });
    }
    tolerations.extend(pool.spec.template.tolerations.iter().cloned());
    tolerations
}

fn container_security_context() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "capabilities": { "drop": ["ALL"] },
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "seccompProfile": { "type": "RuntimeDefault" },
    })
}

fn grpc_probe(period: i32, failures: i32) -> Value {
    json!({ "grpc": { "port": TEI_GRPC_PORT }, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5 })
}

fn http_probe(path: &str, period: i32, failures: i32) -> Value {
    json!({ "httpGet": { "path": path, "port": "admin" }, "periodSeconds": period, "failureThreshold": failures })
}

fn tei_container(pool: &EmbeddingPool, config: &RenderConfig) -> Value {
    json!({
        "name": "tei",
        "image": tei_image(pool, config),
        "args": tei_args(pool),
        "env": [
            { "name": "HUGGINGFACE_HUB_CACHE", "value": "/data" },
            { "name": "HOME", "value": "/tmp" },
        ],
        "ports": [
            { "name": "tei-grpc", "containerPort": TEI_GRPC_PORT, "protocol": "TCP" },
            { "name": "tei-metrics", "containerPort": TEI_METRICS_PORT, "protocol": "TCP" },
        ],
        "resources": tei_resources(pool),
        // TEI downloads the model before it listens: allow up to 30 minutes for that, then let
        // readiness and liveness take over at their normal pace.
        "startupProbe": grpc_probe(10, 180),
        "readinessProbe": grpc_probe(5, 3),
        "livenessProbe": grpc_probe(10, 6),
        "securityContext": container_security_context(),
        "volumeMounts": [
            { "name": "model-cache", "mountPath": "/data" },
            { "name": "tmp", "mountPath": "/tmp" },
        ],
    })
}

fn multiplexer_container(owner: &Owner, config: &RenderConfig) -> Value {
    json!({
        "name": "multiplexer",
        "image": config.multiplexer_image,
        "args": [
            format!("--listen=0.0.0.0:{GRPC_PORT}"),
            format!("--upstream=http://127.0.0.1:{TEI_GRPC_PORT}"),
            format!("--admin-listen=0.0.0.0:{MULTIPLEXER_ADMIN_PORT}"),
        ],
        "env": [
            { "name": labels::ENV_POOL, "value": owner.name },
            { "name": labels::ENV_NAMESPACE, "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
            { "name": labels::ENV_POD_NAME, "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
        ],
        "ports": [
            { "name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP" },
            { "name": "admin", "containerPort": MULTIPLEXER_ADMIN_PORT, "protocol": "TCP" },
        ],
        "resources": {
            "requests": { "cpu": "100m", "memory": "64Mi" },
            "limits": { "memory": "256Mi" },
        },
        "readinessProbe": http_probe("/readyz", 2, 2),
        "livenessProbe": http_probe("/healthz", 10, 3),
        "securityContext": container_security_context(),
    })
}

/// Rollouts on scarce GPUs replace a pod in place instead of surging: a surge pod would wait for
/// a GPU that may never free up. CPU pools surge so capacity never dips.
fn strategy(pool: &EmbeddingPool) -> Value {
    let (surge, unavailable) = if pool.spec.gpu.type_.is_gpu() { (0, 1) } else { (1, 0) };
    json!({ "type": "RollingUpdate", "rollingUpdate": { "maxSurge": surge, "maxUnavailable": unavailable } })
}

pub(super) fn deployment(owner: &Owner, pool: &EmbeddingPool, config: &RenderConfig) -> Result<Deployment> {
    let overrides = &pool.spec.template;
    let mut pod_labels = overrides.labels.clone();
    pod_labels.extend(owner.labels());

    let mut pod_spec = json!({
        "serviceAccountName": labels::sidecar_account_name(&owner.name),
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 60,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "containers": [tei_container(pool, config), multiplexer_container(owner, config)],
        "volumes": [
            { "name": "model-cache", "emptyDir": {} },
            { "name": "tmp", "emptyDir": {} },
        ],
    });
    let fields = pod_spec.as_object_mut().expect("pod spec literal is an object");
    if let Some(affinity) = affinity(pool) {
        fields.insert("affinity".into(), json!(affinity));
    }
    let tolerations = tolerations(pool);
    if !tolerations.is_empty() {
        fields.insert("tolerations".into(), json!(tolerations));
    }
    if !overrides.node_selector.is_empty() {
        fields.insert("nodeSelector".into(), json!(overrides.node_selector));
    }
    if let Some(class) = &overrides.priority_class_name {
        fields.insert("priorityClassName".into(), json!(class));
    }

    let mut template_meta = json!({ "labels": pod_labels });
    if !overrides.annotations.is_empty() {
        template_meta["annotations"] = json!(overrides.annotations);
    }

    let mut spec = json!({
        "selector": { "matchLabels": owner.selector() },
        "strategy": strategy(pool),
        // Model downloads are slow; the startup probe already allows 30 minutes.
        "progressDeadlineSeconds": 2400,
        "revisionHistoryLimit": 5,
        "template": { "metadata": template_meta, "spec": pod_spec },
    });
    if let Some(replicas) = desired_replicas(pool) {
        spec["replicas"] = json!(replicas);
    }

    let mut deployment: Deployment = typed("Deployment", json!({ "spec": spec }))?;
    deployment.metadata = owner.meta(owner.name.clone());
    Ok(deployment)
}
