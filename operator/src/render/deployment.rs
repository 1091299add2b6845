//! The TEI Deployment: the `tei` container on the right GPU nodes with the image built for that
//! GPU, and the `multiplexer` sidecar every client request passes through.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapProjection, Container, ContainerPort, DownwardAPIProjection,
    DownwardAPIVolumeFile, EmptyDirVolumeSource, EnvVar, EnvVarSource, EphemeralVolumeSource, HTTPGetAction, KeyToPath,
    Lifecycle, LifecycleHandler, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector,
    PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate, PersistentVolumeClaimVolumeSource, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecurityContext,
    ServiceAccountTokenProjection, SleepAction, Toleration, Volume, VolumeMount, VolumeProjection,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use teifleet_crds::gpu::GPU_RESOURCE;
use teifleet_crds::{EmbeddingPool, ModelCacheSpec, gpu_memory, labels};
use teifleet_wire::{ports, tei_health};

use super::{Owner, RenderConfig};

/// TEI's `--max-concurrent-requests` unless the spec says otherwise. The multiplexer is the real
/// limiter; TEI's limit is only a guard, set high so budget edits never have to change TEI's
/// arguments (which would restart the pods). TEI's own default, 512, would be hit by ordinary
/// budgets.
const TEI_DEFAULT_MAX_CONCURRENT: i32 = 2048;
/// Unprivileged uid/gid the pods run as (the restricted Pod Security Standard forbids root).
pub(super) const RUN_AS: i64 = 1000;
/// The volume TEI's Hugging Face cache lives on, mounted at [`MODEL_CACHE_PATH`].
const MODEL_CACHE_VOLUME: &str = "model-cache";
const MODEL_CACHE_PATH: &str = "/data";
/// The sidecar's requests and limits unless `spec.template.multiplexerResources` names them: it
/// forwards bytes on one thread and holds only waiting calls.
const MULTIPLEXER_REQUESTS: [(&str, &str); 2] = [("cpu", "100m"), ("memory", "64Mi")];
const MULTIPLEXER_LIMITS: [(&str, &str); 1] = [("memory", "256Mi")];
/// The sidecar's API credentials: the volume the kubelet would mount into every container, here
/// mounted into the sidecar alone, where kube's in-cluster config looks for it.
const API_ACCESS_VOLUME: &str = "kube-api-access";
const API_ACCESS_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Lifetime of the sidecar's projected token. An hour: the kubelet renews it at 80% of that and
/// kube's client rereads the file every minute. Not the kubelet's own 3607, which API servers
/// with `--service-account-extend-token-expiration` (the default) stretch to a year.
const API_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// The replica count `spec.replicas` sets, or `None` when an autoscaler owns it (teifleet's own
/// with `spec.autoscaling`, or one that targets the Deployment).
pub fn desired_replicas(pool: &EmbeddingPool) -> Option<i32> {
    pool.spec.replicas
}

/// The Deployment's replicas: `spec.replicas`; under `spec.autoscaling` the autoscaler's decision
/// (`autoscaled`, computed by the controller: rendering reads no clock), or `minReplicas` before
/// it decided; `None` leaves them to an autoscaler that targets the Deployment.
pub fn deployment_replicas(pool: &EmbeddingPool, autoscaled: Option<i32>) -> Option<i32> {
    // A model that cannot fit its GPU share would only OOM-loop: no pod until the spec changes
    // (the status says why).
    if gpu_memory::shortfall(&pool.spec).is_some() {
        return Some(0);
    }
    match &pool.spec.autoscaling {
        Some(autoscaling) => Some(autoscaled.unwrap_or(autoscaling.min_replicas)),
        None => desired_replicas(pool),
    }
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
    let largest_share = pool.spec.in_flight_per_replica_cap().unwrap_or(budget.max_in_flight).min(budget.max_in_flight);
    let configured = pool.spec.tei.max_concurrent_requests.unwrap_or(TEI_DEFAULT_MAX_CONCURRENT);
    configured.max(largest_share.saturating_mul(2))
}

