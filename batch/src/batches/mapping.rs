//! The pure mapping from a batch's EmbeddingJob to OpenAI's Batch object. The status follows the
//! job: running is `in_progress`; `Complete` is `completed`; `Failed` for `DeadlineExceeded` is
//! `expired` (the completion window is the job's deadline), any other `Failed` is `failed`; a
//! cancel (the cancelling annotation, with `spec.suspend`) is `cancelling` while workers still
//! run, and `cancelled` once none does (`Running` False for `Suspended`). The counts are the
//! job's rows: `completed` those with an answer, `failed` those with an error.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::Serialize;
use serde_json::{Value, json};
use teifleet_crds::EmbeddingJob;
use teifleet_crds::job::job_conditions::{COMPLETE, FAILED, RUNNING, reasons};

use super::COMPLETION_WINDOW_SECONDS;
use crate::cluster::{
    BATCH_LABEL, CANCELLING_AT_ANNOTATION, COMPLETION_WINDOW_ANNOTATION, ENDPOINT_ANNOTATION, INPUT_FILE_ANNOTATION,
    METADATA_ANNOTATION, REQUESTS_ANNOTATION,
};
use crate::ids::BatchId;

/// OpenAI's Batch object.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Batch {
    pub id: String,
    pub object: &'static str,
    pub endpoint: String,
    pub errors: Option<Value>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: Status,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub request_counts: RequestCounts,
    pub metadata: Option<Value>,
}

/// A batch's status, as OpenAI spells it (`validating` never shows: a batch is checked before
/// its job exists).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    InProgress,
    Completed,
    Failed,
    Expired,
    Cancelling,
    Cancelled,
}

impl Status {
    /// Whether the batch will change no more.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Expired | Self::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Cancelling => "cancelling",
            Self::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub struct RequestCounts {
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
}

/// The job's batch; none if the job is not a batch's (no batch label of a batch id's shape).
pub fn to_batch(job: &EmbeddingJob) -> Option<Batch> {
    let labels = job.metadata.labels.as_ref()?;
    let id = BatchId::parse(labels.get(BATCH_LABEL)?)?;
    let annotation = |key: &str| job.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str);
    let status = job.status.clone().unwrap_or_default();
    let condition = |kind: &str| status.conditions.iter().find(|c| c.type_ == kind);
    let holds = |kind: &str| condition(kind).filter(|c| c.status == "True");

    let created_at = job.metadata.creation_timestamp.as_ref().map_or(0, seconds);
    let ended_at =
        |c: &Condition| status.completion_time.as_ref().map_or_else(|| seconds(&c.last_transition_time), seconds);
    let cancelling_at = annotation(CANCELLING_AT_ANNOTATION).and_then(|at| at.parse::<i64>().ok());

    let mut batch = Batch {
        id: id.as_str().to_owned(),
        object: "batch",
        endpoint: annotation(ENDPOINT_ANNOTATION).unwrap_or(super::ENDPOINT).to_owned(),
        errors: None,
        input_file_id: annotation(INPUT_FILE_ANNOTATION).unwrap_or_default().to_owned(),
        completion_window: annotation(COMPLETION_WINDOW_ANNOTATION).unwrap_or(super::COMPLETION_WINDOW).to_owned(),
        status: Status::InProgress,
        output_file_id: None,
        error_file_id: None,
        created_at,
        // Checked before the job was made: work starts when it is created.
        in_progress_at: Some(created_at),
        expires_at: Some(created_at + COMPLETION_WINDOW_SECONDS),
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at,
        cancelled_at: None,
        request_counts: RequestCounts {
            total: annotation(REQUESTS_ANNOTATION).and_then(|n| n.parse().ok()).unwrap_or_default(),
            completed: (status.rows_done - status.rows_failed).max(0),
            failed: status.rows_failed.max(0),
        },
        metadata: annotation(METADATA_ANNOTATION).and_then(|m| serde_json::from_str(m).ok()),
    };

    if let Some(complete) = holds(COMPLETE) {
        let at = ended_at(complete);
        batch.status = Status::Completed;
        (batch.finalizing_at, batch.completed_at) = (Some(at), Some(at));
    } else if let Some(failed) = holds(FAILED) {
        let at = ended_at(failed);
        if failed.reason == reasons::DEADLINE_EXCEEDED {
            batch.status = Status::Expired;
            batch.expired_at = Some(at);
        } else {
            batch.status = Status::Failed;
            batch.failed_at = Some(at);
            batch.errors = Some(json!({
                "object": "list",
                "data": [{ "code": failed.reason, "message": failed.message, "param": null, "line": null }],
            }));
        }
    } else if cancelling_at.is_some() {
        match condition(RUNNING).filter(|c| c.status == "False" && c.reason == reasons::SUSPENDED) {
            Some(stopped) => {
                batch.status = Status::Cancelled;
                batch.cancelled_at =
                    Some(seconds(&stopped.last_transition_time).max(cancelling_at.unwrap_or_default()));
            }
            None => batch.status = Status::Cancelling,
        }
    }

    if batch.status.is_terminal() {
        batch.output_file_id = Some(id.output_file_id());
        if batch.request_counts.failed > 0 {
            batch.error_file_id = Some(id.errors_file_id());
        }
    }
    Some(batch)
}

fn seconds(time: &Time) -> i64 {
    time.0.as_second()
}

#[cfg(test)]
mod tests;
