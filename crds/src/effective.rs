//! What each sidecar reports on its admin port, and the pool-wide summaries the operator writes
//! into status from those reports: the in-flight limits in force for adaptive pools (where they
//! differ from the shares the operator publishes), and every pool's demand.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One sidecar's admission state, as its admin port reports it (`teifleet_wire::sidecar_admin::ADMISSION_PATH`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SidecarAdmission {
    /// The pool the sidecar serves.
    pub pool: String,
    /// Inputs let into TEI at once right now: the adaptive limit, or the share when static.
    pub effective_in_flight: u32,
    /// The ceiling: this replica's share of the pool budget.
    pub max_in_flight: u32,
    pub adaptive: bool,
    /// Inputs in flight and queued at the moment of asking.
    pub in_flight: u32,
    pub queued: u32,
    /// The queue stands: newcomers that would wait longer than the target are refused.
    pub standing_queue: bool,
    /// Calls of the pool refused for capacity (shed, or expired in the queue), per second over
    /// the last minute. Defaulted, like every field added later, so an operator still reads a
    /// sidecar of the release before.
    #[serde(default)]
    pub refused_per_second: f64,
    /// Calls of the pool handed to a sibling replica, per second over the last minute.
    #[serde(default)]
    pub spilled_per_second: f64,
    /// Seconds since a call last arrived at this sidecar (its own clients' or a sibling's), or
    /// since it started: what scaling to zero counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_seconds: Option<f64>,
    /// The sidecar's TLS, when the pool asks for it (`spec.tls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<SidecarTls>,
}

/// What certificate a sidecar serves, and what went wrong with the one it was last given.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SidecarTls {
    /// The certificate new handshakes get; none: none loaded yet, every handshake fails.
    pub serving: Option<CertificateSummary>,
    /// Mutual TLS: client certificates are checked against a CA bundle.
    pub client_auth: bool,
    /// Why the last certificate, key or CA bundle given was not put in force (the one before
    /// stays); none when the last one given is the one served.
    pub error: Option<String>,
    /// The certificate served has passed its `notAfter` while in force: it is still what new
    /// handshakes get (nothing better was given), and clients refuse it. Absent (false) from a
    /// sidecar of a release before; the operator checks `notAfter` against its own clock too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
}

/// A certificate, as people look one up.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSummary {
    /// The serial number in hex, as `openssl x509 -serial` prints it.
    pub serial: String,
    pub subject: String,
    /// RFC 3339.
    pub not_after: String,
}

/// The pool's in-flight limits in force, summed over the sidecars that answered.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveLimits {
    /// Sidecars that reported their limits at the last check.
    pub replicas_reporting: i32,
    /// Inputs the pool lets into TEI at once right now: the sum of the sidecars' limits.
    pub total_in_flight: i32,
    /// The lowest and highest limit among the sidecars: far apart means replicas of unequal speed.
    pub min_in_flight: i32,
    pub max_in_flight: i32,
    /// Sidecars whose queue stands (overloaded; they refuse what they cannot serve soon).
    pub standing_queues: i32,
}

/// What the pool is asked to do, summed over the sidecars that answered: for a person reading
/// `kubectl get epool` and for an autoscaler. Rates are rounded to two significant digits so that
/// a steady load does not rewrite the status at every check.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolDemand {
    /// Sidecars that reported at the last check; the other fields cover these only.
    pub replicas_reporting: i32,
    /// Inputs in flight to TEI.
    pub in_flight: i32,
    /// Inputs waiting in the sidecars' queues.
    pub queued: i32,
    /// `inFlight` as a percentage of the in-flight limits in force at the same sidecars (their
    /// shares, or their adaptive limits): how full the pool is now. The limits of the sidecars
    /// that answered, not `spec.concurrency.maxInFlight`, so a sidecar that did not answer leaves
    /// both sides of the ratio, and an adaptive pool held below its budget by a slow TEI shows
    /// full. Above 100 for a moment when an adaptive limit drops under what is in flight.
    pub utilization_percent: i32,
    /// Calls refused for capacity (shed, or expired in a queue), per second over the last minute.
    pub refused_per_second: f64,
    /// Calls a sidecar handed to a sibling replica, per second over the last minute.
    pub spilled_per_second: f64,
}

