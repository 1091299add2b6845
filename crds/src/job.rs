//! The `EmbeddingJob` API: a corpus (JSONL or Parquet, on a PersistentVolumeClaim or S3) embedded
//! through an EmbeddingPool by `teifleet-job` workers into Parquet vectors, in resumable shards.
//!
//! The operator runs it as an Indexed `batch/v1` Job of `workers` pods; the workers report each
//! finished shard in the ConfigMap `<job>-progress` ([`PROGRESS_PLAN_KEY`], [`ShardProgress`]),
//! from which the operator writes the status.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, LocalObjectReference, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::LaneName;
use crate::pool::resource_requirements_schema;

pub mod validation;

/// The CEL rule every duration field shares (Go's syntax, as `teifleet_wire::duration` parses).
const DURATION: &str = r"self.matches('^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$')";
/// A Kubernetes object name (DNS subdomain).
const OBJECT_NAME: &str = "self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')";
/// A path inside a store: relative, without `..` segments.
const RELATIVE_PATH: &str = r"!self.startsWith('/') && !self.matches('(^|/)\\.\\.(/|$)')";

/// What changing a running job would mean to the Kubernetes Job, whose pod template, completions
/// and failure policy are immutable: every field but `suspend` and `deadline` is fixed.
const FIXED_SPEC: &str = "self.poolRef == oldSelf.poolRef && self.input == oldSelf.input \
    && self.output == oldSelf.output && self.embedding == oldSelf.embedding && self.lane == oldSelf.lane \
    && self.workers == oldSelf.workers && self.rowsPerCall == oldSelf.rowsPerCall \
    && has(self.shardBytes) == has(oldSelf.shardBytes) && (!has(self.shardBytes) || self.shardBytes == oldSelf.shardBytes) \
    && has(self.apiKeySecret) == has(oldSelf.apiKeySecret) && (!has(self.apiKeySecret) || self.apiKeySecret == oldSelf.apiKeySecret) \
    && has(self.image) == has(oldSelf.image) && (!has(self.image) || self.image == oldSelf.image) \
    && self.template == oldSelf.template";

/// Most labels, and most annotations, a job adds to its worker pods: the bound that keeps the
/// CEL rules checking their keys within the API server's cost budget.
const MAX_POD_METADATA: u32 = 64;

/// A corpus embedded once through an EmbeddingPool: `workers` pods of `teifleet-job` read the
/// input in shards, call the pool's bulk path, and write the vectors as Parquet.
// Each printer column repeats `type_ = ...`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "teifleet.dev",
    version = "v1alpha1",
    kind = "EmbeddingJob",
    namespaced,
    shortname = "ejob",
    category = "teifleet",
    doc = "A corpus embedded through an EmbeddingPool into Parquet vectors by a parallel, resumable job.",
    status = "EmbeddingJobStatus",
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.poolRef.name"),
    printcolumn(
        name = "Done",
        type_ = "integer",
        json_path = ".status.rowsDone",
        description = "rows written, one per input row read (with a vector or an error)"
    ),
    printcolumn(
        name = "Total",
        type_ = "integer",
        json_path = ".status.rowsTotal",
        description = "rows in the input: exact when the input says, else estimated from its bytes (status.rowsTotalEstimated)"
    ),
    printcolumn(
        name = "Rows/s",
        type_ = "number",
        json_path = ".status.rowsPerSecond",
        description = "rows done per second since the workers started"
    ),
    printcolumn(
        name = "ETA",
        type_ = "string",
        json_path = ".status.eta",
        description = "time left at the rate so far"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.status==\"True\")].type",
        description = "Running, Complete or Failed: the condition that holds"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Running\")].reason",
        description = "why the job runs or does not: the reason of its Running condition",
        priority = "1"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(FIXED_SPEC).message("an EmbeddingJob's spec is fixed once created, except suspend and deadline: delete it and create it again to change anything else"))]
