//! The activator role: the same multiplexer, run once per namespace beside pools that scale to
//! zero. While a pool has no ready replica, the operator points the pool's Service at the
//! activator (an EndpointSlice of its own beside the pool's); a call that lands here is held
//! until a replica of its pool is ready, then passed to one, as any call routed to another pool
//! is. The calls held are what tells the operator the pool is wanted ([`ActivatorReport`] on the
//! admin port), and it scales the pool up from zero.
//!
//! A call is held for at most its pool's `coldStartHold`, and never past its own deadline (the
//! forwarding path keeps that); then it gets UNAVAILABLE (503) with a retry hint. At most
//! `--max-held-per-pool` calls are held for one pool at once (their bodies are charged to the
//! process's memory budget by the fronts, like every request's); one more is refused at once
//! with a retry hint. A keyed pool's calls are checked against its keys before they are held.
//!
//! The activator runs as several replicas, each holding any pool's calls; none depends on
//! another. One that shuts down ([`Activations::stop_holding`], once its drain delay has given
//! the operator time to take it out of the pools' Services) answers every call it still holds
//! UNAVAILABLE with the same retry hint, so a client that retries reaches another replica; a call
//! whose pool became ready meanwhile is passed on and finishes.
//!
//! Which pool a call is for: `x-teifleet-pool` or `-model` when the call names one, else the
//! name the client dialled (gRPC's `:authority`, HTTP's `Host`): `<pool>`, `<pool>.<namespace>`,
//! `<pool>.<namespace>.svc[.cluster.local]`, with any port; or, when the client dialled an address
//! (`10.96.0.12:50051`, `[fd00::c]:8000`), the pool whose Service has that ClusterIP
//! ([`PoolNaming`], its addresses kept from the namespace's Services by the activator's watch).
//!
//! A pool with `spec.tls` is served here in TLS with its own certificate, picked by the name the
//! client asked for (`transport::tls::PoolCertificates`), and its held calls go to its replicas
//! in TLS, with its own set, as its sidecars call each other: trusting its `ca.crt`, verifying
//! the replica as the pool Service (`<pool>.<namespace>.svc`) and showing the pool's certificate.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Uri};
use teifleet_crds::{ActivatorReport, HeldCalls};
use teifleet_wire::headers::{MODEL, POOL};
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};

use teifleet_runtime::tls::ClientIdentity;

use crate::error::Error;
use crate::transport::tls::{PoolCertificates, TlsReplicas};
use crate::vocab::SetupError;

/// How many peer changes may wait for the balancer at once; more is a bug, not load.
const CHANGES_BUFFERED: usize = 1024;

/// Calls held at once for one pool by default: a burst at zero is a few hundred calls; more is a
/// flood, refused with a retry hint rather than held (each held call is a stream and its body).
pub const DEFAULT_MAX_HELD_PER_POOL: u32 = 1024;

/// The pools this activator holds calls for, each with its ready replicas.
pub struct Activations {
    pools: Mutex<BTreeMap<String, Activation>>,
    /// Woken whenever a pool's ready replicas change.
    peers_changed: Notify,
    /// Calls held at once for one pool; one more is refused with a retry hint.
    max_held_per_pool: u32,
    /// Set when this activator shuts down: no call is held any more (see [`Self::stop_holding`]).
    stopped: AtomicBool,
    /// The TLS pools' sets: their replicas are called in TLS with them.
    certificates: Option<Arc<PoolCertificates>>,
}

impl Default for Activations {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_HELD_PER_POOL)
    }
}

struct Activation {
    /// The longest a call is held while the pool has no ready replica.
    hold: Duration,
    /// Calls waiting now.
    held: u32,
    last_arrival: Option<Instant>,
    started: Instant,
    /// Every ready replica's sidecar, balanced.
    channel: Channel,
    changes: tokio::sync::mpsc::Sender<Change<String, Endpoint>>,
    /// The ready replicas now, by URL.
    peers: BTreeSet<String>,
    /// With `spec.tls`: the channel to its replicas in TLS, and the replicas it dials.
    tls: Option<TlsReplicas>,
}

