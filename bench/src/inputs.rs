//! Request inputs of a given size in tokens. Words are short, common English words, so a real
//! BERT-style tokenizer also counts about one token per word (the simulator counts exactly one);
//! the model adds its own special tokens on top.

use std::str::FromStr;

use serde::Serialize;

use crate::Error;

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
