use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::gpu::GpuType;

/// A fleet of Hugging Face Text Embeddings Inference (TEI) servers serving one model on one GPU
/// type, fronted by teifleet's admission-controlling multiplexer.
// Each printer column repeats `type_ = ...`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "teifleet.dev",
    version = "v1alpha1",
    kind = "EmbeddingPool",
    namespaced,
    shortname = "epool",
    category = "teifleet",
    doc = "A pool of TEI embedding servers on one GPU type, behind teifleet's admission control.",
    status = "EmbeddingPoolStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model.id"),
    printcolumn(name = "GPU", type_ = "string", json_path = ".spec.gpu.type"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "In-Flight",
        type_ = "integer",
        json_path = ".spec.concurrency.maxInFlight",
        description = "pool-wide budget of requests in flight to TEI"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddingPoolSpec {
    /// The model every replica serves.
    pub model: ModelSpec,

    /// The accelerator each replica runs on. It picks both the nodes (by the GPU Feature Discovery
    /// label `nvidia.com/gpu.product`) and the TEI image built for that GPU architecture.
    #[serde(default)]
    pub gpu: GpuSpec,

    /// Number of TEI pods. Exposed through the scale subresource, so `kubectl scale` and a
    /// HorizontalPodAutoscaler targeting the EmbeddingPool both work. Leave it unset to let an
    /// autoscaler that targets the Deployment own the replica count instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("replicas must be 0 or more"))]
    pub replicas: Option<i32>,

    /// The pool-wide admission budget enforced by the multiplexer sidecars. The operator splits it
    /// over ready replicas and publishes each replica's share in `status.admission`; sidecars apply
    /// changes live, without restarting a pod or dropping a request.
    #[serde(default)]
    pub concurrency: ConcurrencySpec,

    /// Identical unary inference calls (same RPC, same request bytes, same priority) that are in
    /// flight at the same time share one TEI call and one permit; every caller gets the answer,
    /// each with its own deadline. Worth turning on when the same texts are embedded repeatedly
    /// at once (hot queries); off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coalesce: bool,

    /// Optional tuning passed to TEI itself.
    #[serde(default)]
    pub tei: TeiSpec,

    /// Pod-level overrides applied to every TEI pod.
    #[serde(default)]
    pub template: PodOverrides,
}

/// Which model to serve, passed to TEI.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Hugging Face model id (e.g. `BAAI/bge-small-en-v1.5`) or a path inside the container.
    #[x_kube(validation = Rule::new("self.size() > 0").message("model.id must name a Hugging Face model or a local path"))]
    pub id: String,

    /// Model revision: a branch, tag or commit sha.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,

    /// Numeric precision TEI loads the weights in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,

    /// Pooling method; TEI's default comes from the model's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooling: Option<Pooling>,
}

/// Numeric precision of the model weights.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Float16,
    Float32,
    Bfloat16,
}

/// How token embeddings are pooled into one vector.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Pooling {
    Cls,
    Mean,
    Splade,
    LastToken,
}

/// The accelerator of each replica.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type == 'cpu' || self.count >= 1").message("gpu.count must be at least 1 unless gpu.type is cpu"))]
pub struct GpuSpec {
    /// Well-known GPU type, or `cpu` for CPU-only replicas.
    #[serde(rename = "type", default)]
    pub type_: GpuType,

    /// `nvidia.com/gpu` devices per replica; ignored when `type` is `cpu`.
    #[serde(default = "default_gpu_count")]
    pub count: i32,
}

fn default_gpu_count() -> i32 {
    1
}

impl Default for GpuSpec {
    fn default() -> Self {
        Self { type_: GpuType::default(), count: default_gpu_count() }
    }
}

