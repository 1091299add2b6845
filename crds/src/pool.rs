use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvFromSource, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
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
    printcolumn(
        name = "Share",
        type_ = "string",
        json_path = ".status.gpu.share",
        description = "what each replica takes of a GPU: 1 GPU, 1/4 time-slicing, mig 1g.10gb"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "why the pool is or is not ready: the reason of its Ready condition"
    ),
    printcolumn(
        name = "In-Flight",
        type_ = "integer",
        json_path = ".spec.concurrency.maxInFlight",
        description = "pool-wide budget of requests in flight to TEI"
    ),
    printcolumn(
        name = "Utilization%",
        type_ = "integer",
        json_path = ".status.demand.utilizationPercent",
        description = "percent of the in-flight limits in force that is in use, as the sidecars last reported"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Queued",
        type_ = "integer",
        json_path = ".status.demand.queued",
        description = "inputs waiting in the sidecars' queues, as they last reported",
        priority = "1"
    ),
    printcolumn(
        name = "gRPC",
        type_ = "string",
        json_path = ".status.endpoints.grpc",
        description = "where gRPC (tei.v1) clients call the pool",
        priority = "1"
    ),
    printcolumn(
        name = "HTTP",
        type_ = "string",
        json_path = ".status.endpoints.http",
        description = "TEI's HTTP API and OpenAI's /v1/embeddings for the pool",
        priority = "1"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.autoscaling) || !has(self.replicas)").message("spec.autoscaling owns this pool's replicas: remove spec.replicas (kubectl scale and HorizontalPodAutoscalers included), or remove spec.autoscaling to size the pool by hand"))]
#[x_kube(validation = Rule::new("!has(self.autoscaling) || has(self.concurrency.maxInFlightPerReplica)").message("spec.autoscaling needs concurrency.maxInFlightPerReplica: what one replica lets in, so capacity grows with the pool"))]
pub struct EmbeddingPoolSpec {
    /// The model every replica serves.
    pub model: ModelSpec,

    /// The accelerator each replica runs on. It picks both the nodes (by the GPU Feature Discovery
    /// label `nvidia.com/gpu.product`) and the TEI image built for that GPU architecture.
    #[serde(default)]
    pub gpu: GpuSpec,

    /// Number of TEI pods. Exposed through the scale subresource, so `kubectl scale` and a
    /// HorizontalPodAutoscaler targeting the EmbeddingPool both work. Leave it unset to let an
    /// autoscaler that targets the Deployment own the replica count instead, or with
    /// `autoscaling`, which then owns it (the two are refused together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("replicas must be 0 or more"))]
    pub replicas: Option<i32>,

    /// The operator sizes the pool from what its sidecars report (docs/operating.md). Each
    /// replica then lets `concurrency.maxInFlightPerReplica` in (required), so capacity grows
    /// with the pool, and `concurrency.maxInFlight` caps the pool as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<crate::AutoscalingSpec>,

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

    /// An embedding cache: each input of an embedding call looked up by its content, only the
    /// misses sent to TEI (docs/caching.md). Unset: no cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::CacheSpec>,

    /// API keys: when set, every call (gRPC `authorization: Bearer <key>`, HTTP
    /// `Authorization: Bearer <key>`, which is what the OpenAI SDKs send) must carry one of the
    /// keys in the named Secret, and the key names the call's tenant. Unset: no keys, and the
    /// `x-teifleet-tenant` metadata names the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,

    /// TLS on the pool's gRPC and HTTP ports, from a `kubernetes.io/tls` Secret (cert-manager's
    /// kind). Unset: plain text. The sidecars follow the Secret live: new connections get a
    /// rotated certificate, open ones keep theirs, and a broken one leaves the last good one in
    /// force (condition `TLSReady` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// The sidecar's gRPC port beyond `tei.v1`: whether it serves server reflection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GrpcSpec>,

    /// Optional tuning passed to TEI itself.
    #[serde(default)]
    pub tei: TeiSpec,

    /// Limits of the sidecar's HTTP front (TEI's HTTP API and OpenAI's embeddings route on the
    /// pool Service's `http` port), with TEI's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSpec>,

    /// Where TEI keeps the models it downloads (mounted at `/data`). Unset: an `emptyDir`, which
    /// lives as long as the pod, so every new pod downloads the model again. A
    /// `persistentVolumeClaim` keeps the cache across pods, restarts and rollouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_cache: Option<ModelCacheSpec>,

    /// Which pods may reach the pool's pods, as a NetworkPolicy the operator keeps (it takes
    /// effect where the network plugin enforces NetworkPolicies). TEI itself listens on the pod's
    /// loopback only, out of every other pod's reach either way.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,

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

