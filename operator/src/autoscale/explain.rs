//! The autoscaler's message (`status.autoscaling.message`): why the pool has the replicas it
//! has, with the numbers of the reading that decided it.

use super::gpu::RETRY_AFTER;
use super::policy::{Limit, Policy};
use super::recommend::{Reason, Recommendation};

/// What held the count away from what the bounds allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    None,
    /// Wanted more, not yet for the whole scale-up window.
    UpWindow,
    /// Needs fewer, not yet for the whole scale-down window.
    DownWindow,
    /// Wanted more than the GPUs of the cluster could place.
    Gpu,
}

/// Everything the message says, but its live numbers: while this stays the same, so does the
/// message, and a steady pool's status is not rewritten for a percent more or less in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub desired: i32,
    pub recommended: i32,
    pub bounded: i32,
    pub stabilized: i32,
    pub reason: Reason,
    pub limit: Limit,
    pub hold: Hold,
}

impl Outcome {
    pub fn hold(bounded: i32, stabilized: i32, desired: i32) -> Hold {
        if desired < stabilized {
            Hold::Gpu
        } else if stabilized < bounded {
            Hold::UpWindow
        } else if stabilized > bounded {
            Hold::DownWindow
        } else {
            Hold::None
        }
    }
}

/// The message for `outcome`, the recommendation's reason followed by whatever moved the count.
pub fn explain(policy: &Policy, recommendation: &Recommendation, outcome: &Outcome) -> String {
    let mut message = recommendation.why.clone();
    let moved = outcome.bounded != recommendation.replicas;
    match outcome.limit {
        Limit::Min if moved => message.push_str(&format!("; minReplicas is {}", policy.min)),
        Limit::Max if moved => message.push_str(&format!("; maxReplicas is {}", policy.max)),
        Limit::Budget if moved => message.push_str(&format!(
            "; {} replicas take the whole budget (maxInFlight {} over maxInFlightPerReplica {}): more add no capacity",
            policy.budget_bound, policy.budget, policy.share
        )),
        _ => {}
    }
    let (bounded, stabilized, desired) = (outcome.bounded, outcome.stabilized, outcome.desired);
    match outcome.hold {
        Hold::None => {}
        Hold::DownWindow => message.push_str(&format!(
            "; keeping {stabilized}, recommended within the last {} (scaleDownStabilization)",
            policy.spelled.scale_down_window
        )),
        Hold::UpWindow => message.push_str(&format!(
            "; {stabilized} until {bounded} has been wanted for {} (scaleUpStabilization)",
            policy.spelled.scale_up_window
        )),
        Hold::Gpu => message.push_str(&format!(
            "; {desired} of {stabilized}: InsufficientGPU, pods beyond what the cluster placed wait for GPUs, \
             one more is tried every {}m",
            RETRY_AFTER.as_secs() / 60
        )),
    }
    if outcome.reason == Reason::Refusals && outcome.limit == Limit::Budget && moved {
        message.push_str("; raise maxInFlight to let the pool grow");
    }
    message
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::policy::tests::pool;
    use super::*;

    fn outcome(recommended: i32, bounded: i32, stabilized: i32, desired: i32, limit: Limit) -> Outcome {
        Outcome {
            desired,
            recommended,
            bounded,
            stabilized,
            reason: Reason::Load,
            limit,
            hold: Outcome::hold(bounded, stabilized, desired),
        }
    }

    fn load(replicas: i32) -> Recommendation {
        Recommendation {
            replicas,
            reason: Reason::Load,
            why: "140% of the in-flight budget in use at target 70%".into(),
        }
    }

    #[test]
    fn each_bound_and_hold_is_named_with_its_numbers() {
        let policy = Policy::of(&pool(64, 16, json!({ "minReplicas": 2, "maxReplicas": 8 }))).unwrap();
        assert_eq!(
            explain(&policy, &load(8), &outcome(8, 4, 4, 4, Limit::Budget)),
            "140% of the in-flight budget in use at target 70%; 4 replicas take the whole budget \
             (maxInFlight 64 over maxInFlightPerReplica 16): more add no capacity"
        );
        assert_eq!(
            explain(&policy, &load(1), &outcome(1, 2, 2, 2, Limit::Min)),
            "140% of the in-flight budget in use at target 70%; minReplicas is 2"
        );
        assert_eq!(
            explain(&policy, &load(3), &outcome(3, 3, 4, 4, Limit::None)),
            "140% of the in-flight budget in use at target 70%; keeping 4, recommended within the last 5m \
             (scaleDownStabilization)"
        );
        assert_eq!(
            explain(&policy, &load(4), &outcome(4, 4, 3, 3, Limit::None)),
            "140% of the in-flight budget in use at target 70%; 3 until 4 has been wanted for 0s (scaleUpStabilization)"
        );
        assert_eq!(
            explain(&policy, &load(4), &outcome(4, 4, 4, 2, Limit::None)),
            "140% of the in-flight budget in use at target 70%; 2 of 4: InsufficientGPU, pods beyond what the \
             cluster placed wait for GPUs, one more is tried every 5m"
        );
        assert_eq!(explain(&policy, &load(4), &outcome(4, 4, 4, 4, Limit::None)), load(4).why);
    }
}
