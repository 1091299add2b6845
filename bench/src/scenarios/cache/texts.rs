//! The scenario's texts: a million distinct ones of realistic length (20 to 60 words), each a pure
//! function of its id, so the open loop, the checks after it and every run of the bench ask for
//! the same texts without holding them (a million of them would be about 250 MB).
//!
//! A text's first three words spell its id in base 128 over [`WORDS`] (so no two ids share a
//! text), the rest are drawn from the id; ids of different `space`s (the Zipf traffic, the
//! re-index corpus, its changed rows) never share a text either.

use teifleet_load::zipf::uniform;

/// 128 common English words.
const WORDS: [&str; 128] = [
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with", "his",
    "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were",
    "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if",
    "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make",
    "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way", "could",
    "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long", "down",
    "day", "did", "get", "come", "made", "may", "part", "over", "new", "sound", "take", "only", "little", "work",
    "know", "place", "year", "live", "me", "back", "give", "most", "very", "after", "thing", "our", "just", "name",
    "good", "sentence", "set", "man", "think", "say", "great", "where", "help",
];

/// Fewest and most words of a text.
pub const MIN_WORDS: usize = 20;
pub const MAX_WORDS: usize = 60;

/// Which family of texts an id is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Part 1's Zipf traffic (and part 4's): id = the Zipf rank.
    Queries,
    /// Part 2's corpus, by row.
    Corpus,
    /// Part 2's changed rows, by row.
    Changed,
    /// Part 3's texts.
    Shared,
}

impl Space {
    fn seed(self) -> u64 {
        match self {
            Self::Queries => 0x5145_5259,
            Self::Corpus => 0x434f_5250,
            Self::Changed => 0x4348_4e47,
            Self::Shared => 0x5348_5244,
        }
    }

    /// The word that starts every text of this space: spaces never share a text.
    fn mark(self) -> &'static str {
        match self {
            Self::Queries => "query",
            Self::Corpus => "document",
            Self::Changed => "revised",
            Self::Shared => "shared",
        }
    }
}

/// Text `id` of `space`: 20 to 60 words, the same every time.
pub fn text(space: Space, id: u64) -> String {
    let seed = space.seed();
    let words = MIN_WORDS + (uniform(seed, id) * (MAX_WORDS - MIN_WORDS + 1) as f64) as usize;
    let mut out = String::with_capacity(words * 6);
    out.push_str(space.mark());
    // The id in base 128: ids below 128^3 (two million) are three distinct words.
    for digit in [id >> 14, id >> 7, id] {
        out.push(' ');
        out.push_str(WORDS[(digit & 127) as usize]);
    }
    for i in 4..words {
        let draw = uniform(seed ^ id.rotate_left(17), i as u64);
        out.push(' ');
        out.push_str(WORDS[(draw * WORDS.len() as f64) as usize % WORDS.len()]);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn texts_are_distinct_of_realistic_length_and_reproducible() {
        let texts: Vec<String> = (0..20_000).map(|id| text(Space::Queries, id)).collect();
        let distinct: HashSet<&String> = texts.iter().collect();
        assert_eq!(distinct.len(), texts.len());
        let lengths: Vec<usize> = texts.iter().map(|t| t.split_whitespace().count()).collect();
        assert!(lengths.iter().all(|n| (MIN_WORDS..=MAX_WORDS).contains(n)), "{lengths:?}");
        let mean = lengths.iter().sum::<usize>() as f64 / lengths.len() as f64;
        assert!((35.0..45.0).contains(&mean), "{mean}");
        assert_eq!(text(Space::Queries, 999_999), text(Space::Queries, 999_999));
        assert_ne!(text(Space::Corpus, 7), text(Space::Changed, 7));
        assert_ne!(text(Space::Queries, 7), text(Space::Shared, 7));
    }
}