impl Activation {
    fn new(hold: Duration) -> Self {
        let (channel, changes) = Channel::balance_channel(CHANGES_BUFFERED);
        let started = Instant::now();
        Self { hold, held: 0, last_arrival: None, started, channel, changes, peers: BTreeSet::new(), tls: None }
    }
}

/// A call held for its pool: counted while it lives.
pub struct Held<'a> {
    activations: &'a Activations,
    pool: String,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(activation) = self.activations.lock().get_mut(&self.pool) {
            activation.held = activation.held.saturating_sub(1);
        }
    }
}

impl Activations {
    /// Holding at most `max_held_per_pool` calls at once for each pool.
    pub fn new(max_held_per_pool: u32) -> Self {
        Self {
            pools: Mutex::default(),
            peers_changed: Notify::new(),
            max_held_per_pool,
            stopped: AtomicBool::new(false),
            certificates: None,
        }
    }

    /// Calling the replicas of pools with `spec.tls` in TLS, with their sets in `certificates`.
    pub fn with_certificates(mut self, certificates: Arc<PoolCertificates>) -> Self {
        self.certificates = Some(certificates);
        self
    }

    /// Whether `pool` serves TLS (its replicas are called in TLS, over a channel of their own);
    /// the replicas known so far are forgotten when that changes (they are named in the other
    /// scheme), until [`Self::set_peers`] names them again.
    pub fn set_tls(&self, pool: &str, tls: bool) -> Result<(), SetupError> {
        let mut activations = self.lock();
        let Some(activation) = activations.get_mut(pool) else { return Ok(()) };
        if activation.tls.is_some() == tls {
            return Ok(());
        }
        for gone in std::mem::take(&mut activation.peers) {
            let _ = activation.changes.try_send(Change::Remove(gone));
        }
        activation.tls = match (tls, &self.certificates) {
            (false, _) => None,
            (true, Some(certificates)) => Some(TlsReplicas::new(pool, certificates)?),
            (true, None) => {
                return Err(SetupError::Config(format!("pool {pool} serves TLS, and this activator serves none")));
            }
        };
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Activation>> {
        self.pools.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the pools activated exactly `pools` (name and hold); a pool that stays keeps its
    /// replicas and counts.
    pub fn sync(&self, pools: &[(String, Duration)]) {
        let mut activations = self.lock();
        activations.retain(|name, _| pools.iter().any(|(pool, _)| pool == name));
        for (pool, hold) in pools {
            activations.entry(pool.clone()).or_insert_with(|| Activation::new(*hold)).hold = *hold;
        }
    }

    /// The channel to `pool`'s ready replicas: balancing over them, or in TLS for a pool with
    /// `spec.tls` ([`Self::set_tls`]).
    pub fn channel(&self, pool: &str) -> Option<Channel> {
        self.lock().get(pool).map(|activation| match &activation.tls {
            Some(tls) => tls.channel(),
            None => activation.channel.clone(),
        })
    }

    /// `pool`'s ready replicas are the sidecars at `urls` from now on.
    pub fn set_peers(&self, pool: &str, urls: &[String]) -> Result<(), SetupError> {
        let mut activations = self.lock();
        let Some(activation) = activations.get_mut(pool) else { return Ok(()) };
        let wanted: BTreeSet<String> = urls.iter().cloned().collect();
        if let Some(tls) = &activation.tls {
            tls.set_addresses(&wanted);
            if activation.peers != wanted {
                tracing::info!(pool, ready = wanted.len(), "the pool's ready replicas changed");
            }
            activation.peers = wanted;
            drop(activations);
            self.peers_changed.notify_waiters();
            return Ok(());
        }
        for gone in activation.peers.difference(&wanted) {
            let _ = activation.changes.try_send(Change::Remove(gone.clone()));
        }
        for new in wanted.difference(&activation.peers) {
            let endpoint = Endpoint::from_shared(new.clone())
                .map_err(|e| SetupError::InvalidUpstream { url: new.clone(), reason: e.to_string() })?
                .tcp_nodelay(true)
                .connect_timeout(Duration::from_secs(1));
            let _ = activation.changes.try_send(Change::Insert(new.clone(), endpoint));
        }
        if activation.peers != wanted {
            tracing::info!(pool, ready = wanted.len(), "the pool's ready replicas changed");
        }
        activation.peers = wanted;
        drop(activations);
        self.peers_changed.notify_waiters();
        Ok(())
    }

    fn has_peers(&self, pool: &str) -> bool {
        self.lock().get(pool).is_some_and(|activation| !activation.peers.is_empty())
    }

    /// Stops holding calls, for good (the process is shutting down): each call held now whose
    /// pool still has no ready replica is answered at once as a hold that ran out (UNAVAILABLE,
    /// 503, with the retry hint), and so is each call that arrives from now on for such a pool. A
    /// client that retries reaches another activator replica, or the pool once it is ready; a
    /// pool with a ready replica still gets its calls passed on.
    pub fn stop_holding(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.peers_changed.notify_waiters();
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Counts a call for `pool`, and, while the pool has no ready replica, holds it until one
    /// is (or its hold runs out: UNAVAILABLE with a retry hint). `None`: not an activated pool.
    pub async fn wait_for_replica(&self, pool: &str) -> Option<Result<(), Error>> {
        let hold = {
            let mut activations = self.lock();
            let activation = activations.get_mut(pool)?;
            activation.last_arrival = Some(Instant::now());
            if !activation.peers.is_empty() {
                return Some(Ok(()));
            }
            if self.stopped() {
                return Some(Err(Error::ColdStart { pool: pool.to_owned(), waited: Duration::ZERO }));
            }
            if activation.held >= self.max_held_per_pool {
                let limit = u64::from(self.max_held_per_pool);
                return Some(Err(Error::HoldsFull { pool: pool.to_owned(), what: "calls", limit }));
            }
            activation.held += 1;
            activation.hold
        };
        let _held = Held { activations: self, pool: pool.to_owned() };
        let started = Instant::now();
        // Ready: a replica is (`true`), or this activator stopped holding (`false`).
        let ready = async {
            loop {
                // Registered before the checks: a change or a stop between them still wakes it.
                let changed = self.peers_changed.notified();
                if self.has_peers(pool) {
                    return true;
                }
                if self.stopped() {
                    return false;
                }
                changed.await;
            }
        };
        Some(match tokio::time::timeout(hold, ready).await {
            Ok(true) => {
                tracing::debug!(pool, waited_ms = started.elapsed().as_millis() as u64, "held call released");
                Ok(())
            }
            Ok(false) => {
                tracing::debug!(
                    pool,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "held call let go: shutting down"
                );
                Err(Error::ColdStart { pool: pool.to_owned(), waited: started.elapsed() })
            }
            Err(_) => Err(Error::ColdStart { pool: pool.to_owned(), waited: hold }),
        })
    }

    /// What the operator reads.
    pub fn report(&self) -> ActivatorReport {
        let now = Instant::now();
        let activations = self.lock();
        let pools = activations.iter().map(|(pool, activation)| HeldCalls {
            pool: pool.clone(),
            held: activation.held,
            idle_seconds: now.duration_since(activation.last_arrival.unwrap_or(activation.started)).as_secs_f64(),
        });
        ActivatorReport { pools: pools.collect() }
    }
}

/// How the activator names the pool of a call that names none: from what its client dialled,
/// among the pools of its namespace. One per activator, shared by both fronts (which read it for
/// every call) and the Services' watch (which keeps the pools' addresses current).
#[derive(Debug)]
pub struct PoolNaming {
    namespace: String,
    /// The pools' Service addresses (ClusterIPs), canonical, each with its pool.
    addresses: RwLock<BTreeMap<IpAddr, String>>,
    /// The pools with mutual TLS, each with its model: their calls are passed on only from a
    /// connection whose client certificate their client CA checked.
    mutual: RwLock<BTreeMap<String, Option<String>>>,
}

impl PoolNaming {
    /// Naming the pools of `namespace`; no address leads to a pool until [`Self::set_addresses`].
    pub fn new(namespace: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), addresses: RwLock::default(), mutual: RwLock::default() }
    }

    /// From now on the pools in `mutual` (each with its model) take calls only from clients whose
    /// certificate their own client CA checked ([`Self::name_pool_for`]).
    pub fn set_mutual(&self, mutual: BTreeMap<String, Option<String>>) {
        *self.mutual.write().unwrap_or_else(PoisonError::into_inner) = mutual;
    }

    /// [`Self::name_pool`] for a call on a connection whose client showed `client`: a connection
    /// in TLS whose certificate a pool's client CA checked (the activator picked that pool's set by
    /// the name the client asked for) names that pool for a call that names none; and a call for
    /// a pool with mutual TLS is refused unless it came on such a connection for that very pool.
    /// Its tenant is the certificate's (the gate names it), and the pool's replicas believe it
    /// from the activator, which calls them as one of their siblings.
    pub fn name_pool_for(
        &self,
        headers: &mut HeaderMap,
        uri: &Uri,
        client: Option<&ClientIdentity>,
    ) -> Result<(), Error> {
        let served = client
            .and_then(|client| client.served.as_deref())
            .and_then(|name| crate::transport::tls::pool_of_server_name(name, &self.namespace));
        match &served {
            Some(pool) if !headers.contains_key(POOL) && !headers.contains_key(MODEL) => {
                if let Ok(value) = HeaderValue::from_str(pool) {
                    headers.insert(POOL, value);
                }
            }
            _ => self.name_pool(headers, uri),
        }
        let mutual = self.mutual.read().unwrap_or_else(PoisonError::into_inner);
        let named = |header| headers.get(header).and_then(|value: &HeaderValue| value.to_str().ok());
        let wanted = match (named(POOL), named(MODEL)) {
            (Some(pool), _) => mutual.get_key_value(pool).map(|(pool, _)| pool),
            (None, Some(model)) => {
                mutual.iter().find(|(_, served_model)| served_model.as_deref() == Some(model)).map(|(pool, _)| pool)
            }
            (None, None) => None,
        };
        match wanted {
            Some(pool) if served.as_ref() != Some(pool) => Err(Error::CertificateRequired { pool: pool.clone() }),
            _ => Ok(()),
        }
    }

    /// The namespace whose pools are named.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// From now on a call to an address in `addresses` that names no pool is for the pool given
    /// there (the pools whose Services have those ClusterIPs); an empty map forgets them all.
    pub fn set_addresses(&self, addresses: BTreeMap<IpAddr, String>) {
        let addresses = addresses.into_iter().map(|(address, pool)| (address.to_canonical(), pool)).collect();
        *self.addresses.write().unwrap_or_else(PoisonError::into_inner) = addresses;
    }

    /// The pool whose Service has the address `address`.
    fn pool_at(&self, address: IpAddr) -> Option<String> {
        self.addresses.read().unwrap_or_else(PoisonError::into_inner).get(&address.to_canonical()).cloned()
    }

    /// Names the pool a call is for from the name its client dialled, or the pool Service address
    /// it dialled, unless it names one itself.
    pub fn name_pool(&self, headers: &mut HeaderMap, uri: &Uri) {
        if headers.contains_key(POOL) || headers.contains_key(MODEL) {
            return;
        }
        let Some(host) = dialled_host(headers, uri) else { return };
        let pool = match address_of(&host) {
            Some(address) => match self.pool_at(address) {
                Some(pool) => pool,
                // Not a pool's Service address (the activator's own pod address, say): the call
                // names no pool, and is not found (`Error::NoPoolNamed`).
                None => return,
            },
            None if host.starts_with('[') => return,
            None => {
                let mut labels = host.split('.');
                let Some(pool) = labels.next() else { return };
                if let Some(other) = labels.next()
                    && other != self.namespace
                {
                    return;
                }
                pool.to_owned()
            }
        };
        if let Ok(value) = HeaderValue::from_str(&pool) {
            headers.insert(POOL, value);
        }
    }
}

/// What the client dialled: the URI's authority (gRPC, HTTP/2) or the `Host` header (HTTP/1.1),
/// without its port; an IPv6 address keeps its brackets when it had them.
fn dialled_host(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    if let Some(authority) = uri.authority() {
        return Some(authority.host().to_owned());
    }
    let host = headers.get(http::header::HOST)?.to_str().ok()?.trim();
    // An IPv6 address without brackets (and so without a port): its last group is no port.
    if host.parse::<IpAddr>().is_ok() {
        return Some(host.to_owned());
    }
    if let Some(bracketed) = host.strip_prefix('[') {
        let (address, _port) = bracketed.split_once(']')?;
        return Some(format!("[{address}]"));
    }
    Some(
        host.rsplit_once(':')
            .map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
            .to_owned(),
    )
}

/// The address `host` is, with or without brackets; `None` for a name.
fn address_of(host: &str) -> Option<IpAddr> {
    let bare = host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')).unwrap_or(host);
    bare.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_named(uri: &str, host: Option<&str>) -> Option<String> {
        pool_named_by(&PoolNaming::new("ml"), uri, host)
    }

    fn pool_named_by(naming: &PoolNaming, uri: &str, host: Option<&str>) -> Option<String> {
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(http::header::HOST, host.parse().unwrap());
        }
        naming.name_pool(&mut headers, &uri.parse().unwrap());
        headers.get(POOL).map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn a_pool_is_the_one_whose_service_address_the_client_dialled() {
        let naming = PoolNaming::new("ml");
        naming.set_addresses(BTreeMap::from([
            ("10.96.0.12".parse().unwrap(), "bge".to_owned()),
            ("fd00:10:96::c".parse().unwrap(), "bge".to_owned()),
            ("10.96.0.13".parse().unwrap(), "gte".to_owned()),
        ]));
        let named = |uri: &str, host: Option<&str>| pool_named_by(&naming, uri, host);
        assert_eq!(named("http://10.96.0.12:50051/tei.v1.Embed/Embed", None).as_deref(), Some("bge"));
        assert_eq!(named("http://10.96.0.13/x", None).as_deref(), Some("gte"), "any port, or none");
        assert_eq!(named("http://[fd00:10:96::c]:50051/x", None).as_deref(), Some("bge"), "IPv6");
        assert_eq!(named("/embed", Some("10.96.0.13:8000")).as_deref(), Some("gte"));
        assert_eq!(named("/embed", Some("10.96.0.12")).as_deref(), Some("bge"));
        assert_eq!(named("/embed", Some("[fd00:10:96::c]:8000")).as_deref(), Some("bge"), "bracketed, a port");
        assert_eq!(named("/embed", Some("[fd00:10:96::c]")).as_deref(), Some("bge"), "bracketed");
        assert_eq!(named("/embed", Some("fd00:10:96::c")).as_deref(), Some("bge"), "bare: no port to strip");
        assert_eq!(named("/embed", Some("fd00:10:96:0:0:0:0:c")).as_deref(), Some("bge"), "written out");
        assert_eq!(named("/embed", Some("[::ffff:10.96.0.12]:8000")).as_deref(), Some("bge"), "IPv4 as IPv6");
        assert_eq!(named("http://10.96.0.99:50051/x", None), None, "no pool's address");
        assert_eq!(named("/embed", Some("[fd00:10:96::d]:8000")), None, "no pool's address");
        assert_eq!(pool_named("http://10.96.0.12:50051/x", None), None, "another activator's addresses");
        assert_eq!(named("http://bge:50051/x", None).as_deref(), Some("bge"), "names still name");
        let mut named_call = HeaderMap::new();
        named_call.insert(POOL, "gte".parse().unwrap());
        naming.name_pool(&mut named_call, &"http://10.96.0.12/x".parse().unwrap());
        assert_eq!(named_call.get(POOL).unwrap(), "gte", "a pool the call names wins");

        naming.set_addresses(BTreeMap::from([("10.96.0.13".parse().unwrap(), "bge".to_owned())]));
        assert_eq!(named("http://10.96.0.12/x", None), None, "a Service gone takes its address along");
        assert_eq!(named("http://10.96.0.13/x", None).as_deref(), Some("bge"), "an address handed on");
        naming.set_addresses(BTreeMap::new());
        assert_eq!(named("http://10.96.0.13/x", None), None);
    }

    #[test]
    fn the_pool_is_the_name_the_client_dialled() {
        assert_eq!(pool_named("http://bge:50051/tei.v1.Embed/Embed", None).as_deref(), Some("bge"));
        assert_eq!(pool_named("http://bge.ml.svc.cluster.local/x", None).as_deref(), Some("bge"));
        assert_eq!(pool_named("/embed", Some("bge.ml:8000")).as_deref(), Some("bge"));
        assert_eq!(pool_named("/embed", Some("bge.ml.svc")).as_deref(), Some("bge"));
        assert_eq!(pool_named("http://bge.other.svc/x", None), None, "another namespace's name");
        assert_eq!(pool_named("http://10.0.0.7:50051/x", None), None, "an address no pool's Service has names nothing");
        let mut named = HeaderMap::new();
        named.insert(POOL, "gte".parse().unwrap());
        PoolNaming::new("ml").name_pool(&mut named, &"http://bge/x".parse().unwrap());
        assert_eq!(named.get(POOL).unwrap(), "gte", "a pool the call names wins");
    }

    #[test]
    fn a_pool_with_mutual_tls_takes_only_calls_whose_certificate_it_checked() {
        let naming = PoolNaming::new("ml");
        naming.set_mutual(BTreeMap::from([("secure".to_owned(), Some("org/secure".to_owned()))]));
        let certified =
            |served: &str| ClientIdentity { name: "search".into(), sibling: false, served: Some(served.into()) };
        let call = |uri: &str, headers: &[(&'static str, &str)], client: Option<&ClientIdentity>| {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, value.parse().unwrap());
            }
            let named = naming.name_pool_for(&mut map, &uri.parse().unwrap(), client);
            named.map(|()| map.get(POOL).map(|v| v.to_str().unwrap().to_owned()))
        };
        let refused = |result: Result<Option<String>, Error>| match result {
            Err(Error::CertificateRequired { pool }) => pool,
            other => panic!("not refused: {other:?}"),
        };

        // Checked for the pool: held for it, named by the server name when the call names none
        // (whatever address it dialled).
        let secure = certified("secure.ml.svc");
        assert_eq!(call("http://secure.ml.svc/x", &[], Some(&secure)).unwrap().as_deref(), Some("secure"));
        assert_eq!(call("http://10.0.0.7:50051/x", &[], Some(&secure)).unwrap().as_deref(), Some("secure"));
        assert_eq!(call("/x", &[(POOL, "secure")], Some(&secure)).unwrap().as_deref(), Some("secure"));
        assert!(call("/x", &[(MODEL, "org/secure")], Some(&secure)).is_ok());

        // Not checked for it: in plain text (by name, address-less header or model), or with a
        // certificate another pool's client CA checked, or on a port with one set.
        assert_eq!(refused(call("http://secure.ml.svc/x", &[], None)), "secure");
        assert_eq!(refused(call("/x", &[(POOL, "secure")], None)), "secure");
        assert_eq!(refused(call("/x", &[(MODEL, "org/secure")], None)), "secure");
        let other = certified("other.ml.svc");
        assert_eq!(refused(call("http://other.ml.svc/x", &[(POOL, "secure")], Some(&other))), "secure");
        let unnamed = ClientIdentity { served: None, ..secure.clone() };
        assert_eq!(refused(call("http://secure.ml.svc/x", &[], Some(&unnamed))), "secure");

        // Other pools are as before, from any connection.
        assert_eq!(call("http://bge.ml.svc/x", &[], None).unwrap().as_deref(), Some("bge"));
        assert_eq!(call("/x", &[(POOL, "bge")], Some(&secure)).unwrap().as_deref(), Some("bge"));
    }

    #[tokio::test]
    async fn calls_past_the_pools_cap_are_refused_with_a_retry_hint_not_held() {
        let activations = std::sync::Arc::new(Activations::new(2));
        activations.sync(&[("bge".into(), Duration::from_secs(10))]);
        let held: Vec<_> = (0..2)
            .map(|_| {
                let activations = activations.clone();
                tokio::spawn(async move { activations.wait_for_replica("bge").await })
            })
            .collect();
        while activations.report().pools[0].held < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let refused = activations.wait_for_replica("bge").await.unwrap().unwrap_err();
        assert!(matches!(refused, Error::HoldsFull { limit: 2, .. }), "{refused}");
        assert!(refused.retry_after().is_some());
        assert_eq!(activations.report().pools[0].held, 2, "the refused call was never counted as held");
        activations.set_peers("bge", &["http://10.0.0.5:50051".into()]).unwrap();
        for call in held {
            assert!(call.await.unwrap().unwrap().is_ok());
        }
    }

    #[tokio::test]
    async fn a_call_is_held_until_a_replica_is_ready_or_its_hold_runs_out() {
        let activations = std::sync::Arc::new(Activations::default());
        activations.sync(&[("bge".into(), Duration::from_millis(200))]);
        assert!(activations.wait_for_replica("other").await.is_none(), "not an activated pool");
        let expired = activations.wait_for_replica("bge").await.unwrap().unwrap_err();
        assert!(matches!(expired, Error::ColdStart { .. }), "{expired}");

        activations.sync(&[("bge".into(), Duration::from_secs(10))]);
        let waiting = tokio::spawn({
            let activations = activations.clone();
            async move { activations.wait_for_replica("bge").await }
        });
        while activations.report().pools[0].held == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        activations.set_peers("bge", &["http://10.0.0.5:50051".into()]).unwrap();
        assert!(waiting.await.unwrap().unwrap().is_ok());
        let report = activations.report();
        assert_eq!((report.pools[0].held, report.pools[0].idle_seconds < 1.0), (0, true));
        assert!(activations.wait_for_replica("bge").await.unwrap().is_ok(), "a ready pool holds nothing");
    }

    #[tokio::test]
    async fn an_activator_that_stops_holding_answers_its_held_calls_at_once_and_passes_on_a_ready_pools() {
        let activations = std::sync::Arc::new(Activations::default());
        activations.sync(&[("bge".into(), Duration::from_secs(60)), ("gte".into(), Duration::from_secs(60))]);
        activations.set_peers("gte", &["http://10.0.0.6:50051".into()]).unwrap();
        let held: Vec<_> = (0..3)
            .map(|_| {
                let activations = activations.clone();
                tokio::spawn(async move { activations.wait_for_replica("bge").await })
            })
            .collect();
        while activations.report().pools[0].held < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        activations.stop_holding();
        for call in held {
            let answer = tokio::time::timeout(Duration::from_secs(1), call).await.expect("answered at once");
            let refused = answer.unwrap().unwrap().unwrap_err();
            assert!(matches!(refused, Error::ColdStart { .. }), "{refused}");
            assert!(refused.retry_after().is_some(), "with the retry hint");
        }
        assert_eq!(activations.report().pools[0].held, 0);
        let late = activations.wait_for_replica("bge").await.unwrap().unwrap_err();
        assert!(matches!(late, Error::ColdStart { .. }), "a call after the stop is not held: {late}");
        assert_eq!(activations.report().pools[0].held, 0);
        assert!(activations.wait_for_replica("gte").await.unwrap().is_ok(), "a ready pool's call still goes on");
    }
}
