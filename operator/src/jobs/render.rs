//! Pure functions from an EmbeddingJob to the objects the operator keeps for it: the progress
//! ConfigMap (its metadata only: the workers own its data), the workers' ServiceAccount, Role and
//! RoleBinding, the Role and RoleBinding that let the operator itself read that one ConfigMap,
//! and the Indexed `batch/v1` Job of `teifleet-job` workers.
//!
//! What the creator writes reaches the workers' pods only where it cannot make them something
//! else: reserved labels and annotations are left out (the CRD refuses them too), and a worker
//! image of the job's own runs only where the pods mount nothing of the namespace.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, KeyToPath, PersistentVolumeClaimVolumeSource,
    PodSpec, PodTemplateSpec, ResourceRequirements, SecretKeySelector, SecretVolumeSource, ServiceAccount, Volume,
    VolumeMount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use teifleet_crds::duration::parse_duration;
use teifleet_crds::gpu_memory::quantity_bytes;
use teifleet_crds::job::validation::{mounts_namespace_data, reserved_annotation, reserved_label};
use teifleet_crds::job::{
    JOB_LABEL, S3_ACCESS_KEY_ID_KEY, S3_SECRET_ACCESS_KEY_KEY, progress_config_map_name, progress_reader_name,
    worker_account_name,
};
use teifleet_crds::{EmbeddingJob, Endpoints, InputFormat, LaneName, StoreSpec, labels};

use crate::render::Owner;
use crate::render::deployment::{container_security_context, env_field, pod_security_context};
use crate::{Error, Result};

/// Where a PersistentVolumeClaim store is mounted in a worker: the input read-only.
pub const INPUT_MOUNT: &str = "/data/input";
pub const OUTPUT_MOUNT: &str = "/data/output";
/// Where the API key Secret is mounted, read-only; `--api-key-file` names the key's file there.
pub const API_KEY_MOUNT: &str = "/var/run/teifleet/api-key";
/// The worker container's name.
pub const WORKER_CONTAINER: &str = "worker";
/// The worker flag naming the one model an `openaiBatch` job's lines may ask for.
const MODEL_FLAG: &str = "--model=";
/// The worker flags of the pool's gRPC address (`host:port`, after the scheme) and HTTP URL.
const POOL_URL_FLAG: &str = "--pool-url=http://";
const POOL_HTTP_URL_FLAG: &str = "--pool-http-url=";
/// Retries of one worker index before it counts as failed (`backoffLimitPerIndex`).
pub const RETRIES_PER_WORKER: i32 = 3;
const WORKER_REQUESTS: [(&str, &str); 2] = [("cpu", "100m"), ("memory", "128Mi")];
const WORKER_LIMITS: [(&str, &str); 1] = [("memory", "512Mi")];

/// Everything one EmbeddingJob owns.
#[derive(Clone, Debug, PartialEq)]
pub struct JobChildren {
    /// `<job>-progress`, metadata only: applying it never touches what the workers wrote.
    pub progress: ConfigMap,
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    /// `<job>-progress-reader`: the operator may get `<job>-progress`, and no other ConfigMap.
    /// Absent when the operator does not know who it is (see `jobs::identity`).
    pub progress_reader: Option<(Role, RoleBinding)>,
    pub job: Job,
}

/// The pool Service's gRPC address by its DNS name, for a cluster whose pods resolve it; the
/// controller prefers the Service's ClusterIP ([`pool_address`]), which needs no cluster DNS.
pub fn pool_dns_address(pool: &str, namespace: &str) -> String {
    Endpoints::of(pool, namespace, false).grpc
}

/// The pool Service's gRPC address at its ClusterIP, when it has one.
pub fn pool_address(cluster_ip: Option<&str>) -> Option<String> {
    at_port(cluster_ip, teifleet_wire::ports::MULTIPLEXER_GRPC)
}

