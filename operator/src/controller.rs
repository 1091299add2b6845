//! The reconcile loop: apply every child with server-side apply, then write status only if it
//! changed, with an Event for each meaningful change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use teifleet_crds::conditions::{self, DEGRADED, READY, TLS_READY};
use teifleet_crds::{EmbeddingPool, EmbeddingPoolStatus, SidecarAdmission, labels};
use tokio_util::sync::CancellationToken;

use crate::admin::Health;
use crate::autoscale::{self, Autoscaler, Decision};
use crate::metrics::Metrics;
use crate::peer_secret::{self, PeerSecrets};
use crate::render::{self, RenderConfig};
use crate::{Error, Result, activator, sidecars, status};

/// Shared state of every reconciliation.
pub struct Context {
    pub client: Client,
    pub render: RenderConfig,
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// How often a steady pool is looked at again even without a watch event.
    pub resync: Duration,
    pub status_memo: StatusMemo,
    /// What each pool's sidecars last reported (their limits and demand), asked in the background.
    pub reports: Arc<sidecars::Reports>,
    /// The recent history of each pool with `spec.autoscaling`.
    pub autoscaler: Autoscaler,
    /// Which pools' peer Secrets are known to exist (the operator cannot watch Secrets).
    pub peer_secrets: PeerSecrets,
}

/// The last status written per pool. The controller's cache can lag behind our own status write
/// by a moment; without this, a reconcile in that window would send the same status again.
#[derive(Default)]
pub struct StatusMemo(Mutex<HashMap<String, EmbeddingPoolStatus>>);

impl StatusMemo {
    fn key(pool: &EmbeddingPool) -> String {
        pool.uid().unwrap_or_default()
    }

    /// Whether `desired` differs from what the pool shows and from what we last wrote.
    fn needs_write(&self, pool: &EmbeddingPool, desired: &EmbeddingPoolStatus) -> bool {
        let mut memo = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if pool.status.as_ref() == Some(desired) {
            // The cache has caught up; forget the memo so later outside edits are seen.
            memo.remove(&Self::key(pool));
            return false;
        }
        memo.get(&Self::key(pool)).is_none_or(|written| !same_but_for_transition_times(written, desired))
    }

    fn written(&self, pool: &EmbeddingPool, status: EmbeddingPoolStatus) {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(Self::key(pool), status);
    }
}

/// Whether two statuses differ at most in their conditions' `lastTransitionTime`. A reconcile in
/// the window where the cache lags computes its conditions from the status before our write, so a
/// condition that changed there gets a new transition time, a second later at most; what we wrote
/// already says the same with the first one.
fn same_but_for_transition_times(a: &EmbeddingPoolStatus, b: &EmbeddingPoolStatus) -> bool {
    let timeless = |status: &EmbeddingPoolStatus| {
        let mut status = status.clone();
        for condition in &mut status.conditions {
            condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        status
    };
    a.conditions.len() == b.conditions.len() && timeless(a) == timeless(b)
}

fn apply_params() -> PatchParams {
    PatchParams::apply(labels::MANAGER).force()
}

/// Server-side applies `object` under the operator's single field manager.
pub(crate) async fn apply<K>(client: &Client, namespace: &str, object: &K) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let name = object.meta().name.clone().ok_or(Error::MissingField("metadata.name"))?;
    Ok(api.patch(&name, &apply_params(), &Patch::Apply(object)).await?)
}

/// Deletes an object the pool no longer needs; one that is already gone is fine.
pub(crate) async fn delete_if_present<K>(client: &Client, namespace: &str, name: &str) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Brings the pool's children to their rendered state and reports status. A pool whose
/// namespace is being deleted is going away with it: the API server's refusal to create
/// anything there is not a failure.
pub async fn reconcile(pool: Arc<EmbeddingPool>, ctx: Arc<Context>) -> Result<Action> {
    match reconcile_pool(pool, ctx).await {
        Err(error) if error.is_namespace_terminating() => Ok(Action::await_change()),
        outcome => outcome,
    }
}

