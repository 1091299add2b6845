//! Arrow IPC in and out of tei-manager's batch RPCs, as tei-manager writes them: a stream's first
//! RecordBatch in, its `text` column (Utf8 or LargeUtf8) read; one RecordBatch out with one row
//! per input row, `embeddings` (FixedSizeList<Float32|Float16>[dim]) or `sparse_embeddings`
//! (List<Struct<index:u32, value:f32>>) null where the row failed, and `error` (Utf8) saying why.

use std::sync::Arc;

use arrow_array::builder::BooleanBufferBuilder;
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, Float16Array, Float32Array, LargeStringArray, ListArray, RecordBatch,
    StringArray, StructArray, UInt32Array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_ipc::CompressionType;
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_schema::{DataType, Field, Fields, Schema};

use super::error::ManagerError;

/// The input column tei-manager's clients send.
pub const TEXT: &str = "text";

/// The texts of a request's batch: borrowed from the decoded IPC buffers, never copied per row.
pub enum Texts {
    Utf8(StringArray),
    LargeUtf8(LargeStringArray),
}

impl Texts {
    pub fn len(&self) -> usize {
        match self {
            Self::Utf8(a) => a.len(),
            Self::LargeUtf8(a) => a.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `i`'s text; `None` for a null.
    pub fn get(&self, i: usize) -> Option<&str> {
        match self {
            Self::Utf8(a) => a.is_valid(i).then(|| a.value(i)),
            Self::LargeUtf8(a) => a.is_valid(i).then(|| a.value(i)),
        }
    }

    /// Why row `i` is answered here, without a TEI call: null, or empty (TEI refuses it, and
    /// 100,000 empty rows would be 100,000 calls to be told so); `None` for a text TEI embeds.
    pub fn refused_here(&self, i: usize) -> Option<&'static str> {
        match self.get(i) {
            None => Some(NULL_INPUT),
            Some("") => Some(EMPTY_INPUT),
            Some(_) => None,
        }
    }

    /// The bytes its buffers hold (sliced from the request, or inflated from it).
    pub fn memory_size(&self) -> usize {
        match self {
            Self::Utf8(a) => a.get_buffer_memory_size(),
            Self::LargeUtf8(a) => a.get_buffer_memory_size(),
        }
    }
}

/// A null input row's reason, in tei-manager's words.
pub const NULL_INPUT: &str = "input text is null";
/// An empty row's reason, in TEI's words (its gRPC status for an empty `inputs`).
pub const EMPTY_INPUT: &str = "Input validation error: `inputs` cannot be empty";

/// Element type of the dense `embeddings` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
}

impl Dtype {
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }
}

/// A dense answer as it is assembled row by row: failed rows hold zeros under a null.
pub struct Dense {
    pub dim: Option<usize>,
    values: Vec<f32>,
    /// Rows that failed before the vector size was known: their zeros go in once it is.
    failed_before_dim: usize,
    ok: Vec<bool>,
    /// TEI's reasons for the rows it refused, by row: few, so not one slot per row. Rows refused
    /// here (null, empty) have none: their reason is read from the input as the column is built.
    errors: Vec<(usize, String)>,
}

impl Dense {
    pub fn with_rows(rows: usize) -> Self {
        Self { dim: None, values: Vec::new(), failed_before_dim: 0, ok: Vec::with_capacity(rows), errors: Vec::new() }
    }

    /// The rows it was made for.
    pub fn rows(&self) -> usize {
        self.ok.capacity()
    }

    /// Row vectors of `len` numbers from here on: the whole answer's room taken at once (the
    /// rows it was made for), the rows failed so far zeroed. The caller charged it first.
    pub fn start(&mut self, len: usize) {
        if self.dim.is_some() {
            return;
        }
        let rows = self.ok.capacity().max(self.ok.len() + 1);
        self.values = Vec::with_capacity(rows.saturating_mul(len));
        self.values.resize(self.failed_before_dim * len, 0.0);
        self.dim = Some(len);
    }

