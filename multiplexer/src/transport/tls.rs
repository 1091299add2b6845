//! The sidecar's certificates: sources (files in `static` and `file` mode, the pool's Secret in
//! Kubernetes) offer sets here; this puts them in force on both ports and for calls to peers
//! (`teifleet_runtime::tls`), logs and counts what happened, and reports what is served, and
//! whether it has expired since (one warning when it does, by a timer set to its end).
//!
//! The activator stands in for every pool of its namespace on one pair of ports: it serves each
//! pool with `spec.tls` that pool's own set, picked by the name the client asked for (SNI, one of
//! the names of the pool's Service), and plain text to clients that open in plain text
//! ([`PoolCertificates`]); and it calls the pool's replicas with the pool's set, as the pool's
//! sidecars call each other.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use teifleet_crds::{CertificateSummary, SidecarTls};
use teifleet_runtime::tls::{CertificateInfo, Loaded, Material, ServerNames, ServerTls};
use tokio::net::TcpStream;
use tokio::task::AbortHandle;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::vocab::SetupError;

/// Where the set in force came from, and how it went.
pub struct Certificates {
    tls: Arc<ServerTls>,
    reloads: IntCounterVec,
    expiry: IntGauge,
    /// The timer that says so when the certificate in force expires; replaced with the set.
    expiry_timer: Mutex<Option<AbortHandle>>,
}

/// The longest the expiry timer sleeps before it reads the wall clock again: the timer runs on
/// the monotonic clock, the certificate's end is on the wall clock, and the two drift apart (a
/// clock step, a suspended host) over weeks.
const EXPIRY_TIMER_NAP: Duration = Duration::from_secs(3600);

/// Returns once `certificate` has expired by the wall clock: sleeps until its end, in naps of at
/// most [`EXPIRY_TIMER_NAP`].
async fn until_expired(certificate: &CertificateInfo) {
    loop {
        let now = SystemTime::now();
        let Ok(left) = certificate.expires_at().duration_since(now) else { return };
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(EXPIRY_TIMER_NAP)).await;
    }
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
        Ok(Self { tls: Arc::new(ServerTls::off()), reloads, expiry, expiry_timer: Mutex::default() })
    }

    /// What the ports and the dialer read.
    pub fn tls(&self) -> &Arc<ServerTls> {
        &self.tls
    }

    /// Puts `material` (read from `from`) in force if it is valid, or says why not.
    fn offer_set(&self, material: &Material, from: &str) {
        match self.tls.offer(material) {
            Ok(info) => {
                self.reloads.with_label_values(&["applied"]).inc();
                self.expiry.set(info.not_after_unix);
                tracing::info!(from, serial = %info.serial, subject = %info.subject, not_after = %info.not_after, "TLS certificate in force");
                self.watch_expiry(info);
            }
            Err(error) => {
                self.reloads.with_label_values(&["rejected"]).inc();
                tracing::warn!(from, %error, "TLS certificate set rejected; the one before stays in force");
            }
        }
    }

    /// The source found nothing to offer (its Secret is missing): say so; what is in force stays
    /// (nothing, before a first set).
    fn missing_set(&self, why: String) {
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
        self.replace_expiry_timer(None);
        tracing::info!("TLS off: plain text");
    }

    /// Starts the timer that warns, once, when `certificate` (just put in force) expires while
    /// still in force; the timer of the set before goes. (The report checks the clock itself,
    /// at each asking: `ServerTls::report`.) Outside a Tokio runtime there is no timer.
    fn watch_expiry(&self, certificate: CertificateInfo) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let tls = self.tls.clone();
        let timer = runtime.spawn(async move {
            until_expired(&certificate).await;
            let still_in_force = tls.in_force().ok().flatten().is_some_and(|loaded| *loaded.info() == certificate);
            if still_in_force {
                tracing::warn!(
                    serial = %certificate.serial,
                    subject = %certificate.subject,
                    not_after = %certificate.not_after,
                    "the TLS certificate in force has expired: clients refuse it, so TLS handshakes fail until a renewed certificate is given"
                );
            }
        });
        self.replace_expiry_timer(Some(timer.abort_handle()));
    }

    fn replace_expiry_timer(&self, timer: Option<AbortHandle>) {
        let before = std::mem::replace(&mut *self.expiry_timer.lock().unwrap_or_else(PoisonError::into_inner), timer);
        if let Some(before) = before {
            before.abort();
        }
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        self.replace_expiry_timer(None);
    }
}

