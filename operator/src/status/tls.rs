//! The `TLSReady` condition of a pool with `spec.tls`: what certificate its sidecars serve, as
//! they reported it, why one that was given is not in force, and whether the one in force has
//! expired since it was put there.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use teifleet_crds::conditions::{Observed, TLS_READY, reasons};
use teifleet_crds::{CertificateSummary, EmbeddingPool, SidecarAdmission, SidecarTls};

/// The condition for `pool` from the `reports` of the sidecars that answered, at `now`; `None`
/// for a pool without `spec.tls`, whose status then has no `TLSReady`.
pub fn tls_ready(pool: &EmbeddingPool, reports: &[SidecarAdmission], now: Timestamp) -> Option<Observed> {
    let tls = pool.spec.tls.as_ref()?;
    // A sidecar that answers without TLS state has not applied spec.tls yet; it says nothing.
    let states: Vec<&SidecarTls> = reports.iter().filter_map(|report| report.tls.as_ref()).collect();
    Some(observe(&states, tls.client_ca.is_some(), reports.len(), now))
}

/// The certificate `state` serves, if it has expired: the sidecar says so, or (a sidecar of a
/// release before, or one that has not checked its clock since) its `notAfter` is behind `now`.
/// X.509 validity includes the `notAfter` second itself.
fn expired(state: &SidecarTls, now: Timestamp) -> Option<&CertificateSummary> {
    let certificate = state.serving.as_ref()?;
    let ended = || certificate.not_after.parse::<Timestamp>().is_ok_and(|end| now.as_second() > end.as_second());
    (state.expired || ended()).then_some(certificate)
}

