//! The pool's peer Secret: a key only the pool's sidecars read, with which a sidecar proves to a
//! sibling that a spilled or forwarded call really comes from the pool. The operator creates it
//! once and never reads or updates it (it holds no read access to Secrets); the key itself is
//! made by the caller, so rendering stays pure.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use teifleet_crds::labels;

use super::Owner;

/// The Secret holding `key` (already encoded as text) under [`labels::PEER_SECRET_KEY`], owned by
/// the pool as its controller so the garbage collector deletes it with the pool. Immutable: the
/// sidecars' view of it can never change under them; rotating the key is deleting the Secret,
/// which the operator then creates anew and the pool's pods pick up.
pub(super) fn peer_secret(owner: &Owner, key: &str) -> Secret {
    Secret {
        metadata: owner.meta(labels::peer_secret_name(&owner.name)),
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(labels::PEER_SECRET_KEY.into(), ByteString(key.as_bytes().to_vec()))])),
        ..Secret::default()
    }
}
