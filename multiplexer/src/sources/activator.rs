//! The activator role in Kubernetes: the namespace's EmbeddingPools, each a pool whose calls are
//! held until one of its replicas is ready (for as long as its `autoscaling.coldStartHold`), and
//! each pool's ready replicas, from the EndpointSlices of its headless `<pool>-peers` Service; and
//! the API keys of every pool with `spec.auth` (the Secret it names, watched as its sidecars do),
//! so that a call without one of its keys is refused before it is held or counted as demand; and
//! each pool's Service address (ClusterIP), so that a call whose client dialled an address rather
//! than a name is held for the pool whose Service that is; and the certificate set of every pool
//! with `spec.tls` (its TLS Secret, and its client CA, watched by name as its sidecars do), which
//! the activator serves that pool's clients and calls its replicas with.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client, ResourceExt as _};
use teifleet_crds::EmbeddingPool;
use teifleet_crds::duration::parse_duration;
use tokio_util::sync::CancellationToken;

use crate::activator::PoolNaming;
use crate::admission::Limits;
use crate::forward::pools::{PoolSpec, PoolTable};
use crate::gate::auth::{Gate, Policy};
use crate::transport::tls::PoolCertificates;

/// The hold of a pool without `spec.autoscaling` (the CRD's default `coldStartHold`).
const DEFAULT_HOLD: Duration = Duration::from_secs(60);

/// The label EndpointSlices carry naming their Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What the activator makes of a pool: its calls pass through here uncounted by any budget (the
/// pool's own sidecars admit them), to the balancer over its ready replicas.
fn activated(pool: &EmbeddingPool) -> (PoolSpec, Duration) {
    let name = pool.name_any();
    let hold = pool
        .spec
        .autoscaling
        .as_ref()
        .and_then(|autoscaling| parse_duration(&autoscaling.cold_start_hold).ok())
        .unwrap_or(DEFAULT_HOLD);
    // A pool's calls are passed on over another channel when it turns TLS on or off.
    let scheme = if pool.spec.tls.is_some() { "activated-tls" } else { "activated" };
    let spec = PoolSpec {
        upstream: format!("{scheme}://{name}"),
        model: Some(pool.spec.model.id.clone()),
        // Admission is the replicas' business; here a call only waits for one to be ready.
        limits: Some(Limits::new(usize::MAX >> 1, usize::MAX >> 1, hold)),
        remote: true,
        coalesce: false,
        cache: None,
        tenants: BTreeMap::new(),
        name,
    };
    (spec, hold)
}

/// The pool a `<pool>-peers` EndpointSlice belongs to.
fn pool_of(slice: &EndpointSlice) -> Option<&str> {
    slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.strip_suffix(teifleet_crds::labels::PEERS_SUFFIX)
}

/// The pools' Service addresses: each ClusterIP (both families' on a dual-stack Service) of a
/// Service that is a live pool's own, the ClusterIP Service the operator names as the pool and
/// labels and owns as its child. A headless Service has no address; a Service that only copies
/// a pool's name label, or is not the pool's child, names nothing, so that no other Service's
/// address can draw a pool's held calls.
fn pool_addresses(services: &[Arc<Service>], pools: &[Arc<EmbeddingPool>]) -> BTreeMap<IpAddr, String> {
    let mut addresses = BTreeMap::new();
    for service in services {
        let name = service.name_any();
        let Some(pool) = pools.iter().find(|pool| pool.name_any() == name) else { continue };
        let labelled = service.labels().get(teifleet_crds::labels::POOL_LABEL) == Some(&name);
        let owned = service.owner_references().iter().any(|owner| {
            owner.controller == Some(true) && owner.kind == "EmbeddingPool" && Some(&owner.uid) == pool.uid().as_ref()
        });
        if !(labelled && owned) {
            continue;
        }
        let Some(spec) = &service.spec else { continue };
        let ips = spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.iter());
        for address in ips.filter_map(|ip| ip.parse::<IpAddr>().ok()) {
            addresses.insert(address, name.clone());
        }
    }
    addresses
}

/// The `spec.tls` of each pool that may scale to zero: the activator stands in for no other, and
/// its Role grants their Secrets alone.
fn tls_specs(live: &[Arc<EmbeddingPool>]) -> BTreeMap<String, teifleet_crds::TlsSpec> {
    let at_zero = |pool: &&Arc<EmbeddingPool>| pool.spec.autoscaling.as_ref().is_some_and(|a| a.min_replicas == 0);
    live.iter().filter(at_zero).filter_map(|pool| Some((pool.name_any(), pool.spec.tls.clone()?))).collect()
}

