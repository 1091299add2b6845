//! A batch's rows on their way upstream: each row's tei.v1 request encoded from the decoded
//! column with the batch's options (its `prompt_name` bounded, and refused from its declared
//! length before prost copies it), and the sub-batches' messages charged to the memory budget
//! while they are in flight, since each is a copy of its row and of the per-request fields.

use super::Context;
use super::error::ManagerError;
use crate::admission::memory::{Charge, Use};
use crate::error::Error;
use crate::vocab::framing::Framed;

/// The longest `prompt_name` a batch may name. TEI's prompt names are keys of the model's prompts
/// config ("query", "passage", "s2p_query"): short words. The name goes into every row's upstream
/// message, so its length is multiplied by the rows in flight: a 40 MB name on 100,000 rows held
/// 1.6 GB before this bound.
pub const MAX_PROMPT_NAME: usize = 256;

/// What a row's upstream message holds beside its text and prompt name: the prefix, the fields'
/// keys, lengths and scalar values (under 40 bytes), rounded up.
pub const MESSAGE_FIXED: usize = 64;

/// What one entry of a message's copy of the carried headers holds (the map's slot and index,
/// its name; the value's bytes are shared), rounded up.
pub const CARRIED_ENTRY: usize = 128;

/// A tei.v1 request whose `inputs` (field 1 of EmbedRequest and EmbedSparseRequest) is borrowed:
/// written first, then the rest of the message, whose own `inputs` is empty and so not written
/// (protobuf reads fields in any order).
#[derive(Debug)]
pub struct WithInputs<'a, M> {
    pub inputs: &'a str,
    pub rest: M,
}

impl<M: prost::Message> prost::Message for WithInputs<'_, M> {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        if !self.inputs.is_empty() {
            prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(self.inputs.len() as u64, buf);
            buf.put_slice(self.inputs.as_bytes());
        }
        self.rest.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Only ever encoded: a field read into it is skipped.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let inputs = match self.inputs.len() {
            0 => 0,
            len => prost::encoding::key_len(1) + prost::encoding::encoded_len_varint(len as u64) + len,
        };
        inputs + self.rest.encoded_len()
    }

    fn clear(&mut self) {
        self.inputs = "";
        self.rest.clear();
    }
}

/// The request's `prompt_name`, refused past [`MAX_PROMPT_NAME`] before anything is built from it.
pub fn prompt_name(name: &Option<String>) -> Result<Option<String>, ManagerError> {
    match name {
        Some(name) if name.len() > MAX_PROMPT_NAME => {
            Err(ManagerError::PromptNameTooLong { bytes: name.len(), limit: MAX_PROMPT_NAME })
        }
        name => Ok(name.clone()),
    }
}

/// `prompt_name`'s field in EmbedArrowRequest and EmbedSparseArrowRequest.
pub const DENSE_PROMPT_NAME: u32 = 7;
pub const SPARSE_PROMPT_NAME: u32 = 6;

/// Refuses a request message whose `prompt_name` (field `tag`) is past [`MAX_PROMPT_NAME`] from
/// its declared length, before prost decodes it: decoding copies a string field into a `String`
/// (the IPC stays a slice of the message), so a 40 MB name would be held twice. Only the
/// top-level fields' keys and lengths are read; what cannot be walked is left to prost to refuse.
pub fn check_prompt_name(message: &[u8], tag: u32) -> Result<(), ManagerError> {
    use prost::encoding::{WireType, decode_key, decode_varint};
    let mut buf = message;
    while !buf.is_empty() {
        let Ok((field, wire_type)) = decode_key(&mut buf) else { return Ok(()) };
        let skip = match wire_type {
            WireType::Varint => match decode_varint(&mut buf) {
                Ok(_) => 0,
                Err(_) => return Ok(()),
            },
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => match decode_varint(&mut buf).map(usize::try_from) {
                Ok(Ok(len)) if field == tag && len > MAX_PROMPT_NAME => {
                    return Err(ManagerError::PromptNameTooLong { bytes: len, limit: MAX_PROMPT_NAME });
                }
                Ok(Ok(len)) => len,
                _ => return Ok(()),
            },
            WireType::StartGroup | WireType::EndGroup => return Ok(()),
        };
        let Some(rest) = buf.get(skip..) else { return Ok(()) };
        buf = rest;
    }
    Ok(())
}