#[x_kube(validation = Rule::new(validation::IMAGE_RULE).message(validation::IMAGE_MESSAGE))]
pub struct EmbeddingJobSpec {
    /// The EmbeddingPool that embeds the texts, in the job's namespace. The workers call its
    /// Service's gRPC port (`<pool>.<namespace>.svc:50051`); an `openaiBatch` job's, its HTTP
    /// port (8000), with lines naming the pool's model.
    pub pool_ref: PoolRef,

    /// The corpus: one record per row, with an id and a text.
    pub input: InputSpec,

    /// Where the vectors go: Parquet files of (id, vector); for `input.format: openaiBatch`, OpenAI's
    /// batch output and error files (`part-NNNNNN.jsonl`, `part-NNNNNN.errors.jsonl`).
    pub output: OutputSpec,

    /// How the pool embeds each text.
    #[serde(default)]
    pub embedding: EmbeddingOptions,

    /// The pool's admission lane the calls take: `ingest` (default) yields to interactive
    /// `query` calls, down to the pool's `concurrency.ingestShare`.
    #[serde(default = "default_lane")]
    pub lane: LaneName,

    /// Worker pods working at once, each taking its own shards (1 to 64, default 2).
    #[serde(default = "default_workers")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 64").message("workers must be between 1 and 64"))]
    pub workers: i32,

    /// Bytes of input in one shard, the unit a worker reads, embeds, writes and reports, and what
    /// a restarted worker redoes at most: a quantity such as `256Mi` (at least `64Ki`). Unset:
    /// the worker's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isInteger() && quantity(string(self)).compareTo(quantity('64Ki')) >= 0").message("shardBytes must be a whole number of bytes, at least 64Ki, such as 256Mi"))]
    pub shard_bytes: Option<Quantity>,

    /// Rows in one call to the pool (1 to 10000, default 512).
    #[serde(default = "default_rows_per_call")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 10000").message("rowsPerCall must be between 1 and 10000"))]
    pub rows_per_call: i32,

    /// Longest the job may run, as a duration such as `2h` or `90m` (the Job's
    /// `activeDeadlineSeconds`): past it the workers are stopped and the job fails with
    /// `DeadlineExceeded`. Time spent suspended does not count. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new(DURATION).message("deadline must be a duration such as 90m or 2h"))]
    pub deadline: Option<String>,

    /// Stops the workers (the shards they finished stay done) until set back to false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// An API key for a pool with `spec.auth`: the key `key` of the Secret `name`, mounted into
    /// the workers' pods read-only. Its tenant's `lane` and priority apply to the job's calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret: Option<ApiKeySecret>,

    /// The worker image; unset: the operator's `--job-image`, the `teifleet-job` build of its own
    /// release. Refused beside anything the workers mount (a claim, S3 credentials, an API key),
    /// which an image of the job's own would read: as every store mounts one, jobs run the
    /// operator's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new("self.size() > 0").message("image must name an image, or be left out"))]
    pub image: Option<String>,

    /// Pod-level settings of the worker pods: where they run and what they take.
    #[serde(default)]
    pub template: WorkerPodOverrides,
}

fn default_lane() -> LaneName {
    LaneName::Ingest
}
fn default_workers() -> i32 {
    2
}
fn default_rows_per_call() -> i32 {
    512
}

/// The pool a job calls.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolRef {
    /// The EmbeddingPool's name, in the job's namespace.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(OBJECT_NAME).message("poolRef.name must name an EmbeddingPool in the job's namespace"))]
    pub name: String,
}

