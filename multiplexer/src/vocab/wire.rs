//! Reading the few protobuf fields the multiplexer needs straight from a message's bytes, without
//! decoding the message: TEI's timing `Metadata` (field 2 of every timed response) and what a
//! request carries (how many inputs, how much text). Malformed bytes read as "nothing found":
//! the message still goes through untouched, and TEI judges it.

use std::time::Duration;

use bytes::Buf;

/// TEI's per-call `Metadata`, the fields the multiplexer uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TeiTiming {
    pub compute_chars: u64,
    pub compute_tokens: u64,
    pub queue: Duration,
    pub inference: Duration,
}

/// What a request message asks TEI to process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestSize {
    pub inputs: u32,
    pub text_bytes: usize,
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LENGTH_DELIMITED: u8 = 2;
const FIXED32: u8 = 5;

/// One field of a message: its number and either its varint value or its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// Iterates over the top-level fields of an encoded message; stops at the first malformed byte.
struct Fields<'a> {
    rest: &'a [u8],
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u32, Value<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let key = varint(&mut self.rest)?;
        let number = u32::try_from(key >> 3).ok()?;
        let value = match (key & 7) as u8 {
            VARINT => Value::Varint(varint(&mut self.rest)?),
            LENGTH_DELIMITED => {
                let len = usize::try_from(varint(&mut self.rest)?).ok()?;
                if len > self.rest.len() {
                    self.rest = &[];
                    return None;
                }
                let (bytes, rest) = self.rest.split_at(len);
                self.rest = rest;
                Value::Bytes(bytes)
            }
            FIXED64 | FIXED32 => {
                let width = if key & 7 == u64::from(FIXED64) { 8 } else { 4 };
                if self.rest.remaining() < width {
                    self.rest = &[];
                    return None;
                }
                self.rest.advance(width);
                Value::Fixed
            }
            _ => {
                // Groups are not used by proto3; anything else is malformed.
                self.rest = &[];
                return None;
            }
        };
        Some((number, value))
    }
}

fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

/// TEI's timing `Metadata` from field 2 of a response, if present.
pub fn tei_timing(response: &[u8]) -> Option<TeiTiming> {
    let metadata = fields(response).find_map(|(number, value)| match (number, value) {
        (2, Value::Bytes(bytes)) => Some(bytes),
        _ => None,
    })?;
    let mut timing = TeiTiming::default();
    for (number, value) in fields(metadata) {
        let Value::Varint(v) = value else { continue };
        match number {
            1 => timing.compute_chars = v,
            2 => timing.compute_tokens = v,
            5 => timing.queue = Duration::from_nanos(v),
            6 => timing.inference = Duration::from_nanos(v),
            _ => {}
        }
    }
    Some(timing)
}

/// The inputs and text a request carries: `inputs_field` counts one input per occurrence (or one
/// input for the message when `None`), `text_fields` are the strings TEI tokenizes.
pub fn request_size(request: &[u8], inputs_field: Option<u32>, text_fields: &[u32]) -> RequestSize {
    let mut size = RequestSize { inputs: u32::from(inputs_field.is_none()), text_bytes: 0 };
    for (number, value) in fields(request) {
        if Some(number) == inputs_field {
            size.inputs += 1;
        }
        if let Value::Bytes(bytes) = value
            && text_fields.contains(&number)
        {
            size.text_bytes += bytes.len();
        }
    }
    size
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use teifleet_proto::v1;

    use super::*;

    #[test]
    fn reads_tei_timing_from_a_response() {
        let response = v1::EmbedResponse {
            embeddings: vec![0.5; 384],
            metadata: Some(v1::Metadata {
                compute_chars: 120,
                compute_tokens: 31,
                total_time_ns: 9_000_000,
                tokenization_time_ns: 1_000,
                queue_time_ns: 2_500_000,
                inference_time_ns: 6_000_000,
            }),
        };
        let timing = tei_timing(&response.encode_to_vec()).unwrap();
        assert_eq!(
            timing,
            TeiTiming {
                compute_chars: 120,
                compute_tokens: 31,
                queue: Duration::from_micros(2500),
                inference: Duration::from_millis(6)
            }
        );
        let rerank = v1::RerankResponse { ranks: vec![], metadata: Some(Default::default()) };
        assert_eq!(tei_timing(&rerank.encode_to_vec()), Some(TeiTiming::default()), "present but all zero");
        assert_eq!(tei_timing(&v1::InfoResponse::default().encode_to_vec()), None);
    }

    #[test]
    fn counts_inputs_and_text() {
        let rerank = v1::RerankRequest {
            query: "what".into(),
            texts: vec!["a".into(), "bb".into(), "ccc".into()],
            truncate: true,
            ..Default::default()
        };
        assert_eq!(request_size(&rerank.encode_to_vec(), Some(2), &[1, 2]), RequestSize { inputs: 3, text_bytes: 10 });
        let embed = v1::EmbedRequest { inputs: "hello world".into(), dimensions: Some(8), ..Default::default() };
        assert_eq!(request_size(&embed.encode_to_vec(), None, &[1]), RequestSize { inputs: 1, text_bytes: 11 });
    }

    #[test]
    fn malformed_bytes_read_as_nothing() {
        assert_eq!(tei_timing(&[0x12, 0x40, 1, 2]), None, "length beyond the end");
        assert_eq!(tei_timing(&[0xff; 12]), None, "varint too long");
        assert_eq!(request_size(&[0x0b], None, &[1]), RequestSize { inputs: 1, text_bytes: 0 }, "a group");
        let fixed = [0x0d, 0, 0, 0x80, 0x3f, 0x12, 0x02, 0x28, 0x07];
        assert_eq!(tei_timing(&fixed).unwrap().queue, Duration::from_nanos(7), "fixed32 skipped");
    }
}
