//! Golden tests of what an EmbeddingJob renders (`UPDATE_GOLDEN=1` rewrites the files under
//! `src/jobs/golden/` after an intended change: review the diff), its status from the Job and the
//! progress ConfigMap, and reconcile() against a mocked API server.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder, Reporter};
use serde::Serialize;
use serde_json::{Value, json};
use teifleet_crds::conditions;
use teifleet_crds::job::job_conditions::{COMPLETE, FAILED, RUNNING, reasons};
use teifleet_crds::job::{ProgressPlan, ShardProgress, progress_shard_key};
use teifleet_crds::{EmbeddingJob, EmbeddingJobStatus, EmbeddingPool};

use super::render::{self, JobChildren, PoolTarget, deadline_seconds, store_url};
use super::status::{self, Blocker, Progress, Seen, format_duration};
use super::worker_message::{MAX_WORKER_MESSAGE, sanitize, worker_message};
use super::{Context, Due, PROGRESS_PACE, StatusMemo, events, next_look, quote_failed_workers, reconcile};
use crate::metrics::Metrics;

const IMAGE: &str = "ghcr.io/teifleet/job:0.1.0";

/// A JSONL corpus on a claim into Parquet on another claim, with most settings left to defaults.
const PVC_JOB: &str = r#"
apiVersion: teifleet.dev/v1alpha1
kind: EmbeddingJob
metadata:
  name: wiki
  namespace: ml
  uid: 9b3e6c1a-0000-4000-8000-000000000001
  generation: 1
spec:
  poolRef:
    name: bge-small
  input:
    store:
      pvc:
        claimName: corpora
        path: wiki/2024/
    path: articles
  output:
    store:
      pvc:
        claimName: vectors
        path: wiki
  workers: 4
  deadline: 2h
"#;

/// Parquet in a MinIO bucket inside the cluster to f16 vectors on AWS S3, through a pool with API
/// keys, every option set.
const S3_JOB: &str = r#"
apiVersion: teifleet.dev/v1alpha1
kind: EmbeddingJob
metadata:
  name: catalog
  namespace: search
  uid: 9b3e6c1a-0000-4000-8000-000000000002
  generation: 3
spec:
  poolRef:
    name: gte-large
  input:
    store:
      s3:
        bucket: corpora
        key: catalog/
        endpoint: http://minio.storage.svc:9000
        region: eu-west-1
        credentialsSecret: minio
        allowHttp: true
    path: 2024/products.parquet
    format: parquet
    idField: sku
    textField: description
  output:
    store:
      s3:
        bucket: vectors
        key: catalog
        endpoint: https://s3.eu-west-1.amazonaws.com
        region: eu-west-1
        credentialsSecret: aws-vectors
    dtype: f16
  embedding:
    normalize: false
    truncate: true
    dimensions: 256
    promptName: passage
  lane: query
  workers: 8
  shardBytes: 256Mi
  rowsPerCall: 1024
  deadline: 90m
  suspend: true
  apiKeySecret:
    name: search-keys
    key: indexer
  image: registry.example.com/teifleet/job:dev
  template:
    nodeSelector:
      node-role.example.com/batch: "true"
    tolerations:
    - key: batch
      operator: Exists
      effect: NoSchedule
    affinity:
      nodeAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
          - matchExpressions:
            - { key: nvidia.com/gpu.present, operator: DoesNotExist }
    priorityClassName: batch-low
    resources:
      requests: { cpu: "1" }
      limits: { memory: 2Gi }
    imagePullSecrets:
    - name: registry-credentials
    annotations:
      example.com/team: search
    labels:
      team: search
      app.kubernetes.io/name: not-this
"#;

/// A batch of OpenAI's Batch API, as `teifleet-batch` creates it: its input file on the server's
/// claim, its output beside it, suspended by a cancel.
const OPENAI_BATCH_JOB: &str = r#"
apiVersion: teifleet.dev/v1alpha1
kind: EmbeddingJob
metadata:
  name: batch-0123456789abcdef01234567
  namespace: ml
  uid: 9b3e6c1a-0000-4000-8000-000000000003
  generation: 2
  labels:
    teifleet.dev/batch: batch_0123456789abcdef01234567
    teifleet.dev/tenant: search
spec:
  poolRef:
    name: bge-small
  input:
    store:
      pvc:
        claimName: teifleet-batch
        path: batch
    path: files/file-89abcdef0123456789abcdef/content
    format: openaiBatch
  output:
    store:
      pvc:
        claimName: teifleet-batch
        path: batch/batches/batch_0123456789abcdef01234567
  deadline: 24h
  suspend: true
"#;

fn job(yaml: &str) -> EmbeddingJob {
    serde_norway::from_str(yaml).expect("fixture parses")
}

fn children(yaml: &str) -> JobChildren {
    render_job(&job(yaml))
}

/// The operator as the chart runs it.
fn operator() -> k8s_openapi::api::rbac::v1::Subject {
    super::identity::subject_of("system:serviceaccount:teifleet-system:teifleet-operator")
}

/// The model of the pool every fixture's job calls.
const MODEL: &str = "BAAI/bge-small-en-v1.5";

/// The job's children, its workers calling its pool by the Service's DNS name.
fn render_job(job: &EmbeddingJob) -> JobChildren {
    let target =
        PoolTarget::of(&job.spec.pool_ref.name, job.metadata.namespace.as_deref().unwrap(), None, Some(MODEL.into()));
    render::render(job, IMAGE, &target, Some(&operator())).expect("renders")
}

#[test]
fn workers_call_the_pool_at_its_cluster_ip_when_it_has_one() {
    assert_eq!(render::pool_address(Some("10.96.0.42")).as_deref(), Some("10.96.0.42:50051"));
    assert_eq!(render::pool_address(Some("fd00::2a")).as_deref(), Some("[fd00::2a]:50051"));
    assert_eq!(render::pool_address(Some("None")), None, "a headless Service");
    assert_eq!(render::pool_address(None), None);
    assert_eq!(render::pool_dns_address("bge", "ml"), "bge.ml.svc:50051");
    assert_eq!(render::pool_http_url(Some("10.96.0.42")).as_deref(), Some("http://10.96.0.42:8000"));
    assert_eq!(render::pool_http_url(Some("fd00::2a")).as_deref(), Some("http://[fd00::2a]:8000"));
    assert_eq!(render::pool_http_url(Some("None")), None, "a headless Service");
    assert_eq!(render::pool_http_url(Some("")), None);
    assert_eq!(render::pool_dns_http_url("bge", "ml"), "http://bge.ml.svc:8000");
    let model = Some(MODEL.to_owned());
    assert_eq!(
        PoolTarget::of("bge", "ml", Some("10.96.0.42"), model.clone()),
        PoolTarget { grpc: "10.96.0.42:50051".into(), http: "http://10.96.0.42:8000".into(), model: model.clone() }
    );
    assert_eq!(
        PoolTarget::of("bge", "ml", Some("None"), None),
        PoolTarget { grpc: "bge.ml.svc:50051".into(), http: "http://bge.ml.svc:8000".into(), model: None }
    );
}

fn check<T: Serialize>(file: &str, value: &T) {
    let rendered = serde_norway::to_string(value).expect("serializes");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/jobs/golden").join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &rendered).expect("writes golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!("{} is missing; run UPDATE_GOLDEN=1 cargo test -p teifleet-operator --lib jobs::", path.display())
    });
    similar_asserts::assert_eq!(expected, rendered, "{file} differs; if intended, rerun with UPDATE_GOLDEN=1");
}

// --- Rendering ----------------------------------------------------------------------------------

