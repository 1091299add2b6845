//! Every status, its timestamps and its files, from jobs as the operator leaves them.

use serde_json::{Value, json};
use teifleet_crds::EmbeddingJob;

use super::*;

const ID: &str = "batch_0123456789abcdef01234567";
const CREATED: i64 = 1_700_000_000;

/// A batch's job created at [`CREATED`], with `annotations` added and `status`.
fn job(annotations: Value, status: Value) -> EmbeddingJob {
    let mut all = json!({
        "teifleet.dev/batch-input-file": "file-00000000000000000000000a",
        "teifleet.dev/batch-endpoint": "/v1/embeddings",
        "teifleet.dev/batch-completion-window": "24h",
        "teifleet.dev/batch-metadata": "{\"run\":\"nightly\"}",
        "teifleet.dev/batch-requests": "100",
    });
    for (key, value) in annotations.as_object().unwrap() {
        all[key] = value.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {
            "name": "batch-0123456789abcdef01234567", "namespace": "ml",
            "creationTimestamp": "2023-11-14T22:13:20Z",
            "labels": { "teifleet.dev/batch": ID, "teifleet.dev/tenant": "team-a" },
            "annotations": all,
        },
        "spec": {
            "poolRef": { "name": "bge" },
            "input": { "store": { "pvc": { "claimName": "batch" } }, "path": "files/file-00000000000000000000000a/content", "format": "openaiBatch" },
            "output": { "store": { "pvc": { "claimName": "batch", "path": "batches/batch_0123456789abcdef01234567/" } } },
        },
        "status": status,
    }))
    .unwrap()
}

fn condition(kind: &str, status: &str, reason: &str, at: &str) -> Value {
    json!({ "type": kind, "status": status, "reason": reason, "message": format!("{reason} message"), "lastTransitionTime": at })
}

/// 2023-11-14T22:13:20Z plus `seconds`, as the API server writes times.
fn at(seconds: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(CREATED + seconds).unwrap().to_string()
}

#[test]
fn a_running_job_is_in_progress_with_its_counts_and_no_files() {
    let batch = to_batch(&job(
        json!({}),
        json!({ "rowsDone": 40, "rowsFailed": 3, "conditions": [condition("Running", "True", "WorkersRunning", &at(5))] }),
    ))
    .unwrap();
    assert_eq!(batch.status, Status::InProgress);
    assert_eq!((batch.id.as_str(), batch.object, batch.endpoint.as_str()), (ID, "batch", "/v1/embeddings"));
    assert_eq!(batch.input_file_id, "file-00000000000000000000000a");
    assert_eq!(batch.completion_window, "24h");
    assert_eq!(batch.request_counts, RequestCounts { total: 100, completed: 37, failed: 3 });
    assert_eq!(
        (batch.created_at, batch.in_progress_at, batch.expires_at),
        (CREATED, Some(CREATED), Some(CREATED + 86_400))
    );
    assert_eq!((batch.output_file_id, batch.error_file_id), (None, None), "files come once the batch is over");
    assert_eq!(batch.metadata, Some(json!({ "run": "nightly" })));
    assert!(batch.errors.is_none() && batch.completed_at.is_none() && batch.cancelling_at.is_none());

    let pending = to_batch(&job(json!({}), Value::Null)).unwrap();
    assert_eq!((pending.status, pending.request_counts.completed), (Status::InProgress, 0), "no status yet");
}

#[test]
fn a_complete_job_is_completed_with_its_files() {
    let status = json!({
        "rowsDone": 100, "rowsFailed": 4, "completionTime": at(60),
        "conditions": [condition("Running", "False", "Completed", &at(60)), condition("Complete", "True", "Completed", &at(60))],
    });
    let batch = to_batch(&job(json!({}), status)).unwrap();
    assert_eq!(batch.status, Status::Completed);
    assert_eq!((batch.completed_at, batch.finalizing_at), (Some(CREATED + 60), Some(CREATED + 60)));
    assert_eq!(batch.request_counts, RequestCounts { total: 100, completed: 96, failed: 4 });
    assert_eq!(batch.output_file_id.as_deref(), Some("batch_0123456789abcdef01234567-output"));
    assert_eq!(batch.error_file_id.as_deref(), Some("batch_0123456789abcdef01234567-errors"));

    let clean = json!({ "rowsDone": 100, "conditions": [condition("Complete", "True", "Completed", &at(9))] });
    let batch = to_batch(&job(json!({}), clean)).unwrap();
    assert_eq!((batch.completed_at, batch.error_file_id), (Some(CREATED + 9), None), "no error file without errors");
}