async fn reconcile_pool(pool: Arc<EmbeddingPool>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let namespace = pool.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let name = pool.name_any();
    let key = format!("{namespace}/{name}");
    if pool.meta().deletion_timestamp.is_some() {
        // Owner references hand the children to the garbage collector.
        ctx.metrics.forget_pool(&namespace, &name);
        ctx.reports.forget(&key);
        ctx.autoscaler.forget(&pool.uid().unwrap_or_default());
        ctx.peer_secrets.forget(&pool.uid().unwrap_or_default());
        return Ok(Action::await_change());
    }

    let client = &ctx.client;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pods = pods.list(&ListParams::default().labels(&labels::pool_selector(&name))).await?.items;
    let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now());
    // What the previous ask brought; the next one starts once the Deployment, whose pods alone
    // are asked, is applied.
    let reports = ctx.reports.latest(&key);
    // Only a pool that may scale to zero has the namespace's activator holding its calls.
    let activator_pods = match render::activator::scales_to_zero(&pool) {
        true => {
            Api::<Pod>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default().labels(&labels::activator_selector()))
                .await?
                .items
        }
        false => Vec::new(),
    };
    let scaling = autoscale(&ctx, &pool, &namespace, &pods, &reports, now).await?;

    let children = render::render(&pool, &ctx.render, scaling.as_ref().map(|decision| decision.desired))?;
    apply(client, &namespace, &children.service_account).await?;
    apply(client, &namespace, &children.role).await?;
    apply(client, &namespace, &children.role_binding).await?;
    // Before the Deployment, so the sidecars find their key when they start.
    peer_secret::ensure(client, &ctx.peer_secrets, &pool, &namespace).await?;
    apply(client, &namespace, &children.service).await?;
    apply(client, &namespace, &children.peers_service).await?;
    // Before the Deployment, so a new pool's pods never run without their isolation.
    match &children.network_policy {
        Some(policy) => drop(apply(client, &namespace, policy).await?),
        None => delete_if_present::<NetworkPolicy>(client, &namespace, &name).await?,
    }
    let deployment = apply(client, &namespace, &children.deployment).await?;
    ask_sidecars(&ctx, &key, &namespace, &name, &deployment, &pods).await?;
    activator::reconcile(&ctx, &pool, &namespace, &deployment, &activator_pods).await?;
    match &children.pdb {
        Some(pdb) => drop(apply(client, &namespace, pdb).await?),
        None => delete_if_present::<PodDisruptionBudget>(client, &namespace, &name).await?,
    }

    let mut desired = status::compute(&pool, Some(&deployment), &pods, &reports, &Time(now));
    let autoscaled = scaling.is_some();
    desired.autoscaling = scaling.map(|decision| decision.status);
    ctx.metrics.pool_demand(&namespace, &name, desired.demand.as_ref());
    ctx.metrics.pool_autoscaling(&namespace, &name, desired.autoscaling.as_ref());
    if ctx.status_memo.needs_write(&pool, &desired) {
        tracing::debug!(pool = %name, %namespace, old = ?pool.status, new = ?desired, "status changed");
        write_status(&ctx, &pool, &namespace, &desired).await?;
        announce_changes(&ctx, &pool, &desired).await;
        ctx.status_memo.written(&pool, desired);
    }

    ctx.metrics.reconciled(started.elapsed());
    // A pool's demand (and an adaptive pool's limits) move without any object changing: look
    // again sooner than the resync, and an autoscaled pool sooner still.
    let again = if autoscaled { autoscale::INTERVAL } else { sidecars::REFRESH };
    Ok(Action::requeue(ctx.resync.min(again)))
}

/// Starts asking the sidecars of `pods` that the pool's own `deployment` runs for their reports.
async fn ask_sidecars(
    ctx: &Arc<Context>,
    key: &str,
    namespace: &str,
    pool: &str,
    deployment: &Deployment,
    pods: &[Pod],
) -> Result<()> {
    let Some(uid) = deployment.metadata.uid.as_deref() else { return Ok(()) };
    let replica_sets = Api::<ReplicaSet>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default().labels(&labels::pool_selector(pool)))
        .await?
        .items;
    ctx.reports.ask(key, &sidecars::run_by(pods, &replica_sets, uid));
    Ok(())
}

