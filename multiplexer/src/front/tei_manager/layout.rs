//! A dense answer's Arrow IPC written before its vectors are known: the schema message, then one
//! RecordBatch message whose flatbuffer metadata (field nodes, buffer offsets and lengths, body
//! length) is built from what is known up front (the rows, the vector size, which rows fail
//! here), then its body in order: the `embeddings` validity, the values as they come, the
//! `error` column, the end-of-stream marker. Every length is fixed before the first byte, so the
//! gRPC message around it can be framed first (see `super::streamed`).
//!
//! With LZ4 asked, the batch says LZ4_FRAME and each buffer carries the IPC format's "not
//! compressed" length prefix (-1): a compressed length cannot be known before the values are.

use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_ipc::{
    BodyCompressionBuilder, BodyCompressionMethod, Buffer, CompressionType, FieldNode, MessageBuilder, MessageHeader,
    MetadataVersion, RecordBatchBuilder,
};

use super::error::ManagerError;
use super::ipc::{Dtype, dense_schema};

/// IPC's continuation marker before each message's metadata length.
const CONTINUATION: [u8; 4] = [0xff; 4];
/// The end-of-stream marker: a continuation and a zero length.
pub const EOS: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
/// The "not compressed" prefix of a buffer in a compressed batch: an uncompressed length of -1.
pub const NOT_COMPRESSED: [u8; 8] = (-1i64).to_le_bytes();
/// Each body buffer starts on this boundary (the format's minimum).
const ALIGN: usize = 8;

/// Padding after `len` bytes to the next boundary.
pub fn padding(len: usize) -> usize {
    len.next_multiple_of(ALIGN) - len
}

/// What the layout is made from.
pub struct Shape {
    pub rows: usize,
    pub dim: usize,
    pub dtype: Dtype,
    /// Rows that fail (null embeddings, a reason in `error`).
    pub failed: usize,
    /// The bytes of their reasons, together.
    pub reasons: usize,
    pub lz4: bool,
}

/// The answer's IPC: its head (the schema and the batch's metadata), and the sizes of its body's
/// parts as they are written.
pub struct Layout {
    pub head: Vec<u8>,
    /// The `embeddings` validity bitmap's bytes, `None` when no row fails (no bitmap is sent).
    pub validity: Option<usize>,
    /// The values' bytes, without their prefix or padding.
    pub values: usize,
    /// The `error` validity bitmap's bytes, `None` when every row fails.
    pub error_validity: Option<usize>,
    pub lz4: bool,
    /// The whole IPC stream: head, body, end-of-stream marker.
    pub total: u64,
}

impl Layout {
    pub fn new(shape: &Shape) -> Result<Self, ManagerError> {
        let build = |e: arrow_schema::ArrowError| ManagerError::Build(e.to_string());
        let Shape { rows, dim, dtype, failed, reasons, lz4 } = *shape;
        let size = i32::try_from(dim).map_err(|_| ManagerError::Build(format!("a vector of {dim} numbers")))?;
        // The schema message as the held path writes it: the stream encoder's schema, its EOS cut.
        let mut head: Vec<u8> = Vec::new();
        let encoder = StreamEncoder::try_new_with_options(&dense_schema(dtype, size), IpcWriteOptions::default())
            .map_err(build)?;
        for part in encoder.finish().map_err(build)? {
            head.extend_from_slice(part.as_slice());
        }
        head.truncate(head.len().saturating_sub(EOS.len()));
        let bitmap = rows.div_ceil(8);
        let validity = (failed > 0).then_some(bitmap);
        let error_validity = (failed < rows).then_some(bitmap);
        let values = rows.saturating_mul(dim).saturating_mul(dtype.bytes());
        // Each buffer: its offset in the body and its length (prefix included), padded.
        let mut buffers = Vec::with_capacity(6);
        let mut offset = 0u64;
        for len in [validity.unwrap_or(0), 0, values, error_validity.unwrap_or(0), 4 * (rows + 1), reasons] {
            let sent = match (len, lz4) {
                (0, _) => 0,
                (len, true) => len as u64 + NOT_COMPRESSED.len() as u64,
                (len, false) => len as u64,
            };
            let to_i64 = |n: u64| i64::try_from(n).map_err(|_| ManagerError::Build("a body over 2^63 bytes".into()));
            buffers.push(Buffer::new(to_i64(offset)?, to_i64(sent)?));
            offset += sent.next_multiple_of(ALIGN as u64);
        }
        let body = offset;
        let to_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let nodes = [
            FieldNode::new(to_i64(rows), to_i64(failed)),
            FieldNode::new(to_i64(rows.saturating_mul(dim)), 0),
            FieldNode::new(to_i64(rows), to_i64(rows - failed)),
        ];
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let compression = lz4.then(|| {
            let mut c = BodyCompressionBuilder::new(&mut fbb);
            c.add_method(BodyCompressionMethod::BUFFER);
            c.add_codec(CompressionType::LZ4_FRAME);
            c.finish()
        });
        let buffers = fbb.create_vector(&buffers);
        let nodes = fbb.create_vector(&nodes);
        let mut batch = RecordBatchBuilder::new(&mut fbb);
        batch.add_length(to_i64(rows));
        batch.add_nodes(nodes);
        batch.add_buffers(buffers);
        if let Some(compression) = compression {
            batch.add_compression(compression);
        }
        let batch = batch.finish().as_union_value();
        let mut message = MessageBuilder::new(&mut fbb);
        message.add_version(MetadataVersion::V5);
        message.add_header_type(MessageHeader::RecordBatch);
        message.add_bodyLength(i64::try_from(body).unwrap_or(i64::MAX));
        message.add_header(batch);
        let message = message.finish();
        fbb.finish(message, None);
        let metadata = fbb.finished_data();
        let padded = metadata.len() + padding(metadata.len() + 8);
        head.extend_from_slice(&CONTINUATION);
        head.extend_from_slice(&i32::try_from(padded).unwrap_or(i32::MAX).to_le_bytes());
        head.extend_from_slice(metadata);
        head.resize(head.len() + padded - metadata.len(), 0);
        let total = head.len() as u64 + body + EOS.len() as u64;
        Ok(Self { head, validity, values, error_validity, lz4, total })
    }