/// The pools with mutual TLS (`spec.tls.clientCA`), each with its model.
fn mutual_pools(live: &[Arc<EmbeddingPool>]) -> BTreeMap<String, Option<String>> {
    live.iter()
        .filter(|pool| pool.spec.tls.as_ref().is_some_and(|tls| tls.client_ca.is_some()))
        .map(|pool| (pool.name_any(), Some(pool.spec.model.id.clone())))
        .collect()
}

/// What one watch event asks of the loop.
enum Step {
    Stop,
    Nothing,
    Changed,
}

/// Reads one event of the watch of `what`; `listed` turns true once its first list is complete.
fn step<K>(event: Option<Result<watcher::Event<K>, watcher::Error>>, what: &str, listed: &mut bool) -> Step {
    match event {
        None => Step::Stop,
        Some(Ok(watcher::Event::InitDone)) => {
            *listed = true;
            Step::Changed
        }
        Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => Step::Changed,
        Some(Ok(_)) => Step::Nothing,
        Some(Err(error)) => {
            tracing::warn!(%error, "{what} watch failed; retrying");
            Step::Nothing
        }
    }
}

/// The key Secret watched for each pool with `spec.auth`, and the token ending that watch.
#[derive(Default)]
struct KeyWatches {
    following: BTreeMap<String, (String, CancellationToken)>,
}

impl KeyWatches {
    /// Follows the key Secrets `live` pools name now: a new or renamed one gets a gate that
    /// refuses every call until its Secret is read; a pool whose `spec.auth` went needs none.
    fn follow(
        &mut self,
        client: &Client,
        namespace: &str,
        table: &PoolTable,
        live: &[Arc<EmbeddingPool>],
        stop: &CancellationToken,
    ) {
        let wanted: BTreeMap<String, String> =
            live.iter().filter_map(|pool| Some((pool.name_any(), super::kubernetes::keys_secret_of(pool)?))).collect();
        self.following.retain(|pool, (secret, token)| {
            let keep = wanted.get(pool) == Some(secret);
            if !keep {
                token.cancel();
                table.set_keys(pool, None);
            }
            keep
        });
        for (pool, secret) in wanted {
            if self.following.contains_key(&pool) {
                continue;
            }
            let gate = Arc::new(Gate::unmetered(&pool, Policy::Waiting));
            table.set_keys(&pool, Some(gate.clone()));
            let token = stop.child_token();
            let watch = super::secret::watch(client.clone(), namespace.to_owned(), secret.clone(), gate, token.clone());
            tokio::spawn(watch);
            self.following.insert(pool, (secret, token));
        }
    }
}

/// The TLS sets followed for each pool with `spec.tls`, and the token ending each watch.
#[derive(Default)]
struct TlsWatches {
    following: BTreeMap<String, (teifleet_crds::TlsSpec, CancellationToken)>,
}

impl TlsWatches {
    /// Follows the TLS Secrets (and client CAs) `live` pools name now; a pool whose `spec.tls`
    /// went, or changed, is served no set until its new one is read.
    fn follow(
        &mut self,
        client: &Client,
        namespace: &str,
        certificates: &Arc<PoolCertificates>,
        live: &[Arc<EmbeddingPool>],
        stop: &CancellationToken,
    ) {
        let wanted = tls_specs(live);
        self.following.retain(|pool, (spec, token)| {
            let keep = wanted.get(pool) == Some(spec);
            if !keep {
                token.cancel();
                certificates.remove(pool);
            }
            keep
        });
        for (pool, spec) in wanted {
            if self.following.contains_key(&pool) {
                continue;
            }
            let token = stop.child_token();
            let set = certificates.of_pool(&pool);
            let watch =
                super::tls_secret::watch(client.clone(), namespace.to_owned(), spec.clone(), set, token.clone());
            tokio::spawn(watch);
            self.following.insert(pool, (spec, token));
        }
    }
}