/// The pool Service's HTTP port by its DNS name (`http://<pool>.<namespace>.svc:8000`), as
/// [`pool_dns_address`] for the gRPC port.
pub fn pool_dns_http_url(pool: &str, namespace: &str) -> String {
    Endpoints::of(pool, namespace, false).http
}

/// The pool Service's HTTP port at its ClusterIP (`http://<ip>:8000`), when it has one.
pub fn pool_http_url(cluster_ip: Option<&str>) -> Option<String> {
    at_port(cluster_ip, teifleet_wire::ports::MULTIPLEXER_HTTP).map(|address| format!("http://{address}"))
}

/// `ip:port` (`[ip]:port` for IPv6) of a Service's ClusterIP; none for a headless Service.
fn at_port(cluster_ip: Option<&str>, port: u16) -> Option<String> {
    cluster_ip.filter(|ip| !ip.is_empty() && *ip != "None").map(|ip| match ip.contains(':') {
        true => format!("[{ip}]:{port}"),
        false => format!("{ip}:{port}"),
    })
}

/// How the workers reach the pool and what they may ask it for.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolTarget {
    /// The Service's gRPC port, `host:port`: what the workers call for `jsonl` and `parquet`.
    pub grpc: String,
    /// The Service's HTTP port, `http://host:port`: where an `openaiBatch` job's lines go.
    pub http: String,
    /// The pool's model id (`spec.model.id`), the one `body.model` an `openaiBatch` line may
    /// name; `None` while it is unknown (then no `--model` is rendered).
    pub model: Option<String>,
}

impl PoolTarget {
    /// The Service of `pool` at its ClusterIP when it has one, else by its DNS name.
    pub fn of(pool: &str, namespace: &str, cluster_ip: Option<&str>, model: Option<String>) -> Self {
        Self {
            grpc: pool_address(cluster_ip).unwrap_or_else(|| pool_dns_address(pool, namespace)),
            http: pool_http_url(cluster_ip).unwrap_or_else(|| pool_dns_http_url(pool, namespace)),
            model,
        }
    }

    /// This target with what `job`'s workers were rendered with in its place. A Job's pods cannot
    /// change: a Job made before its pool's Service had a ClusterIP (by the DNS name), or before
    /// the Service was made again, or the pool's model changed, would otherwise get a rendering
    /// the API server refuses whole, and neither `suspend` (a batch's cancel) nor the deadline
    /// would reach it.
    pub fn as_made(self, job: &Job) -> Self {
        Self {
            grpc: worker_arg(job, POOL_URL_FLAG).map(str::to_owned).unwrap_or(self.grpc),
            http: worker_arg(job, POOL_HTTP_URL_FLAG).map(str::to_owned).unwrap_or(self.http),
            model: worker_model(job).map(str::to_owned).or(self.model),
        }
    }
}

/// Renders every child of `job`, its workers calling the pool at `pool` (its gRPC port; an
/// `openaiBatch` job's, its HTTP port, for its model), the operator (`operator`, as an RBAC
/// subject) allowed to read their progress.
/// Workers run `default_image` (the operator's `--job-image`, or the image a Job already running
/// was made with: a Job's pods cannot change), or `spec.image` where the CRD allows one.
/// Fails for a job without the name, namespace or uid its children's metadata and owner
/// reference are built from (the API server always sets them), or with a deadline that is no
/// duration (the CRD's rule refuses those).
pub fn render(
    job: &EmbeddingJob,
    default_image: &str,
    pool: &PoolTarget,
    operator: Option<&Subject>,
) -> Result<JobChildren> {
    let owner = owner(job)?;
    Ok(JobChildren {
        progress: ConfigMap { metadata: owner.meta(progress_config_map_name(&owner.name)), ..ConfigMap::default() },
        service_account: ServiceAccount {
            metadata: owner.meta(worker_account_name(&owner.name)),
            // The workers write their progress with this token.
            automount_service_account_token: Some(true),
            ..ServiceAccount::default()
        },
        role: role(&owner),
        role_binding: role_binding(&owner),
        progress_reader: operator.map(|operator| progress_reader(&owner, operator)),
        job: batch_job(&owner, job, default_image, pool)?,
    })
}