fn tei_args(pool: &EmbeddingPool) -> Vec<String> {
    let spec = &pool.spec;
    let mut args = vec![
        format!("--model-id={}", spec.model.id),
        // Loopback only: every call must pass the sidecar's admission, and other pods cannot
        // reach TEI even on clusters that do not enforce NetworkPolicies. TEI's metrics port
        // follows the same address.
        format!("--hostname={}", Ipv4Addr::LOCALHOST),
        format!("--port={}", ports::TEI_GRPC),
        format!("--prometheus-port={}", ports::TEI_METRICS),
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
    // A share of a GPU gets a batch sized to it (`EmbeddingPoolSpec::max_batch_tokens`).
    if let Some(tokens) = spec.max_batch_tokens() {
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

/// The user's resources with defaults for what they leave out. A resource the user names, as a
/// request or a limit, keeps exactly the user's settings (so a lone limit still means request =
/// limit, as Kubernetes defaults it); every other resource gets its default request and limit.
fn with_defaults(
    user: Option<&ResourceRequirements>,
    default_requests: BTreeMap<String, Quantity>,
    default_limits: BTreeMap<String, Quantity>,
) -> ResourceRequirements {
    let mut resources = user.cloned().unwrap_or_default();
    let named: BTreeSet<String> =
        resources.requests.iter().chain(resources.limits.iter()).flat_map(|map| map.keys().cloned()).collect();
    for (defaults, target) in [(default_requests, &mut resources.requests), (default_limits, &mut resources.limits)] {
        for (resource, amount) in defaults.into_iter().filter(|(resource, _)| !named.contains(resource)) {
            target.get_or_insert_default().insert(resource, amount);
        }
    }
    resources
}

/// The `tei` container's resources: the user's, CPU and memory requests for the GPU type (scaled
/// to a share of one) where the user names neither, and the GPU resource of the share: whole
/// `nvidia.com/gpu`s, a replica of a shared one, or a MIG instance.
fn tei_resources(pool: &EmbeddingPool) -> ResourceRequirements {
    let (cpu, memory) = pool.spec.default_tei_requests();
    let mut resources = with_defaults(
        pool.spec.template.resources.as_ref(),
        quantities([("cpu", cpu.as_str()), ("memory", memory.as_str())]),
        BTreeMap::new(),
    );
    if let Some(share) = pool.spec.share() {
        let amount = Quantity(share.resource_count().to_string());
        // Extended resources must have requests equal to limits.
        resources.limits.get_or_insert_default().insert(share.resource(), amount.clone());
        resources.requests.get_or_insert_default().insert(share.resource(), amount);
    }
    resources
}

/// The user's affinity with the GPU product requirement (and, for a share of a GPU, the sharing
/// or MIG labels that offer it) added to every required node term, so user terms narrow the
/// choice of GPU nodes but can never escape it.
fn affinity(pool: &EmbeddingPool) -> Option<Affinity> {
    let mut affinity = pool.spec.template.affinity.clone();
    let Some(share) = pool.spec.share() else { return affinity };
    let requirements: Vec<NodeSelectorRequirement> = share
        .node_requirements(pool.spec.gpu.type_)
        .into_iter()
        .map(|(key, operator, values)| NodeSelectorRequirement {
            key,
            operator: operator.into(),
            values: Some(values).filter(|values| !values.is_empty()),
        })
        .collect();
    let node_affinity = affinity.get_or_insert_default().node_affinity.get_or_insert_default();
    let required = node_affinity.required_during_scheduling_ignored_during_execution.get_or_insert_default();
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions.get_or_insert_default().extend(requirements.iter().cloned());
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

/// The pods' security context (the pool's, and the EmbeddingJob workers'): the restricted Pod
/// Security Standard, as uid and gid 1000, volumes writable by that group.
pub(crate) fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        fs_group: Some(RUN_AS),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..PodSecurityContext::default()
    }
}

/// Every container's security context (the pool's, and the EmbeddingJob workers').
pub(crate) fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Capabilities::default() }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

pub(super) fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile { type_: "RuntimeDefault".into(), ..SeccompProfile::default() }
}

/// Slack the kubelet gives the sidecar beyond its own wait for TEI, so a TEI too slow to answer
/// gets a 503 that says so, and a sidecar briefly short of CPU still answers in time.
const TEI_PROBE_SLACK_SECONDS: u64 = 2;