/// The autoscaler's decision for a pool with `spec.autoscaling`, its Events published; `None`
/// for a pool sized by hand.
async fn autoscale(
    ctx: &Context,
    pool: &EmbeddingPool,
    namespace: &str,
    pods: &[Pod],
    reports: &[SidecarAdmission],
    now: Timestamp,
) -> Result<Option<Decision>> {
    let uid = pool.uid().unwrap_or_default();
    let Some(policy) = autoscale::Policy::of(pool) else {
        ctx.autoscaler.forget(&uid);
        return Ok(None);
    };
    let held = match policy.min {
        0 => ctx.reports.held_calls(namespace, &pool.name_any()),
        _ => None,
    };
    let seen = autoscale::Observed::new(pool, pods, reports, held.as_ref());
    let decision = ctx.autoscaler.decide(&uid, &policy, &seen, now);
    publish(ctx, pool, decision.events()).await;
    Ok(Some(decision))
}

async fn write_status(
    ctx: &Context,
    pool: &EmbeddingPool,
    namespace: &str,
    status: &EmbeddingPoolStatus,
) -> Result<()> {
    let api: Api<EmbeddingPool> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = json!({
        "apiVersion": EmbeddingPool::api_version(&()),
        "kind": EmbeddingPool::kind(&()),
        "status": status,
    });
    api.patch_status(&pool.name_any(), &apply_params(), &Patch::Apply(&patch)).await?;
    ctx.metrics.status_written();
    Ok(())
}

/// Publishes an Event for every condition that flipped or changed reason, and for new shares.
async fn announce_changes(ctx: &Context, pool: &EmbeddingPool, new: &EmbeddingPoolStatus) {
    let old = pool.status.clone().unwrap_or_default();
    let mut events = Vec::new();
    for condition in &new.conditions {
        let before = conditions::find(&old.conditions, &condition.type_);
        if before.is_some_and(|b| b.status == condition.status && b.reason == condition.reason) {
            continue;
        }
        // Unknown is the operator not knowing yet (TLSReady before any sidecar reported), not news.
        if condition.status == "Unknown" {
            continue;
        }
        let healthy = match condition.type_.as_str() {
            READY | TLS_READY => condition.status == "True",
            DEGRADED => condition.status == "False",
            _ => true,
        };
        let starting_up = [conditions::reasons::REPLICAS_NOT_READY, conditions::reasons::ROLLING_OUT];
        if before.is_none() && (healthy && condition.type_ != READY || starting_up.contains(&condition.reason.as_str()))
        {
            continue; // A new pool starting up is not news; its first Ready=True is.
        }
        events.push(Event {
            type_: if healthy { EventType::Normal } else { EventType::Warning },
            reason: condition.reason.clone(),
            note: Some(format!("{} is {}: {}", condition.type_, condition.status, condition.message)),
            action: "Reconcile".into(),
            secondary: None,
        });
    }
    if let Some(shares) = new.admission.filter(|shares| old.admission.as_ref() != Some(shares)) {
        events.push(Event {
            type_: EventType::Normal,
            reason: "AdmissionSharesChanged".into(),
            note: Some(format!(
                "each replica now admits {} in flight and queues {} (budget split over {} replica(s))",
                shares.in_flight_per_replica, shares.queued_per_replica, shares.split_over_replicas
            )),
            action: "SplitBudget".into(),
            secondary: None,
        });
    }
    publish(ctx, pool, events).await;
}

async fn publish(ctx: &Context, pool: &EmbeddingPool, events: Vec<Event>) {
    let reference = pool.object_ref(&());
    for event in events {
        match ctx.recorder.publish(&event, &reference).await {
            Ok(()) => {}
            // The pool goes with its namespace; its news with it.
            Err(error) if crate::namespace_terminating(&error) => {
                tracing::debug!(%error, reason = %event.reason, "no event: the namespace is being deleted")
            }
            Err(error) => tracing::warn!(%error, reason = %event.reason, "publishing an event failed"),
        }
    }
}

/// Failed reconciliations are counted and retried with a short delay.
pub fn error_policy(pool: Arc<EmbeddingPool>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(pool = %pool.name_any(), namespace = pool.namespace().unwrap_or_default(), %error, "reconcile failed");
    ctx.metrics.failed(error);
    Action::requeue(Duration::from_secs(5))
}

fn managed() -> watcher::Config {
    watcher::Config::default().labels(&format!("{}={}", labels::MANAGED_BY_LABEL, labels::MANAGER))
}