/// The image a Job's worker container runs, as it was rendered.
pub fn worker_image(job: &Job) -> Option<&str> {
    worker_container(job)?.image.as_deref()
}

/// The model an `openaiBatch` Job's workers were rendered with (`--model=`), if any.
pub fn worker_model(job: &Job) -> Option<&str> {
    worker_arg(job, MODEL_FLAG)
}

/// The value of the worker argument starting with `prefix`, as the Job was rendered.
fn worker_arg<'a>(job: &'a Job, prefix: &str) -> Option<&'a str> {
    let args = worker_container(job)?.args.as_deref()?;
    args.iter().find_map(|arg| arg.strip_prefix(prefix))
}

fn worker_container(job: &Job) -> Option<&Container> {
    let containers = &job.spec.as_ref()?.template.spec.as_ref()?.containers;
    containers.iter().find(|c| c.name == WORKER_CONTAINER)
}

/// The job as the owner of every child: labels on every child and worker pod. Never the pool's
/// label: the pool's controller takes the pods carrying it for the pool's own.
fn owner(job: &EmbeddingJob) -> Result<Owner> {
    Owner::with_labels(job, |name| {
        BTreeMap::from([
            (labels::NAME_LABEL.into(), "teifleet-job".into()),
            (labels::INSTANCE_LABEL.into(), name.to_owned()),
            (labels::COMPONENT_LABEL.into(), "embedding-job".into()),
            (labels::PART_OF_LABEL.into(), labels::PART_OF.into()),
            (labels::MANAGED_BY_LABEL.into(), labels::MANAGER.into()),
            (JOB_LABEL.into(), name.to_owned()),
        ])
    })
}

/// The workers may read and patch their job's progress ConfigMap, by name, and nothing else.
fn role(owner: &Owner) -> Role {
    Role {
        metadata: owner.meta(worker_account_name(&owner.name)),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![progress_config_map_name(&owner.name)]),
            verbs: vec!["get".into(), "patch".into()],
            ..PolicyRule::default()
        }]),
    }
}

fn role_binding(owner: &Owner) -> RoleBinding {
    crate::render::rbac::account_role_binding(owner, worker_account_name(&owner.name))
}

/// The operator may get its job's progress ConfigMap, by name, in the job's namespace: the
/// grant that replaces reading every ConfigMap of the cluster. It holds no such right itself, so
/// writing this Role takes `escalate` and binding it `bind`, as the sidecars' Roles do.
fn progress_reader(owner: &Owner, operator: &Subject) -> (Role, RoleBinding) {
    let name = progress_reader_name(&owner.name);
    let role = Role {
        metadata: owner.meta(name.clone()),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![progress_config_map_name(&owner.name)]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: owner.meta(name.clone()),
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name },
        subjects: Some(vec![operator.clone()]),
    };
    (role, binding)
}

/// The image the workers run: the job's own only where they mount nothing of the namespace (the
/// CRD's image rule; a job made before it still gets the operator's image).
pub fn image_for<'a>(job: &'a EmbeddingJob, default_image: &'a str) -> &'a str {
    match (&job.spec.image, mounts_namespace_data(&job.spec)) {
        (Some(image), false) => image,
        _ => default_image,
    }
}

/// The creator's labels and annotations without the reserved keys, which the CRD refuses: one
/// left from before that rule must still not make a worker look like a pool's pod.
fn unreserved(map: &BTreeMap<String, String>, reserved: fn(&str) -> bool) -> BTreeMap<String, String> {
    map.iter().filter(|(key, _)| !reserved(key)).map(|(key, value)| (key.clone(), value.clone())).collect()
}