    /// GPU memory one replica of the model needs: its weights plus TEI's batch buffers for
    /// `tei.maxBatchTokens`, e.g. `3Gi`. Checked against what the GPU share gives; a model that
    /// does not fit gets no pod and the condition `InsufficientGPUMemory` naming both figures.
    /// Unset: estimated for well-known models, not checked for others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))").message("model.gpuMemory must be a positive quantity such as 3Gi"))]
    pub gpu_memory: Option<Quantity>,
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

/// The accelerator of each replica: whole GPUs, or a share of one (`sharing`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type == 'cpu' || self.count >= 1").message("gpu.count must be at least 1 unless gpu.type is cpu"))]
#[x_kube(validation = Rule::new("!has(self.sharing) || self.type != 'cpu'").message("gpu.sharing needs a GPU type: a cpu pool has no GPU to share"))]
#[x_kube(validation = Rule::new("!has(self.sharing) || self.count == 1").message("gpu.sharing gives each replica one share of one GPU: leave gpu.count at 1"))]
#[x_kube(validation = Rule::new("!has(self.sharing) || self.sharing.strategy != 'mig' || self.type in ['nvidia-a100-40gb', 'nvidia-a100-80gb', 'nvidia-h100-80gb', 'nvidia-h200']").message("gpu.sharing.strategy mig needs a GPU with MIG: nvidia-a100-40gb, nvidia-a100-80gb, nvidia-h100-80gb or nvidia-h200"))]
#[x_kube(validation = Rule::new("!has(self.sharing) || !has(self.sharing.profile) || self.type != 'nvidia-a100-40gb' || self.sharing.profile in ['1g.5gb', '1g.10gb', '2g.10gb', '3g.20gb', '4g.20gb', '7g.40gb']").message("gpu.sharing.profile must be a MIG profile of nvidia-a100-40gb: 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb or 7g.40gb"))]
#[x_kube(validation = Rule::new("!has(self.sharing) || !has(self.sharing.profile) || self.type != 'nvidia-a100-80gb' || self.sharing.profile in ['1g.10gb', '1g.20gb', '2g.20gb', '3g.40gb', '4g.40gb', '7g.80gb']").message("gpu.sharing.profile must be a MIG profile of nvidia-a100-80gb: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb or 7g.80gb"))]
#[x_kube(validation = Rule::new("!has(self.sharing) || !has(self.sharing.profile) || self.type != 'nvidia-h100-80gb' || self.sharing.profile in ['1g.10gb', '1g.20gb', '2g.20gb', '3g.40gb', '4g.40gb', '7g.80gb']").message("gpu.sharing.profile must be a MIG profile of nvidia-h100-80gb: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb or 7g.80gb"))]
#[x_kube(validation = Rule::new("!has(self.sharing) || !has(self.sharing.profile) || self.type != 'nvidia-h200' || self.sharing.profile in ['1g.18gb', '1g.35gb', '2g.35gb', '3g.71gb', '4g.71gb', '7g.141gb']").message("gpu.sharing.profile must be a MIG profile of nvidia-h200: 1g.18gb, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb or 7g.141gb"))]
pub struct GpuSpec {
    /// Well-known GPU type, or `cpu` for CPU-only replicas.
    #[serde(rename = "type", default)]
    pub type_: GpuType,

    /// Whole `nvidia.com/gpu` devices per replica; ignored when `type` is `cpu`, and 1 with
    /// `sharing`.
    #[serde(default = "default_gpu_count")]
    pub count: i32,

    /// A share of one GPU per replica instead of whole GPUs, the way the cluster's NVIDIA device
    /// plugin offers it: `{strategy: time-slicing, replicas: 4}` (or `mps`; `renameByDefault:
    /// true` when the plugin renames the resource to `nvidia.com/gpu.shared`), or `{strategy:
    /// mig, profile: 1g.10gb}`. Pods go to nodes whose GPU Feature Discovery labels offer exactly
    /// that share; the model must fit the share's memory (`model.gpuMemory`), and the defaults
    /// of `tei.maxBatchTokens`, `concurrency.maxInFlightPerReplica` and the CPU and memory
    /// requests follow the share. Unset: whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<crate::sharing::GpuSharing>,
}

fn default_gpu_count() -> i32 {
    1
}

impl Default for GpuSpec {
    fn default() -> Self {
        Self { type_: GpuType::default(), count: default_gpu_count(), sharing: None }
    }
}

/// The pool-wide admission budget.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConcurrencySpec {
    /// Inputs in flight to TEI across the whole pool, counted as TEI counts its slots: one per
    /// Embed or Predict call or stream message, one per text of a Rerank. Each ready replica gets
    /// `ceil(maxInFlight / readyReplicas)` permits (at most `maxInFlightPerReplica`). Edits apply
    /// live, within seconds, without restarting pods.
    #[serde(default = "default_max_in_flight")]
    #[x_kube(validation = Rule::new("self >= 1").message("concurrency.maxInFlight must be at least 1"))]
    pub max_in_flight: i32,