    pub fn push_ok(&mut self, vector: &[f32]) -> Result<(), ManagerError> {
        self.start(vector.len());
        let dim = self.dim.unwrap_or(vector.len());
        if vector.len() != dim {
            return Err(ManagerError::InconsistentDimensions { first: dim, now: vector.len() });
        }
        self.values.extend_from_slice(vector);
        self.ok.push(true);
        Ok(())
    }

    /// A failed row: `reason` is TEI's, `None` for one refused here (its reason is the input's).
    pub fn push_err(&mut self, reason: Option<String>) {
        match self.dim {
            Some(dim) => self.values.resize(self.values.len() + dim, 0.0),
            None => self.failed_before_dim += 1,
        }
        if let Some(reason) = reason {
            self.errors.push((self.ok.len(), reason));
        }
        self.ok.push(false);
    }

    /// TEI's reasons for the rows it refused so far, by row, taken (for a streamed answer).
    pub fn take_errors(&mut self) -> Vec<(usize, String)> {
        std::mem::take(&mut self.errors)
    }

    /// `embeddings: FixedSizeList<f32|f16>[dim]?`, `error: Utf8?`.
    pub fn batch(
        self,
        dtype: Dtype,
        here: &dyn Fn(usize) -> Option<&'static str>,
    ) -> Result<RecordBatch, ManagerError> {
        let dim = self.dim.unwrap_or(0);
        let values: ArrayRef = match dtype {
            Dtype::F32 => Arc::new(Float32Array::from(self.values)),
            Dtype::F16 => Arc::new(Float16Array::from_iter_values(self.values.into_iter().map(half::f16::from_f32))),
        };
        let size = i32::try_from(dim).map_err(|_| ManagerError::Build(format!("a vector of {dim} numbers")))?;
        let schema = dense_schema(dtype, size);
        let DataType::FixedSizeList(item, _) = schema.field(0).data_type().clone() else {
            return Err(ManagerError::Build("the embeddings column is a FixedSizeList".into()));
        };
        let embeddings = FixedSizeListArray::try_new(item, size, values, validity(&self.ok))
            .map_err(|e| ManagerError::Build(e.to_string()))?;
        let errors = error_column(&self.ok, &self.errors, here);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(embeddings), errors])
            .map_err(|e| ManagerError::Build(e.to_string()))
    }
}

/// A dense answer's schema: `embeddings: FixedSizeList<f32|f16>[dim]?`, `error: Utf8?`; the one
/// both the held answer and the streamed one (`super::layout`) are written with.
pub fn dense_schema(dtype: Dtype, size: i32) -> Schema {
    let element = match dtype {
        Dtype::F32 => DataType::Float32,
        Dtype::F16 => DataType::Float16,
    };
    let item = Arc::new(Field::new("item", element, false));
    Schema::new(vec![
        Field::new("embeddings", DataType::FixedSizeList(item, size), true),
        Field::new("error", DataType::Utf8, true),
    ])
}

/// A sparse answer as it is assembled row by row.
pub struct Sparse {
    offsets: Vec<i32>,
    indices: Vec<u32>,
    values: Vec<f32>,
    ok: Vec<bool>,
    /// TEI's reasons for the rows it refused, by row: few, so not one slot per row. Rows refused
    /// here (null, empty) have none: their reason is read from the input as the column is built.
    errors: Vec<(usize, String)>,
}

impl Sparse {
    pub fn with_rows(rows: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self { offsets, indices: Vec::new(), values: Vec::new(), ok: Vec::with_capacity(rows), errors: Vec::new() }
    }

    pub fn push_ok(&mut self, pairs: impl IntoIterator<Item = (u32, f32)>) -> Result<(), ManagerError> {
        for (index, value) in pairs {
            self.indices.push(index);
            self.values.push(value);
        }
        let end =
            i32::try_from(self.indices.len()).map_err(|_| ManagerError::Build("over 2^31 sparse values".into()))?;
        self.offsets.push(end);
        self.ok.push(true);
        Ok(())
    }

    /// A failed row: `reason` is TEI's, `None` for one refused here (its reason is the input's).
    pub fn push_err(&mut self, reason: Option<String>) {
        self.offsets.push(*self.offsets.last().unwrap_or(&0));
        if let Some(reason) = reason {
            self.errors.push((self.ok.len(), reason));
        }
        self.ok.push(false);
    }

