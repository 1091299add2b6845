//! The `TLSReady` condition of a pool with `spec.tls`: what certificate its sidecars serve, as
//! they reported it, and why one that was given is not in force.

use std::collections::{BTreeMap, BTreeSet};

use teifleet_crds::conditions::{Observed, TLS_READY, reasons};
use teifleet_crds::{CertificateSummary, EmbeddingPool, SidecarAdmission, SidecarTls};

/// The condition for `pool` from the `reports` of the sidecars that answered; `None` for a pool
/// without `spec.tls`, whose status then has no `TLSReady`.
pub fn tls_ready(pool: &EmbeddingPool, reports: &[SidecarAdmission]) -> Option<Observed> {
    let tls = pool.spec.tls.as_ref()?;
    // A sidecar that answers without TLS state has not applied spec.tls yet; it says nothing.
    let states: Vec<&SidecarTls> = reports.iter().filter_map(|report| report.tls.as_ref()).collect();
    Some(observe(&states, tls.client_ca.is_some(), reports.len()))
}

/// Reports arrive in no particular order: everything below is counted or sorted, so the same
/// reports always give the same message and a steady pool no status write.
fn observe(states: &[&SidecarTls], mutual: bool, answered: usize) -> Observed {
    let reporting = states.len();
    if reporting == 0 {
        let message = if answered == 0 {
            "no sidecar has reported yet".to_owned()
        } else {
            format!(
                "{answered} sidecar(s) answered without TLS state: they have not applied spec.tls yet, or run an \
                 image without TLS"
            )
        };
        return Observed::unknown(TLS_READY, reasons::NO_REPORTS, message);
    }

    let errors: BTreeSet<&str> = states.iter().filter_map(|state| state.error.as_deref()).collect();
    if let Some(first) = errors.first() {
        let failing = states.iter().filter(|state| state.error.is_some()).count();
        let stranded = states.iter().filter(|state| state.error.is_some() && state.serving.is_none()).count();
        let consequence = match stranded {
            0 => "keep serving the last good one".to_owned(),
            _ => format!("{stranded} of them have none to serve, so their handshakes fail"),
        };
        let others = match errors.len() - 1 {
            0 => String::new(),
            more => format!(" (and {more} other error(s))"),
        };
        let message = format!(
            "{failing} of {reporting} sidecar(s) could not use the certificate, key or CA bundle given, and \
             {consequence}: {first}{others}"
        );
        return Observed::new(TLS_READY, false, reasons::CERTIFICATE_INVALID, message);
    }

    let missing = states.iter().filter(|state| state.serving.is_none()).count();
    if missing > 0 {
        let message = format!(
            "{missing} of {reporting} sidecar(s) serve no certificate yet: every TLS handshake with them fails"
        );
        return Observed::new(TLS_READY, false, reasons::CERTIFICATE_MISSING, message);
    }

    let unchecked = states.iter().filter(|state| !state.client_auth).count();
    if mutual && unchecked > 0 {
        let message = format!(
            "{unchecked} of {reporting} sidecar(s) do not check client certificates yet: the CA bundle of \
             spec.tls.clientCA is not in force there"
        );
        return Observed::new(TLS_READY, false, reasons::CLIENT_CA_MISSING, message);
    }

    let mut served: BTreeMap<&str, (&CertificateSummary, usize)> = BTreeMap::new();
    for certificate in states.iter().filter_map(|state| state.serving.as_ref()) {
        served.entry(certificate.serial.as_str()).or_insert((certificate, 0)).1 += 1;
    }
    let served: Vec<(&CertificateSummary, usize)> = served.into_values().collect();
    let mut message = match served.as_slice() {
        [(certificate, _)] => format!(
            "serving certificate {} ({}), valid until {}",
            certificate.serial, certificate.subject, certificate.not_after
        ),
        several => {
            let each: Vec<String> = several
                .iter()
                .map(|(certificate, sidecars)| {
                    format!("{sidecars} serve {} (valid until {})", certificate.serial, certificate.not_after)
                })
                .collect();
            format!("rotating: {}", each.join(", "))
        }
    };
    if mutual {
        message.push_str("; clients must present a certificate signed by the clientCA bundle");
    }
    Observed::new(TLS_READY, true, reasons::CERTIFICATE_SERVED, message)
}

#[cfg(test)]
mod tests {
    use teifleet_crds::conditions::Status;
    use teifleet_crds::{EmbeddingPoolSpec, TlsSpec};

    use super::super::demand::tests::report;
    use super::*;

    fn pool(tls: Option<TlsSpec>) -> EmbeddingPool {
        let mut spec: EmbeddingPoolSpec =
            serde_json::from_value(serde_json::json!({ "model": { "id": "BAAI/bge-small-en-v1.5" } })).unwrap();
        spec.tls = tls;
        EmbeddingPool::new("embed", spec)
    }

    fn tls(client_ca: bool) -> Option<TlsSpec> {
        let spec = if client_ca {
            serde_json::json!({ "secretName": "embed-tls", "clientCA": { "configMapName": "clients" } })
        } else {
            serde_json::json!({ "secretName": "embed-tls" })
        };
        Some(serde_json::from_value(spec).unwrap())
    }