    /// Inputs allowed to wait in the multiplexers across the pool, split over ready replicas
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

    /// Optional second budget, in tokens: estimated tokens in flight to TEI across the pool,
    /// split over ready replicas like `maxInFlight`. A call is charged its estimated tokens on
    /// admission (its text length over a characters-per-token ratio learned from TEI's answers),
    /// so a 512-token input costs what it costs TEI, not the same as a 2-token one. Size it
    /// near TEI's `--max-batch-tokens` times the replicas for about one batch in flight each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("concurrency.maxInFlightTokens must be at least 1"))]
    pub max_in_flight_tokens: Option<i64>,

    /// Let every sidecar find its own in-flight limit, between 1 and its share of `maxInFlight`
    /// (which becomes the ceiling), from the queue and batch times TEI reports per call: TEI is
    /// kept busy with about one batch time of work queued inside it. Off: the share is the limit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adaptive: bool,

    /// Weights of tenants (named by the `x-teifleet-tenant` metadata) sharing the pool: within a
    /// priority, the queue serves tenants in proportion to their weights, and a tenant flooding
    /// the queue gives up its own newest work first. Tenants not listed weigh 1. Listed tenants
    /// also get metric series of their own; the others are counted together as `other`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // maxItems (not only a rule) so the API server can bound the cost of the uniqueness rule.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(t, self.exists_one(u, u.name == t.name))").message("concurrency.tenants names must be unique"))]
    pub tenants: Vec<TenantWeight>,

    /// The floor of the `ingest` lane, in percent of admissions (0 to 50; unset: 10). Calls say
    /// their lane with `x-teifleet-lane: query|ingest` (default `query`). Queries are served
    /// before waiting ingest, and ingest takes all the room queries leave; while queries would
    /// take every admission (their queue stands: waits longer than a short burst's), a waiting
    /// ingest call is passed by at most `(100 - share) / share` of them before its turn, so a
    /// bulk job keeps at least this share. 0: no floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 50").message("concurrency.ingestShare must be between 0 and 50 (percent)"))]
    pub ingest_share: Option<i32>,

    /// Places of TEI's next batch that `ingest` leaves to queries while queries come, in percent
    /// (0 to 50). Unset (the default): learned from TEI's own batch times, so that a query beside
    /// ingest rides a batch at most about 1.2x as long as one of queries alone (no reserve where
    /// TEI's batch time is mostly a fixed cost, up to half the batch where it grows with the
    /// batch). Set, a fixed share: 0 lets ingest take every place queries leave; more keeps
    /// batches shorter and room for queries that arrive late in a batch, at the cost of that much
    /// ingest throughput while queries come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 50").message("concurrency.queryReserve must be between 0 and 50 (percent)"))]
    pub query_reserve: Option<i32>,

    /// The most of TEI's time each replica keeps it busy while its calls queue, in percent (1 to
    /// 100), always. Unset: a pool on a time-sliced GPU (`gpu.sharing.strategy: time-slicing`)
    /// is capped at its share (`100 / gpu.sharing.replicas`) only while TEI's batch times say a
    /// neighbour is busy on the device, and has the whole card while it is quiet; any other pool
    /// is not capped. A time-sliced GPU hands its turns to whichever replica has work and
    /// isolates nothing: a flooding pool there runs batch after batch, and every neighbour's call
    /// waits for them. Under a cap its sidecar lets calls in only while its time with TEI busy
    /// stays under the cap (over a burst of 50 ms), so neighbours find the device free most of
    /// the time. The price of setting it: the pool never uses more than the cap, even of an idle
    /// GPU. The time counted includes waiting for a neighbour's turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("concurrency.deviceTimeCap must be between 1 and 100 (percent)"))]
    pub device_time_cap: Option<i32>,
}

