//! A request's Arrow IPC stream walked here, message by message, before `arrow` reads any of it:
//! every length, offset and count is checked against the bytes that came, and what decoding the
//! `text` column will inflate (LZ4 buffers declare their uncompressed size in their first 8
//! bytes) is charged to the memory budget before it is inflated. Then `arrow` decodes only that
//! column, fully validated (offsets, UTF-8, null counts).
//!
//! Why not `arrow`'s `StreamReader` alone: it trusts the stream. A buffer declaring 2^62
//! uncompressed bytes is allocated before a byte is inflated (the process aborts), a body length
//! of 2^40 is read towards, and a buffer past the body's end panics inside arrow-buffer. What
//! tei-manager's clients never send (dictionaries, several batches, ZSTD, unions, views) is
//! refused in words, not decoded.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, LargeStringArray, StringArray};
use arrow_ipc::{BodyCompressionMethod, CompressionType, Endianness, MetadataVersion, Type};
use bytes::Bytes;

use super::error::ManagerError;
use super::ipc::{TEXT, Texts};
use crate::admission::memory::{Charge, MemoryBudget, Use};
use crate::error::Error;

/// The most the `text` column may inflate to (its buffers decompressed): far past any batch a
/// tei-manager client sends (100,000 texts of 600 bytes), far below what one call may hold.
pub const MAX_INFLATED_BYTES: u64 = 64 << 20;
/// The most rows one batch may have: tei-manager's own bench sends up to 100,000.
pub const MAX_ROWS: i64 = 1 << 20;
/// Columns and nested fields a schema may have in all, and how deep they may nest.
const MAX_FIELDS: usize = 4096;
const MAX_DEPTH: usize = 16;
/// A message's length follows this marker (the format since Arrow 0.15; older streams omit it).
const CONTINUATION: [u8; 4] = [0xff; 4];
/// A compressed buffer starts with its uncompressed length; -1 says it was left uncompressed.
const LENGTH_PREFIX: usize = 8;
const LEFT_UNCOMPRESSED: i64 = -1;

/// The `text` column of a request's one RecordBatch, and the memory charged for what decoding
/// it inflated (given back when dropped).
pub struct Decoded {
    pub texts: Texts,
    pub charge: Charge,
}

/// Reads the `text` column of `ipc` (a stream: its schema, one RecordBatch, its end), every
/// buffer checked against the body it came in and the inflated bytes charged to `memory` first.
/// A request's bytes can make it return a refusal, never panic.
pub fn decode_texts(ipc: &Bytes, memory: &Arc<MemoryBudget>) -> Result<Decoded, ManagerError> {
    let mut at = 0;
    let (schema_message, _) = next_message(ipc, &mut at)?.ok_or_else(|| malformed("the stream is empty"))?;
    let schema =
        schema_message.header_as_schema().ok_or_else(|| malformed("the stream does not start with a schema"))?;
    let layout = Layout::of(&schema)?;
    let (message, body) = match next_message(ipc, &mut at)? {
        Some(next) => next,
        None => return Err(malformed("the stream holds no RecordBatch")),
    };
    let batch = match message.header_type() {
        arrow_ipc::MessageHeader::RecordBatch => message.header_as_record_batch(),
        arrow_ipc::MessageHeader::DictionaryBatch => return Err(unserved_dictionary()),
        _ => None,
    }
    .ok_or_else(|| malformed("the message after the schema is not a RecordBatch"))?;
    match next_message(ipc, &mut at)? {
        None => {}
        Some((next, _)) if next.header_type() == arrow_ipc::MessageHeader::RecordBatch => {
            return Err(ManagerError::Unserved(
                "the stream holds more than one RecordBatch: send one per EmbedArrow call (or one per \
                 EmbedArrowStream message)"
                    .into(),
            ));
        }
        Some(_) => return Err(malformed("a message follows the RecordBatch where the stream should end")),
    }
    let text = layout.check(&batch, &body)?;
    let charge =
        memory.charge(Use::RequestBodies, text.inflated).map_err(|over| ManagerError::Call(Error::Memory(over)))?;
    let arrow_schema = arrow_ipc::convert::try_fb_to_schema(schema).map_err(arrow_error)?;
    if arrow_schema.fields().len() != layout.columns {
        return Err(malformed("the schema's columns do not match its fields"));
    }
    let body = arrow_buffer::Buffer::from(body);
    let projection = [layout.text];
    let read = arrow_ipc::reader::read_record_batch(
        &body,
        batch,
        Arc::new(arrow_schema),
        &HashMap::new(),
        Some(&projection),
        &message.version(),
    )
    .map_err(arrow_error)?;
    let column = read.column(0);
    let texts = match text.large {
        false => column.as_any().downcast_ref::<StringArray>().cloned().map(Texts::Utf8),
        true => column.as_any().downcast_ref::<LargeStringArray>().cloned().map(Texts::LargeUtf8),
    }
    .ok_or_else(|| ManagerError::TextNotUtf8(column.data_type().to_string()))?;
    Ok(Decoded { texts, charge })
}

