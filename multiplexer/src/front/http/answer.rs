//! An answer's size, estimated before any of it is asked for: `/embed_all` answers one vector per
//! token, `/tokenize` an object per token, `/embed_sparse` several pairs per token, so a small
//! request can ask for an answer hundreds of times its size (issue 31: a 231 KB request, a 540 MB
//! answer). The estimate is inputs x tokens (at most each text's bytes, capped at the model's
//! input length when TEI truncates: [`most_tokens`]) x numbers per token (a vector's size, learned from the pool's answers); past
//! `--max-answer-bytes` of JSON the request is refused with 413, else the estimate is charged to
//! the memory budget (429 when there is no room) and corrected once the answer is in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::error::HttpError;
use super::memory::AnswerCharge;
use crate::admission::memory::{MemoryBudget, Use};
use crate::error::Error;

/// A vector's size assumed for a pool until one of its answers tells: large for a sentence
/// embedding model, so a first request is not let through on a guess too small.
pub const DEFAULT_DIMENSIONS: u64 = 1024;

/// What one number of an answer costs: its JSON (`-0.012345678,` at most) and its decoded `f32`,
/// both held while the answer is serialized.
pub const NUMBER: Cost = Cost { json: 14, decoded: 4 };
/// One token of `/tokenize`: `{"id":..,"text":"..","special":false,"start":..,"stop":..},` and
/// its decoded form.
pub const TOKEN: Cost = Cost { json: 80, decoded: 64 };
/// One pair of `/embed_sparse`: `{"index":30521,"value":0.12345678},` and its decoded form.
pub const SPARSE_VALUE: Cost = Cost { json: 36, decoded: 8 };
/// Pairs assumed per token of a sparse answer (SPLADE's weights over the vocabulary).
pub const SPARSE_VALUES_PER_TOKEN: u64 = 4;

/// Tokens TEI adds to every input (`[CLS]` and `[SEP]`, `<s>` and `</s>`).
pub const SPECIAL_TOKENS: u64 = 2;

/// Tokens a named prompt may add to each input: a model's prompts (`query: `, `Represent this
/// sentence for searching relevant passages: `) are instructions of tens of tokens, chosen by the
/// model's makers, not by the caller, who only names one. An answer of a model with longer ones is
/// still corrected to what came and refused past `--max-answer-bytes` ([`settle`]).
pub const PROMPT_TOKENS: u64 = 64;

/// The most tokens a text of `bytes` bytes can become, whatever was learned: every token of a
/// text covers at least one of its bytes, and TEI adds its special tokens; `prompt` more when the
/// request names one of the model's prompts ([`PROMPT_TOKENS`]); at most
/// `cap` when TEI truncates to it. Not the pool's learned characters per token
/// (`crate::admission`), which follows what callers send: a run of one long word made a 167 KB
/// `/embed_all` look 13 times smaller than it was (issue 43).
pub fn most_tokens(bytes: usize, prompt: u64, cap: Option<u32>) -> u64 {
    let most = (bytes as u64).saturating_add(SPECIAL_TOKENS).saturating_add(prompt);
    cap.map_or(most, |cap| most.min(u64::from(cap.max(1))))
}

/// What one unit of an answer costs in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Cost {
    pub json: u64,
    pub decoded: u64,
}

/// Each pool's vector size, as its answers showed it.
#[derive(Default)]
pub struct Dimensions {
    pools: Mutex<HashMap<String, u64>>,
}

impl Dimensions {
    pub fn of(&self, pool: &str) -> u64 {
        self.pools.lock().unwrap_or_else(PoisonError::into_inner).get(pool).copied().unwrap_or(DEFAULT_DIMENSIONS)
    }

    /// An answer of `pool` carried vectors of `size` numbers.
    pub fn learn(&self, pool: &str, size: usize) {
        if size > 0 {
            self.pools.lock().unwrap_or_else(PoisonError::into_inner).insert(pool.to_owned(), size as u64);
        }
    }
}

/// The charge of an answer of `units` units of `cost`, or its refusal: 413 past `limit` bytes of
/// JSON, 429 when the memory budget has no room.
pub fn charge(memory: &Arc<MemoryBudget>, units: u64, cost: Cost, limit: u64) -> Result<AnswerCharge, HttpError> {
    let json = units.saturating_mul(cost.json);
    if json > limit {
        return Err(HttpError::AnswerTooLarge { estimate: json, limit });
    }
    let held = units.saturating_mul(cost.json + cost.decoded);
    let charge = memory.charge(Use::Answers, held).map_err(|over| HttpError::Call(Error::Memory(over)))?;
    Ok(AnswerCharge(Arc::new(charge)))
}

/// Corrects `charge` to the answer that came: `units` of `cost`, refused past `limit` as before.
pub fn settle(charge: &AnswerCharge, units: u64, cost: Cost, limit: u64) -> Result<(), HttpError> {
    let json = units.saturating_mul(cost.json);
    if json > limit {
        return Err(HttpError::AnswerTooLarge { estimate: json, limit });
    }
    charge.0.set(units.saturating_mul(cost.json + cost.decoded)).map_err(|over| HttpError::Call(Error::Memory(over)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_tokens_are_the_bytes_and_the_specials_within_the_cap() {
        assert_eq!(most_tokens(10, 0, None), 12);
        assert_eq!(most_tokens(10, 0, Some(8)), 8, "truncated to the model's input length");
        assert_eq!(most_tokens(10, PROMPT_TOKENS, None), 76, "a prompt's tokens on top");
        assert_eq!(most_tokens(usize::MAX, u64::MAX, None), u64::MAX);
        assert_eq!(most_tokens(10, 0, Some(0)), 1);
    }

    #[test]
    fn an_answer_past_the_limit_is_refused_and_one_within_it_charged() {
        let memory = MemoryBudget::new(10_000, None);
        let refused = charge(&memory, 1000, NUMBER, 1000).err().expect("14 KB of JSON over 1 KB");
        assert!(matches!(refused, HttpError::AnswerTooLarge { estimate: 14_000, limit: 1000 }), "{refused:?}");
        let held = charge(&memory, 100, NUMBER, 10_000).expect("within both");
        assert_eq!(memory.charged(), 1800);
        assert!(charge(&memory, 500, NUMBER, 100_000).is_err(), "no room in the budget: 429");
        settle(&held, 10, NUMBER, 10_000).unwrap();
        assert_eq!(memory.charged(), 180);
        drop(held);
        assert_eq!(memory.charged(), 0);
        let dimensions = Dimensions::default();
        assert_eq!(dimensions.of("bge"), DEFAULT_DIMENSIONS);
        dimensions.learn("bge", 384);
        assert_eq!(dimensions.of("bge"), 384);
    }
}