/// One tenant's weight.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantWeight {
    /// The tenant's name, as sent in `x-teifleet-tenant`.
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 128").message("concurrency.tenants[].name must be 1 to 128 characters"))]
    pub name: String,

    /// Relative share of the pool when tenants compete (default 1).
    #[serde(default = "default_weight")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000").message("concurrency.tenants[].weight must be between 1 and 1000"))]
    pub weight: i32,

    /// The highest priority this tenant's calls may ask for, when the pool knows who the caller is
    /// (`spec.auth` keys, or a mutual-TLS client certificate): a call asking for more is served
    /// at this priority. Identified tenants not listed, or listed without it, get `standard`:
    /// `critical` jumps every queue and evicts others' work, so it is granted, never claimed.
    /// Without identity there is nothing to check (any caller may name any tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<PriorityCeiling>,

    /// The lane this tenant's calls take when they name none (`x-teifleet-lane`), when the pool
    /// knows who the caller is (`spec.auth` keys, or a mutual-TLS client certificate): `ingest`
    /// for a key an indexing job uses, so it need not set the header on every call. A call's own
    /// header still wins; unset, calls take `query`, streams and Arrow batches `ingest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<LaneName>,
}

/// A lane, as `x-teifleet-lane` spells it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum LaneName {
    Query,
    Ingest,
}

/// A priority a tenant may be allowed, as `x-teifleet-priority` spells it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum PriorityCeiling {
    Critical,
    Standard,
    Sheddable,
}

fn default_weight() -> i32 {
    1
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
            max_in_flight_tokens: None,
            adaptive: false,
            tenants: Vec::new(),
            ingest_share: None,
            query_reserve: None,
            device_time_cap: None,
        }
    }
}

/// Where a pool's API keys live.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// A Secret in the pool's namespace. Each data key is a tenant name; its value is that
    /// tenant's API key, or several separated by newlines, so a key is rotated by adding the new
    /// one beside it, moving clients over, then removing the old one. Edits apply within a second,
    /// without restarts. Keys must be at least 16 characters; the sidecars may read this Secret
    /// and no other.
    #[x_kube(validation = Rule::new("self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("auth.secretName must name a Secret in the pool's namespace (lowercase letters, digits, '-' and '.')"))]
    pub secret_name: String,
}

/// The pool's certificate, and who may connect.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// A `kubernetes.io/tls` Secret in the pool's namespace: `tls.crt` (the chain, leaf first)
    /// and `tls.key`. Its `ca.crt`, when present, is what the sidecars trust when they call each
    /// other (spillover between replicas, routing to other pools with TLS). The certificate must
    /// name the pool Service (`<pool>.<namespace>.svc`).
    #[x_kube(validation = Rule::new("self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("tls.secretName must name a Secret in the pool's namespace (lowercase letters, digits, '-' and '.')"))]
    pub secret_name: String,

    /// Mutual TLS: clients must present a certificate signed by a CA in this bundle, or the
    /// handshake fails. The certificate's identity names the call's tenant (its subject's common
    /// name, else its first DNS name), as an API key does; with `spec.auth` too, the key decides.
    // `clientCA`, as Kubernetes spells initialisms (camelCase would make it `clientCa`).
    #[serde(default, rename = "clientCA", skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<ClientCaSpec>,

    /// Calls routed from this pool to another (`x-teifleet-pool`, `x-teifleet-model`) arrive in
    /// TLS; a pool without `spec.tls` would get them in clear text, so they are refused
    /// (FAILED_PRECONDITION, HTTP 400) unless this is true. Routes to pools with TLS, and calls
    /// served by this pool's own TEI (over the pod's loopback), are never affected.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plaintext_routes: bool,
}

/// Where the CA bundle of mutual TLS lives: exactly one of a Secret or a ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretName) != has(self.configMapName)").message("tls.clientCA needs exactly one of secretName or configMapName"))]
pub struct ClientCaSpec {
    /// A Secret in the pool's namespace holding the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("tls.clientCA.secretName must name a Secret in the pool's namespace"))]
    pub secret_name: Option<String>,
    /// A ConfigMap in the pool's namespace holding the bundle (trust-manager's kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("tls.clientCA.configMapName must name a ConfigMap in the pool's namespace"))]
    pub config_map_name: Option<String>,
    /// The key holding the PEM bundle.
    #[serde(default = "default_ca_key")]
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 253").message("tls.clientCA.key must be a data key, 1 to 253 characters"))]
    pub key: String,
}

/// The data key of a CA bundle in cert-manager's Secrets and trust-manager's ConfigMaps.
pub const CA_BUNDLE_KEY: &str = "ca.crt";

