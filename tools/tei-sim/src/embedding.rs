//! Deterministic stand-ins for model outputs: the same input always gets the same answer, so tests
//! can compare what came back through a proxy with [`embedding_for`].

/// FNV-1a: stable across runs and platforms, unlike `std`'s randomly seeded hasher.
pub(crate) fn hash64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// SplitMix64 step: a tiny PRNG good enough to spread a seed over many components.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Maps 64 random bits to [0, 1) using the top 24 bits, which an f32 holds exactly.
fn unit(bits: u64) -> f32 {
    (bits >> 40) as f32 / 16_777_216.0
}

/// A deterministic pseudo-random value in [0, 1) for `text`, salted so different uses differ.
pub(crate) fn score(salt: &str, text: &str) -> f32 {
    let mut state = hash64(salt.as_bytes()) ^ hash64(text.as_bytes());
    unit(splitmix64(&mut state))
}

/// The embedding the simulator returns for `text`: `dimensions` components, L2-normalized,
/// derived only from the text. Its first `d` components, re-normalized, equal
/// `embedding_for(text, d)`, matching how a Matryoshka model answers a smaller `dimensions`.
pub fn embedding_for(text: &str, dimensions: usize) -> Vec<f32> {
    let mut state = hash64(text.as_bytes());
    let mut v: Vec<f32> = (0..dimensions).map(|_| unit(splitmix64(&mut state)) * 2.0 - 1.0).collect();
    normalize(&mut v);
    v
}

/// Scales to unit length; an all-zero vector (vanishingly unlikely) is left as it is.
pub(crate) fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in v.iter_mut() {
            *x /= norm;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedding_is_deterministic_and_normalized() {
        let a = embedding_for("hello world", 384);
        assert_eq!(a, embedding_for("hello world", 384));
        assert_ne!(a, embedding_for("hello world!", 384));
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert!(embedding_for("x", 0).is_empty());
    }

    #[test]
    fn truncated_prefix_matches_smaller_embedding() {
        let mut prefix = embedding_for("matryoshka", 384)[..64].to_vec();
        normalize(&mut prefix);
        let small = embedding_for("matryoshka", 64);
        for (a, b) in prefix.iter().zip(&small) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn unit_stays_in_range() {
        assert_eq!(unit(0), 0.0);
        assert!(unit(u64::MAX) < 1.0);
        let s = score("salt", "text");
        assert!((0.0..1.0).contains(&s));
    }
}