#[test]
fn golden_jsonl_on_claims() {
    let children = children(PVC_JOB);
    check("job-pvc.yaml", &children.job);
    check("progress-configmap.yaml", &children.progress);
    check("serviceaccount.yaml", &children.service_account);
    check("role.yaml", &children.role);
    check("rolebinding.yaml", &children.role_binding);
    let (reader, reader_binding) = children.progress_reader.expect("the operator knows who it is");
    check("progress-reader-role.yaml", &reader);
    check("progress-reader-rolebinding.yaml", &reader_binding);
}

#[test]
fn golden_parquet_on_s3_with_credentials_and_an_api_key() {
    check("job-s3.yaml", &children(S3_JOB).job);
}

#[test]
fn golden_openai_batch_on_the_batch_servers_claim() {
    let job = job(OPENAI_BATCH_JOB);
    let target = PoolTarget::of("bge-small", "ml", Some("10.96.0.42"), Some(MODEL.into()));
    let children = render::render(&job, IMAGE, &target, Some(&operator())).expect("renders");
    check("job-openai-batch.yaml", &children.job);
}

fn args(children: &JobChildren) -> Vec<String> {
    children.job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].args.clone().unwrap()
}

#[test]
fn the_worker_runs_the_fixed_command_line() {
    let pvc = args(&children(PVC_JOB));
    assert_eq!(
        pvc,
        [
            "run",
            "--pool-url=http://bge-small.ml.svc:50051",
            "--pool=bge-small",
            "--input=file:///data/input/wiki/2024/articles",
            "--input-format=jsonl",
            "--id-field=id",
            "--text-field=text",
            "--output=file:///data/output/wiki/",
            "--workers=4",
            "--rows-per-call=512",
            "--dtype=f32",
            "--lane=ingest",
            "--progress-configmap=wiki-progress",
        ]
    );
    let s3 = args(&children(S3_JOB));
    for expected in [
        "--input=s3://corpora/catalog/2024/products.parquet",
        "--output=s3://vectors/catalog/",
        "--shard-bytes=268435456",
        "--normalize=false",
        "--truncate",
        "--dimensions=256",
        "--prompt-name=passage",
        "--dtype=f16",
        "--lane=query",
        "--api-key-file=/var/run/teifleet/api-key/indexer",
        "--input-s3-endpoint=http://minio.storage.svc:9000",
        "--input-s3-region=eu-west-1",
        "--input-s3-allow-http",
        "--output-s3-endpoint=https://s3.eu-west-1.amazonaws.com",
        "--output-s3-region=eu-west-1",
    ] {
        assert!(s3.iter().any(|arg| arg == expected), "no {expected} in {s3:?}");
    }
    assert!(!s3.iter().any(|arg| arg == "--output-s3-allow-http"), "the output is https");
    assert!(
        !s3.iter().chain(&pvc).any(|arg| arg.starts_with("--worker=")),
        "the index comes from JOB_COMPLETION_INDEX"
    );
}

#[test]
fn an_openai_batch_worker_sends_its_lines_to_the_pools_http_port_for_the_pools_model() {
    let job = job(OPENAI_BATCH_JOB);
    let at_ip = PoolTarget::of("bge-small", "ml", Some("10.96.0.42"), Some(MODEL.into()));
    let args = args(&render::render(&job, IMAGE, &at_ip, None).unwrap());
    assert_eq!(
        args[..7],
        [
            "run",
            "--pool-url=http://10.96.0.42:50051",
            "--pool=bge-small",
            "--input=file:///data/input/batch/files/file-89abcdef0123456789abcdef/content",
            "--input-format=openai-batch",
            "--pool-http-url=http://10.96.0.42:8000",
            "--model=BAAI/bge-small-en-v1.5",
        ]
    );
    assert!(args.contains(&"--output=file:///data/output/batch/batches/batch_0123456789abcdef01234567/".to_owned()));
    let rendered = render::render(&job, IMAGE, &at_ip, None).unwrap().job;
    assert_eq!(render::worker_model(&rendered), Some(MODEL), "read back as the controller carries it over");
    // The file and the output on the server's one claim: one volume, its input mount read-only.
    let pod = rendered.spec.unwrap().template.spec.unwrap();
    let claims: Vec<_> = pod.volumes.unwrap().into_iter().filter_map(|volume| volume.persistent_volume_claim).collect();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!((claims[0].claim_name.as_str(), claims[0].read_only), ("teifleet-batch", None));
    let mounts: Vec<_> = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts[..2],
        [("output", "/data/input", Some(true)), ("output", "/data/output", None)],
        "the input read-only"
    );

    // Without a ClusterIP, by the Service's DNS name, as the gRPC address.
    let by_name = PoolTarget::of("bge-small", "ml", None, Some(MODEL.into()));
    let args = args_of(&job, &by_name);
    assert!(args.contains(&"--pool-http-url=http://bge-small.ml.svc:8000".to_owned()), "{args:?}");

    // The model unknown (the pool gone, no Job to carry it from): no `--model` rather than a wrong one.
    let unknown = PoolTarget::of("bge-small", "ml", None, None);
    assert!(!args_of(&job, &unknown).iter().any(|arg| arg.starts_with("--model")));

    // Other formats call the gRPC port alone.
    for fixture in [PVC_JOB, S3_JOB] {
        let args = args_of(&self::job(fixture), &at_ip);
        assert!(!args.iter().any(|arg| arg.starts_with("--pool-http-url") || arg.starts_with("--model")), "{args:?}");
        assert_eq!(render::worker_model(&render::render(&self::job(fixture), IMAGE, &at_ip, None).unwrap().job), None);
    }
}

fn args_of(job: &EmbeddingJob, target: &PoolTarget) -> Vec<String> {
    args(&render::render(job, IMAGE, target, None).unwrap())
}

#[test]
fn the_progress_config_map_is_applied_without_data() {
    let rendered = serde_json::to_value(children(PVC_JOB).progress).unwrap();
    assert_eq!(rendered.get("data"), None, "applying data would take the workers' progress away");
    assert_eq!(rendered.get("binaryData"), None);
}

#[test]
fn the_indexed_job_has_one_index_per_worker_and_fails_only_once_all_are_done() {
    let job = children(S3_JOB).job;
    let spec = job.spec.unwrap();
    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
    assert_eq!((spec.completions, spec.parallelism, spec.max_failed_indexes), (Some(8), Some(8), Some(8)));
    assert_eq!(spec.backoff_limit_per_index, Some(3));
    assert_eq!((spec.active_deadline_seconds, spec.suspend), (Some(5400), Some(true)));
    assert_eq!(spec.ttl_seconds_after_finished, None);
    let owner = &job.metadata.owner_references.unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("EmbeddingJob", "catalog", Some(true)));
}

#[test]
fn the_workers_run_as_restricted_as_the_pool_pods() {
    let pool: EmbeddingPool = serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
        "metadata": { "name": "bge-small", "namespace": "ml", "uid": "7d1c0f2e-0000-4000-8000-000000000001" },
        "spec": { "model": { "id": "BAAI/bge-small-en-v1.5" } },
    }))
    .unwrap();
    let deployment = crate::render::render(&pool, &crate::render::RenderConfig::default(), None).unwrap().deployment;
    let pool_pod = deployment.spec.unwrap().template.spec.unwrap();
    let job = children(PVC_JOB).job;
    let worker_pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(worker_pod.security_context, pool_pod.security_context);
    for container in &pool_pod.containers {
        assert_eq!(worker_pod.containers[0].security_context, container.security_context, "{}", container.name);
    }
    assert_eq!(worker_pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(worker_pod.automount_service_account_token, Some(true), "the workers write their progress");
}