/// The corpus and how its records read.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InputSpec {
    /// Where the corpus lives.
    pub store: StoreSpec,

    /// A file, or with a trailing `/` a directory (claim) or key prefix (S3) whose every file is
    /// read, in name order, under the store's own path or key; a name that is no file is read as
    /// a directory too. Unset: the store's path or key itself (a claim's root is a directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(RELATIVE_PATH).message("input.path must be relative, without '..'"))]
    pub path: Option<String>,

    /// How rows are written: one JSON object per line (`jsonl`, default), Parquet, or
    /// `openaiBatch`: the request lines of OpenAI's Batch API, answered in its output format.
    #[serde(default)]
    pub format: InputFormat,

    /// The field holding each row's id, copied to its vector's row (default `id`; not read for
    /// `openaiBatch`, whose lines carry `custom_id`).
    #[serde(default = "default_id_field")]
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("self.size() > 0").message("input.idField must name a field"))]
    pub id_field: String,

    /// The field holding the text to embed (default `text`; not read for `openaiBatch`, whose
    /// lines carry `body.input`).
    #[serde(default = "default_text_field")]
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("self.size() > 0").message("input.textField must name a field"))]
    pub text_field: String,
}

fn default_id_field() -> String {
    "id".to_owned()
}
fn default_text_field() -> String {
    "text".to_owned()
}

/// The corpus's file format: `jsonl` (default), `parquet`, or `openaiBatch`, the request lines
/// of OpenAI's Batch API (`/v1/embeddings` only), answered in its output and error files.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum InputFormat {
    #[default]
    Jsonl,
    Parquet,
    // One OpenAI batch request per line, `{"custom_id", "method": "POST", "url":
    // "/v1/embeddings", "body": {"model", "input", ...}}`, each `body` sent as it is to the
    // pool's `/v1/embeddings`; its `model` must be the pool's. The output is OpenAI's batch
    // output and error files (JSONL), not Parquet; `idField`, `textField`, `embedding`,
    // `rowsPerCall` and `output.dtype` do not apply. (A `//` comment: a documented variant would
    // make schemars write a `oneOf` instead of the plain enum the CRD's schema needs.)
    #[serde(rename = "openaiBatch")]
    OpenaiBatch,
}

impl InputFormat {
    /// As `teifleet-job --input-format` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Jsonl => "jsonl",
            Self::Parquet => "parquet",
            Self::OpenaiBatch => "openai-batch",
        }
    }
}

/// Where the vectors are written and in which precision.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OutputSpec {
    /// The directory (PVC) or key prefix (S3) the Parquet files (or an `openaiBatch` job's JSONL
    /// files) are written under.
    pub store: StoreSpec,

    /// The vectors' element type: `f32` (default) or `f16`, half the bytes. Not for
    /// `openaiBatch`, whose vectors are the pool's JSON answers as they came.
    #[serde(default)]
    pub dtype: VectorDtype,
}

/// The element type of the written vectors.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VectorDtype {
    #[default]
    F32,
    F16,
}

impl VectorDtype {
    /// As `teifleet-job --dtype` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }
}

/// A place files are read from or written to: exactly one of a PersistentVolumeClaim or an
/// S3-compatible bucket.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.pvc) != has(self.s3)").message("a store must set exactly one of pvc or s3"))]
pub struct StoreSpec {
    /// A PersistentVolumeClaim in the job's namespace, mounted into every worker (read-only for
    /// the input). With more than one worker on several nodes it must be `ReadOnlyMany` or
    /// `ReadWriteMany`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcStore>,

    /// An S3-compatible bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Store>,
}

/// A directory on a PersistentVolumeClaim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PvcStore {
    /// The PersistentVolumeClaim, in the job's namespace.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(OBJECT_NAME).message("pvc.claimName must name a PersistentVolumeClaim (lowercase letters, digits, '-' and '.')"))]
    pub claim_name: String,

    /// A directory within the claim (default: its root).
    #[serde(default)]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(RELATIVE_PATH).message("pvc.path must be relative to the claim's root, without '..'"))]
    pub path: String,
}