/// The next message of the stream from `at` (its header and body), `None` at its end.
fn next_message<'a>(ipc: &'a Bytes, at: &mut usize) -> Result<Option<(arrow_ipc::Message<'a>, Bytes)>, ManagerError> {
    let rest = &ipc[*at..];
    let (len, skip) = match rest {
        [] => return Ok(None),
        [0xff, 0xff, 0xff, 0xff, a, b, c, d, ..] => (i32::from_le_bytes([*a, *b, *c, *d]), 8),
        [a, b, c, d, ..] if rest[..4] != CONTINUATION => (i32::from_le_bytes([*a, *b, *c, *d]), 4),
        _ => return Err(malformed("the stream ends inside a message's length")),
    };
    // A zero length marks the stream's end; whatever follows is not read.
    if len == 0 {
        *at = ipc.len();
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| malformed(format!("a message's metadata length is {len}")))?;
    let start = *at + skip;
    let end = start.checked_add(len).filter(|end| *end <= ipc.len()).ok_or_else(|| {
        malformed(format!("a message declares {len} bytes of metadata; {} follow", ipc.len() - start))
    })?;
    let message = arrow_ipc::root_as_message(&ipc[start..end])
        .map_err(|e| malformed(format!("a message's metadata is not a valid flatbuffer: {e}")))?;
    if message.version() < MetadataVersion::V4 {
        return Err(ManagerError::Unserved(format!(
            "Arrow IPC metadata version {:?}: write it with Arrow 0.15 or later (V4 or V5)",
            message.version()
        )));
    }
    let body_len = message.bodyLength();
    let body_end = usize::try_from(body_len)
        .ok()
        .and_then(|len| end.checked_add(len))
        .filter(|body_end| *body_end <= ipc.len())
        .ok_or_else(|| {
            malformed(format!("a message declares a {body_len}-byte body; {} bytes follow", ipc.len() - end))
        })?;
    *at = body_end;
    Ok(Some((message, ipc.slice(end..body_end))))
}

/// Where the `text` column's node and buffers sit among the batch's, from the schema.
struct Layout {
    /// Top-level columns.
    columns: usize,
    /// The `text` column's index among them.
    text: usize,
    /// Its field node, and the first of its three buffers (validity, offsets, values).
    text_node: usize,
    text_buffer: usize,
    large: bool,
    /// Field nodes and buffers a batch of this schema has.
    nodes: usize,
    buffers: usize,
}

/// What decoding the `text` column will hold beyond the request's own bytes.
struct TextColumn {
    large: bool,
    inflated: u64,
}

impl Layout {
    fn of(schema: &arrow_ipc::Schema<'_>) -> Result<Self, ManagerError> {
        if schema.endianness() != Endianness::Little {
            return Err(ManagerError::Unserved("a big-endian stream: write it little-endian".into()));
        }
        let fields = schema.fields().ok_or_else(|| malformed("the schema has no fields"))?;
        let mut walk = Walk::default();
        let mut text = None;
        let mut names = Vec::new();
        for (column, field) in fields.iter().enumerate() {
            let name = field.name().unwrap_or_default();
            if name == TEXT && text.is_none() {
                let large = match field.type_type() {
                    Type::Utf8 => false,
                    Type::LargeUtf8 => true,
                    other => return Err(ManagerError::TextNotUtf8(type_name(other))),
                };
                text = Some((column, walk.nodes, walk.buffers, large));
            }
            if names.len() < super::error::NAMES_SHOWN {
                names.push(name.to_owned());
            }
            walk.field(&field, 0)?;
        }
        let Some((text, text_node, text_buffer, large)) = text else {
            return Err(ManagerError::no_text_column(names, fields.len()));
        };
        Ok(Self {
            columns: fields.len(),
            text,
            text_node,
            text_buffer,
            large,
            nodes: walk.nodes,
            buffers: walk.buffers,
        })
    }