fn default_ca_key() -> String {
    CA_BUNDLE_KEY.to_owned()
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

    /// Most inputs TEI takes in one call (`--max-client-batch-size`, TEI's default 32). The
    /// sidecar's HTTP front sends a larger batch to TEI in calls of at most this many inputs,
    /// each admitted as a whole, and puts the answers back together in order, so HTTP clients may
    /// send more (up to `http.payloadLimit`). Changing it restarts the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("tei.maxClientBatchSize must be at least 1"))]
    pub max_client_batch_size: Option<i32>,

    /// Whether TEI truncates an input longer than the model takes when a request does not say
    /// (TEI's `--auto-truncate`, `AUTO_TRUNCATE`; true by default in TEI 1.9). TEI's HTTP routes
    /// follow it and its gRPC API ignores it, so the sidecar's HTTP front follows it too.
    /// Changing it restarts the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_truncate: Option<bool>,

    /// Extra command-line arguments appended to TEI's. Never put a token here (arguments show in
    /// the pod spec and in process listings): set `HF_TOKEN` in `env` from a Secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 128))]
    #[x_kube(
        validation = Rule::new("self.all(a, !a.startsWith('--hf-token') && !a.startsWith('--hf-api-token'))").message("tei.extraArgs must not carry a Hugging Face token (--hf-token): set HF_TOKEN in tei.env from a Secret"),
        validation = Rule::new("self.all(a, !a.startsWith('--max-client-batch-size') && !a.startsWith('--payload-limit') && !a.startsWith('--auto-truncate'))").message("tei.extraArgs must not set --max-client-batch-size, --payload-limit or --auto-truncate: set tei.maxClientBatchSize, http.payloadLimit and tei.autoTruncate, which the sidecar follows too"),
    )]
    pub extra_args: Vec<String>,

    /// Environment variables of the `tei` container, e.g. `HF_TOKEN` from a Secret for gated or
    /// private models: `{name: HF_TOKEN, valueFrom: {secretKeyRef: {name: hf, key: token}}}`.
    /// A Hugging Face token must come from a Secret, never as a literal `value`: the pool spec
    /// is readable by everything that reads EmbeddingPools, the sidecars included.
    /// `HUGGINGFACE_HUB_CACHE` and `HOME` are set by the operator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(
        validation = Rule::new("self.all(e, e.name.size() > 0)").message("tei.env: every variable needs a name"),
        validation = Rule::new("self.all(e, e.name != 'HUGGINGFACE_HUB_CACHE' && e.name != 'HOME')").message("tei.env must not set HUGGINGFACE_HUB_CACHE or HOME: the operator sets them (the cache is spec.modelCache)"),
        validation = Rule::new("self.all(e, e.name != 'AUTO_TRUNCATE')").message("tei.env must not set AUTO_TRUNCATE: set tei.autoTruncate, which the sidecar's HTTP front follows too"),
        validation = Rule::new("self.all(e, !(e.name in ['HF_TOKEN', 'HF_API_TOKEN', 'HUGGING_FACE_HUB_TOKEN']) || !has(e.value))").message("tei.env: a Hugging Face token (HF_TOKEN) must come from a Secret with valueFrom.secretKeyRef, not a literal value"),
    )]
    pub env: Vec<EnvVar>,

    /// Sources of environment variables for the `tei` container: whole ConfigMaps or Secrets.
    /// Variables in `env` win over these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(s, has(s.configMapRef) != has(s.secretRef))").message("tei.envFrom: each entry must set exactly one of configMapRef or secretRef"))]
    pub env_from: Vec<EnvFromSource>,
}

/// TEI's `--payload-limit` default, in bytes.
pub const TEI_DEFAULT_PAYLOAD_LIMIT: i32 = 2_000_000;
/// TEI's `--max-client-batch-size` default.
pub const TEI_DEFAULT_MAX_CLIENT_BATCH_SIZE: i32 = 32;
/// TEI's `--auto-truncate` default (TEI 1.9).
pub const TEI_DEFAULT_AUTO_TRUNCATE: bool = true;
/// What the sidecar's gRPC port serves beside `tei.v1`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GrpcSpec {
    /// gRPC server reflection (`grpc.reflection.v1` and `v1alpha`, what `grpcurl list` asks),
    /// answered without a key: it describes the whole API to anyone who can connect. Unset: on
    /// for a pool without `spec.auth`, off for a pool with it (a caller without a key learns
    /// nothing; clients there use the `.proto` files). Off, reflection calls are UNIMPLEMENTED, as
    /// TEI answers them without reflection. The sidecars follow it live; the namespace's
    /// activator serves no reflection while any pool it stands in for has it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflection: Option<bool>,
}

/// Most inputs in one HTTP request by default: OpenAI's embeddings API takes at most 2048 inputs
/// per request, so clients written for it (LangChain sends 1000 at a time) stay under it.
pub const DEFAULT_MAX_REQUEST_INPUTS: i32 = 2048;

