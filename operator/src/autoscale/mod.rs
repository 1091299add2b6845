//! The autoscaler of pools with `spec.autoscaling`, shaped like the HorizontalPodAutoscaler: the
//! load the sidecars report gives a recommendation (`recommend`), kept within the pool's bounds
//! (`policy`), stabilized over recent recommendations (`stabilize`), and stopped at what the
//! cluster's GPUs can place (`gpu`). docs/operating.md explains the choices.
//!
//! Pure: the controller hands in what it saw and the time, and applies the [`Decision`]; the
//! only state is each pool's recent history, kept in memory as the HPA keeps its own (a restart
//! starts it again from the count the pool shows, so a pool never drops before a full window).

mod explain;
mod gpu;
mod policy;
mod recommend;
mod stabilize;
mod status;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use teifleet_crds::{AutoscalingStatus, EmbeddingPool, HeldCalls, SidecarAdmission};

use self::explain::{Outcome, explain};
pub use self::gpu::Placement;
use self::gpu::RETRY_AFTER;
pub use self::policy::Policy;
use self::recommend::{Reading, Readings, Recommendation, recommend};
use self::stabilize::Recommendations;

/// How often an autoscaled pool is looked at (and its sidecars asked): often enough that a step
/// in load is met within a reading or two, rarely enough that asking the sidecars costs nothing.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// The reason of the Warning when GPUs hold the pool below what it needs.
pub const SCALING_LIMITED: &str = "ScalingLimited";

/// A pool not looked at for this long is forgotten (it was deleted).
const FORGET_AFTER: Duration = Duration::from_secs(60 * 60);

/// What the controller saw of a pool.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    /// The replicas the pool runs as last recorded: `status.autoscaling.desiredReplicas`, or
    /// for a pool sized by hand until now the replicas it has.
    pub recorded: Option<i32>,
    /// Pods ready (not being deleted).
    pub ready: i32,
    pub placement: Placement,
    /// What the ready pods' sidecars last reported.
    pub reports: &'a [SidecarAdmission],
    /// The calls the namespace's activator holds for the pool.
    pub held: Option<&'a HeldCalls>,
    /// What `status.autoscaling` shows.
    pub previous: Option<&'a AutoscalingStatus>,
}

impl<'a> Observed<'a> {
    pub fn new(
        pool: &'a EmbeddingPool,
        pods: &[Pod],
        reports: &'a [SidecarAdmission],
        held: Option<&'a HeldCalls>,
    ) -> Self {
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let live = || pods.iter().filter(|pod| pod.metadata.deletion_timestamp.is_none());
        let placed = pods.iter().filter(|pod| pod.spec.as_ref().is_some_and(|spec| spec.node_name.is_some()));
        let resource = pool.spec.share().map(|share| share.resource());
        let stuck = crate::status::unschedulable(pods, resource.as_deref());
        let previous = pool.status.as_ref().and_then(|status| status.autoscaling.as_ref());
        Self {
            recorded: previous.map(|shown| shown.desired_replicas).or(pool.status.as_ref().map(|s| s.replicas)),
            ready: count(live().filter(|pod| crate::sidecars::is_ready(pod)).count()),
            placement: Placement {
                placed: count(placed.count()),
                gpu_short: stuck.is_some_and(|stuck| stuck.gpu_shortage.is_some()),
            },
            reports,
            held,
            previous,
        }
    }
}

/// What the autoscaler decided for a pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The replicas the pool's Deployment gets.
    pub desired: i32,
    pub status: AutoscalingStatus,
    /// The count before, when this decision changed it.
    pub scaled_from: Option<i32>,
    /// Set when GPUs began to hold the pool below what it needs: what the Warning says.
    pub gpu_warning: Option<String>,
}

impl Decision {
    /// A Normal Event for a change of count, a Warning when GPUs begin to hold the pool back
    /// (`ScalingLimited`, as the HPA says it: the pool's conditions already tell InsufficientGPU).
    pub fn events(&self) -> Vec<Event> {
        let scaled = self.scaled_from.map(|from| {
            let (reason, direction) = if self.desired > from { ("ScaledUp", "up") } else { ("ScaledDown", "down") };
            Event {
                type_: EventType::Normal,
                reason: reason.into(),
                note: Some(format!("Scaled {direction} from {from} to {}: {}", self.desired, self.status.message)),
                action: "Scale".into(),
                secondary: None,
            }
        });
        let gpu = self.gpu_warning.as_ref().map(|note| Event {
            type_: EventType::Warning,
            reason: SCALING_LIMITED.into(),
            note: Some(note.clone()),
            action: "Scale".into(),
            secondary: None,
        });
        scaled.into_iter().chain(gpu).collect()
    }
}

/// Each pool's history, by uid (a pool deleted and created again starts afresh).
#[derive(Default)]
pub struct Autoscaler(Mutex<HashMap<String, History>>);

