//! Kubernetes mode: the own pool's other ready replicas, from the EndpointSlices of its headless
//! `<pool>-peers` Service, so calls can spill to them (`crate::forward::siblings`). Only ready endpoints
//! that are not terminating count: a replica that drains fails its readiness at once, and from
//! then on nothing new spills to it.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use teifleet_crds::labels;
use teifleet_wire::ports::MULTIPLEXER_GRPC;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::forward::siblings::Siblings;

/// The label EndpointSlices carry naming their Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The gRPC URLs of the ready replicas in `slices`, except the pod `own_pod`, in TLS when the
/// pool serves it.
pub fn urls(slices: &[Arc<EndpointSlice>], own_pod: &str, tls: bool) -> Vec<String> {
    let scheme = if tls { "https" } else { "http" };
    let mut urls: Vec<String> = slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter())
        .filter(|endpoint| {
            serving(endpoint) && endpoint.target_ref.as_ref().and_then(|r| r.name.as_deref()) != Some(own_pod)
        })
        .filter_map(|endpoint| endpoint.addresses.first())
        .map(|address| match address.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => format!("{scheme}://[{address}]:{MULTIPLEXER_GRPC}"),
            _ => format!("{scheme}://{address}:{MULTIPLEXER_GRPC}"),
        })
        .collect();
    urls.sort();
    urls.dedup();
    urls
}

fn serving(endpoint: &Endpoint) -> bool {
    let conditions = endpoint.conditions.as_ref();
    conditions.and_then(|c| c.ready) == Some(true) && conditions.and_then(|c| c.terminating) != Some(true)
}

/// Keeps `siblings` in step with the pool's ready replicas, in TLS while `serves_tls` says the
/// pool serves it, until `stop`.
pub async fn watch(
    client: Client,
    namespace: String,
    pool: String,
    own_pod: String,
    siblings: Arc<Siblings>,
    mut serves_tls: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
    let selector = format!("{SERVICE_NAME_LABEL}={}", labels::peers_service_name(&pool));
    let (reader, writer) = reflector::store();
    let events = reflector(writer, watcher(api, watcher::Config::default().labels(&selector))).default_backoff();
    let mut events = std::pin::pin!(events.take_until(stop.cancelled_owned()));
    let mut listed = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => listed = true,
                Some(Ok(_)) => continue,
                Some(Err(error)) => {
                    tracing::warn!(%error, "EndpointSlice watch failed; retrying");
                    continue;
                }
            },
            changed = serves_tls.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        if listed {
            let urls = urls(&reader.state(), &own_pod, *serves_tls.borrow());
            if let Err(error) = siblings.sync(&urls) {
                tracing::warn!(%error, "could not follow the pool's replicas");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(endpoints: serde_json::Value) -> Arc<EndpointSlice> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": { "name": "bge-peers-x", "namespace": "ml" },
                "addressType": "IPv4",
                "endpoints": endpoints,
            }))
            .unwrap(),
        )
    }

    fn endpoint(ip: &str, pod: &str, ready: bool, terminating: bool) -> serde_json::Value {
        json!({ "addresses": [ip], "conditions": { "ready": ready, "terminating": terminating },
                "targetRef": { "kind": "Pod", "name": pod, "namespace": "ml" } })
    }

    #[test]
    fn ready_replicas_but_this_one_and_those_going_away() {
        let slices = [
            slice(json!([endpoint("10.0.0.2", "bge-a", true, false), endpoint("10.0.0.3", "bge-b", true, false)])),
            slice(json!([
                endpoint("10.0.0.4", "bge-c", false, false),
                endpoint("10.0.0.5", "bge-d", true, true),
                endpoint("10.0.0.6", "bge-e", true, false)
            ])),
        ];
        assert_eq!(urls(&slices, "bge-a", false), ["http://10.0.0.3:50051", "http://10.0.0.6:50051"]);
        assert_eq!(urls(&slices, "bge-a", true), ["https://10.0.0.3:50051", "https://10.0.0.6:50051"]);
    }
}