/// `spec.deadline` in whole seconds, at least 1 (`activeDeadlineSeconds` must be positive).
pub fn deadline_seconds(job: &EmbeddingJob) -> Result<Option<i64>> {
    let Some(deadline) = &job.spec.deadline else { return Ok(None) };
    let duration = parse_duration(deadline)
        .map_err(|error| Error::InvalidJob { field: "spec.deadline", message: error.to_string() })?;
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Ok(Some(i64::try_from(seconds).unwrap_or(i64::MAX).max(1)))
}

/// `spec.shardBytes` in bytes.
fn shard_bytes(job: &EmbeddingJob) -> Result<Option<u64>> {
    let Some(quantity) = &job.spec.shard_bytes else { return Ok(None) };
    let bytes = quantity_bytes(&quantity.0)
        .filter(|bytes| bytes.fract() == 0.0 && *bytes <= u64::MAX as f64)
        .ok_or_else(|| Error::InvalidJob {
            field: "spec.shardBytes",
            message: format!("{:?} is not a whole number of bytes", quantity.0),
        })?;
    // A whole, non-negative number within u64's range: the conversion is exact.
    Ok(Some(bytes as u64))
}

/// Path segments joined with `/`, empty ones (and so leading, trailing and doubled slashes) left out.
fn join_path<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    parts
        .into_iter()
        .flat_map(|part| part.split('/'))
        .filter(|segment| !segment.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

/// The URL `teifleet-job` reads or writes: `file://<mount>/<claim path>/<path>` for a claim
/// mounted at `mount`, `s3://<bucket>/<key>/<path>` for a bucket. A trailing `/` says a directory
/// (or prefix) to the worker, as it does to people: kept where the spec wrote one, and always on a
/// `directory` (the output) and on a store's root.
pub fn store_url(store: &StoreSpec, mount: &str, path: Option<&str>, directory: bool) -> String {
    let (root, base) = match (&store.pvc, &store.s3) {
        (Some(pvc), _) => (format!("file://{mount}/"), pvc.path.as_str()),
        (None, Some(s3)) => (format!("s3://{}/", s3.bucket), s3.key.as_str()),
        // The CRD's rule refuses a store with neither; the worker then refuses the empty URL.
        (None, None) => return String::new(),
    };
    let parts = [base, path.unwrap_or_default()];
    let relative = join_path(parts);
    let written_as_directory = parts.iter().rfind(|part| !part.is_empty()).is_some_and(|part| part.ends_with('/'));
    match relative.is_empty() || !(directory || written_as_directory) {
        true => format!("{root}{relative}"),
        false => format!("{root}{relative}/"),
    }
}

fn lane_name(lane: LaneName) -> &'static str {
    match lane {
        LaneName::Query => "query",
        LaneName::Ingest => "ingest",
    }
}

