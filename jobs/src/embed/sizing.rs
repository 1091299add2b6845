//! How much goes in one EmbedArrow call: at most rows-per-call rows, and few enough bytes that the
//! request and the answer each fit under the largest message the pool takes and sends
//! (`--max-message-bytes`: the multiplexer's and tonic's default, 4 MiB), with headroom for what
//! the per-row estimates leave out. A text too large for any call is that row's error.

use crate::settings::Dtype;

/// The multiplexer's default `--max-message-bytes` (and tonic's): what a pool takes unless its
/// operator raised it.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 4 << 20;
/// The smallest `--max-message-bytes` taken: below it the headroom would leave no room for rows.
pub const MIN_MAX_MESSAGE_BYTES: u64 = 4 * HEADROOM as u64;
/// Kept free in each message for what the per-row estimates leave out: the IPC stream's schema
/// and batch headers, the protobuf fields (target, prompt name), padding, and error texts longer
/// than [`ANSWER_ROW_EXTRA`]. A call the estimate still gets wrong is refused by the pool
/// (OUT_OF_RANGE) and split in halves, so this is about not wasting calls, not correctness.
const HEADROOM: usize = 64 << 10;
/// A request row beyond its text's bytes: its offset in the text column (and padding's share).
const REQUEST_ROW_EXTRA: usize = 8;
/// An answer row beyond its vector: the error column's offset, two validity bits, and a short
/// error text.
const ANSWER_ROW_EXTRA: usize = 64;

/// The bounds one call keeps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallSize {
    /// Embeddable rows per call.
    pub rows: usize,
    /// Request bytes per call, over the rows' [`request_bytes`].
    pub request_bytes: usize,
    /// The flag's value, for messages.
    pub max_message_bytes: u64,
}

impl CallSize {
    /// The bounds for calls of at most `rows_per_call` rows whose answers carry vectors of
    /// `dimensions` elements of `dtype`, under messages of `max_message_bytes`.
    pub fn new(rows_per_call: usize, max_message_bytes: u64, dimensions: usize, dtype: Dtype) -> Self {
        let budget = usize::try_from(max_message_bytes).unwrap_or(usize::MAX).saturating_sub(HEADROOM).max(1);
        let element = match dtype {
            Dtype::F32 => 4,
            Dtype::F16 => 2,
        };
        let answer_row = dimensions.saturating_mul(element).saturating_add(ANSWER_ROW_EXTRA);
        let rows = rows_per_call.min(budget / answer_row).max(1);
        Self { rows, request_bytes: budget, max_message_bytes }
    }

    /// Whether a text of `bytes` fits a call on its own; if not, why, as its row error says.
    pub fn refuse_text(&self, bytes: usize) -> Option<String> {
        (request_bytes(bytes) > self.request_bytes).then(|| {
            format!(
                "the text is {bytes} bytes: over the {} one call to the pool carries (--max-message-bytes {})",
                self.request_bytes - REQUEST_ROW_EXTRA,
                self.max_message_bytes
            )
        })
    }
}

/// What a text of `bytes` adds to a request.
pub fn request_bytes(bytes: usize) -> usize {
    bytes.saturating_add(REQUEST_ROW_EXTRA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_per_call_shrink_so_the_answer_fits() {
        // 384 f32 dimensions: 1,600 bytes a row, so 512 rows (819 KB) fit 4 MiB as they are.
        let size = CallSize::new(512, DEFAULT_MAX_MESSAGE_BYTES, 384, Dtype::F32);
        assert_eq!(size.rows, 512);
        // 4,096 f32 dimensions: 16 KiB a row, so at most 251 rows fit 4 MiB less the headroom.
        let size = CallSize::new(512, DEFAULT_MAX_MESSAGE_BYTES, 4096, Dtype::F32);
        assert_eq!(size.rows, ((4 << 20) - HEADROOM) / (4096 * 4 + ANSWER_ROW_EXTRA));
        assert!(size.rows * 4096 * 4 < 4 << 20);
        // f16 halves the vectors: twice the rows.
        assert!(CallSize::new(10_000, DEFAULT_MAX_MESSAGE_BYTES, 1024, Dtype::F16).rows > 1_900);
        // A vector larger than any message still makes calls of one row (the pool says the rest).
        assert_eq!(CallSize::new(512, DEFAULT_MAX_MESSAGE_BYTES, 2 << 20, Dtype::F32).rows, 1);
    }

    #[test]
    fn a_text_larger_than_any_call_is_refused_with_the_bound() {
        let size = CallSize::new(512, DEFAULT_MAX_MESSAGE_BYTES, 384, Dtype::F32);
        assert_eq!(size.refuse_text(12_000), None);
        assert_eq!(size.refuse_text((4 << 20) - HEADROOM - REQUEST_ROW_EXTRA), None);
        let refused = size.refuse_text(5 << 20).unwrap();
        assert!(refused.starts_with("the text is 5242880 bytes: over the 4128760 one call"), "{refused}");
        assert!(refused.ends_with("(--max-message-bytes 4194304)"), "{refused}");
    }
}
