//! Condition types and reasons of an EmbeddingPool, and the one way to update them.
//!
//! `lastTransitionTime` moves only when a condition's status flips, and conditions are kept in a
//! fixed order, so recomputing an unchanged status produces an identical object and no write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
/// Only on pools with `spec.tls`: whether the sidecars serve the pool's certificate.
pub const TLS_READY: &str = "TLSReady";

/// Fixed order conditions appear in.
const ORDER: [&str; 4] = [READY, PROGRESSING, DEGRADED, TLS_READY];

/// Reasons used in conditions and events.
pub mod reasons {
    pub const ALL_REPLICAS_READY: &str = "AllReplicasReady";
    pub const REPLICAS_NOT_READY: &str = "ReplicasNotReady";
    pub const SCALED_TO_ZERO: &str = "ScaledToZero";
    pub const INSUFFICIENT_GPU: &str = "InsufficientGPU";
    /// The model needs more GPU memory than the pool's share of a GPU gives: no pod is started.
    pub const INSUFFICIENT_GPU_MEMORY: &str = "InsufficientGPUMemory";
    pub const ROLLING_OUT: &str = "RollingOut";
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    pub const AS_EXPECTED: &str = "AsExpected";
    pub const CERTIFICATE_SERVED: &str = "CertificateServed";
    pub const CERTIFICATE_INVALID: &str = "CertificateInvalid";
    /// The certificate a sidecar serves has passed its `notAfter` since it was put in force:
    /// every client refuses it until the Secret holds a renewed one.
    pub const CERTIFICATE_EXPIRED: &str = "CertificateExpired";
    pub const CERTIFICATE_MISSING: &str = "CertificateMissing";
    pub const CLIENT_CA_MISSING: &str = "ClientCAMissing";
    pub const NO_REPORTS: &str = "NoReports";
}

/// A condition's status. `Unknown` is for what the operator cannot tell yet, such as what
/// sidecars serve before any has reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(status: bool) -> Self {
        if status { Self::True } else { Self::False }
    }
}

/// A condition as computed, before `lastTransitionTime` is decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub type_: &'static str,
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

impl Observed {
    pub fn new(type_: &'static str, status: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self { type_, status: status.into(), reason, message: message.into() }
    }

    /// A condition whose status the operator cannot tell yet.
    pub fn unknown(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self { type_, status: Status::Unknown, reason, message: message.into() }
    }
}

/// Merges freshly observed conditions into the previous ones: a condition whose status did not
/// change keeps its `lastTransitionTime`; one that flipped (or is new) gets `now`.
pub fn merge(previous: &[Condition], observed: Vec<Observed>, generation: Option<i64>, now: &Time) -> Vec<Condition> {
    let mut merged: Vec<Condition> = observed
        .into_iter()
        .map(|o| {
            let status = o.status.as_str().to_owned();
            let last_transition_time = previous
                .iter()
                .find(|p| p.type_ == o.type_ && p.status == status)
                .map(|p| p.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: o.type_.to_owned(),
                status,
                reason: o.reason.to_owned(),
                message: o.message,
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect();
    merged.sort_by_key(|c| ORDER.iter().position(|t| *t == c.type_).unwrap_or(ORDER.len()));
    merged
}

/// Finds a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn unchanged_status_keeps_transition_time() {
        let first = merge(&[], vec![Observed::new(READY, true, reasons::ALL_REPLICAS_READY, "2/2")], Some(1), &at(10));
        let second =
            merge(&first, vec![Observed::new(READY, true, reasons::ALL_REPLICAS_READY, "2/2")], Some(2), &at(20));
        assert_eq!(second[0].last_transition_time, at(10));
        assert_eq!(second[0].observed_generation, Some(2));
    }

    #[test]
    fn flipped_status_gets_new_transition_time() {
        let first = merge(&[], vec![Observed::new(READY, true, reasons::ALL_REPLICAS_READY, "")], Some(1), &at(10));
        let second = merge(&first, vec![Observed::new(READY, false, reasons::INSUFFICIENT_GPU, "")], Some(1), &at(20));
        assert_eq!(second[0].last_transition_time, at(20));
        assert_eq!(second[0].reason, reasons::INSUFFICIENT_GPU);
        assert_eq!(second[0].status, "False");
    }

    #[test]
    fn unknown_is_a_status_of_its_own() {
        let first = merge(&[], vec![Observed::unknown(TLS_READY, reasons::NO_REPORTS, "")], Some(1), &at(10));
        assert_eq!(first[0].status, "Unknown");
        let second =
            merge(&first, vec![Observed::new(TLS_READY, true, reasons::CERTIFICATE_SERVED, "")], Some(1), &at(20));
        assert_eq!((second[0].status.as_str(), &second[0].last_transition_time), ("True", &at(20)));
    }

    #[test]
    fn order_is_fixed_whatever_the_input_order() {
        let merged = merge(
            &[],
            vec![
                Observed::new(TLS_READY, true, reasons::CERTIFICATE_SERVED, ""),
                Observed::new(DEGRADED, false, reasons::AS_EXPECTED, ""),
                Observed::new(READY, true, reasons::ALL_REPLICAS_READY, ""),
                Observed::new(PROGRESSING, false, reasons::ROLLOUT_COMPLETE, ""),
            ],
            None,
            &at(1),
        );
        let types: Vec<_> = merged.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [READY, PROGRESSING, DEGRADED, TLS_READY]);
        assert!(is_true(&merged, READY));
        assert!(!is_true(&merged, DEGRADED));
    }
}