/// Where a source of certificate sets (files, a Secret) offers what it reads.
pub trait Offered: Send + Sync + 'static {
    /// Puts `material` (read from `from`) in force if it is valid, or says why not.
    fn offer(&self, material: &Material, from: &str);
    /// The source found nothing to offer (its Secret is missing): say so; what is in force stays
    /// (nothing, before a first set).
    fn missing(&self, why: String);
}

impl Offered for Certificates {
    fn offer(&self, material: &Material, from: &str) {
        self.offer_set(material, from);
    }

    fn missing(&self, why: String) {
        self.missing_set(why);
    }
}

/// The pool of `namespace` whose Service `server_name` names: `<pool>`, `<pool>.<namespace>`,
/// `<pool>.<namespace>.svc` or `<pool>.<namespace>.svc.<cluster domain>`, in any case.
pub fn pool_of_server_name(server_name: &str, namespace: &str) -> Option<String> {
    let name = server_name.trim_end_matches('.').to_ascii_lowercase();
    let mut labels = name.split('.');
    let pool = labels.next().filter(|pool| !pool.is_empty())?;
    match (labels.next(), labels.next()) {
        (None, _) => {}
        (Some(within), None | Some("svc")) if within == namespace => {}
        _ => return None,
    }
    Some(pool.to_owned())
}

/// The activator's sets: each pool with `spec.tls` its own, as its TLS Secret holds it.
#[derive(Debug)]
pub struct PoolCertificates {
    /// The namespace whose pools' Service names are served.
    namespace: String,
    pools: RwLock<BTreeMap<String, Arc<Loaded>>>,
    reloads: IntCounterVec,
}

impl PoolCertificates {
    /// No pool's set yet, for the pools of `namespace`; offers are counted with `certificates`'
    /// (`teifleet_tls_reloads_total`).
    pub fn new(namespace: impl Into<String>, certificates: &Certificates) -> Self {
        Self { namespace: namespace.into(), pools: RwLock::default(), reloads: certificates.reloads.clone() }
    }