#[test]
fn the_worker_image_is_the_operators_wherever_the_workers_mount_a_claim_or_a_secret() {
    let first = render_job(&job(PVC_JOB));
    assert_eq!(render::worker_image(&first.job), Some(IMAGE));
    // The S3 job names its own image beside its credentials and API key (made before the CRD
    // refused that): its workers still run the operator's.
    let s3 = render_job(&job(S3_JOB));
    assert_eq!(render::worker_image(&s3.job), Some(IMAGE));
    let mut mounting_nothing = job(S3_JOB);
    mounting_nothing.spec.api_key_secret = None;
    assert_eq!(render::image_for(&mounting_nothing, IMAGE), IMAGE, "the stores' credentials are still mounted");
}

/// A job whose creator set every reserved label and annotation (a job made before the CRD
/// refused them, or a CRD not yet updated).
const RESERVED_JOB_TEMPLATE: &str = r#"
labels:
  team: search
  teifleet.dev/pool: bge-small
  teifleet.dev/job: other
  shadow.teifleet.dev/x: y
  app.kubernetes.io/component: embedding-server
  app.kubernetes.io/part-of: teifleet
  app.kubernetes.io/version: "3"
  batch.kubernetes.io/job-name: other
  job-name: other
  controller-uid: x
annotations:
  example.com/team: search
  teifleet.dev/pool: bge-small
  batch.kubernetes.io/job-completion-index: "0"
  container.apparmor.security.beta.kubernetes.io/worker: unconfined
"#;

#[test]
fn worker_pods_never_carry_a_reserved_label_or_annotation() {
    let mut job = job(PVC_JOB);
    job.spec.template = serde_norway::from_str(RESERVED_JOB_TEMPLATE).unwrap();
    let rendered = render_job(&job).job;
    let meta = rendered.spec.unwrap().template.metadata.unwrap();
    let labels = meta.labels.unwrap();
    let expected_labels = BTreeMap::from([
        ("app.kubernetes.io/component", "embedding-job"),
        ("app.kubernetes.io/instance", "wiki"),
        ("app.kubernetes.io/managed-by", "teifleet-operator"),
        ("app.kubernetes.io/name", "teifleet-job"),
        ("app.kubernetes.io/part-of", "teifleet"),
        ("app.kubernetes.io/version", "3"),
        ("team", "search"),
        ("teifleet.dev/job", "wiki"),
    ]);
    let labels: BTreeMap<&str, &str> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(labels, expected_labels, "no pool's label: the pool's Services never select a worker");
    let annotations = meta.annotations.unwrap();
    assert_eq!(annotations.keys().collect::<Vec<_>>(), ["example.com/team"]);
}

#[test]
fn deadlines_round_up_to_whole_seconds() {
    let with = |deadline: &str| {
        let mut job = job(PVC_JOB);
        job.spec.deadline = Some(deadline.into());
        deadline_seconds(&job)
    };
    assert_eq!(with("90m").unwrap(), Some(5400));
    assert_eq!(with("1.5s").unwrap(), Some(2));
    assert_eq!(with("0s").unwrap(), Some(1), "activeDeadlineSeconds must be positive");
    assert!(with("soon").is_err());
    let mut no_deadline = job(PVC_JOB);
    no_deadline.spec.deadline = None;
    assert_eq!(deadline_seconds(&no_deadline).unwrap(), None);
}

#[test]
fn store_urls_join_the_store_and_the_input_path_and_keep_a_directory_a_directory() {
    let job = job(PVC_JOB);
    let output = &job.spec.output.store;
    assert_eq!(store_url(output, "/data/output", None, true), "file:///data/output/wiki/");
    let input = &job.spec.input.store;
    assert_eq!(store_url(input, "/data/input", Some("articles"), false), "file:///data/input/wiki/2024/articles");
    assert_eq!(store_url(input, "/data/input", Some("docs/"), false), "file:///data/input/wiki/2024/docs/");
    assert_eq!(store_url(input, "/data/input", None, false), "file:///data/input/wiki/2024/", "as the store wrote it");
    let mut root = input.clone();
    root.pvc.as_mut().unwrap().path = String::new();
    assert_eq!(store_url(&root, "/data/input", None, false), "file:///data/input/", "a claim's root is a directory");
    assert_eq!(store_url(&root, "/data/input", Some("a//b"), false), "file:///data/input/a/b");
    let s3 = self::job(S3_JOB);
    assert_eq!(store_url(&s3.spec.output.store, "/data/output", None, true), "s3://vectors/catalog/");
    let mut bucket = s3.spec.input.store.clone();
    bucket.s3.as_mut().unwrap().key = String::new();
    assert_eq!(store_url(&bucket, "/data/input", None, false), "s3://corpora/");
    assert_eq!(store_url(&bucket, "/data/input", Some("2024/"), false), "s3://corpora/2024/");
}

// --- Status ---------------------------------------------------------------------------------------

const T0: i64 = 1_750_000_000;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(T0 + seconds).unwrap()
}

fn batch(status: JobStatus) -> Job {
    Job { status: Some(status), ..Job::default() }
}

fn job_condition(type_: &str, reason: &str, message: &str, at_second: i64) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(Time(at(at_second))),
        ..JobCondition::default()
    }
}

/// A plan of 40 shards over 4 MB of JSONL (rows unknown), and `done` shards of 1000 rows (2 of
/// them with an error) and 100 kB each.
fn progress(done: u32) -> BTreeMap<String, String> {
    let plan = ProgressPlan { shards: 40, bytes: 4_000_000, rows: None };
    let mut data = BTreeMap::from([("plan".to_owned(), serde_json::to_string(&plan).unwrap())]);
    for shard in 0..done {
        let report = ShardProgress { shard, rows: 1000, failed: 2, bytes: 100_000, seconds: 9.5 };
        data.insert(progress_shard_key(shard), serde_json::to_string(&report).unwrap());
    }
    data
}

fn seen<'a>(
    batch: Option<&'a Job>,
    progress: Option<&'a BTreeMap<String, String>>,
    now: i64,
    worker_messages: &'a [String],
) -> Seen<'a> {
    Seen { blocker: None, job: batch, progress, worker_messages, now: at(now) }
}

fn condition<'a>(status: &'a EmbeddingJobStatus, type_: &str) -> (&'a str, &'a str) {
    let condition = conditions::find(&status.conditions, type_).unwrap_or_else(|| panic!("no {type_}"));
    (condition.status.as_str(), condition.reason.as_str())
}

#[test]
fn running_mid_way_counts_shards_and_estimates_rows_rate_and_time_left() {
    let running =
        batch(JobStatus { active: Some(4), ready: Some(4), start_time: Some(Time(at(0))), ..JobStatus::default() });
    let data = progress(10);
    let status = status::compute(&job(PVC_JOB), &seen(Some(&running), Some(&data), 100, &[]));
    assert_eq!(condition(&status, RUNNING), ("True", reasons::WORKERS_RUNNING));
    assert_eq!(condition(&status, COMPLETE), ("False", reasons::WORKERS_RUNNING));
    assert_eq!(condition(&status, FAILED), ("False", reasons::WORKERS_RUNNING));
    assert_eq!(
        conditions::find(&status.conditions, RUNNING).unwrap().message,
        "4 of 4 worker(s) running; 10/40 shards done"
    );
    assert_eq!((status.shards_total, status.shards_done), (Some(40), 10));
    assert_eq!((status.rows_done, status.rows_failed), (10_000, 20));
    // A quarter of the bytes gave 10,000 rows: about 40,000 in all, an estimate.
    assert_eq!((status.rows_total, status.rows_total_estimated), (Some(40_000), true));
    assert_eq!(status.rows_per_second, Some(100.0));
    assert_eq!(status.eta.as_deref(), Some("5m0s"), "a quarter in 100 s: 300 s left");
    assert_eq!((status.start_time.clone(), status.completion_time.clone()), (Some(Time(at(0))), None));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(next_look(&status), Action::requeue(super::PROGRESS_POLL), "progress is read, not watched");
}