/// Messages in sub-batches of `size`, made as the bulk runner asks for them, each charged.
pub struct Chunks<'a, I> {
    pub messages: I,
    pub size: usize,
    pub per_message: u64,
    pub in_flight: &'a InFlight,
}

impl<I: Iterator<Item = Framed>> Iterator for Chunks<'_, I> {
    type Item = Vec<Framed>;

    fn next(&mut self) -> Option<Vec<Framed>> {
        let chunk: Vec<Framed> = self.messages.by_ref().take(self.size).collect();
        if chunk.is_empty() {
            return None;
        }
        let bytes = chunk.iter().map(|message| message.as_ref().len() as u64 + self.per_message).sum();
        // Made, then charged: a sub-batch is at most TEI's batch of rows each within the message
        // limit; refused, it is dropped unsent and the call ends (see `InFlight::refused`).
        self.in_flight.made(bytes).then_some(chunk)
    }
}

/// The bytes of the sub-batches made and not yet answered, charged to the memory budget: a call
/// holds its window's messages beside its decoded rows, and with rows of a megabyte (an LZ4
/// batch inflating 0.5 MB to 16 MiB) those are as large as the rows themselves.
pub struct InFlight {
    charge: Charge,
    /// Each sub-batch's bytes, oldest first: the bulk runner answers them in order.
    made: std::sync::Mutex<std::collections::VecDeque<u64>>,
    over: std::sync::Mutex<Option<crate::admission::memory::OverBudget>>,
}

impl InFlight {
    pub fn new(cx: &Context) -> Result<Self, ManagerError> {
        let charge = cx.memory.charge(Use::RequestBodies, 0).map_err(|over| ManagerError::Call(Error::Memory(over)))?;
        Ok(Self { charge, made: Default::default(), over: Default::default() })
    }

    /// A sub-batch of `bytes` made: charged, or `false` when the budget has no room for it.
    pub fn made(&self, bytes: u64) -> bool {
        match self.charge.grow(bytes) {
            Ok(()) => {
                self.made.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push_back(bytes);
                true
            }
            Err(over) => {
                *self.over.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(over);
                false
            }
        }
    }

    /// The oldest sub-batch answered: its messages were sent and dropped.
    pub fn answered(&self) {
        let bytes = self.made.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop_front();
        self.charge.shrink(bytes.unwrap_or(0));
    }

    /// The call's refusal if a sub-batch could not be charged.
    pub fn refused(&self) -> Result<(), ManagerError> {
        match self.over.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
            Some(over) => Err(ManagerError::Call(Error::Memory(over))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message as _;
    use teifleet_proto::tei_multiplexer::v1 as mux;

    use super::*;

    #[test]
    fn a_long_prompt_name_is_refused_from_its_length_before_decoding() {
        let message = |name: String| {
            let request = mux::EmbedArrowRequest {
                arrow_ipc: Bytes::from_static(b"ipc"),
                prompt_name: Some(name),
                truncate: true,
                dimensions: Some(384),
                ..Default::default()
            };
            request.encode_to_vec()
        };
        assert!(check_prompt_name(&message("p".repeat(MAX_PROMPT_NAME)), DENSE_PROMPT_NAME).is_ok());
        let long = message("p".repeat(MAX_PROMPT_NAME + 1));
        assert!(matches!(
            check_prompt_name(&long, DENSE_PROMPT_NAME),
            Err(ManagerError::PromptNameTooLong { bytes, .. }) if bytes == MAX_PROMPT_NAME + 1
        ));
        let sparse = mux::EmbedSparseArrowRequest { prompt_name: Some("p".repeat(1000)), ..Default::default() };
        assert!(check_prompt_name(&sparse.encode_to_vec(), SPARSE_PROMPT_NAME).is_err());
        // Cut short or garbage: left to prost.
        assert!(check_prompt_name(&long[..long.len() / 2], DENSE_PROMPT_NAME).is_err());
        assert!(check_prompt_name(&[0xff; 16], DENSE_PROMPT_NAME).is_ok());
    }
}