/// TEI's health as the sidecar reports it: the kubelet probes the pod's IP, and TEI listens on
/// loopback only. The port is a number, since a probe's named port is looked up among its own
/// container's ports.
fn tei_health_probe(period: i32, failures: i32) -> Probe {
    let timeout = tei_health::CHECK_TIMEOUT_SECONDS + TEI_PROBE_SLACK_SECONDS;
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(tei_health::PATH.into()),
            port: IntOrString::Int(i32::from(ports::MULTIPLEXER_ADMIN)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: i32::try_from(timeout).ok(),
        ..Probe::default()
    }
}

pub(super) fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

pub(super) fn tcp_port(name: &str, port: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: i32::from(port),
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

fn env_value(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..EnvVar::default() }
}

/// An env var filled in by the kubelet from the pod's own metadata (downward API).
pub(crate) fn env_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: field_path.into(), ..ObjectFieldSelector::default() }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn volume_mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), ..VolumeMount::default() }
}

/// The ServiceAccount token, the cluster's CA bundle and the pod's namespace, laid out as the
/// kubelet lays out its own `kube-api-access-*` volume (file mode 0644 as well), so a container
/// that mounts it at [`API_ACCESS_PATH`] finds what in-cluster clients expect. The pod itself mounts
/// no token (`automountServiceAccountToken: false`): TEI runs whatever image a pool names, and the
/// sidecar's token reads the pool's key and TLS Secrets.
fn api_access_volume() -> Volume {
    let file = |key: &str| KeyToPath { key: key.into(), path: key.into(), ..KeyToPath::default() };
    Volume {
        name: API_ACCESS_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o644),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(API_TOKEN_EXPIRATION_SECONDS),
                        ..ServiceAccountTokenProjection::default()
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![file("ca.crt")]),
                        ..ConfigMapProjection::default()
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".into()),
                                field_path: "metadata.namespace".into(),
                            }),
                            ..DownwardAPIVolumeFile::default()
                        }]),
                    }),
                    ..VolumeProjection::default()
                },
            ]),
        }),
        ..Volume::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() }
}

/// TEI's model cache: the pool's PersistentVolumeClaim, a generic ephemeral volume created with
/// each pod, or by default an emptyDir.
fn model_cache_volume(owner: &Owner, cache: Option<&ModelCacheSpec>) -> Volume {
    let claim = cache.and_then(|cache| cache.persistent_volume_claim.as_ref());
    let ephemeral = cache.and_then(|cache| cache.ephemeral.as_ref());
    match (claim, ephemeral) {
        (Some(claim), _) => Volume {
            name: MODEL_CACHE_VOLUME.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.claim_name.clone(),
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..Volume::default()
        },
        (None, Some(ephemeral)) => Volume {
            name: MODEL_CACHE_VOLUME.into(),
            ephemeral: Some(EphemeralVolumeSource {
                volume_claim_template: Some(PersistentVolumeClaimTemplate {
                    // The claim is named <pod>-model-cache and owned by its pod; the pool label
                    // finds a pool's claims.
                    metadata: Some(ObjectMeta { labels: Some(owner.selector()), ..ObjectMeta::default() }),
                    spec: PersistentVolumeClaimSpec {
                        access_modes: Some(vec!["ReadWriteOnce".into()]),
                        resources: Some(VolumeResourceRequirements {
                            requests: Some(BTreeMap::from([("storage".into(), ephemeral.size.clone())])),
                            ..VolumeResourceRequirements::default()
                        }),
                        storage_class_name: ephemeral.storage_class_name.clone(),
                        ..PersistentVolumeClaimSpec::default()
                    },
                }),
            }),
            ..Volume::default()
        },
        (None, None) => empty_dir(MODEL_CACHE_VOLUME),
    }
}

pub(super) fn quantities<const N: usize>(entries: [(&str, &str); N]) -> BTreeMap<String, Quantity> {
    entries.into_iter().map(|(resource, amount)| (resource.into(), Quantity(amount.into()))).collect()
}