#[test]
fn a_plan_that_counted_its_rows_gives_an_exact_total() {
    let running =
        batch(JobStatus { active: Some(4), ready: Some(4), start_time: Some(Time(at(0))), ..JobStatus::default() });
    let mut data = progress(10);
    data.insert("plan".into(), r#"{"shards": 40, "bytes": 4000000, "rows": 50000}"#.into());
    let status = status::compute(&job(PVC_JOB), &seen(Some(&running), Some(&data), 100, &[]));
    assert_eq!((status.rows_total, status.rows_total_estimated), (Some(50_000), false));
    assert_eq!(status.eta.as_deref(), Some("6m40s"), "a fifth of the rows in 100 s: 400 s left");
}

#[test]
fn pods_not_started_yet_are_pending() {
    let pending =
        batch(JobStatus { active: Some(4), ready: Some(0), start_time: Some(Time(at(0))), ..JobStatus::default() });
    let status = status::compute(&job(PVC_JOB), &seen(Some(&pending), None, 5, &[]));
    assert_eq!(condition(&status, RUNNING), ("True", reasons::WORKERS_PENDING));
    assert_eq!((status.shards_total, status.rows_total, status.rows_per_second, status.eta), (None, None, None, None));
}

#[test]
fn complete_counts_every_row_and_rates_the_whole_run() {
    let done = batch(JobStatus {
        succeeded: Some(4),
        start_time: Some(Time(at(0))),
        completion_time: Some(Time(at(400))),
        conditions: Some(vec![
            job_condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods", 399),
            job_condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods", 400),
        ]),
        ..JobStatus::default()
    });
    let data = progress(40);
    let status = status::compute(&job(PVC_JOB), &seen(Some(&done), Some(&data), 1000, &[]));
    assert_eq!(condition(&status, RUNNING), ("False", reasons::COMPLETED));
    assert_eq!(condition(&status, COMPLETE), ("True", reasons::COMPLETED));
    assert_eq!(condition(&status, FAILED), ("False", reasons::COMPLETED));
    assert_eq!(
        conditions::find(&status.conditions, COMPLETE).unwrap().message,
        "40000 rows written, 80 of them with an error"
    );
    assert_eq!((status.rows_total, status.rows_total_estimated), (Some(40_000), false), "every shard read: counted");
    assert_eq!(status.rows_per_second, Some(100.0), "over the 400 s it ran, not until now");
    assert_eq!((status.eta.clone(), status.completion_time.clone()), (None, Some(Time(at(400)))));
    assert_eq!(next_look(&status), Action::await_change());

    // Complete with shards unreported (a progress write lost): the total stays an estimate.
    let partial = progress(30);
    let status = status::compute(&job(PVC_JOB), &seen(Some(&done), Some(&partial), 1000, &[]));
    assert_eq!((status.rows_total, status.rows_total_estimated), (Some(40_000), true));
}

#[test]
fn failed_by_its_deadline() {
    let failed = batch(JobStatus {
        failed: Some(4),
        start_time: Some(Time(at(0))),
        conditions: Some(vec![
            job_condition("FailureTarget", "DeadlineExceeded", "Job was active longer than specified deadline", 7200),
            job_condition("Failed", "DeadlineExceeded", "Job was active longer than specified deadline", 7201),
        ]),
        ..JobStatus::default()
    });
    let data = progress(30);
    let status = status::compute(&job(PVC_JOB), &seen(Some(&failed), Some(&data), 8000, &[]));
    assert_eq!(condition(&status, FAILED), ("True", reasons::DEADLINE_EXCEEDED));
    assert_eq!(condition(&status, RUNNING), ("False", reasons::DEADLINE_EXCEEDED));
    assert_eq!(condition(&status, COMPLETE), ("False", reasons::DEADLINE_EXCEEDED));
    assert_eq!(
        conditions::find(&status.conditions, FAILED).unwrap().message,
        "Job was active longer than specified deadline"
    );
    assert_eq!(status.completion_time, Some(Time(at(7201))));
    assert_eq!((status.shards_done, status.rows_total_estimated), (30, true), "what was done stays reported");
    assert_eq!(status.eta, None);
}

#[test]
fn failed_workers_are_named_with_what_they_said_last() {
    let failed = batch(JobStatus {
        failed: Some(8),
        succeeded: Some(2),
        failed_indexes: Some("1,3".into()),
        start_time: Some(Time(at(0))),
        conditions: Some(vec![job_condition("Failed", "FailedIndexes", "Job has failed indexes", 60)]),
        ..JobStatus::default()
    });
    let said = ["worker 1: input unreadable: no such file".to_owned()];
    let status = status::compute(&job(PVC_JOB), &seen(Some(&failed), None, 100, &said));
    assert_eq!(condition(&status, FAILED), ("True", reasons::WORKERS_FAILED));
    assert_eq!(
        conditions::find(&status.conditions, FAILED).unwrap().message,
        "Job has failed indexes (failed workers: 1,3); worker 1: input unreadable: no such file"
    );
}

#[test]
fn suspended_shows_what_is_done_and_no_rate() {
    let mut suspended_job = job(S3_JOB);
    suspended_job.spec.suspend = true;
    let suspended = batch(JobStatus {
        start_time: Some(Time(at(0))),
        conditions: Some(vec![job_condition("Suspended", "JobSuspended", "Job suspended", 50)]),
        ..JobStatus::default()
    });
    let data = progress(5);
    let status = status::compute(&suspended_job, &seen(Some(&suspended), Some(&data), 100, &[]));
    assert_eq!(condition(&status, RUNNING), ("False", reasons::SUSPENDED));
    assert_eq!(condition(&status, COMPLETE).0, "False");
    assert_eq!(condition(&status, FAILED).0, "False");
    assert_eq!(status.shards_done, 5);
    assert_eq!((status.rows_per_second, status.eta.clone()), (None, None));
    assert_eq!(next_look(&status), Action::await_change(), "resuming is an edit the watch brings");
}

#[test]
fn a_suspended_job_whose_workers_are_still_stopping_is_not_suspended_yet() {
    let mut suspended_job = job(S3_JOB);
    suspended_job.spec.suspend = true;
    let stopping = |active, terminating| {
        batch(JobStatus {
            start_time: Some(Time(at(0))),
            active: Some(active),
            terminating: Some(terminating),
            conditions: Some(vec![job_condition("Suspended", "JobSuspended", "Job suspended", 50)]),
            ..JobStatus::default()
        })
    };
    let data = progress(5);
    for (active, terminating) in [(1, 0), (0, 2)] {
        let status =
            status::compute(&suspended_job, &seen(Some(&stopping(active, terminating)), Some(&data), 100, &[]));
        // A stopping worker may still write a shard: whoever waits for `Suspended` (a cancelled
        // batch's final counts) must not see it before that shard.
        assert_eq!(condition(&status, RUNNING), ("True", reasons::WORKERS_STOPPING), "{active} {terminating}");
        assert!(status.conditions[0].message.contains(&format!("{} worker pod(s) stopping", active + terminating)));
    }
    let status = status::compute(&suspended_job, &seen(Some(&stopping(0, 0)), Some(&data), 100, &[]));
    assert_eq!(condition(&status, RUNNING), ("False", reasons::SUSPENDED));
}

#[test]
fn a_missing_pool_blocks_the_job() {
    let job = job(PVC_JOB);
    let blocker = status::pool_blocker(&job, None).unwrap();
    assert_eq!(blocker.reason, reasons::POOL_NOT_FOUND);
    let status = status::compute(
        &job,
        &Seen { blocker: Some(&blocker), job: None, progress: None, worker_messages: &[], now: at(0) },
    );
    assert_eq!(condition(&status, RUNNING), ("False", reasons::POOL_NOT_FOUND));
    assert_eq!(condition(&status, COMPLETE).0, "False");
    assert_eq!(condition(&status, FAILED).0, "False");
    assert!(
        conditions::find(&status.conditions, RUNNING)
            .unwrap()
            .message
            .contains("EmbeddingPool bge-small does not exist")
    );
    assert_eq!(next_look(&status), Action::requeue(Duration::from_secs(10)), "pools are not watched for jobs");
}

#[test]
fn a_pool_the_workers_cannot_call_blocks_the_job() {
    let pool = |spec: Value| -> EmbeddingPool {
        serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
            "metadata": { "name": "bge-small", "namespace": "ml" }, "spec": spec,
        }))
        .unwrap()
    };
    let model = json!({ "id": "BAAI/bge-small-en-v1.5" });
    let plain = pool(json!({ "model": model }));
    let tls = pool(json!({ "model": model, "tls": { "secretName": "cert" } }));
    let keyed = pool(json!({ "model": model, "auth": { "secretName": "keys" } }));
    let without_key = job(PVC_JOB);
    let mut with_key = job(PVC_JOB);
    with_key.spec.api_key_secret = job(S3_JOB).spec.api_key_secret;
    assert_eq!(status::pool_blocker(&without_key, Some(&plain)), None);
    assert_eq!(status::pool_blocker(&without_key, Some(&tls)).unwrap().reason, reasons::POOL_USES_TLS);
    assert_eq!(status::pool_blocker(&without_key, Some(&keyed)).unwrap().reason, reasons::API_KEY_REQUIRED);
    assert_eq!(status::pool_blocker(&with_key, Some(&keyed)), None);
    assert_eq!(status::claims_blocker(&without_key, false, false), None);
    let input = status::claims_blocker(&without_key, true, true).unwrap();
    assert_eq!(
        (input.reason, input.message.as_str()),
        (reasons::INPUT_UNREADABLE, "the input's PersistentVolumeClaim corpora does not exist")
    );
    assert_eq!(status::claims_blocker(&without_key, false, true).unwrap().reason, reasons::OUTPUT_UNWRITABLE);
}

