//! A fake word-level tokenizer: deterministic, cheap, and with real byte offsets, so token counts
//! and Tokenize answers behave like a real model's without shipping a vocabulary.

use crate::embedding::hash64;

/// Vocabulary size of BERT-like models, so ids look familiar.
const VOCAB_SIZE: u32 = 30522;
/// Ids below this are reserved for special tokens (as BERT reserves its low ids), so a word can
/// never decode as a special token.
const FIRST_WORD_ID: u32 = 999;

pub(crate) const PAD_ID: u32 = 0;
pub(crate) const UNK_ID: u32 = 100;
pub(crate) const CLS_ID: u32 = 101;
pub(crate) const SEP_ID: u32 = 102;
pub(crate) const MASK_ID: u32 = 103;

/// The special tokens every sequence carries, `[CLS]` and `[SEP]`.
pub(crate) const SPECIAL_TOKENS_PER_SEQUENCE: usize = 2;

/// One word of the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Word {
    pub(crate) id: u32,
    /// Byte offsets into the input, end exclusive.
    pub(crate) start: usize,
    pub(crate) stop: usize,
}

/// Splits on whitespace, keeping byte offsets.
pub(crate) fn words(text: &str) -> Vec<Word> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                words.push(word(text, s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        words.push(word(text, s, text.len()));
    }
    words
}

fn word(text: &str, start: usize, stop: usize) -> Word {
    Word { id: word_id(&text[start..stop]), start, stop }
}

/// Deterministic id of a word, outside the special range.
pub(crate) fn word_id(word: &str) -> u32 {
    let span = u64::from(VOCAB_SIZE - FIRST_WORD_ID);
    // The remainder is below `span`, which fits in u32.
    FIRST_WORD_ID + u32::try_from(hash64(word.as_bytes()) % span).unwrap_or(0)
}

/// Tokens a sequence costs on the device: its words plus `[CLS]` and `[SEP]`.
#[cfg(test)]
fn token_count(text: &str) -> usize {
    words(text).len() + SPECIAL_TOKENS_PER_SEQUENCE
}

pub(crate) fn special_token_text(id: u32) -> Option<&'static str> {
    match id {
        PAD_ID => Some("[PAD]"),
        UNK_ID => Some("[UNK]"),
        CLS_ID => Some("[CLS]"),
        SEP_ID => Some("[SEP]"),
        MASK_ID => Some("[MASK]"),
        _ => None,
    }
}

/// Ids cannot be mapped back to the words they came from, so each decodes to a stable stand-in.
pub(crate) fn decode(ids: &[u32], skip_special_tokens: bool) -> String {
    let mut parts = Vec::with_capacity(ids.len());
    for &id in ids {
        match special_token_text(id) {
            Some(_) if skip_special_tokens => {}
            Some(special) => parts.push(special.to_owned()),
            None => parts.push(format!("tok{id}")),
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_keep_byte_offsets() {
        let text = "  héllo  wörld\tx ";
        let found: Vec<&str> = words(text).iter().map(|w| &text[w.start..w.stop]).collect();
        assert_eq!(found, ["héllo", "wörld", "x"]);
        assert_eq!(token_count(text), 5);
        assert_eq!(token_count(""), 2);
    }

    #[test]
    fn ids_are_stable_and_never_special() {
        assert_eq!(word_id("hello"), word_id("hello"));
        assert_ne!(word_id("hello"), word_id("world"));
        for w in ["a", "b", "the", "[CLS]", "zzz"] {
            let id = word_id(w);
            assert!((FIRST_WORD_ID..VOCAB_SIZE).contains(&id));
        }
    }

    #[test]
    fn decode_names_tokens() {
        assert_eq!(decode(&[CLS_ID, 2000, SEP_ID], false), "[CLS] tok2000 [SEP]");
        assert_eq!(decode(&[CLS_ID, 2000, SEP_ID], true), "tok2000");
    }
}
