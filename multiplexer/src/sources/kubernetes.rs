//! Kubernetes mode: the EmbeddingPools of the namespace, watched. This replica's own pool is
//! served by the TEI beside it, with the per-replica shares the operator publishes in status;
//! every other pool is reachable through its Service, for `x-teifleet-pool`/`-model` routing.
//! The own pool's `spec.auth` says which Secret's keys the gate enforces (`super::secret`), and,
//! with `spec.grpc.reflection`, whether the gRPC port serves reflection; `spec.tls`, whether calls
//! that came in TLS may be routed to pools in plain text.

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use teifleet_crds::{EmbeddingPool, Shares, TlsSpec, split_budget};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::budget;
use crate::admission::Limits;
use crate::cache::CacheSettings;
use crate::forward::pools::{PoolSpec, PoolTable};
use crate::front::grpc::reflection::Reflection;
use crate::gate::auth::{Gate, Policy, grants_of};
use crate::transport::tls::Certificates;

use teifleet_wire::ports::MULTIPLEXER_GRPC as POOL_SERVICE_PORT;

/// This replica's limits for a pool: the shares in its status, or, before the operator has
/// published any, the budget split over the desired replicas.
pub fn limits_of(pool: &EmbeddingPool) -> Option<Limits> {
    let budget = &pool.spec.concurrency;
    let share = match pool.status.as_ref().and_then(|s| s.admission) {
        Some(shares) => Shares {
            in_flight_per_replica: shares.in_flight_per_replica,
            queued_per_replica: shares.queued_per_replica,
            split_over: shares.split_over_replicas,
        },
        None => split_budget(budget, 0, pool.spec.replicas.unwrap_or(1)),
    };
    budget::limits(budget, &share).ok()
}

/// The routing table's view of the namespace's pools.
pub fn specs(pools: &[Arc<EmbeddingPool>], namespace: &str, own: &str, own_upstream: &str) -> Vec<PoolSpec> {
    pools
        .iter()
        .filter(|pool| pool.metadata.deletion_timestamp.is_none())
        .map(|pool| {
            let name = pool.name_any();
            let local = name == own;
            PoolSpec {
                upstream: if local {
                    own_upstream.to_owned()
                } else {
                    let scheme = if pool.spec.tls.is_some() { "https" } else { "http" };
                    format!("{scheme}://{name}.{namespace}.svc:{POOL_SERVICE_PORT}")
                },
                model: Some(pool.spec.model.id.clone()),
                // The share of a time-sliced GPU is the TEI beside this sidecar's: its batch times
                // are what say a neighbour is busy.
                limits: limits_of(pool).map(|limits| match local {
                    true => Limits { gpu_share: budget::gpu_share(&pool.spec.gpu), ..limits },
                    false => limits,
                }),
                remote: !local,
                coalesce: pool.spec.coalesce,
                tenants: budget::tenants(&pool.spec.concurrency),
                cache: if local { cache_of(pool) } else { None },
                name,
            }
        })
        .collect()
}

/// The own pool's cache settings. A `spec.cache` the sidecar cannot run (which the API server's
/// validation should have refused) is logged and leaves the pool without a cache: calls are
/// served either way.
fn cache_of(pool: &EmbeddingPool) -> Option<CacheSettings> {
    let spec = pool.spec.cache.as_ref()?;
    let model = &pool.spec.model;
    let args = format!(
        "model={};revision={};pooling={:?};dtype={:?}",
        model.id,
        model.revision.as_deref().unwrap_or(""),
        model.pooling,
        model.dtype
    );
    let password = std::env::var(crate::cache::settings::PASSWORD_ENV).ok();
    crate::cache::settings::from_spec(spec, args, password)
        .inspect_err(|problem| tracing::warn!(pool = %pool.name_any(), problem, "spec.cache not used"))
        .ok()
        .flatten()
}

/// The Secret of the own pool's API keys, while `spec.auth` names one.
pub fn keys_secret_of(pool: &EmbeddingPool) -> Option<String> {
    pool.spec.auth.as_ref().map(|auth| auth.secret_name.clone())
}

/// What a source follows from the own pool's spec (a Secret's name, a TLS spec) and the watch it
/// started for it.
struct Following<T> {
    /// What is followed now and the token that ends its watch; none: nothing to watch.
    watching: Option<(T, CancellationToken)>,
    /// Whether the pool has been seen at all.
    seen: bool,
}

impl<T: PartialEq> Following<T> {
    fn new() -> Self {
        Self { watching: None, seen: false }
    }

