//! `spec.autoscaling`: the operator sizes the pool from what its sidecars report, between
//! `minReplicas` (0: the pool scales to zero when idle, and calls that arrive then are held by the
//! namespace's activator while a replica starts) and `maxReplicas`; and what it decided, in
//! `status.autoscaling`.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The CEL rule every duration field of this API uses.
const DURATION: &str = r"self.matches('^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$')";

/// How the operator sizes a pool.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("autoscaling.minReplicas must not exceed autoscaling.maxReplicas"))]
pub struct AutoscalingSpec {
    /// Fewest replicas. 0 lets an idle pool scale to zero after `scaleToZeroAfter`.
    #[serde(default = "default_min_replicas")]
    #[x_kube(validation = Rule::new("self >= 0").message("autoscaling.minReplicas must be 0 or more"))]
    pub min_replicas: i32,

    /// Most replicas (GPUs permitting: the autoscaler stops at what the cluster can place).
    #[x_kube(validation = Rule::new("self >= 1").message("autoscaling.maxReplicas must be at least 1"))]
    pub max_replicas: i32,

    /// The share of the in-flight budget in use the autoscaler keeps the pool at: replicas are
    /// added when more is in use (counting what waits in the sidecars' queues), removed when less.
    /// 70 leaves room for a burst to be admitted at once while the next replica starts.
    #[serde(default = "default_target_utilization")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 100").message("autoscaling.targetUtilizationPercent must be between 10 and 100"))]
    pub target_utilization_percent: i32,

    /// How long the pool must have wanted more replicas before it gets them (the lowest wish in
    /// this window counts, so a spike shorter than it adds nothing).
    #[serde(default = "default_scale_up_stabilization")]
    #[x_kube(validation = Rule::new(DURATION).message("autoscaling.scaleUpStabilization must be a duration such as 0s or 30s"))]
    pub scale_up_stabilization: String,

    /// How long the pool must have needed fewer replicas before it loses them (the highest wish in
    /// this window counts, so load that comes and goes keeps its replicas).
    #[serde(default = "default_scale_down_stabilization")]
    #[x_kube(validation = Rule::new(DURATION).message("autoscaling.scaleDownStabilization must be a duration such as 5m"))]
    pub scale_down_stabilization: String,

    /// With `minReplicas: 0`: how long the pool must have had no call before it scales to zero.
    #[serde(default = "default_scale_to_zero_after")]
    #[x_kube(validation = Rule::new(DURATION).message("autoscaling.scaleToZeroAfter must be a duration such as 10m"))]
    pub scale_to_zero_after: String,

    /// With `minReplicas: 0`: the longest a call that arrives while no replica is ready is held
    /// (less when its own deadline is shorter) before it is answered UNAVAILABLE / 503 with a
    /// retry hint. Cover the pool's cold start: pod scheduling, image pull, model load.
    #[serde(default = "default_cold_start_hold")]
    #[x_kube(validation = Rule::new(DURATION).message("autoscaling.coldStartHold must be a duration such as 60s"))]
    pub cold_start_hold: String,
}

fn default_min_replicas() -> i32 {
    1
}

/// The target utilization when none is given.
pub const DEFAULT_TARGET_UTILIZATION: i32 = 70;

fn default_target_utilization() -> i32 {
    DEFAULT_TARGET_UTILIZATION
}

fn default_scale_up_stabilization() -> String {
    "0s".into()
}

fn default_scale_down_stabilization() -> String {
    "5m".into()
}

fn default_scale_to_zero_after() -> String {
    "10m".into()
}

fn default_cold_start_hold() -> String {
    "60s".into()
}

/// What the autoscaler decided last, and why.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStatus {
    /// The replicas the autoscaler set.
    pub desired_replicas: i32,
    /// The replicas the last reports asked for before stabilization and bounds.
    pub recommended_replicas: i32,
    /// Why, with the numbers (`utilization 140% of 4 replicas at target 70%: 8`).
    pub message: String,
    /// When the replicas last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<String>,
    /// When a call last arrived at the pool (its sidecars or the activator), as last reported
    /// (RFC 3339): what `scaleToZeroAfter` counts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_call_time: Option<String>,
}