/// Limits of the sidecar's HTTP front.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpSpec {
    /// Largest request body the HTTP front reads, in bytes (TEI's `--payload-limit`, default
    /// 2000000); a larger body is answered 413 before it is parsed. The sidecar holds a request's
    /// body and texts while it runs: raise `template.multiplexerResources` with it. TEI's gRPC
    /// server has no such limit, so it stays a sidecar setting. Changing it restarts the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("http.payloadLimit must be at least 1 byte"))]
    pub payload_limit: Option<i32>,

    /// Most inputs in one HTTP request (default 2048, OpenAI's own limit); a request with more is
    /// answered 413 before anything is queued. The sidecar splits a request into calls of at most
    /// `tei.maxClientBatchSize` inputs and holds its answers while it runs, so this bounds the
    /// upstream calls, the time and the memory one small body can cost. Changing it restarts the
    /// pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000000").message("http.maxRequestInputs must be between 1 and 1000000"))]
    pub max_request_inputs: Option<i32>,
}

impl EmbeddingPoolSpec {
    /// The HTTP front's body limit in bytes: `http.payloadLimit`, else TEI's default.
    pub fn payload_limit(&self) -> i32 {
        self.http.as_ref().and_then(|http| http.payload_limit).unwrap_or(TEI_DEFAULT_PAYLOAD_LIMIT)
    }

    /// Most inputs in one HTTP request: `http.maxRequestInputs`, else the default.
    pub fn max_request_inputs(&self) -> i32 {
        self.http.as_ref().and_then(|http| http.max_request_inputs).unwrap_or(DEFAULT_MAX_REQUEST_INPUTS)
    }

    /// Whether TEI truncates long inputs when a request does not say: `tei.autoTruncate`, else
    /// TEI's default.
    pub fn auto_truncate(&self) -> bool {
        self.tei.auto_truncate.unwrap_or(TEI_DEFAULT_AUTO_TRUNCATE)
    }

    /// Whether the sidecars serve gRPC server reflection: `grpc.reflection`, else on unless the
    /// pool has API keys (`auth`), whose callers without a key must learn nothing of the API.
    pub fn grpc_reflection(&self) -> bool {
        self.grpc.as_ref().and_then(|grpc| grpc.reflection).unwrap_or(self.auth.is_none())
    }

    /// Whether calls that arrived in TLS may be routed to a pool served in plain text:
    /// `tls.allowPlaintextRoutes` (a pool without TLS has nothing to protect).
    pub fn allows_plaintext_routes(&self) -> bool {
        self.tls.as_ref().is_none_or(|tls| tls.allow_plaintext_routes)
    }

    /// Most inputs in one TEI call: `tei.maxClientBatchSize`, else TEI's default.
    pub fn max_client_batch_size(&self) -> i32 {
        self.tei.max_client_batch_size.unwrap_or(TEI_DEFAULT_MAX_CLIENT_BATCH_SIZE)
    }
}

/// The volume TEI's Hugging Face cache lives on. Exactly one of `persistentVolumeClaim` and
/// `ephemeral`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.persistentVolumeClaim) != has(self.ephemeral)").message("modelCache must set exactly one of persistentVolumeClaim or ephemeral"))]
pub struct ModelCacheSpec {
    /// An existing PersistentVolumeClaim in the pool's namespace, shared by every replica: the
    /// model is downloaded once and survives pod restarts, rescheduling and rollouts. With more
    /// than one replica it must be `ReadWriteMany` (e.g. NFS, EFS, Filestore, CephFS); a
    /// `ReadWriteOnce` claim attaches to one node only, so it works for a single replica (a
    /// second pod on another node stays in ContainerCreating). The operator cannot see the
    /// claim's access mode; the kubelet reports a mismatch on the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<ModelCacheClaim>,

    /// A volume created with each pod and deleted with it (a generic ephemeral volume): a
    /// disk of the given size and storage class instead of the node's own ephemeral storage. It
    /// survives container restarts, not pod replacement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<EphemeralModelCache>,
}

/// An existing PersistentVolumeClaim holding the model cache.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheClaim {
    /// Name of the PersistentVolumeClaim, in the pool's namespace.
    #[x_kube(validation = Rule::new("self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("modelCache.persistentVolumeClaim.claimName must name a PersistentVolumeClaim (lowercase letters, digits, '-' and '.')"))]
    pub claim_name: String,
}

