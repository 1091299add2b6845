//! The request messages of each gRPC row, valid or broken on purpose, as bytes (unframed).

use std::sync::Arc;

use arrow_array::{RecordBatch, StringArray};
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_schema::{DataType, Field, Schema};
use prost::Message as _;
use teifleet_proto::tei_multiplexer::v1 as mux;
use teifleet_proto::v1;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

use super::sidecar::POOL;
use super::table::{GrpcRow, Message, Size};

/// Streams of many messages carry this many.
const STREAM_MESSAGES: usize = 64;
/// The most rows of one Arrow batch an attack sends (the 100,000 empty strings).
const ARROW_ROWS: usize = 100_000;

/// `n` bytes of text in long words (a thousand bytes each): the longest text for the fewest
/// tokens the simulator spends time on.
pub fn long_text(n: usize) -> String {
    let mut text = format!("{} ", "a".repeat(999)).repeat(n / 1000 + 1);
    text.truncate(n.max(1));
    text
}

/// `n` bytes of text, words the simulator counts as tokens.
pub fn words(n: usize) -> String {
    let mut text = "lorem ipsum ".repeat(n / 12 + 1);
    text.truncate(n.max(1));
    text
}

fn target() -> Option<mux::Target> {
    Some(mux::Target { routing: Some(mux::target::Routing::InstanceName(POOL.into())) })
}

/// An IPC stream of one batch with a `text` column of these rows.
pub fn ipc(rows: &[&str], lz4: bool) -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, true)]));
    let column = Arc::new(StringArray::from(rows.to_vec()));
    let batch = RecordBatch::try_new(schema.clone(), vec![column]).expect("a batch");
    let compression = lz4.then_some(arrow_ipc::CompressionType::LZ4_FRAME);
    let options = IpcWriteOptions::default().try_with_compression(compression).expect("lz4 is built in");
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new_with_options(&mut out, &schema, options).expect("a writer");
    writer.write(&batch).expect("written");
    writer.finish().expect("finished");
    drop(writer);
    out
}

/// An Arrow row's request of this IPC stream.
pub fn arrow_with(row: &GrpcRow, ipc: Vec<u8>) -> Vec<u8> {
    arrow(row, ipc, None)
}

fn arrow(row: &GrpcRow, ipc: Vec<u8>, prompt_name: Option<String>) -> Vec<u8> {
    match row.message {
        Message::SparseArrow => mux::EmbedSparseArrowRequest {
            target: target(),
            arrow_ipc: ipc.into(),
            truncate: true,
            prompt_name,
            ..Default::default()
        }
        .encode_to_vec(),
        _ => mux::EmbedArrowRequest {
            target: target(),
            arrow_ipc: ipc.into(),
            truncate: true,
            normalize: true,
            prompt_name,
            ..Default::default()
        }
        .encode_to_vec(),
    }
}

/// The unwrapped message of one request of `row`.
fn one(row: &GrpcRow, size: Size) -> Vec<u8> {
    use Message::*;
    let (long, many) = match size {
        Size::Long(n) => (Some(n), None),
        Size::Many(n) => (None, Some(n)),
        Size::Cheapest | Size::BigAnswer => (None, None),
    };
    let big = matches!(size, Size::BigAnswer);
    let text = long.map_or_else(|| "a".to_owned(), long_text);
    let prompt = many.map(|n| "p".repeat(n));
    match row.message {
        Info => long.or(many).map_or_else(Vec::new, unknown_field),
        Embed => {
            v1::EmbedRequest { inputs: text, truncate: true, prompt_name: prompt, ..Default::default() }.encode_to_vec()
        }
        EmbedSparse | EmbedAll => {
            let inputs = if big { words(12_000) } else { text };
            let request = v1::EmbedSparseRequest { inputs, truncate: true, prompt_name: prompt, ..Default::default() };
            request.encode_to_vec()
        }
        Predict => {
            // A long text in long words: each of a stream's 64 messages of words would cost the
            // simulator a full input's time (14 s in all), which tests nothing the words of the
            // unary `many` do not.
            let inputs = many.map_or(text, words);
            v1::PredictRequest { inputs, truncate: true, ..Default::default() }.encode_to_vec()
        }
        PredictPair => {
            let inputs = match (long, many) {
                (Some(n), _) => vec![long_text(n / 2), long_text(n / 2)],
                (_, Some(n)) => vec!["a".to_owned(); n / 3],
                _ => vec!["a".to_owned(), "b".to_owned()],
            };
            v1::PredictPairRequest { inputs, truncate: true, ..Default::default() }.encode_to_vec()
        }
        Rerank => {
            let (query, texts) = match (long, many) {
                (Some(n), _) => (long_text(n / 2), vec![long_text(n / 2)]),
                (_, Some(n)) => (long_text(n / 2), vec!["a".to_owned(); n / 6]),
                _ if big => ("q".to_owned(), vec![words(400); 2000]),
                _ => ("q".to_owned(), vec!["a".to_owned()]),
            };
            v1::RerankRequest { query, texts, truncate: true, return_text: true, ..Default::default() }.encode_to_vec()
        }
        RerankStream => {
            let (query, text) = match long.or(many) {
                Some(n) => (long_text(n / 2), long_text(n / 2)),
                None if big => ("q".to_owned(), words(400)),
                None => ("q".to_owned(), "a".to_owned()),
            };
            v1::RerankStreamRequest { query, text, truncate: true, return_text: true, ..Default::default() }
                .encode_to_vec()
        }
        Encode => {
            let inputs = if big { "a ".repeat(100_000) } else { text };
            v1::EncodeRequest { inputs, add_special_tokens: true, prompt_name: prompt }.encode_to_vec()
        }
        Decode => {
            let ids = match long.or(many) {
                Some(n) => vec![1000; n / 2],
                None if big => vec![1000; 100_000],
                None => vec![1000],
            };
            v1::DecodeRequest { ids, skip_special_tokens: false }.encode_to_vec()
        }
        Arrow | SparseArrow => match (long, many) {
            (Some(n), _) => arrow(row, ipc(&[&long_text(n.saturating_sub(1024))], false), None),
            (_, Some(n)) => {
                let batch = ipc(&vec!["a"; ARROW_ROWS], false);
                let fill = n.saturating_sub(batch.len() + 1024);
                arrow(row, batch, Some("p".repeat(fill)))
            }
            _ if big => arrow(row, ipc(&["a"; 1000], false), None),
            _ => arrow(row, ipc(&["a"], false), None),
        },
        HealthCheck => {
            let service = long.or(many).map_or_else(String::new, |n| "s".repeat(n));
            tonic_health::pb::HealthCheckRequest { service }.encode_to_vec()
        }
        Reflection => {
            let request = match (long.or(many), big) {
                (_, true) => MessageRequest::FileContainingSymbol("tei_multiplexer.v1.TeiMultiplexer".into()),
                _ => MessageRequest::ListServices(String::new()),
            };
            let host = long.or(many).map_or_else(String::new, |n| "h".repeat(n));
            ServerReflectionRequest { host, message_request: Some(request) }.encode_to_vec()
        }
    }
}