/// A key prefix in an S3-compatible bucket.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.endpoint.startsWith('http://') || (has(self.allowHttp) && self.allowHttp)").message("s3.endpoint is plain http: set s3.allowHttp: true to send the credentials unencrypted"))]
pub struct S3Store {
    /// The bucket's name.
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9][-a-z0-9.]{1,61}[a-z0-9]$')").message("s3.bucket must be a bucket name: 3 to 63 lowercase letters, digits, '-' and '.'"))]
    pub bucket: String,

    /// A key prefix within the bucket (default: none).
    #[serde(default)]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new("!self.startsWith('/')").message("s3.key must not start with '/'"))]
    pub key: String,

    /// The S3 API's URL, e.g. `https://s3.us-east-1.amazonaws.com` or a MinIO Service's
    /// `http://minio.storage.svc:9000`.
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("isURL(self) && (self.startsWith('https://') || self.startsWith('http://'))").message("s3.endpoint must be an http or https URL"))]
    pub endpoint: String,

    /// The bucket's region (default `us-east-1`).
    #[serde(default = "default_region")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.size() > 0").message("s3.region must name a region"))]
    pub region: String,

    /// A Secret in the job's namespace with the keys `accessKeyId` and `secretAccessKey`, passed
    /// to the workers' environment; the operator never reads it.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(OBJECT_NAME).message("s3.credentialsSecret must name a Secret in the job's namespace"))]
    pub credentials_secret: String,

    /// Allow an `http://` endpoint (a bucket inside the cluster, such as MinIO's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_http: bool,
}

fn default_region() -> String {
    "us-east-1".to_owned()
}

/// The data keys of an S3 credentials Secret.
pub const S3_ACCESS_KEY_ID_KEY: &str = "accessKeyId";
pub const S3_SECRET_ACCESS_KEY_KEY: &str = "secretAccessKey";

/// How each text is embedded.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddingOptions {
    /// Normalize each vector to length 1 (default true).
    #[serde(default = "default_normalize")]
    pub normalize: bool,

    /// Truncate texts longer than the model takes instead of failing their rows (default false).
    #[serde(default)]
    pub truncate: bool,

    /// Keep the first `dimensions` of each vector (Matryoshka models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("embedding.dimensions must be at least 1"))]
    pub dimensions: Option<i32>,

    /// A prompt of the model's configuration prepended to each text, e.g. `passage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("self.size() > 0").message("embedding.promptName must name a prompt, or be left out"))]
    pub prompt_name: Option<String>,
}

fn default_normalize() -> bool {
    true
}

impl Default for EmbeddingOptions {
    fn default() -> Self {
        Self { normalize: default_normalize(), truncate: false, dimensions: None, prompt_name: None }
    }
}

/// An API key in a Secret of the job's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeySecret {
    /// The Secret.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(OBJECT_NAME).message("apiKeySecret.name must name a Secret in the job's namespace"))]
    pub name: String,

    /// The data key holding the API key.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$') && self != '.' && self != '..'").message("apiKeySecret.key must be a Secret data key (letters, digits, '-', '_' and '.')"))]
    pub key: String,
}

/// Pod-level settings of the worker pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPodOverrides {
    /// Tolerations of the worker pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,

    /// Affinity of the worker pods, e.g. to keep them off the GPU nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Node selector labels of the worker pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Priority class of the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,

    /// Resources of the worker container. Defaults: requests of 100m CPU and 128Mi memory, a
    /// memory limit of 512Mi. A resource named here, as a request or a limit, replaces its
    /// defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_requirements_schema")]
    pub resources: Option<ResourceRequirements>,

    /// Secrets for pulling the worker image from a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(s, s.name.size() > 0)").message("template.imagePullSecrets: every entry needs the name of a Secret"))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Annotations added to every worker pod; not teifleet's own (`teifleet.dev/`), the Job
    /// controller's (`batch.kubernetes.io/`) or AppArmor's and seccomp's. At most 64.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_POD_METADATA))]
    #[x_kube(validation = Rule::new(validation::annotations_rule()).message(validation::annotations_message().as_str()))]
    pub annotations: BTreeMap<String, String>,

    /// Labels added to every worker pod; not those that make a pod a pool's, the activator's or
    /// the Job's own (`teifleet.dev/`, `batch.kubernetes.io/`, the `app.kubernetes.io` labels the
    /// operator sets, `job-name`, `controller-uid`). At most 64.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_POD_METADATA))]
    #[x_kube(validation = Rule::new(validation::labels_rule()).message(validation::labels_message().as_str()))]
    pub labels: BTreeMap<String, String>,
}

