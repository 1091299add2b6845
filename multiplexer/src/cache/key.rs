//! What a cached answer is filed under: a SHA-256 digest of everything that changes the answer.
//!
//! The request message is hashed whole, so every option TEI reads from it (normalize, truncate,
//! truncation direction, prompt name, dimensions) is in the key without this file naming any: a
//! field TEI adds later is in it too. What the message does not say comes from around it: the
//! pool, the model TEI reports (its id, revision, dtype and kind, which names the pooling), the
//! RPC, and the caller's tenant unless the pool shares its cache. Each part goes in with its
//! length, so no two different sets of parts hash the same bytes.

use sha2::{Digest, Sha256};
use teifleet_proto::v1::InfoResponse;

/// The digest an answer is filed under, in both tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(pub [u8; 32]);

impl Key {
    /// As the shared store names it: the cache's version, then the digest in hex.
    pub fn store_name(&self) -> String {
        let mut name = String::with_capacity(STORE_PREFIX.len() + 64);
        name.push_str(STORE_PREFIX);
        for byte in self.0 {
            name.push_str(&format!("{byte:02x}"));
        }
        name
    }
}

/// Every key in the shared store starts with this: a store shared with other software, or a
/// later layout of the keys, never meets these by chance.
pub const STORE_PREFIX: &str = "teifleet:embed:v1:";

/// The model as TEI described itself: a new revision, dtype or pooling is a new model, whose
/// calls never meet an old model's entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model([u8; 32]);

impl Model {
    /// TEI's own words, and `args`: what the pool's spec asks of the model that Info does not
    /// report (the pooling, the revision asked for).
    pub fn of(info: &InfoResponse, args: &str) -> Self {
        let mut hasher = Sha256::new();
        part(&mut hasher, args.as_bytes());
        part(&mut hasher, info.model_id.as_bytes());
        part(&mut hasher, info.model_sha.as_deref().unwrap_or("").as_bytes());
        part(&mut hasher, info.model_dtype.as_bytes());
        part(&mut hasher, format!("{:?}", info.model_type).as_bytes());
        Self(hasher.finalize().into())
    }
}

/// The parts of a key that one call's inputs share, hashed once per call.
#[derive(Clone)]
pub struct Scope {
    hasher: Sha256,
}

impl Scope {
    /// `tenant` is `None` when the pool shares its cache across tenants (or the call has none).
    pub fn new(pool: &str, model: Model, rpc_path: &str, tenant: Option<&str>) -> Self {
        let mut hasher = Sha256::new();
        part(&mut hasher, pool.as_bytes());
        part(&mut hasher, &model.0);
        part(&mut hasher, rpc_path.as_bytes());
        match tenant {
            Some(tenant) => {
                hasher.update([1]);
                part(&mut hasher, tenant.as_bytes());
            }
            None => hasher.update([0]),
        }
        Self { hasher }
    }

    /// The key of one input: its request message, as sent upstream.
    pub fn key(&self, message: &[u8]) -> Key {
        let mut hasher = self.hasher.clone();
        part(&mut hasher, message);
        Key(hasher.finalize().into())
    }
}

fn part(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(sha: &str) -> Model {
        let info = InfoResponse {
            model_id: "BAAI/bge-small-en-v1.5".into(),
            model_sha: Some(sha.into()),
            model_dtype: "float16".into(),
            ..InfoResponse::default()
        };
        Model::of(&info, "pooling=cls")
    }

    #[test]
    fn the_spec_args_are_part_of_the_model() {
        let info = InfoResponse { model_id: "m".into(), ..InfoResponse::default() };
        assert_ne!(Model::of(&info, "pooling=cls"), Model::of(&info, "pooling=mean"));
    }

    #[test]
    fn every_part_changes_the_key() {
        let base = Scope::new("pool", model("a"), "/tei.v1.Embed/Embed", Some("t")).key(b"text");
        let others = [
            Scope::new("other", model("a"), "/tei.v1.Embed/Embed", Some("t")).key(b"text"),
            Scope::new("pool", model("b"), "/tei.v1.Embed/Embed", Some("t")).key(b"text"),
            Scope::new("pool", model("a"), "/tei.v1.Embed/EmbedSparse", Some("t")).key(b"text"),
            Scope::new("pool", model("a"), "/tei.v1.Embed/Embed", Some("u")).key(b"text"),
            Scope::new("pool", model("a"), "/tei.v1.Embed/Embed", None).key(b"text"),
            Scope::new("pool", model("a"), "/tei.v1.Embed/Embed", Some("t")).key(b"text2"),
        ];
        for other in others {
            assert_ne!(base, other);
        }
        assert_eq!(base, Scope::new("pool", model("a"), "/tei.v1.Embed/Embed", Some("t")).key(b"text"));
    }

    #[test]
    fn parts_cannot_run_into_each_other() {
        // Without lengths, ("ab", "c") and ("a", "bc") would hash the same bytes.
        let one = Scope::new("ab", model("a"), "c", None).key(b"");
        let two = Scope::new("a", model("a"), "bc", None).key(b"");
        assert_ne!(one, two);
    }

    #[test]
    fn store_names_are_prefixed_hex() {
        let name = Key([0xab; 32]).store_name();
        assert!(name.starts_with(STORE_PREFIX));
        assert_eq!(name.len(), STORE_PREFIX.len() + 64);
        assert!(name.ends_with("abab"));
    }
}
