//! gRPC's message framing, one home for both sides of the sidecar: each message follows a 5-byte
//! prefix (a compressed flag and its length). Messages are never decoded here; this only takes
//! the prefix off and puts it back, with the statuses tonic gives for the same faults.

use std::ops::Deref;
use std::pin::Pin;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use futures::Stream;
use tonic::Status;

/// gRPC's status trailer (or header, in a trailers-only answer) and its message.
pub const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
pub const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// An answer's headers gRPC sets itself, dropped from the metadata an answer carries (the
/// upstream's own, passed on, or a status's).
pub static RESERVED_IN_ANSWERS: [http::HeaderName; 6] = [
    http::header::TE,
    http::header::USER_AGENT,
    http::header::CONTENT_TYPE,
    GRPC_STATUS,
    GRPC_MESSAGE,
    http::HeaderName::from_static("grpc-message-type"),
];

/// A stream's messages as bytes, either way: a client's as they arrive, or the answers a
/// streaming call sends back.
pub type MessageStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send + 'static>>;

/// A gRPC message's prefix: the compressed flag and the length.
pub const PREFIX: usize = 5;

/// Messages ready together go out in one data frame up to this size, as tonic's encoder gathers
/// them: each frame costs h2 a queue entry, a window reservation and a write.
pub const GATHER_BYTES: usize = 32 * 1024;

/// The message with its prefix (uncompressed).
pub fn framed(message: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(PREFIX + message.len());
    frame_into(&mut frame, message);
    frame.freeze()
}

/// Appends the message with its prefix to `frames`.
pub fn frame_into(frames: &mut BytesMut, message: &[u8]) {
    frames.reserve(PREFIX + message.len());
    frames.put_u8(0);
    frames.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    frames.extend_from_slice(message);
}

/// One message as it goes over gRPC: its bytes with their prefix. A unary call's message is
/// passed on as it came, prefix and all, and each way (the caller's request, TEI's answer) that
/// spares a buffer and a copy of the message on every call; it reads as the message's bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Framed {
    framed: Bytes,
}

impl Framed {
    /// `message`'s bytes, framed (a copy).
    pub fn new(message: &[u8]) -> Self {
        Self { framed: framed(message) }
    }

    /// `message` encoded after room for its prefix: framed with no copy.
    pub fn encode(message: &impl prost::Message) -> Self {
        let len = message.encoded_len();
        let mut frame = BytesMut::with_capacity(PREFIX + len);
        frame.put_u8(0);
        frame.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        message.encode_raw(&mut frame);
        Self { framed: frame.freeze() }
    }

    /// A message written into `buffer` after `room` bytes kept free for its prefix and `head` (the
    /// bytes that start the message before what was written: a field's key and length), framed in
    /// place: a large answer is written once, never copied to be framed. `room` must be at least
    /// `PREFIX + head.len()`.
    pub fn in_place(mut buffer: Vec<u8>, room: usize, head: &[u8]) -> Self {
        let start = room - head.len() - PREFIX;
        let len = buffer.len() - start - PREFIX;
        buffer[start] = 0;
        buffer[start + 1..start + PREFIX].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        buffer[room - head.len()..room].copy_from_slice(head);
        Self { framed: Bytes::from(buffer).slice(start..) }
    }

    /// The message with its prefix, as it goes on the wire.
    pub fn into_framed(self) -> Bytes {
        self.framed
    }

    /// The message's bytes, without the prefix.
    pub fn into_message(mut self) -> Bytes {
        self.framed.advance(PREFIX);
        self.framed
    }
}

impl Deref for Framed {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.framed[PREFIX..]
    }
}

impl AsRef<[u8]> for Framed {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// Which way the messages go, for the words of a bad flag's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// A client's request messages.
    Request,
    /// The upstream's answers.
    Answer,
}

/// A body's bytes as they arrive, cut into its messages. A message that came whole in one data
/// frame (gRPC stacks write each in one) is passed on as a slice of it, without a copy; only one
/// split over frames is put back together.
pub struct Messages {
    /// The last data frame's bytes not yet taken.
    frame: Bytes,
    /// The start of a message whose rest is in frames still to come.
    partial: BytesMut,
    max_message: usize,
    side: Side,
}

impl Messages {
    pub fn new(max_message: usize, side: Side) -> Self {
        Self { frame: Bytes::new(), partial: BytesMut::new(), max_message, side }
    }

    /// Takes the next data frame, once [`Self::take`] has taken all it could of the last.
    pub fn push(&mut self, data: Bytes) {
        debug_assert!(self.frame.is_empty(), "a frame's bytes are taken before the next is read");
        self.frame = data;
    }

    /// Whether bytes of a message are still waiting for the rest of it: at the end of the body,
    /// the body was cut short.
    pub fn is_cut_short(&self) -> bool {
        !self.frame.is_empty() || !self.partial.is_empty()
    }

    /// The next whole message, if the bytes in hold one; refused as soon as its prefix is in.
    pub fn take(&mut self) -> Result<Option<Bytes>, Status> {
        Ok(self.take_framed()?.map(Framed::into_message))
    }

