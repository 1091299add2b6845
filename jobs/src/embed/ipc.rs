//! EmbedArrow's payloads: the request's `text` column as an Arrow IPC stream, and the answer's
//! `embeddings` and `error` columns read back and checked against the contract.

use std::io::Cursor;
use std::sync::Arc;

use arrow_array::cast::AsArray as _;
use arrow_array::{ArrayRef, FixedSizeListArray, Float16Array, Float32Array, RecordBatch, StringArray};
use arrow_buffer::NullBuffer;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, DataType, Field, Schema};
use bytes::Bytes;

use crate::settings::Dtype;

/// Encodes texts as one batch with a non-null `text` column.
pub fn encode_texts(texts: &[&str]) -> Result<Bytes, ArrowError> {
    let schema = Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(texts.to_vec()))])?;
    let mut out = Vec::with_capacity(texts.iter().map(|text| text.len() + 8).sum::<usize>() + 512);
    let mut writer = StreamWriter::try_new(&mut out, &schema)?;
    writer.write(&batch)?;
    writer.finish()?;
    drop(writer);
    Ok(out.into())
}

/// A checked answer: one vector (or null) and one error (or null) per row sent.
#[derive(Debug, Clone)]
pub struct Answer {
    pub embeddings: FixedSizeListArray,
    pub errors: StringArray,
}

impl Answer {
    /// An answer of `rows` rows without vectors, each failed with `reason`: what a row the pool
    /// refuses for its size becomes.
    pub fn failed(rows: usize, dimensions: usize, dtype: Dtype, reason: &str) -> Result<Self, ArrowError> {
        let length = i32::try_from(dimensions)
            .map_err(|_| ArrowError::InvalidArgumentError(format!("{dimensions} dimensions")))?;
        // Zeros under the nulls: a list's child holds every row's slot, null or not.
        let slots = rows.saturating_mul(dimensions);
        let (item_type, child): (DataType, ArrayRef) = match dtype {
            Dtype::F32 => (DataType::Float32, Arc::new(Float32Array::from(vec![0.0; slots]))),
            Dtype::F16 => (DataType::Float16, Arc::new(Float16Array::from(vec![half::f16::ZERO; slots]))),
        };
        let item = Arc::new(Field::new("item", item_type, false));
        let embeddings = FixedSizeListArray::try_new(item, length, child, Some(NullBuffer::new_null(rows)))?;
        let errors = StringArray::from(vec![Some(reason); rows]);
        Ok(Self { embeddings, errors })
    }

    /// The vectors' length.
    pub fn dimensions(&self) -> usize {
        usize::try_from(self.embeddings.value_length()).unwrap_or(0)
    }
}

/// Reads an answer to `rows` rows, asked for in `dtype`. Any departure from the contract (row
/// count, column types) is an error: writing misaligned vectors would be worse than failing.
pub fn decode_answer(ipc: &[u8], rows: usize, dtype: Dtype) -> Result<Answer, String> {
    let reader = StreamReader::try_new(Cursor::new(ipc), None).map_err(|error| format!("invalid IPC: {error}"))?;
    let batches: Vec<RecordBatch> =
        reader.collect::<Result<_, _>>().map_err(|error| format!("invalid IPC: {error}"))?;
    let [batch] = batches.as_slice() else {
        return Err(format!("{} batches, expected 1", batches.len()));
    };
    if batch.num_rows() != rows {
        return Err(format!("{} rows for {rows} sent", batch.num_rows()));
    }
    let column = |name: &str| batch.column_by_name(name).ok_or_else(|| format!("no `{name}` column"));
    let embeddings = column("embeddings")?
        .as_fixed_size_list_opt()
        .ok_or_else(|| "`embeddings` is not a FixedSizeList".to_owned())?
        .clone();
    let expected = match dtype {
        Dtype::F32 => DataType::Float32,
        Dtype::F16 => DataType::Float16,
    };
    if embeddings.value_type() != expected {
        return Err(format!("vectors of {}, asked for {expected}", embeddings.value_type()));
    }
    let errors = column("error")?.as_string_opt::<i32>().ok_or_else(|| "`error` is not Utf8".to_owned())?.clone();
    Ok(Answer { embeddings, errors })
}

#[cfg(test)]
mod tests {
    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
    use arrow_array::{Array as _, Float32Array};
    use arrow_ipc::reader::StreamReader;

    use super::*;

    fn answer_ipc(rows: &[Option<[f32; 2]>], errors: &[Option<&str>]) -> Vec<u8> {
        let mut builder = FixedSizeListBuilder::new(Float32Builder::new(), 2);
        for row in rows {
            builder.values().append_slice(&row.unwrap_or_default());
            builder.append(row.is_some());
        }
        let embeddings = builder.finish();
        let schema = Arc::new(Schema::new(vec![
            Field::new("embeddings", embeddings.data_type().clone(), true),
            Field::new("error", DataType::Utf8, true),
        ]));
        let errors = StringArray::from(errors.to_vec());
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(embeddings), Arc::new(errors)]).unwrap();
        let mut out = Vec::new();
        let mut writer = StreamWriter::try_new(&mut out, &schema).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
        drop(writer);
        out
    }

    #[test]
    fn texts_go_out_as_a_text_column() {
        let ipc = encode_texts(&["a", "bc"]).unwrap();
        let batch = StreamReader::try_new(Cursor::new(ipc), None).unwrap().next().unwrap().unwrap();
        assert_eq!(batch.schema().field(0).name(), "text");
        assert_eq!(batch.column(0).as_string::<i32>().iter().collect::<Vec<_>>(), [Some("a"), Some("bc")]);
    }

    #[test]
    fn answers_are_read_and_checked() {
        let ipc = answer_ipc(&[Some([1.0, 2.0]), None], &[None, Some("too long")]);
        let answer = decode_answer(&ipc, 2, Dtype::F32).unwrap();
        assert_eq!(answer.dimensions(), 2);
        let first = answer.embeddings.value(0);
        assert_eq!(first.as_any().downcast_ref::<Float32Array>().unwrap().values(), &[1.0, 2.0]);
        assert!(answer.embeddings.is_null(1));
        assert_eq!(answer.errors.value(1), "too long");

        assert_eq!(decode_answer(&ipc, 3, Dtype::F32).unwrap_err(), "2 rows for 3 sent");
        assert_eq!(decode_answer(&ipc, 2, Dtype::F16).unwrap_err(), "vectors of Float32, asked for Float16");
        assert!(decode_answer(b"garbage", 2, Dtype::F32).unwrap_err().starts_with("invalid IPC"));
    }
}