#[test]
fn a_failed_job_is_failed_with_its_reason_and_one_past_its_deadline_expired() {
    let failed = json!({ "rowsDone": 10, "rowsFailed": 0, "completionTime": at(30),
        "conditions": [condition("Failed", "True", "WorkersFailed", &at(30))] });
    let batch = to_batch(&job(json!({}), failed)).unwrap();
    assert_eq!((batch.status, batch.failed_at), (Status::Failed, Some(CREATED + 30)));
    assert_eq!(
        batch.errors,
        Some(
            json!({ "object": "list", "data": [{ "code": "WorkersFailed", "message": "WorkersFailed message", "param": null, "line": null }] })
        )
    );
    assert!(batch.output_file_id.is_some() && batch.error_file_id.is_none());

    let expired = json!({ "rowsDone": 10, "rowsFailed": 2,
        "conditions": [condition("Failed", "True", "DeadlineExceeded", &at(86_400))] });
    let batch = to_batch(&job(json!({}), expired)).unwrap();
    assert_eq!((batch.status, batch.expired_at, batch.failed_at), (Status::Expired, Some(CREATED + 86_400), None));
    assert!(batch.errors.is_none());
    assert!(batch.output_file_id.is_some() && batch.error_file_id.is_some(), "what was done is kept");
}

#[test]
fn a_cancel_is_cancelling_while_workers_run_then_cancelled() {
    let cancel = json!({ "teifleet.dev/batch-cancelling-at": (CREATED + 20).to_string() });
    let running = json!({ "rowsDone": 10, "conditions": [condition("Running", "True", "WorkersRunning", &at(5))] });
    let batch = to_batch(&job(cancel.clone(), running)).unwrap();
    assert_eq!((batch.status, batch.cancelling_at, batch.cancelled_at), (Status::Cancelling, Some(CREATED + 20), None));
    assert_eq!(batch.output_file_id, None);

    let stopped =
        json!({ "rowsDone": 10, "rowsFailed": 1, "conditions": [condition("Running", "False", "Suspended", &at(25))] });
    let batch = to_batch(&job(cancel.clone(), stopped)).unwrap();
    assert_eq!((batch.status, batch.cancelled_at), (Status::Cancelled, Some(CREATED + 25)));
    assert_eq!(batch.request_counts, RequestCounts { total: 100, completed: 9, failed: 1 });
    assert!(batch.output_file_id.is_some() && batch.error_file_id.is_some(), "partial results are downloadable");

    // Finished before the cancel took: it stays completed.
    let done = json!({ "rowsDone": 100, "conditions": [condition("Complete", "True", "Completed", &at(21))] });
    assert_eq!(to_batch(&job(cancel, done)).unwrap().status, Status::Completed);
}

#[test]
fn a_job_that_is_no_batch_maps_to_nothing() {
    let mut plain = job(json!({}), Value::Null);
    plain.metadata.labels = None;
    assert!(to_batch(&plain).is_none());
    let mut forged = job(json!({}), Value::Null);
    forged.metadata.labels.as_mut().unwrap().insert("teifleet.dev/batch".into(), "batch_../x".into());
    assert!(to_batch(&forged).is_none());
}

#[test]
fn the_object_has_every_field_openai_does() {
    let value = serde_json::to_value(to_batch(&job(json!({}), Value::Null)).unwrap()).unwrap();
    let mut keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "cancelled_at",
            "cancelling_at",
            "completed_at",
            "completion_window",
            "created_at",
            "endpoint",
            "error_file_id",
            "errors",
            "expired_at",
            "expires_at",
            "failed_at",
            "finalizing_at",
            "id",
            "in_progress_at",
            "input_file_id",
            "metadata",
            "object",
            "output_file_id",
            "request_counts",
            "status"
        ]
    );
    assert_eq!(value["status"], "in_progress");
    assert_eq!(value["request_counts"], json!({ "total": 100, "completed": 0, "failed": 0 }));
}
