//! What `spec.autoscaling` and `spec.concurrency` ask of the autoscaler, in the units it works in:
//! durations parsed, and the bounds the replica count is kept within.

use std::time::Duration;

use teifleet_crds::EmbeddingPool;
use teifleet_crds::duration::parse_duration;

/// A pool's autoscaling settings, ready to use.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub min: i32,
    pub max: i32,
    /// Beyond this many replicas the pool-wide budget (`maxInFlight`) is used up and another
    /// replica adds no capacity: ceil(maxInFlight / maxInFlightPerReplica).
    pub budget_bound: i32,
    /// `concurrency.maxInFlight` and `maxInFlightPerReplica`: the pool's budget, and what one
    /// replica lets in under autoscaling (its share while the pool is within the budget bound).
    pub budget: i32,
    pub share: i32,
    pub target_percent: i32,
    pub scale_up_window: Duration,
    pub scale_down_window: Duration,
    pub scale_to_zero_after: Duration,
    /// The windows as the spec spells them, for messages.
    pub spelled: Spelled,
}

/// The spec's own spelling of the durations (`5m`, not 300 s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spelled {
    pub scale_up_window: String,
    pub scale_down_window: String,
    pub scale_to_zero_after: String,
}

/// Which bound, if any, moved a recommendation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    None,
    Min,
    Max,
    Budget,
}

impl Policy {
    /// The pool's policy; `None` when the pool is sized by hand (no `spec.autoscaling`).
    pub fn of(pool: &EmbeddingPool) -> Option<Self> {
        let autoscaling = pool.spec.autoscaling.as_ref()?;
        let concurrency = &pool.spec.concurrency;
        let budget = concurrency.max_in_flight.max(1);
        // Required with autoscaling (a CEL rule); the whole budget per replica otherwise.
        let share = concurrency.max_in_flight_per_replica.unwrap_or(budget).clamp(1, budget);
        // The CEL rules admit only what parses; the defaults stand in for anything else.
        let duration = |text: &str, default: u64| parse_duration(text).unwrap_or(Duration::from_secs(default));
        Some(Self {
            min: autoscaling.min_replicas.max(0),
            max: autoscaling.max_replicas.max(1),
            budget_bound: div_ceil(budget, share),
            budget,
            share,
            target_percent: autoscaling.target_utilization_percent.clamp(1, 100),
            scale_up_window: duration(&autoscaling.scale_up_stabilization, 0),
            scale_down_window: duration(&autoscaling.scale_down_stabilization, 300),
            scale_to_zero_after: duration(&autoscaling.scale_to_zero_after, 600),
            spelled: Spelled {
                scale_up_window: autoscaling.scale_up_stabilization.clone(),
                scale_down_window: autoscaling.scale_down_stabilization.clone(),
                scale_to_zero_after: autoscaling.scale_to_zero_after.clone(),
            },
        })
    }

    /// The target as a fraction (0.7).
    pub fn target(&self) -> f64 {
        f64::from(self.target_percent) / 100.0
    }

    /// The most replicas the autoscaler asks for: `maxReplicas`, or fewer where the budget is
    /// used up before; never below `minReplicas`, which the user asked for outright.
    pub fn upper(&self) -> i32 {
        self.max.min(self.budget_bound).max(self.min)
    }

    /// `replicas` within [min, upper], and which bound moved it.
    pub fn bound(&self, replicas: i32) -> (i32, Limit) {
        let upper = self.upper();
        if replicas < self.min {
            (self.min, Limit::Min)
        } else if replicas > upper {
            (upper, if self.budget_bound < self.max { Limit::Budget } else { Limit::Max })
        } else {
            (replicas, Limit::None)
        }
    }

    /// How long recommendations are worth keeping: the longer stabilization window.
    pub fn longest_window(&self) -> Duration {
        self.scale_up_window.max(self.scale_down_window)
    }
}

fn div_ceil(value: i32, divisor: i32) -> i32 {
    // Both positive here; i64 keeps a budget near i32::MAX from wrapping.
    ((i64::from(value) + i64::from(divisor) - 1) / i64::from(divisor)) as i32
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A pool with `autoscaling` and a budget of `budget` in flight, `share` per replica.
    pub(in crate::autoscale) fn pool(budget: i32, share: i32, autoscaling: Value) -> EmbeddingPool {
        serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
            "metadata": { "name": "bge", "namespace": "ml", "uid": "00000000-0000-4000-8000-00000000a0a0" },
            "spec": {
                "model": { "id": "BAAI/bge-small-en-v1.5" },
                "concurrency": { "maxInFlight": budget, "maxInFlightPerReplica": share },
                "autoscaling": autoscaling,
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_spec_becomes_a_policy_with_its_defaults() {
        let policy = Policy::of(&pool(64, 16, json!({ "maxReplicas": 8 }))).unwrap();
        assert_eq!((policy.min, policy.max, policy.target_percent, policy.budget_bound), (1, 8, 70, 4));
        assert_eq!(policy.scale_up_window, Duration::ZERO);
        assert_eq!(policy.scale_down_window, Duration::from_secs(300));
        assert_eq!(policy.scale_to_zero_after, Duration::from_secs(600));
        assert_eq!(policy.spelled.scale_down_window, "5m");
        assert_eq!(policy.target(), 0.7);

        let mut by_hand = pool(64, 16, json!({ "maxReplicas": 8 }));
        by_hand.spec.autoscaling = None;
        assert_eq!(Policy::of(&by_hand), None);
    }

    #[test]
    fn the_budget_bounds_the_replicas_that_add_capacity() {
        // 64 in flight, 16 per replica: a fifth replica would only shrink everyone's share.
        let policy = Policy::of(&pool(64, 16, json!({ "minReplicas": 1, "maxReplicas": 8 }))).unwrap();
        assert_eq!(policy.upper(), 4);
        assert_eq!(policy.bound(6), (4, Limit::Budget));
        assert_eq!(policy.bound(3), (3, Limit::None));
        assert_eq!(policy.bound(0), (1, Limit::Min));
        // A budget that does not divide evenly rounds up: 60 / 16 leaves a replica of 12.
        assert_eq!(Policy::of(&pool(60, 16, json!({ "maxReplicas": 8 }))).unwrap().budget_bound, 4);

        let roomy = Policy::of(&pool(640, 16, json!({ "minReplicas": 2, "maxReplicas": 5 }))).unwrap();
        assert_eq!(roomy.bound(9), (5, Limit::Max));
        assert_eq!(roomy.bound(1), (2, Limit::Min));
        // minReplicas is what the user asked for outright: it wins over the budget bound.
        let floor = Policy::of(&pool(32, 16, json!({ "minReplicas": 3, "maxReplicas": 5 }))).unwrap();
        assert_eq!((floor.upper(), floor.bound(4)), (3, (3, Limit::Budget)));
    }

    #[test]
    fn durations_keep_their_spelling_and_parse() {
        let policy = Policy::of(&pool(
            64,
            16,
            json!({ "maxReplicas": 4, "scaleUpStabilization": "30s", "scaleDownStabilization": "1m30s",
                    "scaleToZeroAfter": "2h" }),
        ))
        .unwrap();
        assert_eq!(policy.scale_up_window, Duration::from_secs(30));
        assert_eq!(policy.scale_down_window, Duration::from_secs(90));
        assert_eq!(policy.scale_to_zero_after, Duration::from_secs(7200));
        assert_eq!(policy.longest_window(), Duration::from_secs(90));
        assert_eq!(policy.spelled.scale_to_zero_after, "2h");
    }
}