/// Runs the controller until `shutdown` fires, reporting watch failures to `health`.
pub async fn run(ctx: Arc<Context>, health: Arc<Health>, shutdown: CancellationToken) {
    let client = ctx.client.clone();
    let metrics = ctx.metrics.clone();
    Controller::new(Api::<EmbeddingPool>::all(client.clone()), watcher::Config::default().any_semantic())
        .owns(Api::<Deployment>::all(client.clone()), managed())
        .owns(Api::<Service>::all(client.clone()), managed())
        .owns(Api::<PodDisruptionBudget>::all(client.clone()), managed())
        .owns(Api::<NetworkPolicy>::all(client.clone()), managed())
        .owns(Api::<ServiceAccount>::all(client.clone()), managed())
        .owns(Api::<Role>::all(client.clone()), managed())
        .owns(Api::<RoleBinding>::all(client.clone()), managed())
        // Pods are not owned directly, but their scheduling decides InsufficientGPU.
        .watches(Api::<Pod>::all(client), managed(), |pod: Pod| {
            let namespace = pod.namespace()?;
            let pool = pod.labels().get(labels::POOL_LABEL)?.clone();
            Some(ObjectRef::<EmbeddingPool>::new(&pool).within(&namespace))
        })
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            match result {
                Ok(_) => health.watches.success(),
                Err(kube::runtime::controller::Error::QueueError(error)) => {
                    tracing::warn!(%error, "watch failed");
                    health.watches.error(Instant::now());
                }
                // A pool without finalizers is gone before any reconcile sees it deleted; this is
                // where the controller next hears of it (its requeue, or its children's removal).
                Err(kube::runtime::controller::Error::ObjectNotFound(pool)) => {
                    metrics.forget_pool(pool.namespace.as_deref().unwrap_or_default(), &pool.name);
                }
                Err(error) => tracing::debug!(%error, "controller event"),
            }
            futures::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use teifleet_crds::PoolDemand;

    use super::*;

    fn pool_showing(demand: Option<PoolDemand>) -> EmbeddingPool {
        let spec = serde_json::from_value(json!({ "model": { "id": "BAAI/bge-small-en-v1.5" } })).unwrap();
        let mut pool = EmbeddingPool::new("embed", spec);
        pool.metadata.uid = Some("7d1c0f2e-0000-4000-8000-000000000001".into());
        pool.status = Some(EmbeddingPoolStatus { demand, ..EmbeddingPoolStatus::default() });
        pool
    }

    fn status_with(demand: PoolDemand) -> EmbeddingPoolStatus {
        EmbeddingPoolStatus { demand: Some(demand), ..EmbeddingPoolStatus::default() }
    }

    #[test]
    fn demand_is_written_when_it_changed_and_only_then() {
        let memo = StatusMemo::default();
        let busy =
            PoolDemand { replicas_reporting: 2, in_flight: 40, utilization_percent: 63, ..PoolDemand::default() };
        let shown = pool_showing(Some(busy));
        assert!(!memo.needs_write(&shown, &status_with(busy)), "the same demand: no write");

        let busier = PoolDemand { in_flight: 64, utilization_percent: 100, ..busy };
        assert!(memo.needs_write(&shown, &status_with(busier)));
        memo.written(&shown, status_with(busier));
        assert!(!memo.needs_write(&shown, &status_with(busier)), "written, the cache not caught up yet: no repeat");

        let unknown = EmbeddingPoolStatus::default();
        assert!(memo.needs_write(&pool_showing(Some(busy)), &unknown), "no sidecar answered: the demand goes");
    }

    #[test]
    fn a_lagging_cache_across_a_second_boundary_is_no_reason_to_write_again() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let ready = |status: &str, second: i64| EmbeddingPoolStatus {
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: status.into(),
                reason: "Reason".into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::from_second(second).unwrap()),
            }],
            ..EmbeddingPoolStatus::default()
        };
        let memo = StatusMemo::default();
        let stale = pool_showing(None);
        memo.written(&stale, ready("True", 100));
        assert!(!memo.needs_write(&stale, &ready("True", 101)), "the same condition, computed a second later");
        assert!(memo.needs_write(&stale, &ready("False", 101)), "a condition that changed is written");
    }
}