    fn certificate(serial: &str) -> CertificateSummary {
        CertificateSummary {
            serial: serial.into(),
            subject: "CN=embed.ml.svc".into(),
            not_after: "2027-01-01T00:00:00Z".into(),
        }
    }

    /// A sidecar's report carrying `state`.
    fn reporting(state: SidecarTls) -> SidecarAdmission {
        SidecarAdmission { tls: Some(state), ..report(32, 0, 0, 0.0, 0.0) }
    }

    fn serving(serial: &str, client_auth: bool) -> SidecarAdmission {
        reporting(SidecarTls { serving: Some(certificate(serial)), client_auth, error: None })
    }

    fn condition(pool: &EmbeddingPool, reports: &[SidecarAdmission]) -> (Status, &'static str, String) {
        let observed = tls_ready(pool, reports).expect("a pool with spec.tls has the condition");
        (observed.status, observed.reason, observed.message)
    }

    #[test]
    fn only_a_pool_with_tls_has_the_condition() {
        assert_eq!(tls_ready(&pool(None), &[serving("0A", false)]), None);
    }

    #[test]
    fn one_certificate_served_everywhere_is_ready_with_its_serial_and_expiry() {
        let reports = [serving("0A1B", false), serving("0A1B", false)];
        assert_eq!(
            condition(&pool(tls(false)), &reports),
            (
                Status::True,
                reasons::CERTIFICATE_SERVED,
                "serving certificate 0A1B (CN=embed.ml.svc), valid until 2027-01-01T00:00:00Z".into()
            )
        );
        let (_, _, message) = condition(&pool(tls(true)), &[serving("0A1B", true)]);
        assert!(message.ends_with("; clients must present a certificate signed by the clientCA bundle"), "{message}");
    }

    #[test]
    fn sidecars_serving_different_certificates_are_rotating_in_a_stable_order() {
        let forward = [serving("0B", false), serving("0A", false), serving("0B", false)];
        let backward = [serving("0B", false), serving("0B", false), serving("0A", false)];
        let (status, reason, message) = condition(&pool(tls(false)), &forward);
        assert_eq!((status, reason), (Status::True, reasons::CERTIFICATE_SERVED));
        assert_eq!(
            message,
            "rotating: 1 serve 0A (valid until 2027-01-01T00:00:00Z), 2 serve 0B (valid until 2027-01-01T00:00:00Z)"
        );
        assert_eq!(condition(&pool(tls(false)), &backward).2, message, "report order does not matter");
    }

    #[test]
    fn a_refused_certificate_is_invalid_and_names_the_error_and_the_sidecars() {
        let broken = |error: &str| {
            reporting(SidecarTls { serving: Some(certificate("0A")), client_auth: false, error: Some(error.into()) })
        };
        let reports = [serving("0A", false), broken("tls.key does not match tls.crt")];
        assert_eq!(
            condition(&pool(tls(false)), &reports),
            (
                Status::False,
                reasons::CERTIFICATE_INVALID,
                "1 of 2 sidecar(s) could not use the certificate, key or CA bundle given, and keep serving the last \
                 good one: tls.key does not match tls.crt"
                    .into()
            )
        );
        let first_one_broken =
            reporting(SidecarTls { serving: None, client_auth: false, error: Some("tls.crt: no PEM".into()) });
        let (_, reason, message) = condition(&pool(tls(false)), &[first_one_broken, serving("0A", false)]);
        assert_eq!(reason, reasons::CERTIFICATE_INVALID, "the error says more than the missing certificate");
        assert!(message.contains("1 of them have none to serve, so their handshakes fail"), "{message}");
        let reports = [broken("b: no PEM"), broken("a: expired"), broken("b: no PEM")];
        let (_, reason, message) = condition(&pool(tls(false)), &reports);
        assert_eq!(reason, reasons::CERTIFICATE_INVALID);
        assert!(message.starts_with("3 of 3 sidecar(s)"), "{message}");
        assert!(message.ends_with(": a: expired (and 1 other error(s))"), "{message}");
    }

    #[test]
    fn no_certificate_served_is_missing() {
        let none = reporting(SidecarTls { serving: None, client_auth: false, error: None });
        assert_eq!(
            condition(&pool(tls(false)), &[serving("0A", false), none]),
            (
                Status::False,
                reasons::CERTIFICATE_MISSING,
                "1 of 2 sidecar(s) serve no certificate yet: every TLS handshake with them fails".into()
            )
        );
    }

    #[test]
    fn mutual_tls_not_in_force_is_not_ready() {
        let (status, reason, message) = condition(&pool(tls(true)), &[serving("0A", true), serving("0A", false)]);
        assert_eq!((status, reason), (Status::False, reasons::CLIENT_CA_MISSING));
        assert!(message.starts_with("1 of 2 sidecar(s) do not check client certificates"), "{message}");
    }

    #[test]
    fn without_reports_the_operator_cannot_tell() {
        assert_eq!(
            condition(&pool(tls(false)), &[]),
            (Status::Unknown, reasons::NO_REPORTS, "no sidecar has reported yet".into())
        );
        let (status, reason, message) = condition(&pool(tls(false)), &[report(32, 0, 0, 0.0, 0.0)]);
        assert_eq!((status, reason), (Status::Unknown, reasons::NO_REPORTS));
        assert!(message.starts_with("1 sidecar(s) answered without TLS state"), "{message}");
    }
}