/// A per-pod volume for the model cache, provisioned from a storage class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralModelCache {
    /// Capacity requested for the volume, e.g. `20Gi`; room for the model's weights and tokenizer.
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))").message("modelCache.ephemeral.size must be a positive quantity such as 20Gi"))]
    pub size: Quantity,

    /// Storage class of the volume; unset uses the cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// The pool's NetworkPolicy: calls reach the sidecars' gRPC and HTTP ports from anywhere, their
/// admin port (metrics and probes) only from the pool's own namespace, the operator's, and the
/// namespaces `metricsNamespaceSelector` picks, and no other port of the pods from anywhere.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Keep the NetworkPolicy (default true). Off: the operator deletes it, and the sidecars'
    /// admin port is open to every pod (TEI stays on loopback).
    #[serde(default = "default_network_policy_enabled")]
    pub enabled: bool,

    /// Namespaces whose pods may also reach the sidecars' admin port (`/metrics`, `/healthz`,
    /// `/readyz`), e.g. the one Prometheus scrapes from:
    /// `{matchLabels: {kubernetes.io/metadata.name: monitoring}}`; `{}` selects every namespace.
    /// Unset: the pool's own namespace (and the operator's) only. The kubelet's probes come from
    /// the node, which NetworkPolicies never block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])").message("networkPolicy.metricsNamespaceSelector.matchExpressions[].operator must be In, NotIn, Exists or DoesNotExist"))]
    pub metrics_namespace_selector: Option<LabelSelector>,
}

fn default_network_policy_enabled() -> bool {
    true
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        Self { enabled: default_network_policy_enabled(), metrics_namespace_selector: None }
    }
}

/// Pod-level overrides for the TEI pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
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

    /// Resources of the `tei` container; the GPU request and limit are always `gpu.count`.
    /// Unset CPU and memory get defaults per GPU type (e.g. 2 CPU and 8Gi on `nvidia-l4`,
    /// 8 CPU and 32Gi on `nvidia-h100-80gb`, 2 CPU and 4Gi on `cpu`), as requests without
    /// limits. A resource named here, as a request or a limit, replaces its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_requirements_schema")]
    pub resources: Option<ResourceRequirements>,

    /// Resources of the `multiplexer` sidecar. Defaults: requests of 100m CPU and 64Mi memory,
    /// a memory limit of 256Mi. A resource named here, as a request or a limit, replaces its
    /// defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_requirements_schema")]
    pub multiplexer_resources: Option<ResourceRequirements>,

    /// Secrets for pulling the TEI and multiplexer images from private registries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(s, s.name.size() > 0)").message("template.imagePullSecrets: every entry needs the name of a Secret"))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Annotations added to every TEI pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,

    /// Labels added to every TEI pod (the operator's own labels win on conflict).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Most resource names one container's requests or limits may list (cpu, memory,
/// ephemeral-storage, nvidia.com/gpu, hugepages-* leave room). The API server bounds the cost of a
/// CEL rule under a map by the map's size, so the quantity check needs the bound.
const MAX_RESOURCE_NAMES: u32 = 10;

/// The schema of `ResourceRequirements` with every request and limit checked to be a quantity,
/// so a typo such as `8GB` is refused with the pool instead of failing the Deployment later.
pub(crate) fn resource_requirements_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<ResourceRequirements>();
    for map in ["requests", "limits"] {
        let Some(map_schema) = schema.get_mut("properties").and_then(|p| p.get_mut(map)) else { continue };
        map_schema["maxProperties"] = MAX_RESOURCE_NAMES.into();
        if let Some(quantity) = map_schema.get_mut("additionalProperties") {
            quantity["x-kubernetes-validations"] = serde_json::json!([{
                "rule": "isQuantity(string(self))",
                "message": "must be a quantity such as 500m, 2 or 8Gi",
            }]);
        }
    }
    schema.insert("nullable".into(), true.into());
    schema
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

    /// What the pool is asked to do, as its ready sidecars reported it at the operator's last
    /// check (every 30 s): in flight, queued, utilization, refusals and spills. Absent while no
    /// sidecar answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<crate::PoolDemand>,

    /// What the autoscaler decided last and why (`spec.autoscaling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<crate::AutoscalingStatus>,

    /// What each replica takes of a GPU and whether the model fits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuShareStatus>,

    /// Where clients call the pool, through its Service (`kubectl get epool -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,

    /// `Ready`, `Progressing` and `Degraded`, and `TLSReady` for a pool with `spec.tls`, each with
    /// the generation it was computed for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The share of a GPU each replica takes, as the operator resolved `spec.gpu`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GpuShareStatus {
    /// `1 GPU`, `2 GPUs`, `1/4 time-slicing`, `1/7 mps`, `mig 1g.10gb` (the `SHARE` column).
    pub share: String,
    /// The extended resource and count each replica requests: `nvidia.com/gpu.shared: 1`.
    pub resource: String,
    /// GPU memory the share gives one replica, e.g. `5.6 GiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// GPU memory the model needs and how that was found, e.g. `0.6 GiB (estimated: ...)`;
    /// absent for a model the catalogue does not know without `spec.model.gpuMemory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_memory: Option<String>,
}

