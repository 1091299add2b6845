//! Pure: an EmbeddingJob's status from what the operator saw: its batch Job's status, the
//! workers' progress ConfigMap, and what keeps it from starting.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use teifleet_crds::conditions::{self, Observed};
use teifleet_crds::job::job_conditions::{COMPLETE, FAILED, RUNNING, reasons};
use teifleet_crds::job::{PROGRESS_PLAN_KEY, PROGRESS_SHARD_PREFIX, ProgressPlan, ShardProgress};
use teifleet_crds::{EmbeddingJob, EmbeddingJobStatus, EmbeddingPool};

/// Why a job cannot run: a condition reason and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    pub reason: &'static str,
    pub message: String,
}

/// What the operator saw of one EmbeddingJob.
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    /// What keeps the job from running (its pool missing, its input claim missing).
    pub blocker: Option<&'a Blocker>,
    /// The batch Job, once created.
    pub job: Option<&'a Job>,
    /// The progress ConfigMap's data, once a worker wrote any.
    pub progress: Option<&'a BTreeMap<String, String>>,
    /// What failed worker pods said (`worker 3: ...`), quoted when the job fails: each already
    /// sanitized and bounded (`super::worker_message`), at most four.
    pub worker_messages: &'a [String],
    pub now: Timestamp,
}

/// Whether the pool can serve this job's workers: they call its Service in plain text, with the
/// job's API key when the pool asks for keys.
pub fn pool_blocker(job: &EmbeddingJob, pool: Option<&EmbeddingPool>) -> Option<Blocker> {
    let name = &job.spec.pool_ref.name;
    let Some(pool) = pool else {
        return Some(Blocker {
            reason: reasons::POOL_NOT_FOUND,
            message: format!("EmbeddingPool {name} does not exist in this namespace; the job starts once it does"),
        });
    };
    if pool.spec.tls.is_some() {
        return Some(Blocker {
            reason: reasons::POOL_USES_TLS,
            message: format!("EmbeddingPool {name} serves TLS (spec.tls), which teifleet-job does not call yet"),
        });
    }
    if pool.spec.auth.is_some() && job.spec.api_key_secret.is_none() {
        return Some(Blocker {
            reason: reasons::API_KEY_REQUIRED,
            message: format!(
                "EmbeddingPool {name} takes calls with an API key only (spec.auth): create the job again with spec.apiKeySecret"
            ),
        });
    }
    None
}

/// The job's PersistentVolumeClaims that do not exist (`missing` says which of input and output).
pub fn claims_blocker(job: &EmbeddingJob, input_missing: bool, output_missing: bool) -> Option<Blocker> {
    let claim =
        |store: &teifleet_crds::StoreSpec| store.pvc.as_ref().map(|pvc| pvc.claim_name.clone()).unwrap_or_default();
    if input_missing {
        return Some(Blocker {
            reason: reasons::INPUT_UNREADABLE,
            message: format!("the input's PersistentVolumeClaim {} does not exist", claim(&job.spec.input.store)),
        });
    }
    output_missing.then(|| Blocker {
        reason: reasons::OUTPUT_UNWRITABLE,
        message: format!("the output's PersistentVolumeClaim {} does not exist", claim(&job.spec.output.store)),
    })
}

/// What the workers reported in the progress ConfigMap.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Progress {
    pub plan: Option<ProgressPlan>,
    pub shards_done: u64,
    pub rows: u64,
    pub failed: u64,
    pub bytes: u64,
}

impl Progress {
    /// Reads the plan and every finished shard; a value that does not parse (a worker of another
    /// release, an edit by hand) is left out rather than failing the status.
    pub fn read(data: &BTreeMap<String, String>) -> Self {
        let plan = data.get(PROGRESS_PLAN_KEY).and_then(|plan| serde_json::from_str(plan).ok());
        let mut progress = Self { plan, ..Self::default() };
        let shards = data
            .iter()
            .filter(|(key, _)| key.starts_with(PROGRESS_SHARD_PREFIX))
            .filter_map(|(_, value)| serde_json::from_str::<ShardProgress>(value).ok());
        for shard in shards {
            progress.shards_done += 1;
            progress.rows = progress.rows.saturating_add(shard.rows);
            progress.failed = progress.failed.saturating_add(shard.failed);
            progress.bytes = progress.bytes.saturating_add(shard.bytes);
        }
        progress
    }

    /// How much of the input is done, from the rows when the plan counted them, else the bytes.
    fn fraction_done(&self) -> Option<f64> {
        let plan = self.plan?;
        let (done, total) = match plan.rows {
            Some(rows) => (self.rows, rows),
            None => (self.bytes, plan.bytes),
        };
        (total > 0).then(|| (done as f64 / total as f64).min(1.0))
    }

