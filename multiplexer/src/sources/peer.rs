//! The pool's peer key (`crate::gate::peer`): from the Secret the operator creates for the pool
//! (kubernetes mode, watched by name like the key Secret, so a replaced key is in force within a
//! second), or from `--peer-key-file` (static mode, read once).

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use teifleet_crds::labels::PEER_SECRET_KEY as DATA_KEY;
use tokio_util::sync::CancellationToken;

use crate::forward::siblings::Siblings;
use crate::vocab::SetupError;

/// Puts the key in `path` in force for `siblings`.
pub fn load_file(path: &Path, siblings: &Siblings) -> Result<(), SetupError> {
    let unusable = |e: &dyn std::fmt::Display| SetupError::Config(format!("--peer-key-file {}: {e}", path.display()));
    let text = std::fs::read(path).map_err(|e| unusable(&e))?;
    siblings.peer_key().set(Some(&text)).map_err(|e| unusable(&e))
}

/// Keeps `siblings`' peer key on Secret `namespace/name`'s `key` until `stop`. While the Secret
/// is missing (the operator creates it with the pool) no spill is believed; while the API
/// server cannot be reached the last key read stays.
pub async fn watch(client: Client, namespace: String, name: String, siblings: Arc<Siblings>, stop: CancellationToken) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher(api, config).default_backoff().take_until(stop.cancelled_owned());
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => {
                let key = secret.data.as_ref().and_then(|data| data.get(DATA_KEY)).map(|value| value.0.as_slice());
                match siblings.peer_key().set(key) {
                    Ok(()) if key.is_some() => tracing::info!(secret = %name, "peer key loaded"),
                    Ok(()) => {
                        tracing::warn!(secret = %name, "the peer Secret has no `{DATA_KEY}`: no spill is believed")
                    }
                    Err(error) => tracing::warn!(secret = %name, %error, "peer key unusable: no spill is believed"),
                }
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!(secret = %name, "the peer Secret was deleted: no spill is believed");
                let _ = siblings.peer_key().set(None);
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(secret = %name, %error, "peer Secret watch failed; retrying"),
        }
    }
}