/// TEI's environment: where the cache is and a writable home, then the user's variables (the
/// schema refuses user variables of the same names).
fn tei_env(pool: &EmbeddingPool) -> Vec<EnvVar> {
    let mut env = vec![env_value("HUGGINGFACE_HUB_CACHE", MODEL_CACHE_PATH), env_value("HOME", "/tmp")];
    // The environment, not the flag: TEI releases spell `--auto-truncate` as a bare switch or
    // with a value, and both read `AUTO_TRUNCATE=true|false`.
    if let Some(auto_truncate) = pool.spec.tei.auto_truncate {
        env.push(env_value("AUTO_TRUNCATE", auto_truncate.to_string()));
    }
    env.extend(pool.spec.tei.env.iter().cloned());
    env
}

/// How long the sidecar keeps serving after SIGTERM while endpoints stop routing to the pod.
const DRAIN_DELAY_SECONDS: i64 = 5;
/// TEI outlives the sidecar's drain delay by this much: the calls the sidecar still forwards in
/// that time find TEI up, and the ones in flight when it stops taking new calls finish under
/// TEI's own graceful shutdown.
const TEI_STOP_MARGIN_SECONDS: i64 = 3;

fn tei_container(pool: &EmbeddingPool, config: &RenderConfig) -> Container {
    Container {
        name: "tei".into(),
        image: Some(tei_image(pool, config)),
        args: Some(tei_args(pool)),
        env: Some(tei_env(pool)),
        env_from: Some(pool.spec.tei.env_from.clone()).filter(|sources| !sources.is_empty()),
        // No ports: TEI listens on loopback only, where only the sidecar reaches it.
        resources: Some(tei_resources(pool)),
        // TEI downloads the model before it listens: allow up to 30 minutes for that, then let
        // readiness and liveness take over at their normal pace. Every probe goes through the
        // sidecar, so liveness asks for a minute of failures in a row before restarting TEI
        // (and its model load): longer than the sidecar's own liveness takes to restart a
        // wedged sidecar (30 s) and the second it needs to serve again.
        startup_probe: Some(tei_health_probe(10, 180)),
        readiness_probe: Some(tei_health_probe(5, 3)),
        liveness_probe: Some(tei_health_probe(10, 6)),
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![volume_mount(MODEL_CACHE_VOLUME, MODEL_CACHE_PATH), volume_mount("tmp", "/tmp")]),
        // The kubelet stops both containers at once; without this TEI would exit while the
        // sidecar still serves its drain delay, and those calls would fail UNAVAILABLE.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction { seconds: DRAIN_DELAY_SECONDS + TEI_STOP_MARGIN_SECONDS }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        ..Container::default()
    }
}

/// A container of the multiplexer image in `role` (`kubernetes` in the pool's pods, `activator`
/// beside them), serving its three ports and probed on its admin port; `args` follow the role and
/// the ports' own flags.
pub(super) fn multiplexer_in_role(
    name: &str,
    role: &str,
    args: Vec<String>,
    config: &RenderConfig,
    resources: ResourceRequirements,
) -> Container {
    let ports_args = [
        format!("--listen=0.0.0.0:{}", ports::MULTIPLEXER_GRPC),
        format!("--admin-listen=0.0.0.0:{}", ports::MULTIPLEXER_ADMIN),
        format!("--http-listen=0.0.0.0:{}", ports::MULTIPLEXER_HTTP),
    ];
    Container {
        name: name.into(),
        image: Some(config.multiplexer_image.clone()),
        args: Some(std::iter::once(role.to_owned()).chain(ports_args).chain(args).collect()),
        ports: Some(vec![
            tcp_port("grpc", ports::MULTIPLEXER_GRPC),
            tcp_port("http", ports::MULTIPLEXER_HTTP),
            tcp_port("admin", ports::MULTIPLEXER_ADMIN),
        ]),
        resources: Some(resources),
        readiness_probe: Some(http_probe("/readyz", 2, 2)),
        liveness_probe: Some(http_probe("/healthz", 10, 3)),
        security_context: Some(container_security_context()),
        ..Container::default()
    }
}