#[test]
fn a_finished_job_stays_finished_whatever_blocks_a_new_one() {
    let done = batch(JobStatus {
        conditions: Some(vec![job_condition("Complete", "CompletionsReached", "", 10)]),
        ..JobStatus::default()
    });
    let blocker = Blocker { reason: reasons::POOL_NOT_FOUND, message: "gone".into() };
    let seen = Seen { blocker: Some(&blocker), job: Some(&done), progress: None, worker_messages: &[], now: at(20) };
    assert_eq!(condition(&status::compute(&job(PVC_JOB), &seen), COMPLETE).0, "True");
    assert!(status::finished(&done) && !status::failed(&done));
    let failing = batch(JobStatus {
        conditions: Some(vec![job_condition("FailureTarget", "DeadlineExceeded", "", 10)]),
        ..JobStatus::default()
    });
    assert!(status::finished(&failing) && status::failed(&failing));
    assert!(!status::finished(&batch(JobStatus { active: Some(1), ..JobStatus::default() })));
}

#[test]
fn an_unchanged_job_keeps_its_transition_times_and_needs_no_write() {
    let running =
        batch(JobStatus { active: Some(4), ready: Some(4), start_time: Some(Time(at(0))), ..JobStatus::default() });
    let data = progress(10);
    let mut shown = job(PVC_JOB);
    shown.status = Some(status::compute(&shown, &seen(Some(&running), Some(&data), 100, &[])));
    let again = status::compute(&shown, &seen(Some(&running), Some(&data), 100, &[]));
    assert_eq!(Some(&again), shown.status.as_ref());
    let memo = StatusMemo::default();
    let now = std::time::Instant::now();
    assert_eq!(memo.due(&shown, &again, now), Due::No, "the same status: no write");

    // Later, more done: the conditions keep their times, the counts move.
    let more = progress(20);
    let later = status::compute(&shown, &seen(Some(&running), Some(&more), 200, &[]));
    let transition = |status: &EmbeddingJobStatus| {
        conditions::find(&status.conditions, RUNNING).unwrap().last_transition_time.clone()
    };
    assert_eq!(transition(&later), transition(shown.status.as_ref().unwrap()));
    assert_eq!(later.shards_done, 20);
    assert_eq!(memo.due(&shown, &later, now), Due::Now, "nothing written yet: at once");
    memo.written(&shown, later.clone(), now);
    assert_eq!(memo.due(&shown, &later, now), Due::No, "written, the cache not caught up yet: no repeat");
}

#[test]
fn progress_alone_is_written_once_a_pace_and_news_at_once() {
    let running =
        batch(JobStatus { active: Some(4), ready: Some(4), start_time: Some(Time(at(0))), ..JobStatus::default() });
    let mut shown = job(PVC_JOB);
    shown.status = Some(status::compute(&shown, &seen(Some(&running), Some(&progress(10)), 100, &[])));
    let memo = StatusMemo::default();
    let start = std::time::Instant::now();
    let eleven = status::compute(&shown, &seen(Some(&running), Some(&progress(11)), 101, &[]));
    assert_eq!(memo.due(&shown, &eleven, start), Due::Now);
    memo.written(&shown, eleven.clone(), start);

    // Shards keep coming a tenth of a second apart: each waits out the pace, never longer.
    let quarter = start + PROGRESS_PACE / 4;
    let twelve = status::compute(&shown, &seen(Some(&running), Some(&progress(12)), 101, &[]));
    assert_eq!(memo.due(&shown, &twelve, quarter), Due::After(PROGRESS_PACE - PROGRESS_PACE / 4));
    // The cache catching up keeps the time of the last write.
    shown.status = Some(eleven);
    assert_eq!(memo.due(&shown, shown.status.as_ref().unwrap(), quarter), Due::No);
    assert_eq!(memo.due(&shown, &twelve, quarter), Due::After(PROGRESS_PACE - PROGRESS_PACE / 4));
    assert_eq!(memo.due(&shown, &twelve, start + PROGRESS_PACE), Due::Now, "the pace is over");

    // A condition is news: a finished job is written at once, however recent the last write.
    let done = batch(JobStatus {
        succeeded: Some(4),
        start_time: Some(Time(at(0))),
        completion_time: Some(Time(at(101))),
        conditions: Some(vec![job_condition("Complete", "CompletionsReached", "", 101)]),
        ..JobStatus::default()
    });
    let complete = status::compute(&shown, &seen(Some(&done), Some(&progress(40)), 101, &[]));
    assert_ne!(complete.conditions, twelve.conditions);
    assert_eq!(memo.due(&shown, &complete, quarter), Due::Now);
}