    /// The rows it was made for.
    pub fn rows(&self) -> usize {
        self.ok.capacity()
    }

    /// Bytes held so far (for the answer's memory charge).
    pub fn held_bytes(&self) -> usize {
        self.indices.len() * 8 + self.offsets.len() * 4
    }

    /// `sparse_embeddings: List<Struct<index:u32, value:f32>>?`, `error: Utf8?`.
    pub fn batch(self, here: &dyn Fn(usize) -> Option<&'static str>) -> Result<RecordBatch, ManagerError> {
        let fields = Fields::from(vec![
            Field::new("index", DataType::UInt32, false),
            Field::new("value", DataType::Float32, false),
        ]);
        let pairs = StructArray::try_new(
            fields.clone(),
            vec![Arc::new(UInt32Array::from(self.indices)), Arc::new(Float32Array::from(self.values))],
            None,
        )
        .map_err(|e| ManagerError::Build(e.to_string()))?;
        let item = Arc::new(Field::new("item", DataType::Struct(fields), false));
        let list = ListArray::try_new(
            item.clone(),
            OffsetBuffer::new(self.offsets.into()),
            Arc::new(pairs),
            validity(&self.ok),
        )
        .map_err(|e| ManagerError::Build(e.to_string()))?;
        let schema = Schema::new(vec![
            Field::new("sparse_embeddings", DataType::List(item), true),
            Field::new("error", DataType::Utf8, true),
        ]);
        let errors = error_column(&self.ok, &self.errors, here);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(list), errors])
            .map_err(|e| ManagerError::Build(e.to_string()))
    }
}

/// `error`: each failed row's reason (TEI's, or `here`'s for a row refused here), null elsewhere.
fn error_column(ok: &[bool], errors: &[(usize, String)], here: &dyn Fn(usize) -> Option<&'static str>) -> ArrayRef {
    let mut failed = errors.iter().peekable();
    let column: StringArray = ok
        .iter()
        .enumerate()
        .map(|(row, ok)| match failed.peek() {
            Some((at, _)) if *at == row => failed.next().map(|(_, reason)| reason.as_str()),
            _ if *ok => None,
            _ => here(row),
        })
        .collect();
    Arc::new(column)
}

/// Null where a row failed; none at all when every row succeeded.
fn validity(ok: &[bool]) -> Option<NullBuffer> {
    if ok.iter().all(|ok| *ok) {
        return None;
    }
    let mut bits = BooleanBufferBuilder::new(ok.len());
    ok.iter().for_each(|ok| bits.append(*ok));
    Some(NullBuffer::new(bits.finish()))
}

/// The batch as an Arrow IPC stream, its buffers LZ4-compressed when asked, written after `head`
/// zero bytes (room for what frames the answer message around it, filled in by the caller).
///
/// Written once, into a buffer of exactly its size: the encoder's parts borrow the batch's own
/// buffers (uncompressed), and each is dropped as soon as it is copied out, so a 100,000-row answer
/// is held at most twice (its vectors, and the IPC being written) and never as a growing buffer
/// that reallocates.
pub fn write_after(head: usize, batch: RecordBatch, lz4: bool) -> Result<Vec<u8>, ManagerError> {
    let build = |e: arrow_schema::ArrowError| ManagerError::Build(e.to_string());
    let options =
        IpcWriteOptions::default().try_with_compression(lz4.then_some(CompressionType::LZ4_FRAME)).map_err(build)?;
    let mut encoder = StreamEncoder::try_new_with_options(&batch.schema(), options).map_err(build)?;
    let mut parts = encoder.encode(&batch).map_err(build)?;
    drop(batch);
    parts.extend(encoder.finish().map_err(build)?);
    let len: usize = parts.iter().map(|part| part.len()).sum();
    let mut out = Vec::with_capacity(head + len);
    out.resize(head, 0);
    for part in parts {
        out.extend_from_slice(part.as_slice());
    }
    Ok(out)
}