/// Observed state of an EmbeddingJob.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddingJobStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Running`, `Complete` and `Failed`, each with the generation it was computed for; at most
    /// one is True.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Shards in the workers' plan; absent until a worker has planned the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_total: Option<i64>,

    /// Shards finished and reported.
    #[serde(default)]
    pub shards_done: i64,

    /// Rows written: one per input row read, with its vector or with the error that kept it
    /// from having one.
    #[serde(default)]
    pub rows_done: i64,

    /// Of `rowsDone`, the rows written with an error instead of a vector.
    #[serde(default)]
    pub rows_failed: i64,

    /// Rows in the input: what the plan counted, or an estimate from the bytes done so far
    /// (`rowsTotalEstimated`). Absent while neither is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_total: Option<i64>,

    /// `rowsTotal` is an estimate from the input's bytes, not a count.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rows_total_estimated: bool,

    /// Rows done per second since the workers started (over the whole run once it ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_per_second: Option<f64>,

    /// Time left at the rate so far, as a duration such as `12m30s`; only while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,

    /// When the workers started (the Job's start; it restarts on resuming a suspended job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the job completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// Condition types and reasons of an EmbeddingJob; `crate::conditions::merge` keeps them in the
/// order given.
pub mod job_conditions {
    /// The workers are at work (or starting); False says why not.
    pub const RUNNING: &str = "Running";
    /// Every shard was done and the Job completed.
    pub const COMPLETE: &str = "Complete";
    /// The Job failed; the reason says how.
    pub const FAILED: &str = "Failed";

    /// The order conditions are written in.
    pub const ORDER: [&str; 3] = [RUNNING, COMPLETE, FAILED];

    pub mod reasons {
        /// `poolRef` names no EmbeddingPool: no Job is created until it exists.
        pub const POOL_NOT_FOUND: &str = "PoolNotFound";
        /// The pool serves TLS (`spec.tls`), which the workers do not call yet.
        pub const POOL_USES_TLS: &str = "PoolUsesTLS";
        /// The pool takes calls with an API key only (`spec.auth`) and the job names none.
        pub const API_KEY_REQUIRED: &str = "APIKeyRequired";
        /// A Job of the EmbeddingJob's name exists that it does not own: it is left alone.
        pub const JOB_NAME_TAKEN: &str = "JobNameTaken";
        /// The input's PersistentVolumeClaim does not exist.
        pub const INPUT_UNREADABLE: &str = "InputUnreadable";
        /// The output's PersistentVolumeClaim does not exist.
        pub const OUTPUT_UNWRITABLE: &str = "OutputUnwritable";
        /// `spec.suspend`: no worker runs.
        pub const SUSPENDED: &str = "Suspended";
        /// The Job exists; no worker pod runs yet.
        pub const WORKERS_PENDING: &str = "WorkersPending";
        /// Worker pods run.
        pub const WORKERS_RUNNING: &str = "WorkersRunning";
        /// `spec.suspend` was set and worker pods are still stopping: their last shards may
        /// still be written. `Suspended` once none is left.
        pub const WORKERS_STOPPING: &str = "WorkersStopping";
        /// Every worker finished its shards.
        pub const COMPLETED: &str = "Completed";
        /// Workers failed more often than their retries allow.
        pub const WORKERS_FAILED: &str = "WorkersFailed";
        /// `spec.deadline` passed.
        pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
        /// The Job failed for a reason of its own (its message says which).
        pub const JOB_FAILED: &str = "JobFailed";
    }
}

/// Label carrying the owning EmbeddingJob's name on every object and pod made for it.
pub const JOB_LABEL: &str = "teifleet.dev/job";

/// Name of the ServiceAccount (and Role, RoleBinding) a job's workers run as.
pub fn worker_account_name(job: &str) -> String {
    format!("{job}-worker")
}

