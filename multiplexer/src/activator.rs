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
//! Which pool a call is for: `x-teifleet-pool` or `-model` when the call names one, else the
//! name the client dialled (gRPC's `:authority`, HTTP's `Host`): `<pool>`, `<pool>.<namespace>`,
//! `<pool>.<namespace>.svc[.cluster.local]`, with any port. A client that dialled an IP address
//! must name its pool in metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Uri};
use teifleet_crds::{ActivatorReport, HeldCalls};
use teifleet_wire::headers::{MODEL, POOL};
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};

use crate::error::Error;
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
    /// The replicas `channel` balances over now, by URL.
    peers: BTreeSet<String>,
}

impl Activation {
    fn new(hold: Duration) -> Self {
        let (channel, changes) = Channel::balance_channel(CHANGES_BUFFERED);
        let started = Instant::now();
        Self { hold, held: 0, last_arrival: None, started, channel, changes, peers: BTreeSet::new() }
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
        Self { pools: Mutex::default(), peers_changed: Notify::new(), max_held_per_pool }
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

    /// The channel balancing over `pool`'s ready replicas.
    pub fn channel(&self, pool: &str) -> Option<Channel> {
        self.lock().get(pool).map(|activation| activation.channel.clone())
    }

    /// `pool`'s ready replicas are the sidecars at `urls` from now on.
    pub fn set_peers(&self, pool: &str, urls: &[String]) -> Result<(), SetupError> {
        let mut activations = self.lock();
        let Some(activation) = activations.get_mut(pool) else { return Ok(()) };
        let wanted: BTreeSet<String> = urls.iter().cloned().collect();
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
            if activation.held >= self.max_held_per_pool {
                let limit = u64::from(self.max_held_per_pool);
                return Some(Err(Error::HoldsFull { pool: pool.to_owned(), what: "calls", limit }));
            }
            activation.held += 1;
            activation.hold
        };
        let _held = Held { activations: self, pool: pool.to_owned() };
        let started = Instant::now();
        let ready = async {
            loop {
                let changed = self.peers_changed.notified();
                if self.has_peers(pool) {
                    return;
                }
                changed.await;
            }
        };
        Some(match tokio::time::timeout(hold, ready).await {
            Ok(()) => {
                tracing::debug!(pool, waited_ms = started.elapsed().as_millis() as u64, "held call released");
                Ok(())
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

/// Names the pool a call is for from the name its client dialled, unless it names one itself.
pub fn name_pool_from_authority(headers: &mut HeaderMap, uri: &Uri, namespace: &str) {
    if headers.contains_key(POOL) || headers.contains_key(MODEL) {
        return;
    }
    let host = uri.authority().map(|a| a.host().to_owned()).or_else(|| {
        let host = headers.get(http::header::HOST)?.to_str().ok()?;
        Some(
            host.rsplit_once(':')
                .map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
                .to_owned(),
        )
    });
    let Some(host) = host else { return };
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return;
    }
    let mut labels = host.split('.');
    let Some(pool) = labels.next() else { return };
    if let Some(other) = labels.next()
        && other != namespace
    {
        return;
    }
    if let Ok(value) = HeaderValue::from_str(pool) {
        headers.insert(POOL, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_named(uri: &str, host: Option<&str>) -> Option<String> {
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(http::header::HOST, host.parse().unwrap());
        }
        name_pool_from_authority(&mut headers, &uri.parse().unwrap(), "ml");
        headers.get(POOL).map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn the_pool_is_the_name_the_client_dialled() {
        assert_eq!(pool_named("http://bge:50051/tei.v1.Embed/Embed", None).as_deref(), Some("bge"));
        assert_eq!(pool_named("http://bge.ml.svc.cluster.local/x", None).as_deref(), Some("bge"));
        assert_eq!(pool_named("/embed", Some("bge.ml:8000")).as_deref(), Some("bge"));
        assert_eq!(pool_named("/embed", Some("bge.ml.svc")).as_deref(), Some("bge"));
        assert_eq!(pool_named("http://bge.other.svc/x", None), None, "another namespace's name");
        assert_eq!(pool_named("http://10.0.0.7:50051/x", None), None, "an address names nothing");
        let mut named = HeaderMap::new();
        named.insert(POOL, "gte".parse().unwrap());
        name_pool_from_authority(&mut named, &"http://bge/x".parse().unwrap(), "ml");
        assert_eq!(named.get(POOL).unwrap(), "gte", "a pool the call names wins");
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
}