/// The messages of one call of `row` of about `size`: one for a unary call; a stream sends
/// [`STREAM_MESSAGES`] for `Many` (each input a message of its own), and many answers' worth for
/// `BigAnswer`.
pub fn messages(row: &GrpcRow, size: Size) -> Vec<Vec<u8>> {
    let wrap = |message: Vec<u8>| if row.wrapped { wrapped(&message) } else { message };
    match (row.client_stream, size) {
        (true, Size::Many(n)) => vec![wrap(one(row, Size::Long(n / STREAM_MESSAGES))); STREAM_MESSAGES],
        (true, Size::BigAnswer) => vec![wrap(one(row, size)); 32],
        _ => vec![wrap(one(row, size))],
    }
}

/// The framed body of one call.
pub fn body(row: &GrpcRow, size: Size) -> bytes::Bytes {
    let framed: Vec<u8> = messages(row, size).iter().flat_map(|m| super::client::frame(m)).collect();
    framed.into()
}

fn wrapped(message: &[u8]) -> Vec<u8> {
    let mut out = mux::InfoRequest { target: target() }.encode_to_vec();
    out.extend(tag(2, 2));
    out.extend(varint(message.len() as u64));
    out.extend_from_slice(message);
    out
}

/// A field the message does not have, which protobuf skips: the only way to make an Info large.
fn unknown_field(n: usize) -> Vec<u8> {
    [tag(15, 2), varint(n as u64), vec![b'a'; n]].concat()
}

pub fn tag(field: u32, wire: u8) -> Vec<u8> {
    varint(u64::from(field) << 3 | u64::from(wire))
}

pub fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

/// Where the row's largest field is: the field numbers from the message sent to that field,
/// after any target (`prefix`).
fn bulk_path(row: &GrpcRow) -> Vec<u32> {
    use Message::*;
    let inner = match row.message {
        Info => vec![15],
        Embed | EmbedSparse | EmbedAll | Predict | PredictPair | Encode | Decode | HealthCheck | Reflection => {
            vec![1]
        }
        Rerank | RerankStream => vec![2],
        Arrow | SparseArrow => return vec![2],
    };
    if row.wrapped { [vec![2], inner].concat() } else { inner }
}

/// The target sent before the bulk field, where the message has one.
fn prefix(row: &GrpcRow) -> Vec<u8> {
    match row.wrapped || matches!(row.message, Message::Arrow | Message::SparseArrow) {
        true => mux::InfoRequest { target: target() }.encode_to_vec(),
        false => Vec::new(),
    }
}

/// The bytes before `content`, a length-delimited payload of the row's largest field of
/// `content_len` bytes (the field's own tag and length included): a message is these bytes and
/// then the content.
pub fn bulk_header(row: &GrpcRow, content_len: usize) -> Vec<u8> {
    let path = bulk_path(row);
    let mut header = Vec::new();
    let mut len = content_len;
    for field in path.iter().rev() {
        let mut level = tag(*field, 2);
        level.extend(varint(len as u64));
        len += level.len();
        level.extend(header);
        header = level;
    }
    [prefix(row), header].concat()
}

/// A message whose largest field's place holds `inner` as it is (a field of the enclosing message
/// written by hand): the rest of the message is well formed around it.
pub fn with_inner(row: &GrpcRow, inner: &[u8]) -> Vec<u8> {
    let path = bulk_path(row);
    let mut message = inner.to_vec();
    for field in path[..path.len() - 1].iter().rev() {
        message = [tag(*field, 2), varint(message.len() as u64), message].concat();
    }
    [prefix(row), message].concat()
}

/// The field number of the row's largest field, in its own message.
pub fn bulk_field(row: &GrpcRow) -> u32 {
    *bulk_path(row).last().expect("a path")
}