    /// Rows in the input, and whether that is an estimate: the plan's count; the rows read once
    /// every planned shard is reported; else the rows per byte so far times the input's bytes.
    fn rows_total(&self, all_done: bool) -> Option<(u64, bool)> {
        let plan = self.plan?;
        if let Some(rows) = plan.rows {
            return Some((rows, false));
        }
        if all_done {
            return Some((self.rows, false));
        }
        (self.bytes > 0).then(|| {
            let estimate = self.rows as f64 * plan.bytes as f64 / self.bytes as f64;
            (estimate.round() as u64, true)
        })
    }

    fn all_shards_done(&self) -> bool {
        self.plan.is_some_and(|plan| self.shards_done >= u64::from(plan.shards))
    }
}

/// Where the job is.
#[derive(Clone, Debug, PartialEq)]
enum Phase {
    Complete,
    Failed {
        reason: &'static str,
        message: String,
    },
    Blocked(Blocker),
    /// Suspended, some worker pods still stopping (`pods` of them).
    Stopping {
        pods: i32,
    },
    Suspended,
    Pending,
    Running,
}

fn condition<'a>(status: &'a JobStatus, type_: &str) -> Option<&'a JobCondition> {
    status.conditions.as_deref()?.iter().find(|c| c.type_ == type_ && c.status == "True")
}

/// The EmbeddingJob's reason for a failed Job's.
fn failure_reason(job_reason: Option<&str>) -> &'static str {
    match job_reason {
        Some("DeadlineExceeded") => reasons::DEADLINE_EXCEEDED,
        Some("BackoffLimitExceeded" | "FailedIndexes" | "MaxFailedIndexesExceeded" | "PodFailurePolicy") => {
            reasons::WORKERS_FAILED
        }
        _ => reasons::JOB_FAILED,
    }
}

fn phase(job: &EmbeddingJob, seen: &Seen<'_>) -> Phase {
    let status = seen.job.and_then(|job| job.status.as_ref());
    if let Some(status) = status {
        if condition(status, "Complete").or_else(|| condition(status, "SuccessCriteriaMet")).is_some() {
            return Phase::Complete;
        }
        if let Some(failed) = condition(status, "Failed").or_else(|| condition(status, "FailureTarget")) {
            let mut message = failed.message.clone().unwrap_or_default();
            if let Some(indexes) = status.failed_indexes.as_deref().filter(|indexes| !indexes.is_empty()) {
                message = format!("{message} (failed workers: {indexes})");
            }
            for worker in seen.worker_messages {
                message = format!("{message}; {worker}");
            }
            return Phase::Failed { reason: failure_reason(failed.reason.as_deref()), message: message.trim().into() };
        }
    }
    if let Some(blocker) = seen.blocker {
        return Phase::Blocked(blocker.clone());
    }
    if job.spec.suspend || status.is_some_and(|status| condition(status, "Suspended").is_some()) {
        // Suspended once no worker is left: a stopping one may still write a shard, and who
        // reads `Suspended` (a cancelled batch's final counts) must see its last.
        let pods = status.map_or(0, |s| s.active.unwrap_or(0) + s.terminating.unwrap_or(0));
        return if pods > 0 { Phase::Stopping { pods } } else { Phase::Suspended };
    }
    match status.and_then(|status| status.ready).unwrap_or_default() {
        0 => Phase::Pending,
        _ => Phase::Running,
    }
}

/// `seconds` as Go prints a duration, in whole seconds: `45s`, `2m0s`, `1h2m3s`.
pub fn format_duration(seconds: u64) -> String {
    let (hours, minutes, seconds) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, _) => format!("{minutes}m{seconds}s"),
        _ => format!("{hours}h{minutes}m{seconds}s"),
    }
}