    /// The namespace whose pools' Service names are served.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The pool whose Service `server_name` names (see [`pool_of_server_name`]).
    pub fn pool_named(&self, server_name: &str) -> Option<String> {
        pool_of_server_name(server_name, &self.namespace)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Loaded>>> {
        self.pools.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The set in force for `pool`.
    pub fn set_of(&self, pool: &str) -> Option<Arc<Loaded>> {
        self.read().get(pool).cloned()
    }

    /// How the activator calls `pool`'s replicas: trusting its Secret's `ca.crt` (the system's
    /// roots without one) and showing its own certificate, as its sidecars call each other.
    pub fn client(&self, pool: &str) -> Option<Arc<ClientConfig>> {
        self.set_of(pool).map(|loaded| loaded.client_config())
    }

    /// Puts `material` (read from `from`) in force for `pool`'s new handshakes if it is valid;
    /// otherwise the set before stays.
    pub fn offer(&self, pool: &str, material: &Material, from: &str) {
        match Loaded::check(material) {
            Ok(loaded) => {
                self.reloads.with_label_values(&["applied"]).inc();
                let info = loaded.info();
                tracing::info!(pool, from, serial = %info.serial, subject = %info.subject, not_after = %info.not_after, "the pool's TLS certificate in force");
                self.pools.write().unwrap_or_else(PoisonError::into_inner).insert(pool.to_owned(), Arc::new(loaded));
            }
            Err(error) => {
                self.reloads.with_label_values(&["rejected"]).inc();
                tracing::warn!(pool, from, %error, "the pool's TLS certificate set rejected; the one before stays in force");
            }
        }
    }

    /// `pool` serves no TLS here any more (its `spec.tls` went, or the pool did).
    pub fn remove(&self, pool: &str) {
        if self.pools.write().unwrap_or_else(PoisonError::into_inner).remove(pool).is_some() {
            tracing::info!(pool, "the pool's TLS certificate no longer served");
        }
    }

    /// What a source following `pool`'s Secret offers to.
    pub fn of_pool(self: &Arc<Self>, pool: &str) -> Arc<PoolSet> {
        Arc::new(PoolSet { certificates: self.clone(), pool: pool.to_owned() })
    }
}

impl ServerNames for PoolCertificates {
    fn pick(&self, server_name: Option<&str>) -> Option<Arc<Loaded>> {
        self.set_of(&self.pool_named(server_name?)?)
    }
}

/// One pool's place among the activator's sets, where the source following its Secret offers.
pub struct PoolSet {
    certificates: Arc<PoolCertificates>,
    pool: String,
}

impl Offered for PoolSet {
    fn offer(&self, material: &Material, from: &str) {
        self.certificates.offer(&self.pool, material, from);
    }

    fn missing(&self, why: String) {
        // The set in force stays: a Secret deleted in the middle of a rotation takes no pool down.
        tracing::warn!(pool = %self.pool, reason = %why, "no TLS certificate set to load for the pool");
    }
}

/// A TLS pool's replicas, as the activator calls them: one connection at a time (made to the
/// next ready replica in turn when there is none), in TLS with the pool's own set, verifying the
/// replica as the pool Service (`<pool>.<namespace>.svc`, what the pool's certificate names; the
/// replicas are reached by pod IP), as the pool's sidecars call each other. The replica that
/// takes the calls spreads what it cannot serve over its siblings, as any replica does.
pub struct TlsReplicas {
    channel: Channel,
    /// The ready replicas' addresses (`host:port`), shared with the channel's connector.
    addresses: Arc<RwLock<Vec<String>>>,
}

impl TlsReplicas {
    /// `pool`'s replicas, none ready yet; the set each connection is made with is the one in
    /// force in `certificates` when it is made, so a rotation reaches the next connection.
    pub fn new(pool: &str, certificates: &Arc<PoolCertificates>) -> Result<Self, SetupError> {
        let url = format!("https://{pool}.activated");
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| SetupError::InvalidUpstream { url, reason: e.to_string() })?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(1));
        let addresses: Arc<RwLock<Vec<String>>> = Arc::default();
        let next = Arc::new(AtomicUsize::new(0));
        let server_name = format!("{pool}.{}.svc", certificates.namespace());
        let (pool, dialled, certificates) = (pool.to_owned(), addresses.clone(), certificates.clone());
        let connector = tower::service_fn(move |_: Uri| {
            let address = {
                let addresses = dialled.read().unwrap_or_else(PoisonError::into_inner);
                let turn = next.fetch_add(1, Ordering::Relaxed);
                (!addresses.is_empty()).then(|| addresses[turn % addresses.len()].clone())
            };
            let (config, server_name) = (certificates.client(&pool), server_name.clone());
            async move {
                let address = address.ok_or_else(|| std::io::Error::other("the pool has no ready replica"))?;
                let config = config.ok_or_else(|| std::io::Error::other("the pool's TLS certificate is not loaded"))?;
                let name = ServerName::try_from(server_name).map_err(std::io::Error::other)?;
                let tcp = TcpStream::connect(address.as_str()).await?;
                tcp.set_nodelay(true)?;
                let stream = TlsConnector::from(config).connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        });
        Ok(Self { channel: endpoint.connect_with_connector_lazy(connector), addresses })
    }

    /// The channel to the replicas.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The ready replicas are the sidecars at `urls` (`https://host:port`) from now on.
    pub fn set_addresses(&self, urls: &BTreeSet<String>) {
        let addresses = urls.iter().map(|url| url.strip_prefix("https://").unwrap_or(url).to_owned()).collect();
        *self.addresses.write().unwrap_or_else(PoisonError::into_inner) = addresses;
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
        expired: report.expired,
    })
}

