//! EmbeddingJobs: each one becomes an Indexed `batch/v1` Job of `teifleet-job` workers, with the
//! ServiceAccount, Role and RoleBinding that let them write their progress ConfigMap, all applied
//! with server-side apply under the operator's field manager and owned by the EmbeddingJob, so
//! deleting it removes them (and the Job's pods) by garbage collection. Its status is the Job's,
//! with the workers' progress read from that ConfigMap; written only when it changed.
//!
//! The operator holds no right to read ConfigMaps: it creates the progress ConfigMap (create
//! only, as it does each pool's peer Secret) and reads it through the job's own
//! `<job>-progress-reader` Role, which names that one ConfigMap. With no cluster-wide watch of
//! ConfigMaps, progress is read by looking again every [`PROGRESS_POLL`] while the workers run.

pub mod identity;
pub mod render;
pub mod status;
#[cfg(test)]
mod tests;
pub mod worker_message;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::rbac::v1::Subject;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use teifleet_crds::conditions;
use teifleet_crds::job::job_conditions::{COMPLETE, FAILED, RUNNING, reasons};
use teifleet_crds::job::progress_config_map_name;
use teifleet_crds::{EmbeddingJob, EmbeddingJobStatus, EmbeddingPool, StoreSpec, labels};
use tokio_util::sync::CancellationToken;

use self::status::{Blocker, Seen};
use crate::admin::Health;
use crate::controller::apply;
use crate::metrics::Metrics;
use crate::{Error, Result};

/// How often a job is looked at again while it waits for a pool or a claim, which the operator
/// does not watch for it.
pub const REFRESH: Duration = Duration::from_secs(10);
/// How often a job is looked at again while its workers start or run: their progress (which the
/// operator may read but not watch), the rate and the time left move meanwhile.
pub const PROGRESS_POLL: Duration = Duration::from_secs(2);
/// Progress alone (rows, shards, rate, time left) is written at most this often per job, so a
/// job whose many workers report a shard each a few times a second writes its status once a
/// second. A trailing debounce would not do: reports that never pause would hide every one of them
/// until the job ended (kube's `Config::debounce` keeps delaying while updates come).
pub const PROGRESS_PACE: Duration = Duration::from_secs(1);
/// The pod annotation holding an Indexed Job pod's worker index.
const COMPLETION_INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
/// The label the Job controller puts on its pods.
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// Failed workers quoted in a Failed condition, at most.
const QUOTED_WORKERS: usize = 4;
/// An Event's note is at most 1 kB.
const MAX_NOTE: usize = 1000;

/// Shared state of every EmbeddingJob reconciliation.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// The worker image of jobs that name none (`--job-image`).
    pub image: String,
    /// The operator itself as an RBAC subject, which each job's progress reader Role is bound to
    /// ([`identity::whoami`]); `None`: no such Role, and progress read only where the operator
    /// may read ConfigMaps anyway.
    pub operator: Option<Subject>,
    pub status_memo: StatusMemo,
}

/// The last status written per job, and when. The controller's cache can lag behind our own status
/// write by a moment; without this, a reconcile in that window would send the same status again.
#[derive(Default)]
pub struct StatusMemo(Mutex<HashMap<String, Written>>);

#[derive(Clone)]
struct Written {
    /// `None` once the cache showed it: later outside edits are then seen.
    status: Option<EmbeddingJobStatus>,
    at: Instant,
}

/// Whether a computed status is to be written.
#[derive(Debug, PartialEq, Eq)]
pub enum Due {
    /// The job shows it, or it was just written.
    No,
    Now,
    /// Only progress moved, and the last write was less than [`PROGRESS_PACE`] ago.
    After(Duration),
}