#[test]
fn progress_leaves_out_what_does_not_parse() {
    let mut data = progress(3);
    data.insert("shard-000099".into(), "not json".into());
    data.insert("notes".into(), "{}".into());
    let read = Progress::read(&data);
    assert_eq!((read.shards_done, read.rows, read.failed, read.bytes), (3, 3000, 6, 300_000));
    assert_eq!(read.plan, Some(ProgressPlan { shards: 40, bytes: 4_000_000, rows: None }));
    assert_eq!(Progress::read(&BTreeMap::new()), Progress::default());
}

#[test]
fn durations_print_as_go_prints_them() {
    assert_eq!(format_duration(0), "0s");
    assert_eq!(format_duration(45), "45s");
    assert_eq!(format_duration(120), "2m0s");
    assert_eq!(format_duration(3723), "1h2m3s");
    assert_eq!(format_duration(90_000), "25h0m0s");
}

fn terminated(exit_code: i32, reason: Option<&str>, message: &str) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code,
        reason: reason.map(Into::into),
        message: Some(message.into()),
        ..ContainerStateTerminated::default()
    }
}

#[test]
fn a_worker_message_is_its_error_line_and_never_the_rest_of_its_log() {
    let log = "{\"level\":\"INFO\",\"message\":\"shard 3\",\"secret\":\"hunter2\"}\n\
               teifleet-job: pool bge: Unavailable: no replica\n\n";
    assert_eq!(worker_message(&terminated(1, Some("Error"), log)), "pool bge: Unavailable: no replica");
    // No error line (a crash, an image of another build): Kubernetes' words only, never the log.
    let crash = "{\"level\":\"INFO\",\"message\":\"row text: my password\"}\nthread panicked at x.rs";
    assert_eq!(worker_message(&terminated(101, Some("Error"), crash)), "exited with code 101 (Error)");
    assert_eq!(worker_message(&terminated(137, Some("OOMKilled"), "")), "exited with code 137 (OOMKilled)");
    assert_eq!(worker_message(&terminated(1, Some("\u{1b}[31m<b>"), "")), "exited with code 1 (31mb)");
    assert_eq!(worker_message(&terminated(2, None, "")), "exited with code 2");
}

#[test]
fn a_worker_message_is_one_bounded_line_without_an_answer_body_or_a_key() {
    // An S3 error as object_store quotes it: the XML body names the access key id.
    let s3 = "teifleet-job: s3://vectors/catalog/: Generic S3 error: Error performing PUT \
              <?xml version=\"1.0\"?><Error><Code>InvalidAccessKeyId</Code>\
              <AWSAccessKeyId>AKIAIOSFODNN7EXAMPLE</AWSAccessKeyId></Error>";
    let said = worker_message(&terminated(1, None, s3));
    assert_eq!(said, "s3://vectors/catalog/: Generic S3 error: Error performing PUT [answer body left out]");
    assert_eq!(
        sanitize("access key AKIAIOSFODNN7EXAMPLE, secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEYwJalrXUtnFEMI9"),
        "access key [redacted], secret wJalrXUtnFEMI/K7MDENG/[redacted]"
    );
    assert_eq!(sanitize("a\u{7}b\rc\u{202e}d\te\u{85}f   g"), "a b c d e f g", "control and bidi characters");
    let long = sanitize(&format!("{}é", "x ".repeat(200)));
    assert!(long.len() <= MAX_WORKER_MESSAGE + '…'.len_utf8() && long.ends_with('…'), "{long}");
    assert!(!long.contains('\n'));
    let hash = "sha256 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_eq!(sanitize(hash), hash, "a digest is not a secret");
}

fn failed_pod(index: &str, finished: i64, exit_code: i32, message: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            annotations: Some(BTreeMap::from([("batch.kubernetes.io/job-completion-index".into(), index.into())])),
            ..ObjectMeta::default()
        },
        status: Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "worker".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code,
                        message: Some(message.into()),
                        finished_at: Some(Time(at(finished))),
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
        ..Pod::default()
    }
}

#[test]
fn each_failed_worker_is_quoted_once_by_its_latest_failure() {
    let pods = [
        failed_pod("3", 10, 1, "first try\nteifleet-job: pool unavailable"),
        failed_pod("3", 20, 1, "teifleet-job: input unreadable"),
        failed_pod("1", 15, 2, "panic: out of memory"),
        failed_pod("0", 30, 0, "done"),
    ];
    assert_eq!(quote_failed_workers(&pods), ["worker 1: exited with code 2", "worker 3: input unreadable"]);
}

#[test]
fn events_say_started_completed_and_failed_once() {
    let running =
        batch(JobStatus { active: Some(4), ready: Some(4), start_time: Some(Time(at(0))), ..JobStatus::default() });
    let mut job = job(PVC_JOB);
    let first = status::compute(&job, &seen(Some(&running), None, 10, &[]));
    let started = events(None, &first);
    assert_eq!(started.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), ["Started"]);
    assert_eq!(started[0].type_, EventType::Normal);
    job.status = Some(first.clone());
    assert!(events(Some(&first), &status::compute(&job, &seen(Some(&running), None, 20, &[]))).is_empty());

    let failed = batch(JobStatus {
        conditions: Some(vec![job_condition(
            "Failed",
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
            30,
        )]),
        ..JobStatus::default()
    });
    let last = status::compute(&job, &seen(Some(&failed), None, 30, &[]));
    let ended = events(Some(&first), &last);
    assert_eq!(ended.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), ["Failed"]);
    assert_eq!(ended[0].type_, EventType::Warning);
    assert_eq!(ended[0].note.as_deref(), Some("DeadlineExceeded: Job was active longer than specified deadline"));

    let complete = batch(JobStatus {
        conditions: Some(vec![job_condition("Complete", "CompletionsReached", "", 30)]),
        ..JobStatus::default()
    });
    let done = status::compute(&job, &seen(Some(&complete), None, 30, &[]));
    assert_eq!(events(Some(&first), &done).iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), ["Completed"]);

    let blocker = status::pool_blocker(&job, None).unwrap();
    let blocked = status::compute(
        &job,
        &Seen { blocker: Some(&blocker), job: None, progress: None, worker_messages: &[], now: at(40) },
    );
    assert_eq!(events(None, &blocked).iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), ["PoolNotFound"]);
    assert!(events(Some(&blocked), &blocked).is_empty(), "once");
}

// --- reconcile() against a mocked API server -------------------------------------------------------

#[derive(Clone, Debug)]
struct Sent {
    method: String,
    path: String,
    query: String,
    body: Value,
}

fn not_found() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "metadata": {} }),
    )
}

/// An API server holding `objects` (by path) that accepts every apply, echoing it back, and
/// answers a status apply with `job` carrying that status.
fn mock_api(objects: HashMap<String, Value>, job: Value) -> (Client, Arc<Mutex<Vec<Sent>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let path = parts.uri.path().to_owned();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            log.lock().unwrap().push(Sent {
                method: parts.method.to_string(),
                path: path.clone(),
                query,
                body: body.clone(),
            });
            let (status, reply) = match parts.method.as_str() {
                "PATCH" if path.ends_with("/status") => {
                    let mut reply = job.clone();
                    reply["status"] = body["status"].clone();
                    (StatusCode::OK, reply)
                }
                "PATCH" => (StatusCode::OK, body),
                "GET" => match objects.get(&path) {
                    // A refusal stands in for the object: `{"code": 403}`.
                    Some(object) if object["kind"] == "Status" => {
                        (StatusCode::from_u16(object["code"].as_u64().unwrap_or(500) as u16).unwrap(), object.clone())
                    }
                    Some(object) => (StatusCode::OK, object.clone()),
                    None if path.split("/namespaces/").nth(1).is_some_and(|rest| rest.split('/').count() == 3) => {
                        not_found()
                    }
                    None => {
                        (StatusCode::OK, json!({ "apiVersion": "v1", "kind": "List", "metadata": {}, "items": [] }))
                    }
                },
                "POST" => (StatusCode::CREATED, body),
                _ => (StatusCode::OK, json!({})),
            };
            let response =
                Response::builder().status(status).body(Body::from(serde_json::to_vec(&reply).unwrap())).unwrap();
            send.send_response(response);
        }
    });
    (Client::new(service, "default"), seen)
}