    /// [`Self::take`], the message kept with its prefix.
    pub fn take_framed(&mut self) -> Result<Option<Framed>, Status> {
        if self.partial.is_empty() {
            let Some(len) = self.length(&self.frame[..])? else {
                self.keep_rest();
                return Ok(None);
            };
            if self.frame.len() < PREFIX + len {
                self.keep_rest();
                return Ok(None);
            }
            return Ok(Some(Framed { framed: self.frame.split_to(PREFIX + len) }));
        }
        // The prefix first, then as much of the message as this frame has.
        let short_of_prefix = PREFIX.saturating_sub(self.partial.len()).min(self.frame.len());
        self.partial.extend_from_slice(&self.frame.split_to(short_of_prefix));
        let Some(len) = self.length(&self.partial[..])? else { return Ok(None) };
        let short = (PREFIX + len - self.partial.len()).min(self.frame.len());
        self.partial.extend_from_slice(&self.frame.split_to(short));
        if self.partial.len() < PREFIX + len {
            return Ok(None);
        }
        Ok(Some(Framed { framed: std::mem::take(&mut self.partial).freeze() }))
    }

    /// The length of the message `bytes` start with, once its prefix is in.
    fn length(&self, bytes: &[u8]) -> Result<Option<usize>, Status> {
        let Some(mut prefix) = bytes.get(..PREFIX) else { return Ok(None) };
        let flag = prefix.get_u8();
        let len = prefix.get_u32() as usize;
        match (flag, self.side) {
            (0, _) => {}
            (1, _) | (_, Side::Answer) => return Err(compressed_flag()),
            (flag, Side::Request) => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and \
                     1), while sending request"
                )));
            }
        }
        if len > self.max_message {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.max_message
            )));
        }
        Ok(Some(len))
    }

    /// The frame's last bytes start a message that continues in the next frame.
    fn keep_rest(&mut self) {
        self.partial.extend_from_slice(&std::mem::take(&mut self.frame));
    }
}

/// A message marked compressed, which no `grpc-encoding` allows here, in tonic's words.
fn compressed_flag() -> Status {
    Status::internal("protocol error: received message with compressed-flag but no grpc-encoding was specified")
}

/// A unary body that ended without its one message, in tonic's words.
pub fn missing(side: Side) -> Status {
    Status::internal(match side {
        Side::Request => "Missing request message.",
        Side::Answer => "Missing response message.",
    })
}

/// A body that ended inside a message, in tonic's words.
pub fn cut_short() -> Status {
    Status::internal("Unexpected EOF decoding stream.")
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn bytes_are_cut_into_messages_whatever_the_frames() {
        let frames: [&[u8]; 4] = [&[0, 0, 0], &[0, 2, b'h', b'i', 0, 0], &[0, 0, 1, b'!', 0, 0, 0, 0, 1], b"?"];
        let mut messages = Messages::new(10, Side::Answer);
        let mut taken = Vec::new();
        for frame in frames {
            messages.push(Bytes::from_static(frame));
            while let Some(message) = messages.take().unwrap() {
                taken.push(message);
            }
        }
        assert_eq!(taken, [&b"hi"[..], b"!", b"?"]);
        assert!(!messages.is_cut_short());

        // Whole messages in one frame are slices of it.
        let frame = Bytes::from_static(&[0, 0, 0, 0, 2, b'h', b'i', 0, 0, 0, 0, 1, b'!']);
        let mut whole = Messages::new(10, Side::Answer);
        whole.push(frame.clone());
        let first = whole.take().unwrap().unwrap();
        assert_eq!(first.as_ptr(), frame[5..].as_ptr(), "no copy");
        assert_eq!(whole.take().unwrap(), Some(Bytes::from_static(b"!")));
        assert_eq!(framed(b"hi").as_ref(), &frame[..7]);

        // Kept with its prefix, the message is the same slice, prefix and all.
        let mut kept = Messages::new(10, Side::Answer);
        kept.push(frame.clone());
        let first = kept.take_framed().unwrap().unwrap();
        assert_eq!(&first[..], b"hi", "it reads as the message");
        assert_eq!(first.clone().into_framed().as_ptr(), frame.as_ptr(), "no copy");
        assert_eq!(first, Framed::new(b"hi"));
        assert_eq!(first.into_message().as_ptr(), frame[5..].as_ptr());
        assert_eq!(
            Framed::encode(&"hi".to_owned()).into_framed(),
            framed(&prost::Message::encode_to_vec(&"hi".to_owned()))
        );

        let mut cut = Messages::new(10, Side::Answer);
        cut.push(Bytes::from_static(&[0, 0, 0, 0, 9, b'h']));
        assert_eq!(cut.take().unwrap(), None);
        assert!(cut.is_cut_short(), "a body ending here ends inside a message");
    }

    #[test]
    fn bad_prefixes_get_tonics_statuses() {
        let refused = |side, bytes: &'static [u8]| {
            let mut messages = Messages::new(10, side);
            messages.push(Bytes::from_static(&bytes[..2]));
            assert_eq!(messages.take().unwrap(), None);
            messages.push(Bytes::from_static(&bytes[2..]));
            messages.take().unwrap_err()
        };
        let large = refused(Side::Request, &[0, 0, 0, 0, 11]);
        assert_eq!(large.code(), Code::OutOfRange, "refused before its bytes arrive, its prefix split");
        assert!(large.message().ends_with("found 11 bytes, the limit is: 10 bytes"), "{large:?}");
        assert_eq!(refused(Side::Answer, &[1, 0, 0, 0, 1, b'x']).code(), Code::Internal);
        assert_eq!(refused(Side::Answer, &[7, 0, 0, 0, 1, b'x']).code(), Code::Internal);
        let flag = refused(Side::Request, &[7, 0, 0, 0, 1, b'x']);
        assert!(flag.message().contains("invalid compression flag: 7"), "{flag:?}");
    }
}
