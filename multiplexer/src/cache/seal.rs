//! What the cache writes to its shared store is sealed with the pool's peer key (the Secret only
//! the pool's sidecars may read, `crate::gate::peer`): an HMAC-SHA256 over the entry's key and
//! the answer. A store anyone else can write to (a shared Redis, a leaked password) can then lose
//! or drop entries, but not put a vector of its choosing under a text: an entry whose seal does
//! not verify is a miss, counted as `forged`.
//!
//! Without a peer key (a sidecar run from a file without `--peer-key-file`) entries are written
//! and read unsealed, marked as such; a sidecar with a key never takes an unsealed one.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::cache::key::Key;
use crate::gate::peer::PeerKey;

/// The first byte of a sealed entry; then 32 bytes of seal, then the answer.
const SEALED: u8 = b'S';
/// The first byte of an entry written without a key; then the answer.
const OPEN: u8 = b'O';
const SEAL_LEN: usize = 32;

/// Why a stored entry is not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Unsealed {
    /// Its seal does not verify, it is unsealed where a key is in force, or it is no entry of ours.
    Forged,
}

/// The bytes to store for `answer` under `key`.
pub fn seal(peer_key: &PeerKey, key: &Key, answer: &[u8]) -> Vec<u8> {
    match peer_key.value() {
        Some(secret) => {
            let mut stored = Vec::with_capacity(1 + SEAL_LEN + answer.len());
            stored.push(SEALED);
            stored.extend_from_slice(&tag(secret.as_bytes(), key, answer));
            stored.extend_from_slice(answer);
            stored
        }
        None => {
            let mut stored = Vec::with_capacity(1 + answer.len());
            stored.push(OPEN);
            stored.extend_from_slice(answer);
            stored
        }
    }
}

/// The answer in `stored` under `key`, if its seal holds.
pub fn open<'a>(peer_key: &PeerKey, key: &Key, stored: &'a [u8]) -> Result<&'a [u8], Unsealed> {
    match (peer_key.value(), stored.split_first()) {
        (Some(secret), Some((&SEALED, rest))) if rest.len() >= SEAL_LEN => {
            let (seal, answer) = rest.split_at(SEAL_LEN);
            mac(secret.as_bytes(), key, answer).verify_slice(seal).map(|()| answer).map_err(|_| Unsealed::Forged)
        }
        (None, Some((&OPEN, answer))) => Ok(answer),
        _ => Err(Unsealed::Forged),
    }
}

fn mac(secret: &[u8], key: &Key, answer: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(&key.0);
    mac.update(answer);
    mac
}

fn tag(secret: &[u8], key: &Key, answer: &[u8]) -> [u8; SEAL_LEN] {
    mac(secret, key, answer).finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(secret: &str) -> PeerKey {
        let key = PeerKey::default();
        key.set(Some(secret.as_bytes())).unwrap();
        key
    }

    #[test]
    fn a_sealed_entry_opens_only_with_its_key_and_its_place() {
        let (pool, other) = (keyed(&"a".repeat(32)), keyed(&"b".repeat(32)));
        let (here, there) = (Key([1; 32]), Key([2; 32]));
        let stored = seal(&pool, &here, b"vector");
        assert_eq!(open(&pool, &here, &stored), Ok(&b"vector"[..]));
        assert_eq!(open(&other, &here, &stored), Err(Unsealed::Forged), "another key");
        assert_eq!(open(&pool, &there, &stored), Err(Unsealed::Forged), "moved under another text");
        let mut changed = stored.clone();
        *changed.last_mut().unwrap() ^= 1;
        assert_eq!(open(&pool, &here, &changed), Err(Unsealed::Forged), "a changed vector");
    }

    #[test]
    fn a_key_in_force_takes_no_open_entry() {
        let (pool, none) = (keyed(&"a".repeat(32)), PeerKey::default());
        let key = Key([1; 32]);
        let unsealed = seal(&none, &key, b"vector");
        assert_eq!(open(&none, &key, &unsealed), Ok(&b"vector"[..]));
        assert_eq!(open(&pool, &key, &unsealed), Err(Unsealed::Forged));
        assert_eq!(open(&pool, &key, b""), Err(Unsealed::Forged));
        assert_eq!(open(&pool, &key, b"S short"), Err(Unsealed::Forged));
    }
}