    /// Whether `wanted` is news; if it is, the previous watch has ended.
    fn changes_to(&mut self, wanted: Option<&T>) -> bool {
        if self.seen && self.watching.as_ref().map(|(followed, _)| followed) == wanted {
            return false;
        }
        self.seen = true;
        if let Some((_, previous)) = self.watching.take() {
            previous.cancel();
        }
        true
    }

    /// A token for the watch of `followed`, ended with `stop` or when the spec moves on.
    fn watch(&mut self, followed: T, stop: &CancellationToken) -> CancellationToken {
        let token = stop.child_token();
        self.watching = Some((followed, token.clone()));
        token
    }
}

/// The watch of the own pool's key Secret, following the pool's `spec.auth`. Until the pool has
/// been seen the gate refuses every call.
struct KeysSource {
    client: Client,
    namespace: String,
    gate: Arc<Gate>,
    stop: CancellationToken,
    following: Following<String>,
}

impl KeysSource {
    fn follow(&mut self, secret: Option<String>) {
        if !self.following.changes_to(secret.as_ref()) {
            return;
        }
        match secret {
            None => {
                tracing::info!("spec.auth unset: calls need no API key");
                self.gate.set(Policy::Off);
            }
            Some(name) => {
                tracing::info!(secret = %name, "spec.auth: calls need an API key from this Secret");
                // Refuse everything until the Secret is read: never open while it loads.
                self.gate.set(Policy::Waiting);
                let stop = self.following.watch(name.clone(), &self.stop);
                let (client, namespace, gate) = (self.client.clone(), self.namespace.clone(), self.gate.clone());
                tokio::spawn(super::secret::watch(client, namespace, name, gate, stop));
            }
        }
    }
}

/// The watch of the own pool's certificate set, following the pool's `spec.tls`.
struct TlsSource {
    client: Client,
    namespace: String,
    certificates: Arc<Certificates>,
    /// Whether the own pool serves TLS, for the siblings' source (their URLs' scheme).
    serves_tls: watch::Sender<bool>,
    stop: CancellationToken,
    /// None followed: plain text.
    following: Following<TlsSpec>,
}

impl TlsSource {
    fn follow(&mut self, spec: Option<TlsSpec>) {
        if !self.following.changes_to(spec.as_ref()) {
            return;
        }
        self.serves_tls.send_replace(spec.is_some());
        match spec {
            None => self.certificates.turn_off(),
            Some(spec) => {
                tracing::info!(secret = %spec.secret_name, mutual = spec.client_ca.is_some(), "spec.tls: serving TLS");
                // Never plain text once TLS is asked for; a set in force stays until the new one is read.
                if self.certificates.tls().in_force().is_ok_and(|loaded| loaded.is_none()) {
                    self.certificates.tls().wait();
                }
                let stop = self.following.watch(spec.clone(), &self.stop);
                let (client, namespace) = (self.client.clone(), self.namespace.clone());
                tokio::spawn(super::tls_secret::watch(client, namespace, spec, self.certificates.clone(), stop));
            }
        }
    }
}

/// What the sidecar serves of the own pool, kept in step with its EmbeddingPool.
pub struct OwnPool {
    pub name: String,
    /// The TEI beside the sidecar.
    pub upstream: String,
    pub gate: Arc<Gate>,
    pub certificates: Arc<Certificates>,
    /// Told whether the pool serves TLS (`spec.tls`), as it changes.
    pub serves_tls: watch::Sender<bool>,
    /// Whether the gRPC port serves reflection (`spec.grpc.reflection`, off with `spec.auth`).
    pub reflection: Arc<Reflection>,
}

