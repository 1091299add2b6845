//! How many tokens a text will be: its length over a characters-per-token ratio learned from what
//! TEI reports for each call (`compute_chars` and `compute_tokens` in its response Metadata).

/// A typical ratio for English text with BERT-style tokenizers, used until TEI has answered.
const INITIAL_CHARS_PER_TOKEN: f64 = 4.0;
/// Tokens TEI adds to every input (`[CLS]`, `[SEP]` or their kin).
const SPECIAL_TOKENS_PER_INPUT: u64 = 2;
/// Weight of the newest observation: follows a change of traffic within tens of calls.
const ALPHA: f64 = 0.05;

#[derive(Clone, Copy, Debug)]
pub struct TokenEstimate {
    chars_per_token: f64,
}

impl Default for TokenEstimate {
    fn default() -> Self {
        Self { chars_per_token: INITIAL_CHARS_PER_TOKEN }
    }
}

impl TokenEstimate {
    /// Estimated tokens of `inputs` inputs totalling `text_bytes` bytes of text (at least one per
    /// input).
    pub fn estimate(&self, text_bytes: usize, inputs: u32) -> u64 {
        let text = (text_bytes as f64 / self.chars_per_token).ceil() as u64;
        text + SPECIAL_TOKENS_PER_INPUT * u64::from(inputs)
    }

    /// Learns from one answer: TEI counted `chars` characters as `tokens` tokens.
    pub fn observe(&mut self, chars: u64, tokens: u64) {
        if chars == 0 || tokens == 0 {
            return;
        }
        let ratio = (chars as f64 / tokens as f64).clamp(0.5, 32.0);
        self.chars_per_token += ALPHA * (ratio - self.chars_per_token);
    }

    pub fn chars_per_token(&self) -> f64 {
        self.chars_per_token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_inputs_cost_more_than_short_ones() {
        let estimate = TokenEstimate::default();
        let short = estimate.estimate(8, 1);
        let long = estimate.estimate(2000, 1);
        assert_eq!(short, 4);
        assert_eq!(long, 502);
        assert_eq!(estimate.estimate(0, 3), 6, "special tokens per input");
    }

    #[test]
    fn learns_the_ratio_tei_reports() {
        let mut estimate = TokenEstimate::default();
        for _ in 0..200 {
            estimate.observe(3000, 1000); // 3 characters per token
        }
        assert!((estimate.chars_per_token() - 3.0).abs() < 0.01, "{}", estimate.chars_per_token());
        estimate.observe(0, 0);
        assert!((estimate.chars_per_token() - 3.0).abs() < 0.01, "empty answers teach nothing");
    }
}