impl StatusMemo {
    fn key(job: &EmbeddingJob) -> String {
        job.uid().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `desired` is to be written at `now`: not when the job shows it or we last wrote
    /// it; later when it differs from what was last written only in progress and that write was
    /// less than [`PROGRESS_PACE`] ago; else at once.
    pub fn due(&self, job: &EmbeddingJob, desired: &EmbeddingJobStatus, now: Instant) -> Due {
        let mut memo = self.lock();
        let key = Self::key(job);
        if job.status.as_ref() == Some(desired) {
            // The cache has caught up; forget the status so later outside edits are seen, keep
            // the time so the pace holds.
            if let Some(written) = memo.get_mut(&key) {
                written.status = None;
            }
            return Due::No;
        }
        let Some(written) = memo.get(&key) else { return Due::Now };
        if written.status.as_ref() == Some(desired) {
            return Due::No;
        }
        let shown = written.status.as_ref().or(job.status.as_ref());
        let since = now.saturating_duration_since(written.at);
        match shown.is_some_and(|shown| only_progress_differs(shown, desired)) && since < PROGRESS_PACE {
            true => Due::After(PROGRESS_PACE - since),
            false => Due::Now,
        }
    }

    pub fn written(&self, job: &EmbeddingJob, status: EmbeddingJobStatus, at: Instant) {
        self.lock().insert(Self::key(job), Written { status: Some(status), at });
    }

    pub fn forget(&self, job: &EmbeddingJob) {
        self.lock().remove(&Self::key(job));
    }
}

/// Whether `a` and `b` differ at most in what moves with every shard: the counts, the rate, the
/// time left and the conditions' messages (`Running` quotes the shards done). A condition's
/// status or reason, the times, the plan's shard count and the generation are news, written at
/// once.
fn only_progress_differs(a: &EmbeddingJobStatus, b: &EmbeddingJobStatus) -> bool {
    let without_progress = |status: &EmbeddingJobStatus| EmbeddingJobStatus {
        conditions: status.conditions.iter().map(|c| Condition { message: String::new(), ..c.clone() }).collect(),
        shards_done: 0,
        rows_done: 0,
        rows_failed: 0,
        rows_total: None,
        rows_total_estimated: false,
        rows_per_second: None,
        eta: None,
        ..status.clone()
    };
    without_progress(a) == without_progress(b)
}

/// Brings the job's children to their rendered state and reports its status. A job whose
/// namespace is being deleted is going away with it.
pub async fn reconcile(job: Arc<EmbeddingJob>, ctx: Arc<Context>) -> Result<Action> {
    match reconcile_job(job.clone(), ctx.clone()).await {
        Err(error) if error.is_namespace_terminating() => {
            // Nothing may be created there any more, so no child's removal will bring the job
            // back here once it is gone: its series go now.
            ctx.metrics.forget_job(&job.namespace().unwrap_or_default(), &job.name_any());
            Ok(Action::await_change())
        }
        outcome => outcome,
    }
}

async fn reconcile_job(job: Arc<EmbeddingJob>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let namespace = job.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let name = job.name_any();
    if job.meta().deletion_timestamp.is_some() {
        // Owner references hand the children to the garbage collector.
        ctx.status_memo.forget(&job);
        ctx.metrics.forget_job(&namespace, &name);
        return Ok(Action::await_change());
    }

    let client = &ctx.client;
    let existing = Api::<Job>::namespaced(client.clone(), &namespace).get_opt(&name).await?;
    let mut blocker = None;
    let mut batch = None;
    match existing {
        Some(other) if !owned_by(&other, &job) => {
            blocker = Some(Blocker {
                reason: reasons::JOB_NAME_TAKEN,
                message: format!(
                    "a Job named {name} exists that this EmbeddingJob does not own: delete it, or name the job otherwise"
                ),
            });
        }
        // Nothing of a finished Job changes any more, and it needs neither its pool nor its claims.
        Some(done) if status::finished(&done) => batch = Some(done),
        existing => {
            let pool =
                Api::<EmbeddingPool>::namespaced(client.clone(), &namespace).get_opt(&job.spec.pool_ref.name).await?;
            blocker = find_blocker(client, &job, &namespace, pool.as_ref()).await?;
            // A blocker keeps a Job from being created; one already running is still kept (a
            // `suspend` still reaches it).
            if existing.is_some() || blocker.is_none() {
                let model = pool.map(|pool| pool.spec.model.id);
                batch = Some(apply_children(&ctx, &job, &namespace, existing, model).await?);
            }
        }
    }

    let progress = read_progress(client, &job, &namespace).await?;
    // What the failed workers said is quoted once the Job failed.
    let worker_messages = match batch.as_ref().is_some_and(status::failed) {
        true => worker_messages(client, &namespace, &name).await?,
        false => Vec::new(),
    };
    let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now());
    let seen = Seen {
        blocker: blocker.as_ref(),
        job: batch.as_ref(),
        progress: progress.as_ref(),
        worker_messages: &worker_messages,
        now,
    };
    let desired = status::compute(&job, &seen);
    ctx.metrics.job_status(&namespace, &name, &desired);
    let due = ctx.status_memo.due(&job, &desired, Instant::now());
    if due == Due::Now {
        tracing::debug!(job = %name, %namespace, old = ?job.status, new = ?desired, "status changed");
        write_status(&ctx, &job, &namespace, &desired).await?;
        announce_changes(&ctx, &job, &desired).await;
        ctx.status_memo.written(&job, desired.clone(), Instant::now());
    }
    ctx.metrics.reconciled(started.elapsed());
    Ok(match due {
        Due::After(wait) => Action::requeue(wait),
        Due::No | Due::Now => next_look(&desired),
    })
}