/// The pool Service's addresses, one per protocol, inside the cluster.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    /// gRPC (`tei.v1`): `<pool>.<namespace>.svc:50051`, the target gRPC clients take; h2c, or
    /// HTTP/2 over TLS when `tls` is true.
    pub grpc: String,
    /// TEI's HTTP API and OpenAI's embeddings route: `http://<pool>.<namespace>.svc:8000`, or
    /// `https://` with TLS.
    pub http: String,
    /// Both ports speak TLS (`spec.tls`): clients must connect with TLS and trust the pool's
    /// certificate, which names `<pool>.<namespace>.svc`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
}

impl Endpoints {
    /// The addresses of the Service `pool` in `namespace`, whose ports speak TLS when `tls`.
    pub fn of(pool: &str, namespace: &str, tls: bool) -> Self {
        use teifleet_wire::ports::{MULTIPLEXER_GRPC, MULTIPLEXER_HTTP};
        let scheme = if tls { "https" } else { "http" };
        Self {
            grpc: format!("{pool}.{namespace}.svc:{MULTIPLEXER_GRPC}"),
            http: format!("{scheme}://{pool}.{namespace}.svc:{MULTIPLEXER_HTTP}"),
            tls,
        }
    }
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
    /// With `concurrency.adaptive`: the limits the sidecars enforce right now, below their shares,
    /// as they reported them at the operator's last check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective: Option<crate::EffectiveLimits>,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt as _;

    use super::*;

    /// The rules on the whole spec, as the API server gets them.
    fn spec_rules() -> Vec<String> {
        let crd = serde_json::to_value(EmbeddingPool::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let rules = spec["x-kubernetes-validations"].as_array().cloned().unwrap_or_default();
        rules.iter().filter_map(|rule| Some(rule["rule"].as_str()?.to_owned())).collect()
    }

    #[test]
    fn a_pool_with_tls_or_mutual_tls_may_scale_to_zero() {
        // The activator serves each TLS pool's own certificate and passes a client certificate's
        // tenant on (docs/operating.md, TLS at zero): no rule ties spec.tls to autoscaling.
        let rules = spec_rules();
        assert!(rules.iter().any(|rule| rule.contains("self.autoscaling")), "{rules:?}");
        assert!(!rules.iter().any(|rule| rule.contains("self.tls")), "{rules:?}");
    }

    fn spec(extra: serde_json::Value) -> EmbeddingPoolSpec {
        let mut spec = serde_json::json!({ "model": { "id": "BAAI/bge-small-en-v1.5" } });
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(spec).unwrap()
    }

    #[test]
    fn reflection_is_served_unless_the_pool_has_keys_or_says_otherwise() {
        let keys = serde_json::json!({ "secretName": "bge-keys" });
        assert!(spec(serde_json::json!({})).grpc_reflection(), "no keys: as TEI serves it");
        assert!(!spec(serde_json::json!({ "auth": keys })).grpc_reflection(), "keys: off unless asked for");
        let on = spec(serde_json::json!({ "auth": keys, "grpc": { "reflection": true } }));
        assert!(on.grpc_reflection());
        assert!(!spec(serde_json::json!({ "grpc": { "reflection": false } })).grpc_reflection());
        // Unset stays unset: a pool written back carries no default it never asked for.
        let written = serde_json::to_value(spec(serde_json::json!({ "grpc": {} }))).unwrap();
        assert_eq!(written["grpc"], serde_json::json!({}));
    }

    #[test]
    fn plaintext_routes_are_refused_from_a_tls_pool_unless_it_allows_them() {
        assert!(spec(serde_json::json!({})).allows_plaintext_routes(), "plain text: nothing to protect");
        let tls = spec(serde_json::json!({ "tls": { "secretName": "bge-tls" } }));
        assert!(!tls.allows_plaintext_routes());
        assert!(!serde_json::to_value(&tls).unwrap()["tls"].as_object().unwrap().contains_key("allowPlaintextRoutes"));
        let allowed = spec(serde_json::json!({ "tls": { "secretName": "bge-tls", "allowPlaintextRoutes": true } }));
        assert!(allowed.allows_plaintext_routes());
    }
}
