//! The sidecar's certificates: sources (files in `static` and `file` mode, the pool's Secret in
//! Kubernetes) offer sets here; this puts them in force on both ports and for calls to peers
//! (`teifleet_runtime::tls`), logs and counts what happened, and reports what is served.

use std::sync::Arc;

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use teifleet_crds::{CertificateSummary, SidecarTls};
use teifleet_runtime::tls::{Material, ServerTls};

use crate::vocab::SetupError;

/// Where the set in force came from, and how it went.
pub struct Certificates {
    tls: Arc<ServerTls>,
    reloads: IntCounterVec,
    expiry: IntGauge,
}

impl Certificates {
    /// Plain text until a source offers a set, or turns TLS on and waits for one.
    pub fn new(registry: &Registry) -> Result<Self, SetupError> {
        let reloads = IntCounterVec::new(
            Opts::new(
                "teifleet_tls_reloads_total",
                "Certificate sets offered to the sidecar, by result: applied (new handshakes use it) or \
                 rejected (broken or mismatched: the set before stays in force).",
            ),
            &["result"],
        )
        .expect("valid counter");
        let expiry = IntGauge::with_opts(Opts::new(
            "teifleet_tls_certificate_expiry_timestamp_seconds",
            "When the certificate new handshakes get expires, in seconds since the epoch (0: none in force).",
        ))
        .expect("valid gauge");
        teifleet_runtime::metrics::register(registry, &[&reloads, &expiry])
            .map_err(|e| SetupError::Config(format!("TLS metrics: {e}")))?;
        Ok(Self { tls: Arc::new(ServerTls::off()), reloads, expiry })
    }

    /// What the ports and the dialer read.
    pub fn tls(&self) -> &Arc<ServerTls> {
        &self.tls
    }

    /// Puts `material` (read from `from`) in force if it is valid, or says why not.
    pub fn offer(&self, material: &Material, from: &str) {
        match self.tls.offer(material) {
            Ok(info) => {
                self.reloads.with_label_values(&["applied"]).inc();
                self.expiry.set(info.not_after_unix);
                tracing::info!(from, serial = %info.serial, subject = %info.subject, not_after = %info.not_after, "TLS certificate in force");
            }
            Err(error) => {
                self.reloads.with_label_values(&["rejected"]).inc();
                tracing::warn!(from, %error, "TLS certificate set rejected; the one before stays in force");
            }
        }
    }

    /// The source found nothing to offer (its Secret is missing): say so; what is in force stays
    /// (nothing, before a first set).
    pub fn missing(&self, why: String) {
        if self.tls.in_force().is_ok_and(|loaded| loaded.is_none()) {
            self.tls.wait();
        }
        self.tls.note_error(why.clone());
        tracing::warn!(reason = %why, "no TLS certificate set to load");
    }

    /// TLS off: plain text for new connections.
    pub fn turn_off(&self) {
        self.tls.turn_off();
        self.expiry.set(0);
        tracing::info!("TLS off: plain text");
    }
}

/// What the sidecar's TLS reports to the operator; none in plain text.
pub fn report(tls: &ServerTls) -> Option<SidecarTls> {
    let report = tls.report()?;
    Some(SidecarTls {
        serving: report.serving.map(|info| CertificateSummary {
            serial: info.serial,
            subject: info.subject,
            not_after: info.not_after,
        }),
        client_auth: report.client_auth,
        error: report.error,
    })
}
