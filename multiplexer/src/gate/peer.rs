//! The pool's peer key: how a sidecar proves to a sibling replica that a spilled call is really
//! its own. A spilled call skips the sibling's door and is counted once, by the replica it came
//! from; those are privileges, so `x-teifleet-spilled-from` is believed only next to the key
//! (`x-teifleet-peer-key`), compared in constant time. From anyone else the claim is dropped and
//! the call is a client's like any other: counted, held at the door, free to spill.
//!
//! The key comes from the per-pool Secret the operator creates (`sources::peer` watches it) or, in
//! static mode, from `--peer-key-file`. Without a key nothing is believed: spills still reach the
//! sibling, which then serves them as its own callers' calls.

use std::fmt;
use std::sync::{PoisonError, RwLock};

use http::{HeaderMap, HeaderName, HeaderValue};
use subtle::ConstantTimeEq as _;
use teifleet_wire::headers::PEER_KEY as PEER_KEY_HEADER;

pub static PEER_KEY: HeaderName = HeaderName::from_static(PEER_KEY_HEADER);

/// Shortest peer key accepted: the operator writes 43 characters (32 random bytes, base64url).
pub const MIN_PEER_KEY_LEN: usize = 32;

/// Why a peer key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a peer key must be at least {MIN_PEER_KEY_LEN} printable ASCII characters, without spaces")]
pub struct UnusablePeerKey;

/// The key in force, if any.
#[derive(Default)]
pub struct PeerKey {
    key: RwLock<Option<HeaderValue>>,
}

impl fmt::Debug for PeerKey {
    /// Whether there is one: a key must never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerKey").field("set", &self.read().is_some()).finish()
    }
}

impl PeerKey {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Option<HeaderValue>> {
        self.key.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `text` (surrounding whitespace ignored) in force, or, with `None`, none.
    pub fn set(&self, text: Option<&[u8]>) -> Result<(), UnusablePeerKey> {
        let key = match text.map(<[u8]>::trim_ascii) {
            None => None,
            Some(key) if key.len() >= MIN_PEER_KEY_LEN && key.iter().all(u8::is_ascii_graphic) => {
                let mut value = HeaderValue::from_bytes(key).map_err(|_| UnusablePeerKey)?;
                value.set_sensitive(true);
                Some(value)
            }
            Some(_) => return Err(UnusablePeerKey),
        };
        *self.key.write().unwrap_or_else(PoisonError::into_inner) = key;
        Ok(())
    }

    /// The header value a spill carries to a sibling; none while no key is known.
    pub fn value(&self) -> Option<HeaderValue> {
        self.read().clone()
    }

    /// Whether `headers` carry the key in force: exactly one value, equal in constant time.
    pub fn vouches(&self, headers: &HeaderMap) -> bool {
        let mut shown = headers.get_all(&PEER_KEY).iter();
        let (Some(value), None) = (shown.next(), shown.next()) else { return false };
        match &*self.read() {
            Some(key) => bool::from(key.as_bytes().ct_eq(value.as_bytes())),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "peer-key-0123456789-0123456789-0123456789";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn only_the_key_in_force_vouches_for_a_call() {
        let peer = PeerKey::default();
        assert!(!peer.vouches(&headers(&[(PEER_KEY_HEADER, KEY)])), "no key in force: nothing is believed");
        peer.set(Some(format!("{KEY}\n").as_bytes())).unwrap();
        assert!(peer.vouches(&headers(&[(PEER_KEY_HEADER, KEY)])));
        assert!(!peer.vouches(&headers(&[])));
        assert!(!peer.vouches(&headers(&[(PEER_KEY_HEADER, &KEY[1..])])));
        assert!(!peer.vouches(&headers(&[(PEER_KEY_HEADER, KEY), (PEER_KEY_HEADER, KEY)])), "one value only");
        peer.set(None).unwrap();
        assert!(!peer.vouches(&headers(&[(PEER_KEY_HEADER, KEY)])));
    }

    #[test]
    fn a_short_or_unprintable_key_is_refused_and_never_shown() {
        let peer = PeerKey::default();
        assert_eq!(peer.set(Some(b"short")), Err(UnusablePeerKey));
        assert_eq!(peer.set(Some("peer key with spaces in it 0123456789".as_bytes())), Err(UnusablePeerKey));
        peer.set(Some(KEY.as_bytes())).unwrap();
        assert!(!format!("{peer:?}").contains(KEY));
        assert!(peer.value().unwrap().is_sensitive());
    }
}