/// Name of the Role (and RoleBinding) that lets the operator read a job's progress ConfigMap, by
/// name, in the job's namespace: it reads no other ConfigMap.
pub fn progress_reader_name(job: &str) -> String {
    format!("{job}-progress-reader")
}

/// The data key of the workers' plan in the progress ConfigMap: [`ProgressPlan`] as JSON.
pub const PROGRESS_PLAN_KEY: &str = "plan";
/// The prefix of each finished shard's data key: `shard-000042`, [`ShardProgress`] as JSON.
pub const PROGRESS_SHARD_PREFIX: &str = "shard-";

/// The name of a job's progress ConfigMap, which its workers write and the operator reads.
pub fn progress_config_map_name(job: &str) -> String {
    format!("{job}-progress")
}

/// The data key of shard `shard`'s progress.
pub fn progress_shard_key(shard: u32) -> String {
    format!("{PROGRESS_SHARD_PREFIX}{shard:06}")
}

/// What the workers planned (every worker plans the same): the input's shards and size.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgressPlan {
    pub shards: u32,
    pub bytes: u64,
    /// Rows in the input, when its format says (Parquet's metadata); `None` for JSONL.
    pub rows: Option<u64>,
}

/// One finished shard, as its worker reported it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct ShardProgress {
    pub shard: u32,
    /// Rows written, one per input row (with a vector or an error).
    pub rows: u64,
    /// Of `rows`, those written with an error instead of a vector.
    pub failed: u64,
    /// Input bytes the shard covered.
    pub bytes: u64,
    /// Seconds the shard took.
    pub seconds: f64,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt as _;
    use serde_json::{Value, json};

    use super::*;

    fn crd() -> Value {
        serde_json::to_value(EmbeddingJob::crd()).unwrap()
    }

    fn spec_schema(crd: &Value) -> &Value {
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    }

    fn rules(schema: &Value) -> Vec<&str> {
        schema["x-kubernetes-validations"]
            .as_array()
            .map(|rules| rules.iter().filter_map(|rule| rule["rule"].as_str()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_crd_is_namespaced_in_the_teifleet_group_with_its_status_subresource() {
        let crd = crd();
        assert_eq!(crd["metadata"]["name"], "embeddingjobs.teifleet.dev");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["ejob"]));
        assert_eq!(crd["spec"]["versions"][0]["name"], "v1alpha1");
        assert_eq!(crd["spec"]["versions"][0]["subresources"], json!({ "status": {} }));
        let columns: Vec<&str> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|column| column["name"].as_str().unwrap())
            .collect();
        assert_eq!(columns, ["Pool", "Done", "Total", "Rows/s", "ETA", "Status", "Age", "Reason"]);
    }

    #[test]
    fn a_store_is_exactly_one_of_pvc_and_s3() {
        let crd = crd();
        let spec = spec_schema(&crd);
        for side in ["input", "output"] {
            let store = &spec["properties"][side]["properties"]["store"];
            assert_eq!(rules(store), ["has(self.pvc) != has(self.s3)"], "{side}");
            let s3 = &store["properties"]["s3"];
            assert_eq!(s3["required"], json!(["bucket", "credentialsSecret", "endpoint"]), "{side}");
            assert_eq!(s3["properties"]["region"]["default"], "us-east-1");
            assert!(rules(s3).iter().any(|rule| rule.contains("self.allowHttp")), "{side}: plain http needs allowHttp");
            assert_eq!(store["properties"]["pvc"]["properties"]["path"]["default"], "");
        }
    }

    #[test]
    fn defaults_are_in_the_schema() {
        let crd = crd();
        let spec = spec_schema(&crd);
        let properties = &spec["properties"];
        assert_eq!(spec["required"], json!(["input", "output", "poolRef"]));
        assert_eq!(properties["lane"]["default"], "ingest");
        assert_eq!(properties["lane"]["enum"], json!(["query", "ingest"]));
        assert_eq!(properties["workers"]["default"], 2);
        assert_eq!(properties["rowsPerCall"]["default"], 512);
        assert_eq!(properties["embedding"]["default"], json!({ "normalize": true, "truncate": false }));
        assert_eq!(properties["template"]["default"], json!({}));
        assert_eq!(properties["embedding"]["properties"]["normalize"]["default"], true);
        let input = &properties["input"]["properties"];
        assert_eq!(input["format"]["default"], "jsonl");
        assert_eq!(input["format"]["enum"], json!(["jsonl", "parquet", "openaiBatch"]));
        assert_eq!(input["idField"]["default"], "id");
        assert_eq!(input["textField"]["default"], "text");
        assert_eq!(properties["output"]["properties"]["dtype"]["default"], "f32");
        assert_eq!(properties["output"]["properties"]["dtype"]["enum"], json!(["f32", "f16"]));
        assert!(rules(&properties["workers"]).contains(&"self >= 1 && self <= 64"));
        assert!(rules(&properties["rowsPerCall"]).contains(&"self >= 1 && self <= 10000"));
        assert!(rules(&properties["shardBytes"])[0].contains("compareTo(quantity('64Ki')) >= 0"));
    }

    #[test]
    fn everything_but_suspend_and_deadline_is_fixed_once_created() {
        let crd = crd();
        let fixed: Vec<&str> = rules(spec_schema(&crd)).into_iter().filter(|rule| rule.contains("oldSelf")).collect();
        assert_eq!(fixed.len(), 1);
        for field in ["poolRef", "input", "output", "embedding", "lane", "workers", "rowsPerCall", "template"] {
            assert!(fixed[0].contains(&format!("self.{field} == oldSelf.{field}")), "{field} is not fixed");
        }
        for field in ["shardBytes", "apiKeySecret", "image"] {
            assert!(fixed[0].contains(&format!("has(self.{field}) == has(oldSelf.{field})")), "{field} is not fixed");
        }
        assert!(!fixed[0].contains("suspend") && !fixed[0].contains("deadline"));
    }

    fn messages(schema: &Value) -> Vec<(&str, &str)> {
        schema["x-kubernetes-validations"]
            .as_array()
            .map(|rules| {
                rules.iter().filter_map(|rule| Some((rule["rule"].as_str()?, rule["message"].as_str()?))).collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn worker_pod_labels_and_annotations_refuse_the_reserved_keys_in_words() {
        let crd = crd();
        let template = &spec_schema(&crd)["properties"]["template"]["properties"];
        let labels = messages(&template["labels"]);
        assert_eq!(labels.len(), 1);
        assert_eq!(labels[0].0, validation::labels_rule());
        assert!(labels[0].0.contains("k.startsWith('teifleet.dev/')"), "the pool's label among them");
        assert!(labels[0].1.starts_with("template.labels must not set the labels that make a pod a pool's"));
        let annotations = messages(&template["annotations"]);
        assert_eq!(
            annotations,
            [(validation::annotations_rule().as_str(), validation::annotations_message().as_str())]
        );
    }

    #[test]
    fn an_image_is_refused_beside_a_claim_or_a_secret_in_words() {
        let crd = crd();
        let spec = messages(spec_schema(&crd));
        let image = spec.iter().find(|(rule, _)| rule.starts_with("!has(self.image)")).expect("the image rule");
        for mounted in ["apiKeySecret", "input.store.pvc", "input.store.s3", "output.store.pvc", "output.store.s3"] {
            assert!(image.0.contains(&format!("!has(self.{mounted})")), "{mounted}");
        }
        assert!(image.1.starts_with("image cannot be set on a job whose workers mount a claim or a Secret"));
        // What the rule says, the operator knows: every store mounts something.
        let job: EmbeddingJob = serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingJob",
            "metadata": { "name": "corpus", "namespace": "ml" },
            "spec": {
                "poolRef": { "name": "bge" },
                "input": { "store": { "pvc": { "claimName": "corpus" } } },
                "output": { "store": { "pvc": { "claimName": "vectors" } } },
            },
        }))
        .unwrap();
        assert!(validation::mounts_namespace_data(&job.spec));
    }

    #[test]
    fn every_string_the_fixed_spec_rule_compares_is_bounded() {
        // Comparing strings costs their length: every string the spec's own fields hold has a
        // maxLength (or an enum). The template's are Kubernetes' own types, compared whole.
        fn unbounded(path: &str, schema: &Value, found: &mut Vec<String>) {
            if path == "spec.template" {
                return;
            }
            if schema["type"] == "string" && schema.get("maxLength").is_none() && schema.get("enum").is_none() {
                found.push(path.to_owned());
            }
            if let Some(properties) = schema["properties"].as_object() {
                for (name, property) in properties {
                    unbounded(&format!("{path}.{name}"), property, found);
                }
            }
        }
        let crd = crd();
        let mut found = Vec::new();
        unbounded("spec", spec_schema(&crd), &mut found);
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn a_minimal_spec_takes_its_defaults() {
        let job: EmbeddingJob = serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1",
            "kind": "EmbeddingJob",
            "metadata": { "name": "corpus", "namespace": "ml" },
            "spec": {
                "poolRef": { "name": "bge" },
                "input": { "store": { "pvc": { "claimName": "corpus" } } },
                "output": { "store": { "s3": {
                    "bucket": "vectors", "endpoint": "https://s3.example.com", "credentialsSecret": "s3"
                } } },
            },
        }))
        .unwrap();
        let spec = &job.spec;
        assert_eq!((spec.lane, spec.workers, spec.rows_per_call, spec.suspend), (LaneName::Ingest, 2, 512, false));
        assert_eq!(spec.embedding, EmbeddingOptions::default());
        assert!(spec.embedding.normalize);
        assert_eq!(spec.input.format, InputFormat::Jsonl);
        assert_eq!((spec.input.id_field.as_str(), spec.input.text_field.as_str()), ("id", "text"));
        assert_eq!(spec.output.dtype, VectorDtype::F32);
        assert_eq!(spec.output.store.s3.as_ref().unwrap().region, "us-east-1");
        assert_eq!(spec.input.store.pvc.as_ref().unwrap().path, "");
    }

    #[test]
    fn the_openai_batch_format_reads_as_the_crd_spells_it_and_reaches_the_worker_as_it_spells_it() {
        let input: InputSpec = serde_json::from_value(json!({
            "store": { "pvc": { "claimName": "batches" } }, "path": "files/file-0123/content", "format": "openaiBatch",
        }))
        .unwrap();
        assert_eq!(input.format, InputFormat::OpenaiBatch);
        assert_eq!(input.format.as_str(), "openai-batch");
        assert_eq!(serde_json::to_value(InputFormat::OpenaiBatch).unwrap(), "openaiBatch");
        let formats = [InputFormat::Jsonl, InputFormat::Parquet, InputFormat::OpenaiBatch];
        assert_eq!(formats.map(InputFormat::as_str), ["jsonl", "parquet", "openai-batch"]);
        assert!(serde_json::from_value::<InputFormat>(json!("openai-batch")).is_err(), "the CRD's spelling only");
    }

    #[test]
    fn progress_keys_and_records_read_as_the_workers_write_them() {
        assert_eq!(progress_config_map_name("corpus"), "corpus-progress");
        assert_eq!(progress_shard_key(42), "shard-000042");
        let plan: ProgressPlan = serde_json::from_str(r#"{"shards": 40, "bytes": 1048576, "rows": null}"#).unwrap();
        assert_eq!(plan, ProgressPlan { shards: 40, bytes: 1_048_576, rows: None });
        let shard: ShardProgress =
            serde_json::from_str(r#"{"shard": 7, "rows": 100, "failed": 2, "bytes": 4096, "seconds": 1.5}"#).unwrap();
        assert_eq!(shard, ShardProgress { shard: 7, rows: 100, failed: 2, bytes: 4096, seconds: 1.5 });
    }
}
