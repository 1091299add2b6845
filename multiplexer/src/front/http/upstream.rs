//! A request's inputs as the upstream messages they become, planned before any is built.
//!
//! One field of a request can go into every message: `prompt_name` into each of up to 2,048
//! `/embed` calls, `/rerank`'s query into every slice of texts. Built all at once, a 58 KB body
//! became 213 MB of messages (issue 43). So each message's exact size is computed first, from the
//! request's own fields and never by building it. A request whose messages would be more than
//! [`most_upstream_bytes`] of its body is refused whole (413): what is sent upstream for a body,
//! and the work it makes there, is a small multiple of it. The rest are cut into chunks of at
//! most the max client batch size and at most [`chunk_bytes`] bytes; the most the chunks in
//! flight at once can hold is charged to the memory budget (429 when there is no room); and only
//! then are the messages built, a chunk at a time as it is sent. What one request holds in
//! messages is then at most a small multiple of its body, and charged.

use prost::Message;

use crate::vocab::framing::{Framed, PREFIX};

/// The least a chunk may carry whatever the body's size: every ordinary request fits in one
/// chunk per max client batch, as before; only a field copied into every message cuts chunks
/// smaller.
pub const CHUNK_BYTES_FLOOR: usize = 1 << 20;

/// How many times its body a request's messages may be in all (beyond [`UPSTREAM_FLOOR`]): each
/// message repeats a few fields (`truncate`, `normalize`, its framing) that are not in the body,
/// and TEI's short prompt names and queries are copied into each.
pub const UPSTREAM_PER_BODY: u64 = 4;
/// What a request's messages may be in all whatever its body: 2,048 one-letter inputs with a
/// prompt name are about 50 KB of messages.
pub const UPSTREAM_FLOOR: u64 = 4 << 20;

/// The most bytes of messages a request of `body` bytes may become.
pub fn most_upstream_bytes(body: usize) -> u64 {
    (body as u64).saturating_mul(UPSTREAM_PER_BODY).max(UPSTREAM_FLOOR)
}

/// Each of `items` as one upstream message: `template` with the item put in `field` (the
/// template's `field` left empty).
pub struct Each<M, T> {
    pub template: M,
    pub field: fn(&mut M) -> &mut T,
    pub items: Vec<T>,
}

/// What [`Each::plan`] found: how many messages each chunk takes, the bytes of all of them, and
/// the most bytes of messages that live at once while they are sent.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub chunks: Vec<usize>,
    pub total: u64,
    pub peak: u64,
}

/// Most bytes of messages one chunk carries for a request of `body` bytes.
pub fn chunk_bytes(body: usize) -> usize {
    body.max(CHUNK_BYTES_FLOOR)
}

impl<M: Message + Clone, T: Default> Each<M, T> {
    /// The exact framed size of each message, from the template with each item swapped in and
    /// back out: nothing is copied.
    pub fn sizes(&mut self) -> Vec<usize> {
        let Self { template, field, items } = self;
        items
            .iter_mut()
            .map(|item| {
                std::mem::swap(field(template), item);
                let size = PREFIX + template.encoded_len();
                std::mem::swap(field(template), item);
                size
            })
            .collect()
    }

    /// Whether `holds` is true of every message, each encoded in turn into one scratch buffer
    /// (the item swapped in and back out, as [`Self::sizes`] does): none is kept.
    pub fn all(&mut self, mut holds: impl FnMut(&[u8]) -> bool) -> bool {
        let Self { template, field, items } = self;
        let mut scratch = Vec::new();
        items.iter_mut().all(|item| {
            std::mem::swap(field(template), item);
            scratch.clear();
            template.encode_raw(&mut scratch);
            std::mem::swap(field(template), item);
            holds(&scratch)
        })
    }