fn multiplexer_container(owner: &Owner, pool: &EmbeddingPool, config: &RenderConfig) -> Container {
    let mut args = vec![
        format!("--upstream=http://127.0.0.1:{}", ports::TEI_GRPC),
        // The HTTP front's limits from the spec; TEI gets the same batch size (its default is
        // the same 32 when the spec leaves it out), so no call the sidecar sends is too large.
        format!("--payload-limit={}", pool.spec.payload_limit()),
        format!("--max-client-batch-size={}", pool.spec.max_client_batch_size()),
        format!("--max-request-inputs={}", pool.spec.max_request_inputs()),
        format!("--auto-truncate={}", pool.spec.auto_truncate()),
        format!("--drain-delay={DRAIN_DELAY_SECONDS}s"),
        // The key siblings prove a spill with; the operator creates the Secret before the pods.
        format!("--peer-secret={}", labels::peer_secret_name(&owner.name)),
    ];
    let mut resources = with_defaults(
        pool.spec.template.multiplexer_resources.as_ref(),
        quantities(MULTIPLEXER_REQUESTS),
        quantities(MULTIPLEXER_LIMITS),
    );
    // The embedding cache's local tier is charged to the sidecar's memory budget.
    args.extend(super::cache::grow_sidecar_memory(pool, &mut resources));
    // Pool, namespace and pod name come from the environment; so does the cache store's password.
    let mut env = vec![
        env_value(labels::ENV_POOL, owner.name.clone()),
        env_field(labels::ENV_NAMESPACE, "metadata.namespace"),
        env_field(labels::ENV_POD_NAME, "metadata.name"),
    ];
    env.extend(super::cache::store_password_env(pool));
    Container {
        env: Some(env),
        volume_mounts: Some(vec![VolumeMount {
            read_only: Some(true),
            ..volume_mount(API_ACCESS_VOLUME, API_ACCESS_PATH)
        }]),
        ..multiplexer_in_role("multiplexer", "kubernetes", args, config, resources)
    }
}

/// Rollouts on scarce GPUs replace a pod in place instead of surging: a surge pod would wait for
/// a GPU that may never free up. CPU pools surge so capacity never dips.
fn strategy(pool: &EmbeddingPool) -> DeploymentStrategy {
    let (surge, unavailable) = if pool.spec.gpu.type_.is_gpu() { (0, 1) } else { (1, 0) };
    DeploymentStrategy {
        type_: Some("RollingUpdate".into()),
        rolling_update: Some(RollingUpdateDeployment {
            max_surge: Some(IntOrString::Int(surge)),
            max_unavailable: Some(IntOrString::Int(unavailable)),
        }),
    }
}

fn pod_spec(owner: &Owner, pool: &EmbeddingPool, config: &RenderConfig) -> PodSpec {
    let overrides = &pool.spec.template;
    PodSpec {
        service_account_name: Some(labels::sidecar_account_name(&owner.name)),
        // Only the sidecar gets the token, through its own mount of `api_access_volume`.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(60),
        security_context: Some(pod_security_context()),
        containers: vec![tei_container(pool, config), multiplexer_container(owner, pool, config)],
        volumes: Some(vec![
            model_cache_volume(owner, pool.spec.model_cache.as_ref()),
            empty_dir("tmp"),
            api_access_volume(),
        ]),
        image_pull_secrets: Some(overrides.image_pull_secrets.clone()).filter(|secrets| !secrets.is_empty()),
        affinity: affinity(pool),
        // Empty lists and maps are left out rather than applied empty, so the operator claims no
        // ownership of fields it does not set.
        tolerations: Some(tolerations(pool)).filter(|t| !t.is_empty()),
        node_selector: Some(overrides.node_selector.clone()).filter(|s| !s.is_empty()),
        priority_class_name: overrides.priority_class_name.clone(),
        ..PodSpec::default()
    }
}

pub(super) fn deployment(
    owner: &Owner,
    pool: &EmbeddingPool,
    config: &RenderConfig,
    autoscaled: Option<i32>,
) -> Deployment {
    let overrides = &pool.spec.template;
    let mut pod_labels = overrides.labels.clone();
    pod_labels.extend(owner.labels());

    Deployment {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(DeploymentSpec {
            replicas: deployment_replicas(pool, autoscaled),
            selector: LabelSelector { match_labels: Some(owner.selector()), ..LabelSelector::default() },
            strategy: Some(strategy(pool)),
            // Model downloads are slow; the startup probe already allows 30 minutes.
            progress_deadline_seconds: Some(2400),
            revision_history_limit: Some(5),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(overrides.annotations.clone()).filter(|a| !a.is_empty()),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(owner, pool, config)),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}