/// Whether `batch` is this EmbeddingJob's own.
fn owned_by(batch: &Job, job: &EmbeddingJob) -> bool {
    owns(job, batch)
}

/// When to look again: every [`PROGRESS_POLL`] while the workers start or run, every
/// [`REFRESH`] while the job waits for something unwatched; on the next change once it finished
/// or is suspended (the watches bring that).
pub fn next_look(status: &EmbeddingJobStatus) -> Action {
    let finished = conditions::is_true(&status.conditions, COMPLETE) || conditions::is_true(&status.conditions, FAILED);
    let suspended = conditions::find(&status.conditions, RUNNING).is_some_and(|c| c.reason == reasons::SUSPENDED);
    let working = conditions::is_true(&status.conditions, RUNNING);
    match (finished || suspended, working) {
        (true, _) => Action::await_change(),
        (false, true) => Action::requeue(PROGRESS_POLL),
        (false, false) => Action::requeue(REFRESH),
    }
}

/// The workers' progress: the data of the job's progress ConfigMap, when this job owns it. One
/// the job does not own (made before the job, under its name) is not read: the status would show
/// what someone else wrote. The operator may read it only through the job's progress reader
/// Role: refused (the Role not made yet, or the operator not knowing who it is), the status shows
/// no progress until a later look.
async fn read_progress(
    client: &Client,
    job: &EmbeddingJob,
    namespace: &str,
) -> Result<Option<BTreeMap<String, String>>> {
    let name = progress_config_map_name(&job.name_any());
    match Api::<ConfigMap>::namespaced(client.clone(), namespace).get_opt(&name).await {
        Ok(config_map) => {
            Ok(config_map.filter(|config_map| owns(job, config_map)).and_then(|config_map| config_map.data))
        }
        Err(kube::Error::Api(refusal)) if refusal.code == 403 => {
            tracing::debug!(job = %job.name_any(), %namespace, error = %refusal.message, "progress not readable (yet)");
            Ok(None)
        }
        Err(error) => Err(error.into()),
    }
}

/// Whether `object` is one of `job`'s children (its controller owner reference).
fn owns(job: &EmbeddingJob, object: &impl Resource) -> bool {
    let uid = job.uid();
    object.owner_references().iter().any(|owner| owner.controller == Some(true) && Some(&owner.uid) == uid.as_ref())
}

/// What keeps a job from starting: its pool (`pool`, as read) missing or unable to serve it, its
/// claims missing.
async fn find_blocker(
    client: &Client,
    job: &EmbeddingJob,
    namespace: &str,
    pool: Option<&EmbeddingPool>,
) -> Result<Option<Blocker>> {
    if let Some(blocker) = status::pool_blocker(job, pool) {
        return Ok(Some(blocker));
    }
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let missing = async |store: &StoreSpec| -> Result<bool> {
        match &store.pvc {
            Some(pvc) => Ok(claims.get_opt(&pvc.claim_name).await?.is_none()),
            None => Ok(false),
        }
    };
    let input_missing = missing(&job.spec.input.store).await?;
    let output_missing = missing(&job.spec.output.store).await?;
    Ok(status::claims_blocker(job, input_missing, output_missing))
}

/// Applies the job's children, the Job last, and returns the Job as the API server has it. A Job's
/// pods cannot change once it exists: a Job made by an earlier operator keeps its image, and a
/// change the API server still refuses (a rendering that changed between operator releases) leaves
/// the Job as it is.
/// `pool_model` is the pool's `spec.model.id` (`None`: the pool is gone), which an `openaiBatch`
/// job's lines must name.
async fn apply_children(
    ctx: &Context,
    job: &EmbeddingJob,
    namespace: &str,
    existing: Option<Job>,
    pool_model: Option<String>,
) -> Result<Job> {
    // Only an operator's default image is carried over from a Job made by an earlier operator,
    // never the creator's own, which the CRD now refuses beside mounted claims and Secrets.
    let carried =
        existing.as_ref().and_then(render::worker_image).filter(|image| Some(*image) != job.spec.image.as_deref());
    let image = render::image_for(job, carried.unwrap_or(&ctx.image));
    let client = &ctx.client;
    // The pool's Service by its ClusterIP: workers reach it without cluster DNS (they name the
    // pool in their calls' metadata, which is what the activator of a pool at zero reads).
    let pool = &job.spec.pool_ref.name;
    let service = Api::<Service>::namespaced(client.clone(), namespace).get_opt(pool).await?;
    let cluster_ip = service.as_ref().and_then(|s| s.spec.as_ref()).and_then(|s| s.cluster_ip.as_deref());
    let mut target = render::PoolTarget::of(pool, namespace, cluster_ip, pool_model);
    // A Job keeps the addresses and the model it was made with, as it keeps its image
    // ([`render::PoolTarget::as_made`]).
    if let Some(existing) = &existing {
        target = target.as_made(existing);
    }
    let children = render::render(job, image, &target, ctx.operator.as_ref())?;
    if let Some((role, binding)) = &children.progress_reader {
        apply(client, namespace, role).await?;
        apply(client, namespace, binding).await?;
    }
    create_progress(client, namespace, &children.progress).await?;
    apply(client, namespace, &children.service_account).await?;
    apply(client, namespace, &children.role).await?;
    apply(client, namespace, &children.role_binding).await?;
    match (apply(client, namespace, &children.job).await, existing) {
        (Ok(applied), _) => Ok(applied),
        (Err(Error::Kube(kube::Error::Api(refusal))), Some(existing)) if refusal.code == 422 => {
            tracing::warn!(job = %job.name_any(), %namespace, error = %refusal.message, "the Job cannot take its new rendering; left as it is");
            Ok(existing)
        }
        (Err(error), _) => Err(error),
    }
}