    /// Checks a batch of this schema against its body: its counts, every buffer
    /// within the body, every node's counts sane, and the `text` column's buffers long enough
    /// for its rows; returns what decoding that column will inflate.
    fn check(&self, batch: &arrow_ipc::RecordBatch<'_>, body: &[u8]) -> Result<TextColumn, ManagerError> {
        let rows = batch.length();
        if !(0..=MAX_ROWS).contains(&rows) {
            return Err(ManagerError::TooManyRows { rows, limit: MAX_ROWS });
        }
        if batch.variadicBufferCounts().is_some_and(|counts| !counts.is_empty()) {
            return Err(malformed("variadic buffer counts for a schema without view columns"));
        }
        let nodes = batch.nodes().ok_or_else(|| malformed("the RecordBatch has no field nodes"))?;
        let buffers = batch.buffers().ok_or_else(|| malformed("the RecordBatch has no buffers"))?;
        if nodes.len() != self.nodes || buffers.len() != self.buffers {
            return Err(malformed(format!(
                "the RecordBatch has {} field nodes and {} buffers; its schema needs {} and {}",
                nodes.len(),
                buffers.len(),
                self.nodes,
                self.buffers
            )));
        }
        for node in nodes.iter() {
            if node.length() < 0
                || node.length() > i64::from(i32::MAX)
                || !(0..=node.length()).contains(&node.null_count())
            {
                return Err(malformed(format!(
                    "a field node of {} rows and {} nulls",
                    node.length(),
                    node.null_count()
                )));
            }
        }
        for (i, buffer) in buffers.iter().enumerate() {
            let fits = u64::try_from(buffer.offset())
                .ok()
                .zip(u64::try_from(buffer.length()).ok())
                .and_then(|(offset, length)| offset.checked_add(length))
                .is_some_and(|end| end <= body.len() as u64);
            if !fits {
                return Err(malformed(format!(
                    "buffer {i} spans bytes {}..+{} of a {}-byte body",
                    buffer.offset(),
                    buffer.length(),
                    body.len()
                )));
            }
        }
        let compressed = match batch.compression() {
            None => false,
            Some(compression) if compression.method() != BodyCompressionMethod::BUFFER => {
                return Err(ManagerError::Unserved("a body compressed other than buffer by buffer".into()));
            }
            Some(compression) => match compression.codec() {
                CompressionType::LZ4_FRAME => true,
                CompressionType::ZSTD => {
                    return Err(ManagerError::Unserved(
                        "ZSTD-compressed IPC: send it LZ4_FRAME-compressed (as tei-manager's clients do) or \
                         uncompressed"
                            .into(),
                    ));
                }
                other => return Err(malformed(format!("unknown compression codec {}", other.0))),
            },
        };
        // The text column's buffers as `arrow` will hold them: (bytes held, bytes newly allocated).
        let mut sizes = [(0u64, 0u64); 3];
        // The LZ4 decoder's own buffers while a buffer is inflated (one at a time).
        let mut decoder = 0u64;
        for (size, i) in sizes.iter_mut().zip(self.text_buffer..) {
            let buffer = buffers.get(i);
            // Within the body, checked above.
            let (offset, length) = (buffer.offset() as usize, buffer.length() as usize);
            *size = match (compressed, length) {
                (_, 0) => (0, 0),
                // Uncompressed, sliced from the request's bytes: only the offsets are copied, and
                // only if misaligned (bytes need no alignment).
                (false, _) => (length as u64, if i == self.text_buffer + 1 { length as u64 } else { 0 }),
                (true, _) if length < LENGTH_PREFIX => {
                    return Err(malformed(format!("compressed buffer {i} of {length} bytes has no length prefix")));
                }
                (true, _) => {
                    let mut prefix = [0; LENGTH_PREFIX];
                    prefix.copy_from_slice(&body[offset..offset + LENGTH_PREFIX]);
                    let declared = i64::from_le_bytes(prefix);
                    match declared {
                        LEFT_UNCOMPRESSED => ((length - LENGTH_PREFIX) as u64, (length - LENGTH_PREFIX) as u64),
                        0.. => {
                            let frame = &body[offset + LENGTH_PREFIX..offset + length];
                            decoder = decoder.max(lz4_decoder_bytes(frame, declared as u64));
                            (declared as u64, declared as u64)
                        }
                        _ => return Err(malformed(format!("compressed buffer {i} declares {declared} bytes"))),
                    }
                }
            };
        }
        let inflated = sizes.iter().fold(0u64, |sum, (_, allocated)| sum.saturating_add(*allocated));
        if inflated > MAX_INFLATED_BYTES {
            return Err(ManagerError::InflatesTooLarge { bytes: inflated, limit: MAX_INFLATED_BYTES });
        }
        let node = nodes.get(self.text_node);
        let (validity, offsets) = (sizes[0].0, sizes[1].0);
        let width = if self.large { 8 } else { 4 };
        if node.length() != rows {
            return Err(malformed(format!("the `text` column has {} rows in a batch of {rows}", node.length())));
        }
        if node.null_count() > 0 && validity < (rows as u64).div_ceil(8) {
            return Err(malformed(format!("the `text` column's validity is {validity} bytes for {rows} rows")));
        }
        // arrow reads the offsets as a slice of i32 (i64) and panics on a buffer whose length is
        // not a whole number of them (found by the proptest in tests/it/hostile_arrow/fuzz.rs).
        if offsets % width != 0 {
            return Err(malformed(format!(
                "the `text` column's offsets are {offsets} bytes, not a multiple of {width}"
            )));
        }
        if rows > 0 && offsets < (rows as u64 + 1) * width {
            return Err(malformed(format!("the `text` column's offsets are {offsets} bytes for {rows} rows")));
        }
        Ok(TextColumn { large: self.large, inflated: inflated + decoder })
    }
}

