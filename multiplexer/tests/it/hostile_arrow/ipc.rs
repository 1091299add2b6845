//! Arrow IPC streams as a pyarrow client writes them, and where their length fields sit, so an
//! attack (or a proptest case) can set one to a value no writer would.

use std::sync::Arc;

use arrow_array::{LargeStringArray, RecordBatch, StringArray};
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_schema::{DataType, Field, Schema};

/// An IPC stream of one batch: a `text` column of these rows (`large`: LargeUtf8), beside an
/// `id` column, LZ4-compressed when asked.
pub fn stream(rows: &[Option<&str>], large: bool, lz4: bool) -> Vec<u8> {
    let (kind, texts): (DataType, Arc<dyn arrow_array::Array>) = match large {
        false => (DataType::Utf8, Arc::new(StringArray::from(rows.to_vec()))),
        true => (DataType::LargeUtf8, Arc::new(LargeStringArray::from(rows.to_vec()))),
    };
    let ids = Arc::new(arrow_array::Int64Array::from_iter_values(0..rows.len() as i64));
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("text", kind, true)]));
    write(schema.clone(), &[RecordBatch::try_new(schema, vec![ids, texts]).unwrap()], lz4)
}

pub fn write(schema: Arc<Schema>, batches: &[RecordBatch], lz4: bool) -> Vec<u8> {
    let compression = lz4.then_some(arrow_ipc::CompressionType::LZ4_FRAME);
    let options = IpcWriteOptions::default().try_with_compression(compression).unwrap();
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new_with_options(&mut out, &schema, options).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
    }
    writer.finish().unwrap();
    drop(writer);
    out
}

/// A length or count field of a stream: where its little-endian bytes sit, and how wide it is.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub at: usize,
    pub width: usize,
    pub what: &'static str,
}

/// Every length field of `ipc`'s messages: the metadata lengths, the body lengths, the batch's
/// row count, its field nodes' lengths and null counts, its buffers' offsets and lengths, and
/// each compressed buffer's declared uncompressed length.
pub fn slots(ipc: &[u8]) -> Vec<Slot> {
    let mut slots = Vec::new();
    let mut at = 0;
    while at + 8 <= ipc.len() {
        let len = i32::from_le_bytes(ipc[at + 4..at + 8].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        slots.push(Slot { at: at + 4, width: 4, what: "metadata length" });
        let meta = &ipc[at + 8..at + 8 + len];
        let message = arrow_ipc::root_as_message(meta).unwrap();
        let offset_of = |bytes: &[u8]| at + 8 + (bytes.as_ptr() as usize - meta.as_ptr() as usize);
        let body_len = message.bodyLength();
        if let Some(found) = meta.windows(8).position(|w| w == body_len.to_le_bytes()) {
            slots.push(Slot { at: at + 8 + found, width: 8, what: "body length" });
        }
        let body_start = at + 8 + len;
        if let Some(batch) = message.header_as_record_batch() {
            if let Some(found) = meta.windows(8).position(|w| w == batch.length().to_le_bytes()) {
                slots.push(Slot { at: at + 8 + found, width: 8, what: "row count" });
            }
            let nodes = batch.nodes().unwrap();
            let start = offset_of(nodes.bytes());
            for i in 0..nodes.len() {
                slots.push(Slot { at: start + 16 * i, width: 8, what: "node length" });
                slots.push(Slot { at: start + 16 * i + 8, width: 8, what: "node null count" });
            }
            let buffers = batch.buffers().unwrap();
            let start = offset_of(buffers.bytes());
            for (i, buffer) in buffers.iter().enumerate() {
                slots.push(Slot { at: start + 16 * i, width: 8, what: "buffer offset" });
                slots.push(Slot { at: start + 16 * i + 8, width: 8, what: "buffer length" });
                if batch.compression().is_some() && buffer.length() >= 8 {
                    let prefix = body_start + buffer.offset() as usize;
                    slots.push(Slot { at: prefix, width: 8, what: "declared uncompressed length" });
                }
            }
        }
        at = body_start + body_len as usize;
    }
    slots
}

/// `ipc` with the field at `slot` set to `value`.
pub fn set(ipc: &[u8], slot: Slot, value: i64) -> Vec<u8> {
    let mut out = ipc.to_vec();
    out[slot.at..slot.at + slot.width].copy_from_slice(&value.to_le_bytes()[..slot.width]);
    out
}

/// The first slot of a kind.
pub fn slot(ipc: &[u8], what: &str) -> Slot {
    slots(ipc).into_iter().find(|slot| slot.what == what).unwrap_or_else(|| panic!("no {what} in the stream"))
}

/// The last slot of a kind (the `text` column's, which follows `id`'s).
pub fn last_slot(ipc: &[u8], what: &str) -> Slot {
    slots(ipc).into_iter().rev().find(|slot| slot.what == what).unwrap_or_else(|| panic!("no {what} in the stream"))
}