/// The summary of `reports`; `None` when no sidecar answered.
pub fn summarize(reports: &[SidecarAdmission]) -> Option<EffectiveLimits> {
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let limit = |r: &SidecarAdmission| i32::try_from(r.effective_in_flight).unwrap_or(i32::MAX);
    Some(EffectiveLimits {
        replicas_reporting: count(reports.len()),
        total_in_flight: reports.iter().map(limit).fold(0, i32::saturating_add),
        min_in_flight: reports.iter().map(limit).min()?,
        max_in_flight: reports.iter().map(limit).max()?,
        standing_queues: count(reports.iter().filter(|r| r.standing_queue).count()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(limit: u32, standing: bool) -> SidecarAdmission {
        SidecarAdmission {
            pool: "bge".into(),
            effective_in_flight: limit,
            max_in_flight: 64,
            adaptive: true,
            in_flight: 0,
            queued: 0,
            standing_queue: standing,
            refused_per_second: 0.0,
            spilled_per_second: 0.0,
            idle_seconds: None,
            tls: None,
        }
    }

    #[test]
    fn the_summary_sums_and_spans_the_reports() {
        assert_eq!(summarize(&[]), None);
        let summary = summarize(&[report(12, false), report(30, true), report(20, false)]).unwrap();
        assert_eq!(
            summary,
            EffectiveLimits {
                replicas_reporting: 3,
                total_in_flight: 62,
                min_in_flight: 12,
                max_in_flight: 30,
                standing_queues: 1
            }
        );
    }

    #[test]
    fn the_report_is_camel_case_json() {
        let json = serde_json::to_value(report(8, false)).unwrap();
        assert_eq!(json["effectiveInFlight"], 8);
        assert_eq!(json["standingQueue"], false);
        assert_eq!(json["refusedPerSecond"], 0.0);
    }

    #[test]
    fn a_report_without_the_rates_still_parses() {
        // What a sidecar of the release before answers.
        let older = serde_json::json!({
            "pool": "bge", "effectiveInFlight": 8, "maxInFlight": 64, "adaptive": false,
            "inFlight": 3, "queued": 1, "standingQueue": false,
        });
        let report: SidecarAdmission = serde_json::from_value(older).unwrap();
        assert_eq!((report.in_flight, report.refused_per_second, report.spilled_per_second), (3, 0.0, 0.0));
    }

    #[test]
    fn tls_state_says_expired_only_when_it_is_and_reads_a_release_before_as_not() {
        let serving = CertificateSummary {
            serial: "0A".into(),
            subject: "CN=bge".into(),
            not_after: "2027-01-01T00:00:00Z".into(),
        };
        let state = SidecarTls { serving: Some(serving), client_auth: false, error: None, expired: false };
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(json.get("expired"), None, "what a sidecar of the release before sends");
        assert_eq!(serde_json::from_value::<SidecarTls>(json).unwrap(), state);
        let expired = SidecarTls { expired: true, ..state };
        let json = serde_json::to_value(&expired).unwrap();
        assert_eq!(json["expired"], true);
        assert_eq!(serde_json::from_value::<SidecarTls>(json).unwrap(), expired);
    }
}

/// What a namespace's activator reports on its admin port: the calls it holds for pools with no
/// ready replica, which is how the operator learns that a pool scaled to zero is called.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ActivatorReport {
    pub pools: Vec<HeldCalls>,
}

/// One pool's calls at the activator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeldCalls {
    pub pool: String,
    /// Calls waiting now for a replica of the pool to be ready.
    pub held: u32,
    /// Seconds since a call for the pool last arrived here.
    pub idle_seconds: f64,
}