    /// Chunks of at most `per_permit` messages and at most `max_bytes` bytes (one message at
    /// least), and what `window` consecutive chunks hold at most, plus one message being built
    /// beside them.
    pub fn plan(&mut self, per_permit: usize, max_bytes: usize, window: usize) -> Plan {
        let sizes = self.sizes();
        let (mut chunks, mut bytes) = (Vec::<usize>::new(), Vec::<u64>::new());
        let (mut count, mut held) = (0usize, 0usize);
        for &size in &sizes {
            if count > 0 && (count >= per_permit.max(1) || held.saturating_add(size) > max_bytes) {
                chunks.push(count);
                bytes.push(held as u64);
                (count, held) = (0, 0);
            }
            count += 1;
            held = held.saturating_add(size);
        }
        if count > 0 {
            chunks.push(count);
            bytes.push(held as u64);
        }
        let in_flight = bytes.windows(window.max(1).min(bytes.len().max(1))).map(|w| w.iter().sum::<u64>()).max();
        let largest = sizes.iter().copied().max().unwrap_or(0) as u64;
        Plan { chunks, total: bytes.iter().sum(), peak: in_flight.unwrap_or(0) + largest }
    }

    /// The messages, built a chunk at a time as the chunks are taken.
    pub fn chunks(self, plan: Vec<usize>) -> impl Iterator<Item = Vec<Framed>> {
        let Self { template, field, items } = self;
        let mut items = items.into_iter();
        plan.into_iter().map(move |n| {
            items
                .by_ref()
                .take(n)
                .map(|item| {
                    let mut message = template.clone();
                    *field(&mut message) = item;
                    Framed::encode(&message)
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use teifleet_proto::v1;

    use super::*;

    fn embeds(prompt: usize, texts: &[&str]) -> Each<v1::EmbedRequest, String> {
        let template = v1::EmbedRequest { prompt_name: Some("p".repeat(prompt)), ..Default::default() };
        Each { template, field: |m| &mut m.inputs, items: texts.iter().map(|t| (*t).to_owned()).collect() }
    }

    #[test]
    fn sizes_are_the_built_messages_exactly() {
        let mut each = embeds(300, &["a", "two words", &"x".repeat(200)]);
        let sizes = each.sizes();
        assert!(each.items.iter().all(|item| !item.is_empty()) && each.template.inputs.is_empty(), "swapped back");
        // `Framed` reads as its message; its buffer holds the prefix too.
        let built: Vec<usize> =
            each.chunks(vec![2, 1]).flatten().map(|framed| PREFIX + framed.as_ref().len()).collect();
        assert_eq!(sizes, built);
    }

    #[test]
    fn a_field_in_every_message_cuts_chunks_by_bytes_and_the_peak_is_what_the_window_holds() {
        // Small messages: chunks of the batch size, the peak two chunks and one message.
        let texts = vec!["hello"; 100];
        let mut small = embeds(0, &texts);
        let size = small.sizes()[0];
        let plan = small.plan(32, chunk_bytes(1000), 2);
        assert_eq!(plan.chunks, [32, 32, 32, 4]);
        assert_eq!((plan.total, plan.peak), ((100 * size) as u64, (64 * size + size) as u64));
        // A 100 KB prompt name in each of 100 messages: 10 per MiB chunk, not 32.
        let mut large = embeds(100_000, &texts);
        let plan = large.plan(32, chunk_bytes(101_000), 2);
        assert_eq!(plan.chunks.iter().sum::<usize>(), 100);
        assert!(plan.chunks.iter().all(|&n| n <= 10), "{:?}", plan.chunks);
        assert!(plan.peak <= 3 * CHUNK_BYTES_FLOOR as u64, "{}", plan.peak);
        assert!(plan.total > most_upstream_bytes(101_000), "refused: 10 MB of messages for a 101 KB body");
        // A message larger than a chunk goes alone.
        let mut huge = embeds(2 * CHUNK_BYTES_FLOOR, &["a", "b"]);
        assert_eq!(huge.plan(32, chunk_bytes(10), 2).chunks, [1, 1]);
        let mut none = embeds(0, &[]);
        assert_eq!(none.plan(32, 10, 2), Plan { chunks: vec![], total: 0, peak: 0 });
    }
}
