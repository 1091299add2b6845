//! Request inputs: texts of a given size in tokens, or a Zipf mix of distinct queries. Words are
//! short, common English words, so a real BERT-style tokenizer also counts about one token per
//! word (the simulator counts exactly one); the model adds its own special tokens on top.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::zipf::Zipf;

/// What request `index` asks to embed.
#[derive(Clone, Debug, PartialEq)]
pub enum Inputs {
    /// The same few texts, by size.
    Words(Tokens),
    /// `distinct` different queries of `tokens` words each, drawn with Zipf popularity.
    Queries(QueryMix),
}

/// A Zipf mix of distinct queries (`--zipf 1.1:1000`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryMix {
    pub exponent: f64,
    pub distinct: usize,
    pub tokens: usize,
}

/// Parses `EXPONENT:DISTINCT`, e.g. `1.1:1000`; tokens per query default to 16.
impl FromStr for QueryMix {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || Error::InvalidArgument(format!("--zipf wants EXPONENT:DISTINCT such as 1.1:1000, not {s:?}"));
        let (exponent, distinct) = s.split_once(':').ok_or_else(bad)?;
        let exponent: f64 = exponent.trim().parse().map_err(|_| bad())?;
        let distinct: usize = distinct.trim().parse().map_err(|_| bad())?;
        Zipf::new(exponent, distinct)?;
        Ok(Self { exponent, distinct, tokens: 16 })
    }
}

impl std::fmt::Display for Inputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Words(tokens) => write!(f, "tokens {tokens}"),
            Self::Queries(m) => {
                write!(f, "Zipf s={} over {} queries of {} tokens", m.exponent, m.distinct, m.tokens)
            }
        }
    }
}

/// The texts of a run, built once, and which one each request uses.
#[derive(Clone, Debug)]
pub(crate) struct Texts {
    kind: TextsKind,
    seed: u64,
}

#[derive(Clone, Debug)]
enum TextsKind {
    Words { tokens: Tokens, texts: Vec<(usize, String)> },
    Queries { zipf: Zipf, texts: Vec<String> },
}

impl Texts {
    pub(crate) fn new(inputs: &Inputs, seed: u64) -> Result<Self, Error> {
        let kind = match inputs {
            Inputs::Words(tokens) => TextsKind::Words {
                tokens: tokens.clone(),
                texts: tokens.sizes().into_iter().map(|n| (n, text(n))).collect(),
            },
            Inputs::Queries(m) => TextsKind::Queries {
                zipf: Zipf::new(m.exponent, m.distinct)?,
                texts: (0..m.distinct).map(|rank| query(rank, m.tokens)).collect(),
            },
        };
        Ok(Self { kind, seed })
    }

    pub(crate) fn get(&self, index: u64) -> &str {
        match &self.kind {
            TextsKind::Words { tokens, texts } => {
                let n = tokens.for_request(index);
                // Every size of the mix was built in `new`.
                texts.iter().find(|(size, _)| *size == n).map_or("", |(_, t)| t.as_str())
            }
            TextsKind::Queries { zipf, texts } => &texts[zipf.draw(self.seed, index)],
        }
    }
}

/// Query `rank` of a mix: `tokens` words that no other rank shares as a whole.
pub fn query(rank: usize, tokens: usize) -> String {
    let rest = text(tokens.max(2) - 1);
    format!("q{rank} {rest}")
}

const WORDS: [&str; 16] = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "to", "the", "river", "bank",
    "today",
];

/// Input size of each request: one size, or a mix cycled through request by request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Tokens {
    Fixed(usize),
    Mix(Vec<usize>),
}

impl Tokens {
    /// Tokens of request `index`: a mix is cycled, so each size gets an equal share in order.
    pub fn for_request(&self, index: u64) -> usize {
        match self {
            Self::Fixed(n) => *n,
            Self::Mix(sizes) => {
                let i = usize::try_from(index % sizes.len() as u64).unwrap_or(0);
                sizes[i]
            }
        }
    }

    pub fn sizes(&self) -> Vec<usize> {
        match self {
            Self::Fixed(n) => vec![*n],
            Self::Mix(sizes) => sizes.clone(),
        }
    }
}

impl std::fmt::Display for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "{n}"),
            Self::Mix(sizes) => {
                let list: Vec<String> = sizes.iter().map(ToString::to_string).collect();
                write!(f, "mix {}", list.join(","))
            }
        }
    }
}

/// Parses `2,16,128,512` (a `--tokens-mix`).
impl FromStr for Tokens {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let sizes: Result<Vec<usize>, _> = s.split(',').map(|p| p.trim().parse::<usize>()).collect();
        match sizes {
            Ok(sizes) if !sizes.is_empty() && sizes.iter().all(|n| *n > 0) => {
                Ok(if sizes.len() == 1 { Self::Fixed(sizes[0]) } else { Self::Mix(sizes) })
            }
            _ => Err(Error::InvalidArgument(format!("token sizes must be positive integers like 2,16,128,512: {s:?}"))),
        }
    }
}

/// A text of `tokens` words (at least one: TEI refuses empty inputs).
pub fn text(tokens: usize) -> String {
    let n = tokens.max(1);
    let mut out = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[i % WORDS.len()]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_the_asked_number_of_words() {
        assert_eq!(text(2), "the quick");
        assert_eq!(text(512).split_whitespace().count(), 512);
        assert_eq!(text(0).split_whitespace().count(), 1);
    }

    #[test]
    fn queries_are_distinct_sized_and_drawn_by_popularity() {
        let mix: QueryMix = "1.1:50".parse().unwrap();
        assert_eq!(mix, QueryMix { exponent: 1.1, distinct: 50, tokens: 16 });
        assert!("1.1".parse::<QueryMix>().is_err());
        assert!("x:10".parse::<QueryMix>().is_err());
        assert!("1.1:0".parse::<QueryMix>().is_err());
        let texts = Texts::new(&Inputs::Queries(mix), 3).unwrap();
        let drawn: Vec<&str> = (0..2000).map(|i| texts.get(i)).collect();
        assert!(drawn.iter().all(|t| t.split_whitespace().count() == 16));
        let hottest = drawn.iter().filter(|t| t.starts_with("q0 ")).count();
        let tenth = drawn.iter().filter(|t| t.starts_with("q9 ")).count();
        assert!(hottest > 3 * tenth, "{hottest} vs {tenth}");
        assert_ne!(query(1, 16), query(10, 16));
        assert_eq!(Inputs::Queries(mix).to_string(), "Zipf s=1.1 over 50 queries of 16 tokens");
    }

    #[test]
    fn mix_parses_and_cycles() {
        let mix: Tokens = "2,16,128,512".parse().unwrap();
        assert_eq!(mix, Tokens::Mix(vec![2, 16, 128, 512]));
        assert_eq!((0..5).map(|i| mix.for_request(i)).collect::<Vec<_>>(), vec![2, 16, 128, 512, 2]);
        assert_eq!("16".parse::<Tokens>().unwrap(), Tokens::Fixed(16));
        assert!("2,x".parse::<Tokens>().is_err());
        assert!("0".parse::<Tokens>().is_err());
        assert_eq!(mix.to_string(), "mix 2,16,128,512");
    }
}