/// Keeps `table` and `activations` in step with the pools of `naming`'s namespace and their ready
/// replicas, `naming` with their Services' addresses, and `certificates` with the sets of the pools
/// with `spec.tls`, until `stop`.
pub async fn watch(
    client: Client,
    naming: Arc<PoolNaming>,
    table: Arc<PoolTable>,
    certificates: Arc<PoolCertificates>,
    stop: CancellationToken,
) {
    let Some(activations) = table.activations().cloned() else { return };
    let namespace = naming.namespace().to_owned();
    let mut keys = KeyWatches::default();
    let mut tls = TlsWatches::default();
    let pools_api: Api<EmbeddingPool> = Api::namespaced(client.clone(), &namespace);
    let slices_api: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let services_api: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let (pools, pools_writer) = reflector::store();
    let (slices, slices_writer) = reflector::store();
    let (services, services_writer) = reflector::store();
    let pool_events = reflector(pools_writer, watcher(pools_api, watcher::Config::default())).default_backoff();
    let slice_config = watcher::Config::default().labels(SERVICE_NAME_LABEL);
    let slice_events = reflector(slices_writer, watcher(slices_api, slice_config)).default_backoff();
    let service_config = watcher::Config::default().labels(teifleet_crds::labels::POOL_LABEL);
    let service_events = reflector(services_writer, watcher(services_api, service_config)).default_backoff();
    let mut pool_events = std::pin::pin!(pool_events.take_until(stop.clone().cancelled_owned()));
    let mut slice_events = std::pin::pin!(slice_events.take_until(stop.clone().cancelled_owned()));
    let mut service_events = std::pin::pin!(service_events.take_until(stop.clone().cancelled_owned()));
    // The Services are not waited for: a pool's calls are held by name without them, and an
    // activator whose Role cannot read Services yet (an older operator's) still holds those.
    let (mut pools_listed, mut slices_listed, mut services_listed) = (false, false, false);
    loop {
        let step = tokio::select! {
            event = pool_events.next() => step(event, "EmbeddingPool", &mut pools_listed),
            event = slice_events.next() => step(event, "EndpointSlice", &mut slices_listed),
            event = service_events.next() => step(event, "Service", &mut services_listed),
        };
        match step {
            Step::Stop => {
                naming.set_addresses(BTreeMap::new());
                return;
            }
            Step::Nothing => continue,
            Step::Changed => {}
        }
        if !(pools_listed && slices_listed) {
            continue;
        }
        let live: Vec<Arc<EmbeddingPool>> =
            pools.state().into_iter().filter(|pool| pool.metadata.deletion_timestamp.is_none()).collect();
        let (specs, holds): (Vec<PoolSpec>, Vec<(String, Duration)>) = live
            .iter()
            .map(|pool| {
                let (spec, hold) = activated(pool);
                let name = spec.name.clone();
                (spec, (name, hold))
            })
            .unzip();
        // Keys before the pools become routable: never hold a keyed pool's call unchecked.
        keys.follow(&client, &namespace, &table, &live, &stop);
        tls.follow(&client, &namespace, &certificates, &live, &stop);
        // The pools with mutual TLS, whose replicas take the activator (which shows the pool's
        // own certificate) for a sibling and believe the tenant it passes on: only calls whose
        // certificate the pool's client CA checked here go to them. Before they are routable.
        naming.set_mutual(mutual_pools(&live));
        // Balancers first, so the table's new pools find theirs.
        activations.sync(&holds);
        let slices = slices.state();
        for (pool, _) in &holds {
            let own: Vec<Arc<EndpointSlice>> = slices.iter().filter(|s| pool_of(s) == Some(pool)).cloned().collect();
            let tls = live.iter().find(|p| p.name_any() == *pool).and_then(|p| p.spec.tls.as_ref());
            if let Err(error) = activations.set_tls(pool, tls.is_some()) {
                tracing::warn!(pool, %error, "could not follow the pool's replicas in TLS");
                continue;
            }
            let urls = super::siblings::urls(&own, "", tls.is_some());
            if let Err(error) = activations.set_peers(pool, &urls) {
                tracing::warn!(pool, %error, "could not follow the pool's replicas");
            }
        }
        if let Err(error) = table.sync(specs) {
            tracing::warn!(%error, "could not apply the namespace's pools");
        }
        // After the table: an address leads only to pools the table has.
        naming.set_addresses(pool_addresses(&services.state(), &live));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pool_is_held_for_its_cold_start_hold_and_admitted_by_its_replicas() {
        let pool: EmbeddingPool = serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
            "metadata": { "name": "bge", "namespace": "ml" },
            "spec": { "model": { "id": "org/bge" },
                      "concurrency": { "maxInFlight": 8, "maxInFlightPerReplica": 4 },
                      "autoscaling": { "minReplicas": 0, "maxReplicas": 4, "coldStartHold": "90s" } },
        }))
        .unwrap();
        let (spec, hold) = activated(&pool);
        assert_eq!((spec.name.as_str(), spec.remote, hold), ("bge", true, Duration::from_secs(90)));
        assert!(spec.limits.unwrap().max_in_flight > 1_000_000, "no budget here");
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": { "name": "bge-peers-x", "labels": { SERVICE_NAME_LABEL: "bge-peers" } },
            "addressType": "IPv4", "endpoints": [],
        }))
        .unwrap();
        assert_eq!(pool_of(&slice), Some("bge"));
    }

    #[test]
    fn the_tls_sets_followed_are_the_zero_pools_and_every_mutual_tls_pool_is_guarded() {
        let pool = |name: &str, min: i32, tls: serde_json::Value| -> Arc<EmbeddingPool> {
            let mut spec = json!({ "model": { "id": format!("org/{name}") },
                                   "concurrency": { "maxInFlight": 8, "maxInFlightPerReplica": 4 },
                                   "autoscaling": { "minReplicas": min, "maxReplicas": 2 } });
            if !tls.is_null() {
                spec["tls"] = tls;
            }
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
                    "metadata": { "name": name, "namespace": "ml" }, "spec": spec,
                }))
                .unwrap(),
            )
        };
        let mutual = json!({ "secretName": "m-tls", "clientCA": { "configMapName": "clients" } });
        let live = [
            pool("tls", 0, json!({ "secretName": "tls-tls" })),
            pool("mutual", 0, mutual.clone()),
            pool("plain", 0, serde_json::Value::Null),
            pool("busy", 1, json!({ "secretName": "busy-tls" })),
            pool("busy-mutual", 1, mutual),
        ];
        let followed: Vec<String> = tls_specs(&live).into_keys().collect();
        assert_eq!(followed, ["mutual", "tls"], "only the pools that may be at zero (the Role's names)");
        let guarded = mutual_pools(&live);
        assert_eq!(guarded.keys().collect::<Vec<_>>(), ["busy-mutual", "mutual"], "any pool with mutual TLS");
        assert_eq!(guarded["mutual"].as_deref(), Some("org/mutual"));
    }

    fn service(name: &str, pool_label: &str, owner_uid: &str, spec: serde_json::Value) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": name, "namespace": "ml", "labels": { teifleet_crds::labels::POOL_LABEL: pool_label },
                              "ownerReferences": [{ "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
                                                    "name": pool_label, "uid": owner_uid, "controller": true }] },
                "spec": spec,
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_pools_service_addresses_lead_to_the_pool_and_no_other_services_do() {
        let pool = |name: &str| -> Arc<EmbeddingPool> {
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
                    "metadata": { "name": name, "namespace": "ml", "uid": format!("uid-{name}") },
                    "spec": { "model": { "id": "org/m" }, "concurrency": { "maxInFlight": 8 } },
                }))
                .unwrap(),
            )
        };
        let pools = [pool("bge"), pool("gte")];
        let services = [
            service("bge", "bge", "uid-bge", json!({ "clusterIP": "10.96.0.12", "clusterIPs": ["10.96.0.12"] })),
            // Dual-stack: both families' addresses.
            service(
                "gte",
                "gte",
                "uid-gte",
                json!({ "clusterIP": "10.96.0.13", "clusterIPs": ["10.96.0.13", "fd00::13"] }),
            ),
            // The pool's headless peers Service: no address.
            service("bge-peers", "bge", "uid-bge", json!({ "clusterIP": "None", "clusterIPs": ["None"] })),
            // A Service that copies a pool's label, and one named as a pool but not its child.
            service("copy", "bge", "uid-bge", json!({ "clusterIP": "10.96.0.20" })),
            service("bge", "bge", "uid-other", json!({ "clusterIP": "10.96.0.21" })),
            // A Service of a pool that is gone.
            service("old", "old", "uid-old", json!({ "clusterIP": "10.96.0.22" })),
            // Only clusterIP, as older API servers write it.
            service("gte", "gte", "uid-gte", json!({ "clusterIP": "10.96.0.14" })),
        ];
        let addresses = pool_addresses(&services, &pools);
        let found: Vec<(String, &str)> = addresses.iter().map(|(ip, pool)| (ip.to_string(), pool.as_str())).collect();
        assert_eq!(
            found,
            [
                ("10.96.0.12".to_owned(), "bge"),
                ("10.96.0.13".to_owned(), "gte"),
                ("10.96.0.14".to_owned(), "gte"),
                ("fd00::13".to_owned(), "gte"),
            ]
        );
    }
}