/// What lz4_flex's frame decoder holds while it inflates `frame` to `declared` bytes: a block of
/// the input, and the output window (two blocks and 64 KiB when blocks are linked), each at most
/// what this frame fills. The block size is the frame descriptor's (up to 4 MiB): with 4 MiB
/// blocks a 16 MiB inflation held 8 MiB more than its output while it ran. A header that cannot
/// be read is charged as the largest (the decoder refuses it anyway).
fn lz4_decoder_bytes(frame: &[u8], declared: u64) -> u64 {
    const MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];
    const WINDOW: u64 = 64 << 10;
    let (block, linked) = match frame {
        [m0, m1, m2, m3, flags, descriptor, ..] if [*m0, *m1, *m2, *m3] == MAGIC => {
            let code = u32::from((descriptor >> 4) & 7).clamp(4, 7);
            (1u64 << (2 * code + 8), flags & 0x20 == 0)
        }
        _ => (4 << 20, true),
    };
    let window = if linked { 2 * block + WINDOW } else { block };
    block.min(frame.len() as u64) + window.min(declared)
}

/// Counts a schema's field nodes and buffers as a batch lays them out, refusing the types
/// tei-manager's clients never send.
#[derive(Default)]
struct Walk {
    fields: usize,
    nodes: usize,
    buffers: usize,
}

impl Walk {
    fn field(&mut self, field: &arrow_ipc::Field<'_>, depth: usize) -> Result<(), ManagerError> {
        self.fields += 1;
        if self.fields > MAX_FIELDS || depth > MAX_DEPTH {
            return Err(ManagerError::Unserved(format!(
                "a schema of over {MAX_FIELDS} fields or nested over {MAX_DEPTH} deep"
            )));
        }
        if field.dictionary().is_some() {
            return Err(unserved_dictionary());
        }
        let children = field.children().map_or(0, |children| children.len());
        let kind = field.type_type();
        let (buffers, expected_children) = match kind {
            Type::Null => (0, Some(0)),
            Type::Int
            | Type::FloatingPoint
            | Type::Bool
            | Type::Decimal
            | Type::Date
            | Type::Time
            | Type::Timestamp
            | Type::Interval
            | Type::Duration
            | Type::FixedSizeBinary => (2, Some(0)),
            Type::Binary | Type::Utf8 | Type::LargeBinary | Type::LargeUtf8 => (3, Some(0)),
            Type::List | Type::LargeList | Type::Map => (2, Some(1)),
            Type::FixedSizeList => (1, Some(1)),
            Type::Struct_ => (1, None),
            other => {
                return Err(ManagerError::Unserved(format!(
                    "column `{}` is of type {}, which tei-manager's clients do not send",
                    field.name().unwrap_or_default().chars().take(64).collect::<String>(),
                    type_name(other)
                )));
            }
        };
        if expected_children.is_some_and(|expected| expected != children) {
            return Err(malformed(format!("a {} field with {children} children", type_name(kind))));
        }
        self.nodes += 1;
        self.buffers += buffers;
        for child in field.children().iter().flat_map(|children| children.iter()) {
            self.field(&child, depth + 1)?;
        }
        Ok(())
    }
}

fn type_name(kind: Type) -> String {
    kind.variant_name().map_or_else(|| format!("type {}", kind.0), str::to_owned)
}

fn unserved_dictionary() -> ManagerError {
    ManagerError::Unserved("dictionary-encoded columns: send the `text` column as plain Utf8 or LargeUtf8".into())
}

fn malformed(why: impl Into<String>) -> ManagerError {
    ManagerError::MalformedIpc(why.into())
}

fn arrow_error(error: arrow_schema::ArrowError) -> ManagerError {
    ManagerError::MalformedIpc(error.to_string())
}