fn context(client: Client) -> Arc<Context> {
    Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client, Reporter { controller: "teifleet-operator".into(), instance: None }),
        metrics: Metrics::new(),
        image: IMAGE.into(),
        operator: Some(operator()),
        status_memo: Default::default(),
    })
}

fn pool_json() -> Value {
    json!({
        "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
        "metadata": { "name": "bge-small", "namespace": "ml", "uid": "7d1c0f2e-0000-4000-8000-000000000001" },
        "spec": { "model": { "id": "BAAI/bge-small-en-v1.5" } },
    })
}

fn claim_json(name: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": { "name": name, "namespace": "ml" } })
}

#[tokio::test]
async fn a_job_whose_pool_is_missing_creates_nothing_and_says_why() {
    let job_json = serde_json::to_value(job(PVC_JOB)).unwrap();
    let (client, seen) = mock_api(HashMap::new(), job_json);
    let action = tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(job(PVC_JOB)), context(client)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
    let seen = seen.lock().unwrap().clone();
    let writes: Vec<(&str, &str)> =
        seen.iter().filter(|s| s.method != "GET").map(|s| (s.method.as_str(), s.path.as_str())).collect();
    assert_eq!(
        writes,
        [
            ("PATCH", "/apis/teifleet.dev/v1alpha1/namespaces/ml/embeddingjobs/wiki/status"),
            ("POST", "/apis/events.k8s.io/v1/namespaces/ml/events"),
        ],
        "no Job, no RBAC, no ConfigMap"
    );
    let status = &seen.iter().find(|s| s.path.ends_with("/status")).unwrap().body["status"];
    assert_eq!(status["conditions"][0]["type"], "Running");
    assert_eq!(status["conditions"][0]["status"], "False");
    assert_eq!(status["conditions"][0]["reason"], "PoolNotFound");
    assert_eq!(status["conditions"][0]["observedGeneration"], 1);
    let event = &seen.iter().find(|s| s.method == "POST").unwrap().body;
    assert_eq!(event["reason"], "PoolNotFound");
}

/// What the API server holds for a job whose pool and claims exist and whose workers have
/// reported ten shards' progress.
fn a_running_jobs_objects() -> HashMap<String, serde_json::Value> {
    HashMap::from([
        ("/apis/teifleet.dev/v1alpha1/namespaces/ml/embeddingpools/bge-small".to_owned(), pool_json()),
        ("/api/v1/namespaces/ml/persistentvolumeclaims/corpora".to_owned(), claim_json("corpora")),
        ("/api/v1/namespaces/ml/persistentvolumeclaims/vectors".to_owned(), claim_json("vectors")),
        (
            "/api/v1/namespaces/ml/configmaps/wiki-progress".to_owned(),
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "data": progress(10), "metadata": {
                "name": "wiki-progress",
                "ownerReferences": [{ "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingJob", "name": "wiki",
                                      "uid": "9b3e6c1a-0000-4000-8000-000000000001", "controller": true }],
            } }),
        ),
    ])
}

#[tokio::test]
async fn a_job_with_its_pool_applies_its_children_then_reports_progress() {
    let objects = a_running_jobs_objects();
    let job_json = serde_json::to_value(job(PVC_JOB)).unwrap();
    let (client, seen) = mock_api(objects, job_json);
    tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(job(PVC_JOB)), context(client)))
        .await
        .unwrap()
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let applied: Vec<&str> = seen
        .iter()
        .filter(|s| s.method == "PATCH" && !s.path.ends_with("/status"))
        .map(|s| s.path.rsplit('/').nth(1).unwrap())
        .collect();
    assert_eq!(applied, ["roles", "rolebindings", "serviceaccounts", "roles", "rolebindings", "jobs"]);
    let applied_names: Vec<&str> =
        seen.iter().filter(|s| s.method == "PATCH").filter_map(|s| s.body["metadata"]["name"].as_str()).collect();
    assert_eq!(applied_names[..2], ["wiki-progress-reader", "wiki-progress-reader"], "the reader Role, bound first");
    for request in seen.iter().filter(|s| s.method == "PATCH") {
        assert!(request.query.contains("fieldManager=teifleet-operator"), "{request:?}");
        assert!(request.query.contains("force=true"), "{request:?}");
    }
    // Created, never patched: the operator may create ConfigMaps and read this one, nothing more.
    let config_map = seen.iter().find(|s| s.path.contains("/configmaps")).unwrap();
    assert_eq!((config_map.method.as_str(), config_map.path.as_str()), ("POST", "/api/v1/namespaces/ml/configmaps"));
    assert_eq!(config_map.body["metadata"]["name"], "wiki-progress");
    assert_eq!(config_map.body.get("data"), None, "the workers' data is not the operator's to write");
    assert!(!seen.iter().any(|s| s.method == "PATCH" && s.path.contains("/configmaps")));

    let status = &seen.iter().find(|s| s.path.ends_with("/status")).unwrap().body["status"];
    assert_eq!((status["shardsDone"].clone(), status["shardsTotal"].clone()), (json!(10), json!(40)));
    assert_eq!(status["rowsDone"], 10_000);
    assert_eq!(status["conditions"][0]["reason"], "WorkersPending", "the applied Job has no pods yet");
}

/// The worker args of the Job one reconcile of the `openaiBatch` fixture applies, with its pool
/// (Service at 10.96.0.42) and claim, and `existing` as the Job already there.
async fn applied_batch_args(existing: Option<Job>) -> Vec<String> {
    let mut objects = HashMap::from([
        ("/apis/teifleet.dev/v1alpha1/namespaces/ml/embeddingpools/bge-small".to_owned(), pool_json()),
        ("/api/v1/namespaces/ml/persistentvolumeclaims/teifleet-batch".to_owned(), claim_json("teifleet-batch")),
        (
            "/api/v1/namespaces/ml/services/bge-small".to_owned(),
            json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "bge-small", "namespace": "ml" },
                    "spec": { "clusterIP": "10.96.0.42" } }),
        ),
    ]);
    if let Some(existing) = existing {
        let path = "/apis/batch/v1/namespaces/ml/jobs/batch-0123456789abcdef01234567".to_owned();
        objects.insert(path, serde_json::to_value(existing).unwrap());
    }
    let (client, seen) = mock_api(objects, serde_json::to_value(job(OPENAI_BATCH_JOB)).unwrap());
    tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(job(OPENAI_BATCH_JOB)), context(client)))
        .await
        .unwrap()
        .expect("reconciles");
    let seen = seen.lock().unwrap().clone();
    let applied = seen.iter().find(|s| s.method == "PATCH" && s.path.contains("/jobs/")).expect("the Job is applied");
    serde_json::from_value(applied.body["spec"]["template"]["spec"]["containers"][0]["args"].clone()).unwrap()
}