/// `teifleet-job run`'s arguments. The worker index comes from `JOB_COMPLETION_INDEX`, which
/// Kubernetes sets in an Indexed Job's pods.
fn worker_args(owner: &Owner, job: &EmbeddingJob, target: &PoolTarget) -> Result<Vec<String>> {
    let spec = &job.spec;
    let pool = &spec.pool_ref.name;
    let mut args = vec![
        "run".to_owned(),
        format!("{POOL_URL_FLAG}{}", target.grpc),
        format!("--pool={pool}"),
        format!("--input={}", store_url(&spec.input.store, INPUT_MOUNT, spec.input.path.as_deref(), false)),
        format!("--input-format={}", spec.input.format.as_str()),
    ];
    // OpenAI's batch lines are sent as they are to the pool's OpenAI route, and only for its model.
    if spec.input.format == InputFormat::OpenaiBatch {
        args.push(format!("{POOL_HTTP_URL_FLAG}{}", target.http));
        if let Some(model) = &target.model {
            args.push(format!("{MODEL_FLAG}{model}"));
        }
    }
    args.extend([
        format!("--id-field={}", spec.input.id_field),
        format!("--text-field={}", spec.input.text_field),
        format!("--output={}", store_url(&spec.output.store, OUTPUT_MOUNT, None, true)),
        format!("--workers={}", spec.workers),
    ]);
    if let Some(bytes) = shard_bytes(job)? {
        args.push(format!("--shard-bytes={bytes}"));
    }
    args.push(format!("--rows-per-call={}", spec.rows_per_call));
    if !spec.embedding.normalize {
        args.push("--normalize=false".into());
    }
    if spec.embedding.truncate {
        args.push("--truncate".into());
    }
    if let Some(dimensions) = spec.embedding.dimensions {
        args.push(format!("--dimensions={dimensions}"));
    }
    if let Some(prompt) = &spec.embedding.prompt_name {
        args.push(format!("--prompt-name={prompt}"));
    }
    args.push(format!("--dtype={}", spec.output.dtype.as_str()));
    args.push(format!("--lane={}", lane_name(spec.lane)));
    if let Some(key) = &spec.api_key_secret {
        args.push(format!("--api-key-file={API_KEY_MOUNT}/{}", key.key));
    }
    for (side, store) in [("input", &spec.input.store), ("output", &spec.output.store)] {
        let Some(s3) = &store.s3 else { continue };
        args.push(format!("--{side}-s3-endpoint={}", s3.endpoint));
        args.push(format!("--{side}-s3-region={}", s3.region));
        if s3.allow_http {
            args.push(format!("--{side}-s3-allow-http"));
        }
    }
    args.push(format!("--progress-configmap={}", progress_config_map_name(&owner.name)));
    Ok(args)
}

fn env_secret(name: String, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                ..SecretKeySelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// The namespace (the progress ConfigMap's), and each S3 store's credentials from its Secret.
fn worker_env(job: &EmbeddingJob) -> Vec<EnvVar> {
    let mut env = vec![env_field("POD_NAMESPACE", "metadata.namespace")];
    for (side, store) in [("INPUT", &job.spec.input.store), ("OUTPUT", &job.spec.output.store)] {
        let Some(s3) = &store.s3 else { continue };
        env.push(env_secret(format!("TEIFLEET_{side}_S3_ACCESS_KEY_ID"), &s3.credentials_secret, S3_ACCESS_KEY_ID_KEY));
        env.push(env_secret(
            format!("TEIFLEET_{side}_S3_SECRET_ACCESS_KEY"),
            &s3.credentials_secret,
            S3_SECRET_ACCESS_KEY_KEY,
        ));
    }
    env
}

fn claim_volume(name: &str, claim: &str, read_only: bool) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: read_only.then_some(true),
        }),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// The claims (input read-only), the API key's Secret (read-only, that one key alone) and a