impl Autoscaler {
    /// Decides `pool`'s replicas from what was `seen` at `now`.
    pub fn decide(&self, pool: &str, policy: &Policy, seen: &Observed<'_>, now: Timestamp) -> Decision {
        let mut pools = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        pools.retain(|_, history| now.duration_since(history.touched).as_secs_f64() < FORGET_AFTER.as_secs_f64());
        let history = pools.entry(pool.to_owned()).or_insert_with(|| History::new(now));
        history.decide(policy, seen, now)
    }

    /// Forgets a pool that is gone or no longer autoscaled.
    pub fn forget(&self, pool: &str) {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(pool);
    }
}

/// What the autoscaler remembers of one pool.
#[derive(Clone, Debug)]
struct History {
    readings: Readings,
    recommendations: Recommendations,
    ceiling: Option<gpu::Ceiling>,
    /// The replicas last decided (fresher than the pool in the controller's cache).
    desired: Option<i32>,
    last_scale: Option<Timestamp>,
    /// The `lastCallTime` last decided (the cache may not show it yet).
    last_call: Option<String>,
    /// The last message and what it said, kept while the outcome stays the same.
    explained: Option<(Outcome, String)>,
    touched: Timestamp,
}

impl History {
    fn new(now: Timestamp) -> Self {
        Self {
            readings: Readings::default(),
            recommendations: Recommendations::default(),
            ceiling: None,
            desired: None,
            last_scale: None,
            last_call: None,
            explained: None,
            touched: now,
        }
    }

    fn decide(&mut self, policy: &Policy, seen: &Observed<'_>, now: Timestamp) -> Decision {
        self.touched = now;
        let current = self.desired.or(seen.recorded).unwrap_or(policy.min);
        if let Some(reading) = Reading::of(policy, seen.reports, now) {
            self.readings.add(reading);
        }
        let recommendation = recommend(policy, current, seen, self.readings.load());
        let (bounded, limit) = policy.bound(recommendation.replicas);
        let (up, down) = (policy.scale_up_window, policy.scale_down_window);
        let stabilized = self.recommendations.stabilize(now, bounded, current, up, down);
        // The bounds hold at once, as the HPA applies them after stabilizing: a lowered
        // maxReplicas does not wait out a window of older, higher recommendations.
        let stabilized = if recommendation.skips_windows() { bounded } else { policy.bound(stabilized).0 };
        let (desired, gpu_began) = gpu::cap(&mut self.ceiling, stabilized, seen.placement, policy.min, now);

        let outcome = Outcome {
            desired,
            recommended: recommendation.replicas,
            bounded,
            stabilized,
            reason: recommendation.reason,
            limit,
            hold: Outcome::hold(bounded, stabilized, desired),
        };
        let message = self.message(policy, &recommendation, outcome, seen.previous);
        let scaled_from = (desired != current).then_some(current);
        if scaled_from.is_some() {
            self.last_scale = Some(now);
        }
        self.desired = Some(desired);
        Decision {
            desired,
            status: self.status(policy, seen, outcome, message, now),
            scaled_from,
            gpu_warning: gpu_began.then(|| {
                format!(
                    "InsufficientGPU: the autoscaler holds the pool at {desired} replica(s) of the {stabilized} it \
                     wants, as pods beyond what the cluster placed cannot be scheduled for lack of GPUs; one more \
                     is tried every {}m",
                    RETRY_AFTER.as_secs() / 60
                )
            }),
        }
    }

    /// The message for `outcome`: the one last given while the outcome stays the same (its
    /// numbers are those of the reading that decided), else a new one.
    fn message(
        &mut self,
        policy: &Policy,
        recommendation: &Recommendation,
        outcome: Outcome,
        previous: Option<&AutoscalingStatus>,
    ) -> String {
        let message = match (&self.explained, previous) {
            (Some((explained, message)), _) if *explained == outcome => message.clone(),
            // After a restart: the status shows the same decision.
            (None, Some(shown))
                if (shown.desired_replicas, shown.recommended_replicas) == (outcome.desired, outcome.recommended) =>
            {
                shown.message.clone()
            }
            _ => explain(policy, recommendation, &outcome),
        };
        self.explained = Some((outcome, message.clone()));
        message
    }

    /// `status.autoscaling` for the decision, its times kept unless what they stand for moved.
    fn status(
        &mut self,
        policy: &Policy,
        seen: &Observed<'_>,
        outcome: Outcome,
        message: String,
        now: Timestamp,
    ) -> AutoscalingStatus {
        let previous = seen.previous;
        // Only where scaleToZeroAfter counts from it: a busy pool moves it once a minute.
        let shown_call = self.last_call.take().or_else(|| previous.and_then(|shown| shown.last_call_time.clone()));
        if policy.min == 0 {
            self.last_call = status::last_call(shown_call.as_deref(), status::idle_seconds(seen), now);
        }
        AutoscalingStatus {
            desired_replicas: outcome.desired,
            recommended_replicas: outcome.recommended,
            message,
            last_scale_time: self
                .last_scale
                .map(|at| at.to_string())
                .or_else(|| previous.and_then(|shown| shown.last_scale_time.clone())),
            last_call_time: self.last_call.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