/// The pool-wide admission budget.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConcurrencySpec {
    /// Requests in flight to TEI across the whole pool. Each ready replica gets
    /// `ceil(maxInFlight / readyReplicas)` permits (at most `maxInFlightPerReplica`). Edits apply
    /// live, within seconds, without restarting pods.
    #[serde(default = "default_max_in_flight")]
    #[x_kube(validation = Rule::new("self >= 1").message("concurrency.maxInFlight must be at least 1"))]
    pub max_in_flight: i32,

    /// Requests allowed to wait in the multiplexers across the pool, split over ready replicas
    /// like `maxInFlight`. Requests beyond it are refused at once with RESOURCE_EXHAUSTED.
    /// 0 disables queueing: a request is served at once or refused.
    #[serde(default = "default_max_queued")]
    #[x_kube(validation = Rule::new("self >= 0").message("concurrency.maxQueued must be 0 or more"))]
    pub max_queued: i32,

    /// Longest time a request may wait in the multiplexer's queue before it is refused, as a
    /// duration such as `500ms`, `2s` or `1m30s`.
    #[serde(default = "default_queue_timeout")]
    #[x_kube(validation = Rule::new(r"self.matches('^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$')").message("concurrency.queueTimeout must be a duration such as 500ms, 2s or 1m30s"))]
    pub queue_timeout: String,

    /// Upper bound on one replica's in-flight share, protecting a single TEI when few replicas
    /// are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("concurrency.maxInFlightPerReplica must be at least 1"))]
    pub max_in_flight_per_replica: Option<i32>,
}

fn default_max_in_flight() -> i32 {
    32
}
fn default_max_queued() -> i32 {
    128
}
fn default_queue_timeout() -> String {
    "2s".to_owned()
}

impl Default for ConcurrencySpec {
    fn default() -> Self {
        Self {
            max_in_flight: default_max_in_flight(),
            max_queued: default_max_queued(),
            queue_timeout: default_queue_timeout(),
            max_in_flight_per_replica: None,
        }
    }
}

/// Tuning passed to TEI.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TeiSpec {
    /// Full TEI image reference; overrides the image chosen for `gpu.type`. Must be a gRPC build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// Token budget of one TEI batch (`--max-batch-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("tei.maxBatchTokens must be at least 1"))]
    pub max_batch_tokens: Option<i32>,

    /// TEI's own concurrency limit (`--max-concurrent-requests`, default 2048). The operator raises
    /// it to at least twice the largest per-replica share so TEI never sheds before the multiplexer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("tei.maxConcurrentRequests must be at least 1"))]
    pub max_concurrent_requests: Option<i32>,

    /// Most inputs one client request may carry (`--max-client-batch-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("tei.maxClientBatchSize must be at least 1"))]
    pub max_client_batch_size: Option<i32>,

    /// Extra command-line arguments appended to TEI's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
}

/// Pod-level overrides for the TEI pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Tolerations added to the GPU toleration the operator always sets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,

    /// Affinity; required node-affinity terms are combined with the GPU product selection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Extra node selector labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Priority class of the TEI pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,

    /// Resources of the `tei` container; the GPU limit is always set from `gpu.count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Annotations added to every TEI pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,

    /// Labels added to every TEI pod (the operator's own labels win on conflict).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Observed state of an EmbeddingPool.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddingPoolStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// TEI pods that exist.
    #[serde(default)]
    pub replicas: i32,

    /// TEI pods that pass their readiness checks.
    #[serde(default)]
    pub ready_replicas: i32,

    /// TEI pods running the current pod template.
    #[serde(default)]
    pub updated_replicas: i32,

    /// Label selector of the pool's pods, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// Each replica's share of the pool budget, applied live by the multiplexer sidecars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionStatus>,

    /// `Ready`, `Progressing` and `Degraded`, each with the generation it was computed for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One replica's share of the pool-wide admission budget.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionStatus {
    /// Requests one replica's multiplexer lets into its TEI at once.
    pub in_flight_per_replica: i32,
    /// Requests one replica's multiplexer lets wait.
    pub queued_per_replica: i32,
    /// Number of replicas the budget was split over.
    pub split_over_replicas: i32,
}