/// Reports arrive in no particular order: everything below is counted or sorted, so the same
/// reports always give the same message and a steady pool no status write. `now` only decides
/// whether a certificate has expired; no message counts down to its end.
fn observe(states: &[&SidecarTls], mutual: bool, answered: usize, now: Timestamp) -> Observed {
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
    let others = |errors: &BTreeSet<&str>| match errors.len().saturating_sub(1) {
        0 => String::new(),
        more => format!(" (and {more} other error(s))"),
    };

    // Before a refused set: an expired certificate in force fails every handshake, while a
    // refused one alone leaves a good one serving.
    let served = by_serial(states.iter().filter_map(|state| expired(state, now)));
    if !served.is_empty() {
        let sidecars: usize = served.iter().map(|(_, sidecars)| sidecars).sum();
        let what = match served.as_slice() {
            [(certificate, _)] => format!(
                "serve certificate {} ({}), which expired at {}",
                certificate.serial, certificate.subject, certificate.not_after
            ),
            several => {
                let each: Vec<String> = several
                    .iter()
                    .map(|(certificate, sidecars)| {
                        format!("{sidecars} serve {}, expired at {}", certificate.serial, certificate.not_after)
                    })
                    .collect();
                format!("serve expired certificates ({})", each.join("; "))
            }
        };
        let mut message = format!(
            "{sidecars} of {reporting} sidecar(s) {what}: clients refuse it, so every TLS handshake with them fails \
             until the Secret holds a renewed certificate"
        );
        if let Some(first) = errors.first() {
            message.push_str(&format!("; the certificate, key or CA bundle given since was refused: {first}"));
            message.push_str(&others(&errors));
        }
        return Observed::new(TLS_READY, false, reasons::CERTIFICATE_EXPIRED, message);
    }

    if let Some(first) = errors.first() {
        let failing = states.iter().filter(|state| state.error.is_some()).count();
        let stranded = states.iter().filter(|state| state.error.is_some() && state.serving.is_none()).count();
        let consequence = match stranded {
            0 => "keep serving the last good one".to_owned(),
            _ => format!("{stranded} of them have none to serve, so their handshakes fail"),
        };
        let message = format!(
            "{failing} of {reporting} sidecar(s) could not use the certificate, key or CA bundle given, and \
             {consequence}: {first}{}",
            others(&errors)
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

    let served = by_serial(states.iter().filter_map(|state| state.serving.as_ref()));
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

/// The certificates named, each once with how many sidecars named it, in serial order (reports
/// arrive in no particular order; the message must not change with it).
fn by_serial<'a>(certificates: impl Iterator<Item = &'a CertificateSummary>) -> Vec<(&'a CertificateSummary, usize)> {
    let mut counted: BTreeMap<&str, (&CertificateSummary, usize)> = BTreeMap::new();
    for certificate in certificates {
        counted.entry(certificate.serial.as_str()).or_insert((certificate, 0)).1 += 1;
    }
    counted.into_values().collect()
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
        reporting(SidecarTls { serving: Some(certificate(serial)), client_auth, error: None, expired: false })
    }

    /// A sidecar serving `serial`, which it reports expired (or, `flagged` false, does not: a
    /// sidecar of a release before).
    fn serving_expired(serial: &str, flagged: bool, error: Option<&str>) -> SidecarAdmission {
        let state = SidecarTls {
            serving: Some(certificate(serial)),
            client_auth: false,
            error: error.map(Into::into),
            expired: flagged,
        };
        reporting(state)
    }

    /// A moment well inside `certificate()`'s validity, which ends 2027-01-01T00:00:00Z.
    fn before_the_end() -> Timestamp {
        "2026-06-01T00:00:00Z".parse().unwrap()
    }

    fn at(pool: &EmbeddingPool, reports: &[SidecarAdmission], now: &str) -> (Status, &'static str, String) {
        let observed = tls_ready(pool, reports, now.parse().unwrap()).expect("a pool with spec.tls has the condition");
        (observed.status, observed.reason, observed.message)
    }

    fn condition(pool: &EmbeddingPool, reports: &[SidecarAdmission]) -> (Status, &'static str, String) {
        let observed = tls_ready(pool, reports, before_the_end()).expect("a pool with spec.tls has the condition");
        (observed.status, observed.reason, observed.message)
    }

    #[test]
    fn only_a_pool_with_tls_has_the_condition() {
        assert_eq!(tls_ready(&pool(None), &[serving("0A", false)], before_the_end()), None);
    }

    #[test]
    fn a_certificate_that_expired_in_force_is_not_ready_naming_its_serial_end_and_sidecars() {
        let expected = (
            Status::False,
            reasons::CERTIFICATE_EXPIRED,
            "2 of 3 sidecar(s) serve certificate 0A1B (CN=embed.ml.svc), which expired at 2027-01-01T00:00:00Z: \
             clients refuse it, so every TLS handshake with them fails until the Secret holds a renewed certificate"
                .to_owned(),
        );
        // The sidecars say so (the operator's clock not there yet: a clock behind theirs)...
        let flagged = [serving_expired("0A1B", true, None), serving("0C", false), serving_expired("0A1B", true, None)];
        assert_eq!(condition(&pool(tls(false)), &flagged), expected);
        // ...or the operator's clock does, for sidecars that do not (a release before): the same
        // condition, and the same words an hour or a week later, so no status write.
        let silent = [serving("0A1B", false), serving("0C", false), serving("0A1B", false)];
        for now in ["2027-01-01T00:00:01Z", "2027-01-01T01:00:00Z", "2027-01-08T00:00:00Z"] {
            let mut silent = silent.clone();
            // 0C ends later than 0A1B.
            silent[1].tls.as_mut().unwrap().serving.as_mut().unwrap().not_after = "2027-06-01T00:00:00Z".into();
            assert_eq!(at(&pool(tls(false)), &silent, now), expected, "at {now}");
        }
    }

    #[test]
    fn a_certificate_about_to_expire_is_still_served_and_ready_with_words_that_do_not_count_down() {
        let reports = [serving("0A1B", false), serving("0A1B", false)];
        let served = (
            Status::True,
            reasons::CERTIFICATE_SERVED,
            "serving certificate 0A1B (CN=embed.ml.svc), valid until 2027-01-01T00:00:00Z".to_owned(),
        );
        for now in ["2026-12-25T00:00:00Z", "2026-12-31T23:59:59Z", "2027-01-01T00:00:00Z"] {
            assert_eq!(at(&pool(tls(false)), &reports, now), served, "its last second included, at {now}");
        }
        let (_, reason, _) = at(&pool(tls(false)), &reports, "2027-01-01T00:00:01Z");
        assert_eq!(reason, reasons::CERTIFICATE_EXPIRED, "the second after");
    }

    #[test]
    fn a_renewed_certificate_clears_the_expiry_sidecar_by_sidecar() {
        let now = "2027-01-01T00:00:05Z";
        let mut renewed = certificate("0B");
        renewed.not_after = "2027-04-01T00:00:00Z".into();
        let renewed = reporting(SidecarTls { serving: Some(renewed), client_auth: false, error: None, expired: false });

        let halfway = [serving_expired("0A", true, None), renewed.clone()];
        let (status, reason, message) = at(&pool(tls(false)), &halfway, now);
        assert_eq!((status, reason), (Status::False, reasons::CERTIFICATE_EXPIRED));
        assert!(message.starts_with("1 of 2 sidecar(s) serve certificate 0A "), "{message}");

        let done = [renewed.clone(), renewed];
        assert_eq!(
            at(&pool(tls(false)), &done, now),
            (
                Status::True,
                reasons::CERTIFICATE_SERVED,
                "serving certificate 0B (CN=embed.ml.svc), valid until 2027-04-01T00:00:00Z".into()
            )
        );
    }

    #[test]
    fn an_expired_certificate_outranks_a_refused_renewal_and_the_message_says_both() {
        let reports = [
            serving_expired("0B", true, Some("b: no PEM")),
            serving_expired("0A", true, Some("a: key mismatch")),
            serving_expired("0A", true, None),
        ];
        let (status, reason, message) = condition(&pool(tls(false)), &reports);
        assert_eq!((status, reason), (Status::False, reasons::CERTIFICATE_EXPIRED));
        assert_eq!(
            message,
            "3 of 3 sidecar(s) serve expired certificates (2 serve 0A, expired at 2027-01-01T00:00:00Z; 1 serve 0B, \
             expired at 2027-01-01T00:00:00Z): clients refuse it, so every TLS handshake with them fails until the \
             Secret holds a renewed certificate; the certificate, key or CA bundle given since was refused: a: key \
             mismatch (and 1 other error(s))"
        );
        let mut backward = reports.clone();
        backward.reverse();
        assert_eq!(condition(&pool(tls(false)), &backward).2, message, "report order does not matter");
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
            reporting(SidecarTls {
                serving: Some(certificate("0A")),
                client_auth: false,
                error: Some(error.into()),
                expired: false,
            })
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
        let first_one_broken = reporting(SidecarTls {
            serving: None,
            client_auth: false,
            error: Some("tls.crt: no PEM".into()),
            expired: false,
        });
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
        let none = reporting(SidecarTls::default());
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
