//! The EmbeddingJob a batch is: its input the uploaded file in the server's own store (format
//! `openaiBatch`), its output the batch's directory there, its deadline the completion window,
//! and the batch's facts in its labels and annotations (the server keeps nothing else).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use teifleet_crds::EmbeddingJob;

use super::{COMPLETION_WINDOW, ENDPOINT};
use crate::cluster::{
    BATCH_LABEL, COMPLETION_WINDOW_ANNOTATION, ENDPOINT_ANNOTATION, INPUT_FILE_ANNOTATION, METADATA_ANNOTATION,
    REQUESTS_ANNOTATION, TENANT_LABEL,
};
use crate::ids::BatchId;
use crate::state::{JobDefaults, JobStore};
use crate::store::FileStore;

/// What one batch's job is made of.
#[derive(Debug, Clone)]
pub struct BatchJob<'a> {
    pub batch: &'a BatchId,
    pub tenant: &'a str,
    pub input_file_id: &'a str,
    /// The EmbeddingPool serving the file's model.
    pub pool: &'a str,
    pub requests: u64,
    /// The input file's size, which its shards are cut from.
    pub file_bytes: u64,
    pub metadata: &'a BTreeMap<String, String>,
}

/// Fewest and most bytes in a shard of a batch's file.
pub const MIN_SHARD_BYTES: u64 = 64 << 10;
pub const MAX_SHARD_BYTES: u64 = 8 << 20;
/// Shards per worker a file is cut into, at least.
pub const SHARDS_PER_WORKER: u64 = 8;

/// `spec.shardBytes` for a file of `file_bytes` read by `workers`: about
/// [`SHARDS_PER_WORKER`] shards each, within [64 KiB, 8 MiB]. A batch's progress, its output after a
/// cancel and the work a restarted worker redoes all move a shard at a time, and the workers end
/// together only when each has several: the EmbeddingJob default (8 MiB) would make a 50,000-line
/// file (about 10 MB) two shards, one worker idle and nothing to show until the end.
pub fn shard_bytes(file_bytes: u64, workers: i32) -> u64 {
    let workers = u64::try_from(workers).unwrap_or(1).max(1);
    let wanted = file_bytes.div_ceil(workers * SHARDS_PER_WORKER);
    wanted.next_multiple_of(1 << 10).clamp(MIN_SHARD_BYTES, MAX_SHARD_BYTES)
}

/// The job for `batch`, in the server's namespace (the API server fills it in).
pub fn job(batch: &BatchJob<'_>, defaults: &JobDefaults) -> EmbeddingJob {
    let input_path = FileStore::content_key(batch.input_file_id);
    let output = FileStore::batch_key(batch.batch);
    let metadata = serde_json::to_string(batch.metadata).expect("strings serialize");
    let value = json!({
        "apiVersion": "teifleet.dev/v1alpha1",
        "kind": "EmbeddingJob",
        "metadata": {
            "name": batch.batch.job_name(),
            "labels": { BATCH_LABEL: batch.batch.as_str(), TENANT_LABEL: batch.tenant },
            "annotations": {
                INPUT_FILE_ANNOTATION: batch.input_file_id,
                ENDPOINT_ANNOTATION: ENDPOINT,
                COMPLETION_WINDOW_ANNOTATION: COMPLETION_WINDOW,
                METADATA_ANNOTATION: metadata,
                REQUESTS_ANNOTATION: batch.requests.to_string(),
            },
        },
        "spec": {
            "poolRef": { "name": batch.pool },
            "input": { "store": store(&defaults.store, ""), "path": input_path, "format": "openaiBatch" },
            "output": { "store": store(&defaults.store, &output) },
            "workers": defaults.workers,
            "shardBytes": shard_bytes(batch.file_bytes, defaults.workers).to_string(),
            "deadline": COMPLETION_WINDOW,
        },
    });
    let mut value = value;
    if let Some(template) = &defaults.template {
        value["spec"]["template"] = serde_json::to_value(template).expect("a template serializes");
    }
    if let Some((name, key)) = &defaults.api_key_secret {
        value["spec"]["apiKeySecret"] = json!({ "name": name, "key": key });
    }
    serde_json::from_value(value).expect("the job's JSON is an EmbeddingJob")
}

/// The server's store, `under` a path within it, as a job's store spec.
fn store(store: &JobStore, under: &str) -> Value {
    match store {
        JobStore::Pvc { claim, path } => json!({ "pvc": { "claimName": claim, "path": join(path, under) } }),
        JobStore::S3 { bucket, key, endpoint, region, credentials_secret, allow_http } => json!({ "s3": {
            "bucket": bucket, "key": join(key, under), "endpoint": endpoint, "region": region,
            "credentialsSecret": credentials_secret, "allowHttp": allow_http,
        } }),
    }
}