#[cfg(test)]
mod tests {
    use teifleet_testkit::certs::Authority;

    use super::*;

    fn pool_certificates() -> Arc<PoolCertificates> {
        let certificates = Certificates::new(&Registry::new()).unwrap();
        Arc::new(PoolCertificates::new("ml", &certificates))
    }

    fn material(ca: &Authority, names: &[&str]) -> (Material, String) {
        let issued = ca.server(names);
        let material = Material {
            chain: issued.chain_pem.clone().into(),
            key: issued.key_pem.clone().into(),
            ca: Some(ca.pem.clone().into()),
            client_ca: None,
        };
        (material, issued.serial)
    }

    #[test]
    fn a_server_name_is_one_of_a_pools_service_names_in_the_namespace() {
        let pools = pool_certificates();
        for name in ["bge", "bge.ml", "bge.ml.svc", "bge.ml.svc.cluster.local", "BGE.ML.SVC", "bge.ml.svc.example.org."]
        {
            assert_eq!(pools.pool_named(name).as_deref(), Some("bge"), "{name}");
        }
        for name in ["bge.other", "bge.other.svc", "bge.ml.pod", "bge.ml.svc2.cluster.local", "", ".ml.svc"] {
            assert_eq!(pools.pool_named(name), None, "{name}");
        }
    }

    #[test]
    fn each_pool_is_served_its_own_set_by_the_name_asked_for() {
        let pools = pool_certificates();
        let (bge_ca, gte_ca) = (Authority::new("bge CA"), Authority::new("gte CA"));
        let (bge, bge_serial) = material(&bge_ca, &["bge.ml.svc"]);
        let (gte, gte_serial) = material(&gte_ca, &["gte.ml.svc"]);
        pools.of_pool("bge").offer(&bge, "Secret bge-tls");
        pools.of_pool("gte").offer(&gte, "Secret gte-tls");
        let serial = |name: Option<&str>| pools.pick(name).map(|loaded| loaded.info().serial.clone());
        assert_eq!(serial(Some("bge.ml.svc")), Some(bge_serial.clone()));
        assert_eq!(serial(Some("bge")), Some(bge_serial.clone()));
        assert_eq!(serial(Some("gte.ml.svc.cluster.local")), Some(gte_serial));
        assert_eq!(serial(Some("plain.ml.svc")), None, "a pool without TLS");
        assert_eq!(serial(Some("bge.other.svc")), None, "another namespace's");
        assert_eq!(serial(None), None, "no name asked for");
        assert!(pools.client("bge").is_some() && pools.client("plain").is_none());

        // A renewal is in force for the next handshake; a broken set leaves the one in force; a
        // removed pool is served no more.
        let (renewed, renewed_serial) = material(&bge_ca, &["bge.ml.svc"]);
        pools.of_pool("bge").offer(&renewed, "Secret bge-tls");
        assert_eq!(serial(Some("bge.ml.svc")), Some(renewed_serial.clone()));
        assert_ne!(renewed_serial, bge_serial);
        let broken = Material { key: b"nonsense".to_vec(), ..bge };
        pools.of_pool("bge").offer(&broken, "Secret bge-tls");
        assert_eq!(serial(Some("bge.ml.svc")), Some(renewed_serial));
        pools.remove("bge");
        assert_eq!(serial(Some("bge.ml.svc")), None);
    }
}