#[tokio::test]
async fn an_openai_batch_job_calls_its_pools_http_port_for_the_pools_model_and_keeps_the_model_it_was_made_with() {
    let args = applied_batch_args(None).await;
    assert!(args.contains(&"--input-format=openai-batch".to_owned()), "{args:?}");
    assert!(args.contains(&"--pool-http-url=http://10.96.0.42:8000".to_owned()), "the ClusterIP: {args:?}");
    assert!(args.contains(&"--model=BAAI/bge-small-en-v1.5".to_owned()), "the pool's spec.model.id: {args:?}");

    // The pool's model changed under a running Job, which was made before the pool's Service had
    // its ClusterIP: its pods cannot change, and a rendering the API server refuses would keep a
    // cancel's `suspend` from reaching it.
    let made_with = PoolTarget::of("bge-small", "ml", None, Some("BAAI/bge-base-en-v1.5".into()));
    let existing = render::render(&job(OPENAI_BATCH_JOB), IMAGE, &made_with, None).unwrap().job;
    let args = applied_batch_args(Some(existing.clone())).await;
    assert_eq!(args, args_of_job(&existing), "the Job as it was made");
    assert!(args.contains(&"--model=BAAI/bge-base-en-v1.5".to_owned()), "{args:?}");
    assert!(args.contains(&"--pool-url=http://bge-small.ml.svc:50051".to_owned()), "{args:?}");
    assert!(args.contains(&"--pool-http-url=http://bge-small.ml.svc:8000".to_owned()), "{args:?}");
}

fn args_of_job(job: &Job) -> Vec<String> {
    job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].args.clone().unwrap()
}

#[test]
fn a_job_keeps_the_pool_target_it_was_made_with() {
    let now = PoolTarget::of("bge-small", "ml", Some("10.96.0.42"), Some(MODEL.into()));
    let by_name = PoolTarget::of("bge-small", "ml", None, Some("BAAI/bge-base-en-v1.5".into()));
    let batch = render::render(&job(OPENAI_BATCH_JOB), IMAGE, &by_name, None).unwrap().job;
    assert_eq!(now.clone().as_made(&batch), by_name);
    // A Job of another format was made without an HTTP URL and a model: those stay as they are now.
    let grpc_only = render::render(&job(PVC_JOB), IMAGE, &by_name, None).unwrap().job;
    assert_eq!(now.clone().as_made(&grpc_only), PoolTarget { grpc: "bge-small.ml.svc:50051".into(), ..now.clone() });
    assert_eq!(now.clone().as_made(&Job::default()), now, "nothing to carry");
}

/// The `shardsDone` the job's status was written with, after one reconcile against `objects`.
async fn shards_done_with(objects: HashMap<String, Value>) -> Value {
    let (client, seen) = mock_api(objects, serde_json::to_value(job(PVC_JOB)).unwrap());
    tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(job(PVC_JOB)), context(client)))
        .await
        .unwrap()
        .expect("reconciles");
    let seen = seen.lock().unwrap().clone();
    seen.iter().find(|s| s.path.ends_with("/status")).unwrap().body["status"]["shardsDone"].clone()
}

#[tokio::test]
async fn progress_is_read_only_from_the_jobs_own_config_map_and_only_where_the_operator_may() {
    let path = "/api/v1/namespaces/ml/configmaps/wiki-progress";
    assert_eq!(shards_done_with(a_running_jobs_objects()).await, 10);

    // A ConfigMap of that name made before the job, by someone else: not the job's progress.
    let mut foreign = a_running_jobs_objects();
    foreign.get_mut(path).unwrap()["metadata"]["ownerReferences"] = json!([]);
    assert_eq!(shards_done_with(foreign).await, 0);

    // The reader Role not in force yet: no progress this time, and no failed reconcile.
    let mut refused = a_running_jobs_objects();
    refused.insert(
        path.into(),
        json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                "message": "configmaps \"wiki-progress\" is forbidden", "metadata": {} }),
    );
    assert_eq!(shards_done_with(refused).await, 0);
}

/// The value of the gauge `name` of job ml/wiki whose labels include `extra`.
fn wiki_gauge(metrics: &Metrics, name: &str, extra: (&str, &str)) -> Option<f64> {
    let wanted = [("namespace", "ml"), ("job_name", "wiki"), extra];
    metrics.registry.gather().iter().filter(|family| family.name() == name).find_map(|family| {
        family
            .get_metric()
            .iter()
            .find(|metric| {
                wanted.iter().all(|(key, value)| {
                    metric.get_label().iter().any(|label| label.name() == *key && label.value() == *value)
                })
            })
            .map(|metric| metric.get_gauge().get_value())
    })
}

fn job_series(metrics: &Metrics) -> usize {
    metrics
        .registry
        .gather()
        .iter()
        .filter(|family| family.name().starts_with("teifleet_job_"))
        .map(|family| family.get_metric().len())
        .sum()
}

#[tokio::test]
async fn reconciling_shows_the_jobs_status_as_metrics_and_deleting_it_removes_them() {
    let objects = a_running_jobs_objects();
    let (client, _) = mock_api(objects, serde_json::to_value(job(PVC_JOB)).unwrap());
    let ctx = context(client);
    tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(job(PVC_JOB)), ctx.clone()))
        .await
        .unwrap()
        .unwrap();
    let metrics = &ctx.metrics;
    assert_eq!(wiki_gauge(metrics, "teifleet_job_rows", ("state", "done")), Some(10_000.0));
    assert_eq!(wiki_gauge(metrics, "teifleet_job_rows", ("state", "failed")), Some(20.0));
    assert_eq!(wiki_gauge(metrics, "teifleet_job_shards", ("state", "done")), Some(10.0));
    assert_eq!(wiki_gauge(metrics, "teifleet_job_shards", ("state", "total")), Some(40.0));
    assert_eq!(wiki_gauge(metrics, "teifleet_job_phase", ("phase", "Pending")), Some(1.0), "no pod runs yet");
    assert_eq!(wiki_gauge(metrics, "teifleet_job_phase", ("phase", "Running")), Some(0.0));

    // The job is being deleted: its series go with it.
    let mut deleted = job(PVC_JOB);
    deleted.metadata.deletion_timestamp = Some(Time(at(0)));
    tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(deleted), ctx.clone())).await.unwrap().unwrap();
    assert_eq!(job_series(metrics), 0, "no stale series of a deleted job");
}

#[tokio::test]
async fn a_blocked_job_shows_as_blocked_and_a_steady_one_keeps_its_series() {
    let job_json = serde_json::to_value(job(PVC_JOB)).unwrap();
    let (client, seen) = mock_api(HashMap::new(), job_json);
    let ctx = context(client);
    tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(job(PVC_JOB)), ctx.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(wiki_gauge(&ctx.metrics, "teifleet_job_phase", ("phase", "Blocked")), Some(1.0), "PoolNotFound");
    assert_eq!(wiki_gauge(&ctx.metrics, "teifleet_job_rows", ("state", "total")), None, "unknown, not zero");

    // Read again with the status it now shows: nothing to write, the same series (as after an
    // operator restart, when every job's status is read and none written).
    let written = seen.lock().unwrap().iter().find(|s| s.path.ends_with("/status")).unwrap().body["status"].clone();
    let mut steady = job(PVC_JOB);
    steady.status = Some(serde_json::from_value(written).unwrap());
    let (client, sent) = mock_api(HashMap::new(), json!({}));
    let fresh = context(client);
    tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(steady), fresh.clone())).await.unwrap().unwrap();
    assert!(sent.lock().unwrap().iter().all(|s| s.method == "GET"), "nothing written");
    assert_eq!(wiki_gauge(&fresh.metrics, "teifleet_job_phase", ("phase", "Blocked")), Some(1.0));
    assert_eq!(job_series(&fresh.metrics), job_series(&ctx.metrics));
}