/// Creates the progress ConfigMap, once: the operator may create ConfigMaps but not change one, and
/// the workers write its data. One that exists already is left as it is (and read only if this
/// job owns it, [`read_progress`]).
async fn create_progress(client: &Client, namespace: &str, progress: &ConfigMap) -> Result<()> {
    match Api::<ConfigMap>::namespaced(client.clone(), namespace).create(&PostParams::default(), progress).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(refusal)) if refusal.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// What each failed worker said ([`worker_message`]), the latest failure of each index, in
/// index order.
async fn worker_messages(client: &Client, namespace: &str, job: &str) -> Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{JOB_NAME_LABEL}={job}")))
        .await?
        .items;
    Ok(quote_failed_workers(&pods))
}

/// See [`worker_messages`]; pure, for tests.
pub fn quote_failed_workers(pods: &[Pod]) -> Vec<String> {
    let mut latest: BTreeMap<u32, (Timestamp, String)> = BTreeMap::new();
    for pod in pods {
        let Some(index) = pod.annotations().get(COMPLETION_INDEX_ANNOTATION).and_then(|index| index.parse().ok())
        else {
            continue;
        };
        let statuses = pod.status.as_ref().and_then(|status| status.container_statuses.as_deref()).unwrap_or_default();
        let worker = statuses.iter().find(|status| status.name == render::WORKER_CONTAINER);
        let Some(terminated) =
            worker.and_then(|status| status.state.as_ref()).and_then(|state| state.terminated.as_ref())
        else {
            continue;
        };
        if terminated.exit_code == 0 {
            continue;
        }
        let message = worker_message::worker_message(terminated);
        let at = terminated.finished_at.as_ref().map(|time| time.0).unwrap_or_default();
        if latest.get(&index).is_none_or(|(seen, _)| *seen <= at) {
            latest.insert(index, (at, message));
        }
    }
    latest.into_iter().take(QUOTED_WORKERS).map(|(index, (_, message))| format!("worker {index}: {message}")).collect()
}

async fn write_status(ctx: &Context, job: &EmbeddingJob, namespace: &str, status: &EmbeddingJobStatus) -> Result<()> {
    let api: Api<EmbeddingJob> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = json!({
        "apiVersion": EmbeddingJob::api_version(&()),
        "kind": EmbeddingJob::kind(&()),
        "status": status,
    });
    api.patch_status(&job.name_any(), &PatchParams::apply(labels::MANAGER).force(), &Patch::Apply(&patch)).await?;
    ctx.metrics.status_written();
    Ok(())
}

