//! Creates each pool's peer Secret (`render::peer_secret`) and nothing more: a POST, where an
//! `AlreadyExists` answer is success. The operator never reads, lists or updates a Secret, so
//! its RBAC grants `create` on Secrets and no other verb; the key it makes is written once and
//! seen afterwards only by the pool's sidecars.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt as _};
use teifleet_crds::EmbeddingPool;

use crate::{Error, Result, render};

/// Bytes of randomness in a peer key: 256 bits, as much as the HMAC-SHA-256 that uses it takes.
pub const KEY_BYTES: usize = 32;

/// How long a pool's Secret is taken to be there after it was created or found to exist. The
/// operator cannot watch Secrets (it may not read them), so one deleted by hand, to rotate the
/// key, is created again at the first reconcile after this; in between no reconcile posts it.
pub const RECHECK: Duration = Duration::from_secs(600);

/// A fresh key: [`KEY_BYTES`] from the operating system's generator, as unpadded base64url text
/// (43 characters), so it reads the same in a shell, an environment variable or a header.
pub fn new_key() -> Result<String> {
    let mut bytes = [0u8; KEY_BYTES];
    getrandom::fill(&mut bytes).map_err(|error| Error::Random(error.to_string()))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// When each pool's Secret was last known to exist, by the pool's uid (a pool deleted and made
/// again under the same name is a new pool, whose old Secret the garbage collector removes).
#[derive(Default)]
pub struct PeerSecrets(Mutex<HashMap<String, Instant>>);

impl PeerSecrets {
    fn due(&self, uid: &str, now: Instant) -> bool {
        let known = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        known.get(uid).is_none_or(|since| now.duration_since(*since) >= RECHECK)
    }

    fn seen(&self, uid: &str, now: Instant) {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(uid.to_owned(), now);
    }

    /// Forgets a deleted pool.
    pub fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(uid);
    }
}

/// Makes sure `pool` has its peer Secret: creates it with a new key unless it was seen within
/// [`RECHECK`]. An existing Secret is left as it is (its key stays the pods' key).
pub async fn ensure(client: &Client, known: &PeerSecrets, pool: &EmbeddingPool, namespace: &str) -> Result<()> {
    let uid = pool.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let now = Instant::now();
    if !known.due(&uid, now) {
        return Ok(());
    }
    let secret = render::peer_secret(pool, &new_key()?)?;
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match api
        .create(
            &PostParams { field_manager: Some(teifleet_crds::labels::MANAGER.into()), ..PostParams::default() },
            &secret,
        )
        .await
    {
        Ok(_) => tracing::info!(pool = %pool.name_any(), %namespace, "created the pool's peer Secret"),
        Err(kube::Error::Api(status)) if status.code == 409 && status.reason == "AlreadyExists" => {}
        Err(error) => return Err(error.into()),
    }
    known.seen(&uid, now);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_32_random_bytes_in_unpadded_base64url() {
        let (a, b) = (new_key().unwrap(), new_key().unwrap());
        assert_eq!(a.len(), 43);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'), "{a}");
        assert_eq!(URL_SAFE_NO_PAD.decode(&a).unwrap().len(), KEY_BYTES);
        assert_ne!(a, b, "a new key each time");
    }

    #[test]
    fn a_pools_secret_is_posted_again_only_after_the_recheck_interval() {
        let known = PeerSecrets::default();
        let start = Instant::now();
        assert!(known.due("uid", start), "never seen: post it");
        known.seen("uid", start);
        assert!(!known.due("uid", start + RECHECK / 2));
        assert!(known.due("uid", start + RECHECK), "deleted by hand, it comes back");
        assert!(known.due("other", start));
        known.forget("uid");
        assert!(known.due("uid", start));
    }
}
