//! Kubernetes mode, with `spec.auth`: the pool's API keys from the one Secret it names, watched,
//! so an edit of the Secret is in force within a second, with no restart.
//!
//! The watch lists and watches with a field selector on `metadata.name`, which the API server
//! authorizes as a request for that one Secret: the sidecar's Role names it in `resourceNames`
//! and grants no other.

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::gate::auth::{Gate, KeyRing, Policy};

/// The keys a Secret holds: each data key a tenant, its value the tenant's key or keys.
pub fn keys_of(secret: &Secret) -> (KeyRing, Vec<String>) {
    let data = secret.data.iter().flatten();
    KeyRing::parse(data.map(|(tenant, value)| (tenant.as_str(), value.0.as_slice())))
}

/// Keeps `gate` on the keys of Secret `namespace/name` until `stop`. While the Secret is missing
/// every call is refused; while the API server cannot be reached the last keys read stay.
pub async fn watch(client: Client, namespace: String, name: String, gate: Arc<Gate>, stop: CancellationToken) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher(api, config).default_backoff().take_until(stop.cancelled_owned());
    let mut events = std::pin::pin!(events);
    // Whether the Secret showed up in the current (re)list.
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => {
                listed = true;
                let (ring, problems) = keys_of(&secret);
                for problem in problems {
                    tracing::warn!(secret = %name, problem, "API key entry skipped");
                }
                tracing::info!(secret = %name, keys = ring.len(), "API keys loaded");
                gate.set(Policy::Keys(ring));
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!(secret = %name, "the API key Secret was deleted: refusing every call");
                gate.set(Policy::Waiting);
            }
            Ok(watcher::Event::Init) => listed = false,
            Ok(watcher::Event::InitDone) if !listed => {
                tracing::warn!(secret = %name, "no API key Secret of this name: refusing every call until it exists");
                gate.set(Policy::Waiting);
            }
            Ok(watcher::Event::InitDone) => {}
            Err(error) => tracing::warn!(secret = %name, %error, "API key Secret watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn every_data_key_is_a_tenant() {
        let secret = Secret {
            data: Some(
                [
                    ("search".to_owned(), ByteString(b"search-key-0123456789".to_vec())),
                    ("batch".to_owned(), ByteString(b"batch-key-0123456789\nbatch-key-new-0123456789\n".to_vec())),
                    ("bad".to_owned(), ByteString(b"short".to_vec())),
                ]
                .into(),
            ),
            ..Secret::default()
        };
        let (ring, problems) = keys_of(&secret);
        assert_eq!(ring.len(), 3);
        assert_eq!(problems.len(), 2, "the short key, and its tenant left without one: {problems:?}");
        assert!(keys_of(&Secret::default()).0.is_empty());
    }
}