/// writable `/tmp` on the read-only root filesystem. Input and output on one claim (as
/// `teifleet-batch` keeps a batch's file and its output) are one volume mounted twice, the input's
/// mount read-only: a pod naming one claim in two volumes is not what every volume plugin takes.
fn volumes(job: &EmbeddingJob) -> (Vec<Volume>, Vec<VolumeMount>) {
    let spec = &job.spec;
    let (mut volumes, mut mounts) = (Vec::new(), Vec::new());
    let output_claim = spec.output.store.pvc.as_ref().map(|pvc| pvc.claim_name.as_str());
    if let Some(pvc) = &spec.input.store.pvc {
        match output_claim == Some(pvc.claim_name.as_str()) {
            true => mounts.push(mount("output", INPUT_MOUNT, true)),
            false => {
                volumes.push(claim_volume("input", &pvc.claim_name, true));
                mounts.push(mount("input", INPUT_MOUNT, true));
            }
        }
    }
    if let Some(pvc) = &spec.output.store.pvc {
        volumes.push(claim_volume("output", &pvc.claim_name, false));
        mounts.push(mount("output", OUTPUT_MOUNT, false));
    }
    if let Some(key) = &spec.api_key_secret {
        volumes.push(Volume {
            name: "api-key".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(key.name.clone()),
                items: Some(vec![KeyToPath { key: key.key.clone(), path: key.key.clone(), ..KeyToPath::default() }]),
                // Readable by the workers' group (the pod's fsGroup) and no one else.
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(mount("api-key", API_KEY_MOUNT, true));
    }
    volumes.push(Volume { name: "tmp".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() });
    mounts.push(mount("tmp", "/tmp", false));
    (volumes, mounts)
}

fn quantities<const N: usize>(entries: [(&str, &str); N]) -> BTreeMap<String, Quantity> {
    entries.into_iter().map(|(resource, amount)| (resource.into(), Quantity(amount.into()))).collect()
}

/// The user's resources with the defaults for what they leave out, as the pool's containers get
/// theirs (render/deployment.rs): a resource the user names, as a request or a limit, keeps exactly
/// the user's settings; every other resource gets its default request and limit.
fn with_defaults(user: Option<&ResourceRequirements>) -> ResourceRequirements {
    let mut resources = user.cloned().unwrap_or_default();
    let named: BTreeSet<String> =
        resources.requests.iter().chain(resources.limits.iter()).flat_map(|map| map.keys().cloned()).collect();
    let defaults =
        [(quantities(WORKER_REQUESTS), &mut resources.requests), (quantities(WORKER_LIMITS), &mut resources.limits)];
    for (defaults, target) in defaults {
        for (resource, amount) in defaults.into_iter().filter(|(resource, _)| !named.contains(resource)) {
            target.get_or_insert_default().insert(resource, amount);
        }
    }
    resources
}

fn batch_job(owner: &Owner, job: &EmbeddingJob, default_image: &str, pool: &PoolTarget) -> Result<Job> {
    let spec = &job.spec;
    let overrides = &spec.template;
    let (volumes, volume_mounts) = volumes(job);
    let mut pod_labels = unreserved(&overrides.labels, reserved_label);
    pod_labels.extend(owner.labels());
    let annotations = unreserved(&overrides.annotations, reserved_annotation);
    let worker = Container {
        name: WORKER_CONTAINER.into(),
        image: Some(image_for(job, default_image).to_owned()),
        args: Some(worker_args(owner, job, pool)?),
        env: Some(worker_env(job)),
        resources: Some(with_defaults(overrides.resources.as_ref())),
        security_context: Some(container_security_context()),
        // A failed worker's last log lines become its termination message, of which the operator
        // quotes only the worker's one error line, sanitized (`super::worker_message`), in the
        // Failed condition.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(volume_mounts),
        ..Container::default()
    };
    Ok(Job {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(spec.workers),
            parallelism: Some(spec.workers),
            backoff_limit_per_index: Some(RETRIES_PER_WORKER),
            // Every worker finishes or fails on its own; the Job fails once all are done if any
            // failed (reason FailedIndexes), without stopping the others' shards.
            max_failed_indexes: Some(spec.workers),
            active_deadline_seconds: deadline_seconds(job)?,
            suspend: Some(spec.suspend),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations).filter(|a| !a.is_empty()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    service_account_name: Some(worker_account_name(&owner.name)),
                    automount_service_account_token: Some(true),
                    enable_service_links: Some(false),
                    security_context: Some(pod_security_context()),
                    containers: vec![worker],
                    volumes: Some(volumes),
                    image_pull_secrets: Some(overrides.image_pull_secrets.clone()).filter(|s| !s.is_empty()),
                    affinity: overrides.affinity.clone(),
                    // Empty lists and maps are left out rather than applied empty, so the operator
                    // claims no ownership of fields it does not set.
                    tolerations: Some(overrides.tolerations.clone()).filter(|t| !t.is_empty()),
                    node_selector: Some(overrides.node_selector.clone()).filter(|s| !s.is_empty()),
                    priority_class_name: overrides.priority_class_name.clone(),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    })
}