/// `base/under`, without empty segments; a trailing `/` on `under` kept (a directory).
fn join(base: &str, under: &str) -> String {
    let joined: Vec<&str> = base.split('/').chain(under.split('/')).filter(|s| !s.is_empty()).collect();
    let joined = joined.join("/");
    match under.ends_with('/') && !joined.is_empty() {
        true => format!("{joined}/"),
        false => joined,
    }
}

#[cfg(test)]
mod tests {
    use teifleet_crds::InputFormat;

    use super::*;

    #[test]
    fn the_job_reads_the_file_and_writes_under_the_batch() {
        let batch = BatchId::parse("batch_0123456789abcdef01234567").unwrap();
        let metadata = BTreeMap::from([("run".to_owned(), "nightly".to_owned())]);
        let spec = BatchJob {
            batch: &batch,
            tenant: "team-a",
            input_file_id: "file-00000000000000000000000a",
            pool: "bge",
            requests: 3,
            file_bytes: 10_000_000,
            metadata: &metadata,
        };
        let pvc = JobDefaults {
            store: JobStore::Pvc { claim: "batch".into(), path: "api/".into() },
            workers: 3,
            api_key_secret: None,
            template: None,
        };
        let job = job(&spec, &pvc);
        assert_eq!(job.metadata.name.as_deref(), Some("batch-0123456789abcdef01234567"));
        let labels = job.metadata.labels.clone().unwrap();
        assert_eq!(labels["teifleet.dev/batch"], "batch_0123456789abcdef01234567");
        assert_eq!(labels["teifleet.dev/tenant"], "team-a");
        let annotations = job.metadata.annotations.clone().unwrap();
        assert_eq!(annotations["teifleet.dev/batch-input-file"], "file-00000000000000000000000a");
        assert_eq!(annotations["teifleet.dev/batch-endpoint"], "/v1/embeddings");
        assert_eq!(annotations["teifleet.dev/batch-completion-window"], "24h");
        assert_eq!(annotations["teifleet.dev/batch-metadata"], r#"{"run":"nightly"}"#);
        assert_eq!(annotations["teifleet.dev/batch-requests"], "3");
        assert_eq!(job.spec.pool_ref.name, "bge");
        assert_eq!(job.spec.input.format, InputFormat::OpenaiBatch);
        assert_eq!(job.spec.input.path.as_deref(), Some("files/file-00000000000000000000000a/content"));
        let input = job.spec.input.store.pvc.as_ref().unwrap();
        assert_eq!((input.claim_name.as_str(), input.path.as_str()), ("batch", "api"));
        let output = job.spec.output.store.pvc.as_ref().unwrap();
        assert_eq!(output.path, "api/batches/batch_0123456789abcdef01234567/");
        assert_eq!((job.spec.workers, job.spec.deadline.as_deref(), job.spec.suspend), (3, Some("24h"), false));
        assert!(job.spec.api_key_secret.is_none());
        // 10 MB over 3 workers, 8 shards each: 417 KB, rounded up to whole KiB.
        assert_eq!(job.spec.shard_bytes.as_ref().map(|q| q.0.as_str()), Some("416768"));

        let s3 = JobDefaults {
            store: JobStore::S3 {
                bucket: "batches".into(),
                key: String::new(),
                endpoint: "http://seaweedfs:8333".into(),
                region: "us-east-1".into(),
                credentials_secret: "batch-s3".into(),
                allow_http: true,
            },
            workers: 2,
            api_key_secret: Some(("batch-pool-key".into(), "key".into())),
            template: Some(serde_json::from_value(json!({ "nodeSelector": { "pool": "cpu" } })).unwrap()),
        };
        let job = super::job(&spec, &s3);
        assert_eq!(job.spec.template.node_selector["pool"], "cpu", "the workers go where --job-template says");
        let secret = job.spec.api_key_secret.as_ref().unwrap();
        assert_eq!((secret.name.as_str(), secret.key.as_str()), ("batch-pool-key", "key"));
        let output = job.spec.output.store.s3.as_ref().unwrap();
        assert_eq!(
            (output.key.as_str(), output.credentials_secret.as_str(), output.allow_http),
            ("batches/batch_0123456789abcdef01234567/", "batch-s3", true)
        );
        assert_eq!(job.spec.input.store.s3.as_ref().unwrap().key, "");
    }

    #[test]
    fn a_file_is_cut_into_several_shards_a_worker_within_the_bounds() {
        assert_eq!(shard_bytes(0, 2), MIN_SHARD_BYTES);
        assert_eq!(shard_bytes(1_000_000, 2), MIN_SHARD_BYTES);
        assert_eq!(shard_bytes(10_000_000, 2), 611 << 10);
        assert_eq!(shard_bytes(200_000_000, 2), MAX_SHARD_BYTES);
        assert_eq!(shard_bytes(10_000_000, 0), shard_bytes(10_000_000, 1));
    }
}