/// The Events a status change is worth: `Started` when the workers start (again), `Completed`,
/// `Failed`, and each new reason the job cannot run.
pub fn events(old: Option<&EmbeddingJobStatus>, new: &EmbeddingJobStatus) -> Vec<Event> {
    let before = |type_: &str| old.and_then(|old| conditions::find(&old.conditions, type_));
    let became_true =
        |type_: &str| conditions::is_true(&new.conditions, type_) && before(type_).is_none_or(|c| c.status != "True");
    let note = |message: &str| {
        let mut end = message.len().min(MAX_NOTE);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        Some(message[..end].to_owned())
    };
    let event = |type_, reason: &str, message: &str| Event {
        type_,
        reason: reason.into(),
        note: note(message),
        action: "Reconcile".into(),
        secondary: None,
    };
    let Some(running) = conditions::find(&new.conditions, RUNNING) else { return Vec::new() };
    let mut events = Vec::new();
    if became_true(RUNNING) {
        events.push(event(EventType::Normal, "Started", &running.message));
    }
    if became_true(COMPLETE) {
        let complete = conditions::find(&new.conditions, COMPLETE).map(|c| c.message.as_str()).unwrap_or_default();
        events.push(event(EventType::Normal, "Completed", complete));
    }
    if became_true(FAILED) {
        let failed = conditions::find(&new.conditions, FAILED).map(|c| format!("{}: {}", c.reason, c.message));
        events.push(event(EventType::Warning, "Failed", &failed.unwrap_or_default()));
    }
    let blocked = [
        reasons::POOL_NOT_FOUND,
        reasons::POOL_USES_TLS,
        reasons::API_KEY_REQUIRED,
        reasons::JOB_NAME_TAKEN,
        reasons::INPUT_UNREADABLE,
        reasons::OUTPUT_UNWRITABLE,
    ];
    let reason_is_new = before(RUNNING).is_none_or(|c| c.reason != running.reason);
    if reason_is_new && blocked.contains(&running.reason.as_str()) {
        events.push(event(EventType::Warning, &running.reason, &running.message));
    }
    if reason_is_new && running.reason == reasons::SUSPENDED {
        events.push(event(EventType::Normal, "Suspended", &running.message));
    }
    events
}

async fn announce_changes(ctx: &Context, job: &EmbeddingJob, new: &EmbeddingJobStatus) {
    let reference = job.object_ref(&());
    for event in events(job.status.as_ref(), new) {
        match ctx.recorder.publish(&event, &reference).await {
            Ok(()) => {}
            Err(error) if crate::namespace_terminating(&error) => {
                tracing::debug!(%error, reason = %event.reason, "no event: the namespace is being deleted")
            }
            Err(error) => tracing::warn!(%error, reason = %event.reason, "publishing an event failed"),
        }
    }
}

/// Failed reconciliations are counted and retried with a short delay.
pub fn error_policy(job: Arc<EmbeddingJob>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(job = %job.name_any(), namespace = job.namespace().unwrap_or_default(), %error, "reconcile failed");
    ctx.metrics.failed(error);
    Action::requeue(Duration::from_secs(5))
}

fn managed() -> watcher::Config {
    watcher::Config::default().labels(&format!("{}={}", labels::MANAGED_BY_LABEL, labels::MANAGER))
}

/// Whether the API server serves EmbeddingJobs to this operator. A cluster without the CRD (one
/// upgraded without applying it first) keeps its pools served: the job controller stays off.
pub async fn served(client: &Client) -> bool {
    match Api::<EmbeddingJob>::all(client.clone()).list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            tracing::warn!(
                "the EmbeddingJob CRD is not installed: EmbeddingJobs are not reconciled until it is applied (crds/teifleet.dev_embeddingjobs.yaml) and the operator restarted"
            );
            false
        }
        Err(kube::Error::Api(status)) if status.code == 403 => {
            tracing::warn!(error = %status.message, "the operator may not list EmbeddingJobs: EmbeddingJobs are not reconciled (the chart's ClusterRole grants it)");
            false
        }
        // Anything else is the API server's moment: the controller's watches retry.
        Err(_) => true,
    }
}

/// Runs the EmbeddingJob controller until `shutdown` fires, reporting watch failures to `health`;
/// returns at once where EmbeddingJobs are not served ([`served`]).
pub async fn run(ctx: Arc<Context>, health: Arc<Health>, shutdown: CancellationToken) {
    let client = ctx.client.clone();
    if !served(&client).await {
        return;
    }
    let metrics = ctx.metrics.clone();
    tracing::info!("EmbeddingJob controller running");
    Controller::new(Api::<EmbeddingJob>::all(client.clone()), watcher::Config::default().any_semantic())
        .owns(Api::<Job>::all(client), managed())
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            match result {
                Ok(_) => health.watches.success(),
                Err(controller::Error::QueueError(error)) => {
                    tracing::warn!(%error, "EmbeddingJob watch failed");
                    health.watches.error(Instant::now());
                }
                // A job without finalizers is gone before any reconcile sees it deleted; this is
                // where the controller next hears of it (its children's removal, or its requeue).
                Err(controller::Error::ObjectNotFound(job)) => {
                    metrics.forget_job(job.namespace.as_deref().unwrap_or_default(), &job.name);
                }
                Err(error) => tracing::debug!(%error, "EmbeddingJob controller event"),
            }
            futures::future::ready(())
        })
        .await;
}