/// Watches the namespace's EmbeddingPools and keeps `table` and the own pool's key gate and
/// certificates in step until `stop`.
pub async fn watch(client: Client, namespace: String, own: OwnPool, table: Arc<PoolTable>, stop: CancellationToken) {
    let OwnPool { name: own, upstream: own_upstream, gate, certificates, serves_tls, reflection } = own;
    let api: Api<EmbeddingPool> = Api::namespaced(client.clone(), &namespace);
    let mut tls = TlsSource {
        client: client.clone(),
        namespace: namespace.clone(),
        certificates,
        serves_tls,
        stop: stop.clone(),
        following: Following::new(),
    };
    let mut keys =
        KeysSource { client, namespace: namespace.clone(), gate, stop: stop.clone(), following: Following::new() };
    let (reader, writer) = reflector::store();
    let events = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    let mut events = std::pin::pin!(events.take_until(stop.cancelled_owned()));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                let pools = reader.state();
                // The gate before the table: the pool must not become routable before its keys
                // are enforced. A deleted own pool keeps the keys last in force.
                if let Some(pool) = pools.iter().find(|pool| pool.name_any() == own) {
                    keys.follow(keys_secret_of(pool));
                    keys.gate.set_grants(grants_of(&pool.spec.concurrency.tenants));
                    // The certificate's watch follows what names certificates: allowing routes
                    // in plain text starts no new one.
                    let certificate = |tls: &TlsSpec| TlsSpec { allow_plaintext_routes: false, ..tls.clone() };
                    tls.follow(pool.spec.tls.as_ref().map(certificate));
                    table.allow_plaintext_routes(pool.spec.allows_plaintext_routes());
                    reflection.serve(pool.spec.grpc_reflection());
                }
                let specs = specs(&pools, &namespace, &own, &own_upstream);
                if let Err(error) = table.sync(specs) {
                    tracing::warn!(%error, "could not apply the namespace's pools");
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "EmbeddingPool watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderMap;
    use serde_json::json;

    use super::*;
    use crate::gate::auth::AuthFailure;
    use crate::vocab::Protocol;

    /// A client for an address where nothing listens: the watches it starts fail and retry.
    fn unreachable_client() -> Client {
        Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap()
    }

    #[tokio::test]
    async fn the_gate_follows_the_pools_auth_from_waiting_to_off_or_to_its_secret() {
        let gate = Arc::new(Gate::new("bge", &prometheus::Registry::new(), Policy::Waiting).unwrap());
        let stop = CancellationToken::new();
        let mut keys = KeysSource {
            client: unreachable_client(),
            namespace: "ml".into(),
            gate: gate.clone(),
            stop: stop.clone(),
            following: Following::new(),
        };
        let admit = || gate.admit(&mut HeaderMap::new(), None, Protocol::Grpc);
        assert_eq!(admit(), Err(AuthFailure::KeysNotLoaded), "nothing passes before the pool is seen");
        keys.follow(None);
        assert_eq!(admit(), Ok(()), "a pool without spec.auth opens the gate");
        keys.follow(Some("bge-keys".into()));
        assert_eq!(admit(), Err(AuthFailure::KeysNotLoaded), "keys turned on: closed until the Secret is read");
        let watch = keys.following.watching.as_ref().map(|(name, token)| (name.clone(), token.clone())).unwrap();
        assert_eq!(watch.0, "bge-keys");
        keys.follow(None);
        assert!(watch.1.is_cancelled(), "the Secret's watch ends with spec.auth");
        assert_eq!(admit(), Ok(()));
        stop.cancel();
    }

    fn pool(name: &str, status: serde_json::Value) -> Arc<EmbeddingPool> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
                "metadata": { "name": name, "namespace": "ml" },
                "spec": { "model": { "id": format!("org/{name}") }, "replicas": 4,
                          "concurrency": { "maxInFlight": 40, "maxQueued": 80, "queueTimeout": "1500ms" } },
                "status": status,
            }))
            .unwrap(),
        )
    }

    #[test]
    fn own_pool_uses_local_tei_and_published_shares() {
        let pools = [
            pool(
                "bge",
                json!({ "admission": { "inFlightPerReplica": 7, "queuedPerReplica": 9, "splitOverReplicas": 6 } }),
            ),
            pool("gte", json!({})),
        ];
        let specs = specs(&pools, "ml", "bge", "http://127.0.0.1:8080");
        let own = &specs[0];
        assert_eq!((own.upstream.as_str(), own.remote), ("http://127.0.0.1:8080", false));
        assert_eq!(own.limits, Some(Limits::new(7, 9, Duration::from_millis(1500))));
        let other = &specs[1];
        assert_eq!((other.upstream.as_str(), other.remote), ("http://gte.ml.svc:50051", true));
        assert_eq!(other.model.as_deref(), Some("org/gte"));
        // No status yet: the budget split over the desired 4 replicas.
        assert_eq!(other.limits.map(|l| (l.max_in_flight, l.max_queued)), Some((10, 20)));
    }

    #[test]
    fn the_own_pool_on_a_time_sliced_gpu_gets_its_share_by_default() {
        let shared = |name: &str| {
            let mut pool = (*pool(name, json!({}))).clone();
            pool.spec.gpu = serde_json::from_value(
                json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing", "replicas": 4 } }),
            )
            .unwrap();
            Arc::new(pool)
        };
        let both = specs(&[shared("bge"), shared("gte")], "ml", "bge", "http://127.0.0.1:8080");
        assert_eq!(both[0].limits.and_then(|l| l.gpu_share), Some(25));
        assert_eq!(both[1].limits.and_then(|l| l.gpu_share), None, "another pool's share is its own sidecar's");
        let whole = specs(&[pool("bge", json!({}))], "ml", "bge", "http://127.0.0.1:8080");
        assert_eq!(whole[0].limits.and_then(|l| l.gpu_share), None, "a whole GPU: no share");
    }
}