fn clamp_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The status `job` should show: conditions merged with what it shows now (a condition keeps its
/// `lastTransitionTime` until its status flips), counts from the progress ConfigMap, the rate over
/// the time the workers ran, and the time left while they run.
pub fn compute(job: &EmbeddingJob, seen: &Seen<'_>) -> EmbeddingJobStatus {
    let phase = phase(job, seen);
    let batch = seen.job.and_then(|job| job.status.as_ref());
    let progress = seen.progress.map(Progress::read).unwrap_or_default();
    let workers = job.spec.workers;
    let shards = |progress: &Progress| match progress.plan {
        Some(plan) => format!("{}/{} shards done", progress.shards_done, plan.shards),
        None => "no shard planned yet".to_owned(),
    };

    let (running, reason, message) = match &phase {
        Phase::Complete => (
            false,
            reasons::COMPLETED,
            format!("{} rows written, {} of them with an error", progress.rows, progress.failed),
        ),
        Phase::Failed { reason, message } => (false, *reason, message.clone()),
        Phase::Blocked(blocker) => (false, blocker.reason, blocker.message.clone()),
        Phase::Stopping { pods } => (
            true,
            reasons::WORKERS_STOPPING,
            format!("spec.suspend: {pods} worker pod(s) stopping; {}", shards(&progress)),
        ),
        Phase::Suspended => (false, reasons::SUSPENDED, format!("spec.suspend: no worker runs; {}", shards(&progress))),
        Phase::Pending => (true, reasons::WORKERS_PENDING, format!("waiting for the {workers} worker pod(s) to start")),
        Phase::Running => {
            let ready = batch.and_then(|status| status.ready).unwrap_or_default();
            (true, reasons::WORKERS_RUNNING, format!("{ready} of {workers} worker(s) running; {}", shards(&progress)))
        }
    };
    let complete = phase == Phase::Complete;
    let failed = matches!(phase, Phase::Failed { .. });
    let observed = vec![
        Observed::new(RUNNING, running, reason, message.clone()),
        Observed::new(COMPLETE, complete, reason, if complete { message.clone() } else { String::new() }),
        Observed::new(FAILED, failed, reason, if failed { message } else { String::new() }),
    ];
    let previous = job.status.as_ref().map(|status| status.conditions.as_slice()).unwrap_or_default();
    let generation = job.metadata.generation;
    let now = Time(seen.now);

    let start_time = batch.and_then(|status| status.start_time.clone());
    let completion_time = match &phase {
        Phase::Complete => batch.and_then(|status| {
            status
                .completion_time
                .clone()
                .or_else(|| condition(status, "SuccessCriteriaMet").and_then(|c| c.last_transition_time.clone()))
        }),
        Phase::Failed { .. } => batch.and_then(|status| {
            condition(status, "Failed")
                .or_else(|| condition(status, "FailureTarget"))
                .and_then(|c| c.last_transition_time.clone())
        }),
        _ => None,
    };
    // The rate over the time the workers ran: until now while they run, over the whole run once
    // it ended; nothing while suspended or blocked (the clock stopped with the workers).
    let end = match &phase {
        Phase::Pending | Phase::Running => Some(seen.now),
        Phase::Complete | Phase::Failed { .. } => completion_time.as_ref().map(|time| time.0),
        Phase::Blocked(_) | Phase::Stopping { .. } | Phase::Suspended => None,
    };
    let elapsed = start_time.as_ref().zip(end).map(|(start, end)| end.as_second() - start.0.as_second());
    let rows_per_second = elapsed
        .filter(|elapsed| *elapsed > 0 && progress.rows > 0)
        .map(|elapsed| (progress.rows as f64 / elapsed as f64 * 10.0).round() / 10.0);
    let eta = match (&phase, elapsed, progress.fraction_done()) {
        (Phase::Pending | Phase::Running, Some(elapsed), Some(done)) if elapsed > 0 && done > 0.0 => {
            let left = elapsed as f64 * (1.0 - done) / done;
            Some(format_duration(left.round() as u64))
        }
        _ => None,
    };
    let rows_total = progress.rows_total(progress.all_shards_done());

    EmbeddingJobStatus {
        observed_generation: generation,
        conditions: conditions::merge(previous, observed, generation, &now),
        shards_total: progress.plan.map(|plan| i64::from(plan.shards)),
        shards_done: clamp_i64(progress.shards_done),
        rows_done: clamp_i64(progress.rows),
        rows_failed: clamp_i64(progress.failed),
        rows_total: rows_total.map(|(rows, _)| clamp_i64(rows)),
        rows_total_estimated: rows_total.is_some_and(|(_, estimated)| estimated),
        rows_per_second,
        eta,
        start_time,
        completion_time,
    }
}

/// Whether the batch Job failed (or will, once its pods are gone).
pub fn failed(job: &Job) -> bool {
    job.status
        .as_ref()
        .is_some_and(|status| ["Failed", "FailureTarget"].iter().any(|type_| condition(status, type_).is_some()))
}

/// Whether the batch Job has finished, one way or the other: nothing about it changes any more.
pub fn finished(job: &Job) -> bool {
    job.status.as_ref().is_some_and(|status| {
        ["Complete", "SuccessCriteriaMet", "Failed", "FailureTarget"]
            .iter()
            .any(|type_| condition(status, type_).is_some())
    })
}

/// The phases a job's status shows, as `teifleet_job_phase{phase}` names them: exactly one holds.
pub const PHASES: [&str; 6] = ["Pending", "Running", "Suspended", "Blocked", "Complete", "Failed"];

/// Which of [`PHASES`] a job's status shows: `Complete` or `Failed` when that condition holds;
/// else the `Running` condition's reason says: `Pending` (no worker pod runs yet, or no status
/// yet), `Running`, `Suspended`, or `Blocked` (a reason the job cannot start: its pool missing or
/// unusable, a claim missing, its Job name taken).
pub fn shown_phase(status: &EmbeddingJobStatus) -> &'static str {
    if conditions::is_true(&status.conditions, COMPLETE) {
        return "Complete";
    }
    if conditions::is_true(&status.conditions, FAILED) {
        return "Failed";
    }
    match conditions::find(&status.conditions, RUNNING) {
        None => "Pending",
        Some(running) if running.status == "True" => match running.reason.as_str() {
            reasons::WORKERS_PENDING => "Pending",
            _ => "Running",
        },
        Some(running) if running.reason == reasons::SUSPENDED => "Suspended",
        Some(_) => "Blocked",
    }
}