    /// What goes before a buffer of `len` bytes: its "not compressed" prefix in an LZ4 batch.
    pub fn prefix(&self, len: usize) -> &'static [u8] {
        match (len, self.lz4) {
            (0, _) | (_, false) => &[],
            (_, true) => &NOT_COMPRESSED,
        }
    }

    /// The padding after a buffer of `len` bytes (its prefix counted).
    pub fn pad(&self, len: usize) -> usize {
        padding(len + self.prefix(len).len())
    }
}

/// `out` gains a buffer: its prefix, `bytes`, its padding.
pub fn put_buffer(layout: &Layout, out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(layout.prefix(bytes.len()));
    out.extend_from_slice(bytes);
    out.resize(out.len() + layout.pad(bytes.len()), 0);
}

#[cfg(test)]
mod tests {
    use arrow_array::{Array, FixedSizeListArray, Float32Array, StringArray};

    use super::*;

    /// Three rows of two numbers, the middle one failed: the head, then the body in the layout's
    /// order, read back by arrow-rs as the rows and reasons written (LZ4 marked or not).
    #[test]
    fn a_body_written_after_its_head_reads_back_as_its_rows() {
        for lz4 in [false, true] {
            let shape = Shape { rows: 3, dim: 2, dtype: Dtype::F32, failed: 1, reasons: 4, lz4 };
            let layout = Layout::new(&shape).unwrap();
            let mut out = layout.head.clone();
            put_buffer(&layout, &mut out, &[0b101]);
            let values: Vec<u8> = [1.0f32, 2.0, 0.0, 0.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
            put_buffer(&layout, &mut out, &values);
            put_buffer(&layout, &mut out, &[0b010]);
            let offsets: Vec<u8> = [0i32, 0, 4, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
            put_buffer(&layout, &mut out, &offsets);
            put_buffer(&layout, &mut out, b"why?");
            out.extend_from_slice(&EOS);
            assert_eq!(out.len() as u64, layout.total, "lz4 {lz4}");
            let mut reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(out), None).unwrap();
            let batch = reader.next().unwrap().unwrap();
            assert!(reader.next().is_none());
            let list = batch.column(0).as_any().downcast_ref::<FixedSizeListArray>().unwrap();
            assert_eq!((list.len(), list.null_count(), list.is_null(1)), (3, 1, true));
            let row = |i| list.value(i).as_any().downcast_ref::<Float32Array>().unwrap().values().to_vec();
            assert_eq!((row(0), row(2)), (vec![1.0, 2.0], vec![3.0, 4.0]));
            let errors = batch.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            assert_eq!(errors.iter().collect::<Vec<_>>(), [None, Some("why?"), None]);
        }
    }
}
