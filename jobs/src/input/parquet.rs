//! A Parquet shard's rows: one row group's id and text columns, read with ranged requests. The id
//! column passes through as it is; the text column may be any string or binary type (a null, an
//! empty or, in binary, an invalid UTF-8 text is that row's error).

use arrow_array::cast::AsArray as _;
use arrow_array::{Array, RecordBatch};
use futures::TryStreamExt as _;
use parquet::arrow::ProjectionMask;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::errors::ParquetError;

use super::{RowPiece, RowText, ShardRows};
use crate::listing::InputObject;
use crate::settings::Fields;
use crate::store::Store;
use crate::store::parquet_reader::ObjectReader;
use crate::{Error, Result};

/// Reads row group `row_group` of `object`: one piece per batch the reader hands over.
pub async fn read_row_group(
    input: &Store,
    object: &InputObject,
    row_group: usize,
    fields: &Fields,
) -> Result<ShardRows> {
    let url = input.url_of(&object.path);
    let parquet_error = |source| Error::Parquet { url: url.clone(), source };
    let reader = ObjectReader::new(input.objects().clone(), object.path.clone(), object.size);
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await.map_err(parquet_error)?;
    let Some(rows) = builder.metadata().row_groups().get(row_group).map(|group| group.num_rows()) else {
        let changed = format!("no row group {row_group}: the file changed after the job was planned");
        return Err(parquet_error(ParquetError::General(changed)));
    };
    let root_fields = builder.parquet_schema().root_schema().get_fields();
    let column_index = |name: &str| {
        root_fields.iter().position(|field| field.name() == name).ok_or_else(|| Error::MissingColumn {
            url: url.clone(),
            column: name.to_owned(),
            available: root_fields.iter().map(|field| field.name()).collect::<Vec<_>>().join(", "),
        })
    };
    let id_index = column_index(&fields.id)?;
    let id_type = builder.schema().field(id_index).data_type().clone();
    let projection = ProjectionMask::roots(builder.parquet_schema(), [id_index, column_index(&fields.text)?]);
    // The whole row group in one batch where the reader allows it: a shard is one row group.
    let batch_size = usize::try_from(rows).unwrap_or(usize::MAX).max(1);
    let batches: Vec<RecordBatch> = builder
        .with_row_groups(vec![row_group])
        .with_projection(projection)
        .with_batch_size(batch_size)
        .build()
        .map_err(parquet_error)?
        .try_collect()
        .await
        .map_err(parquet_error)?;
    let pieces = batches.iter().map(|batch| piece_of(batch, &url, fields)).collect::<Result<_>>()?;
    Ok(ShardRows { id_type, pieces })
}

fn piece_of(batch: &RecordBatch, url: &str, fields: &Fields) -> Result<RowPiece> {
    let column = |name: &str| {
        batch.column_by_name(name).cloned().ok_or_else(|| Error::MissingColumn {
            url: url.to_owned(),
            column: name.to_owned(),
            available: batch.schema().fields().iter().map(|field| field.name().as_str()).collect::<Vec<_>>().join(", "),
        })
    };
    let ids = column(&fields.id)?;
    let text_column = column(&fields.text)?;
    let texts = texts_of(text_column.as_ref(), &fields.text).ok_or_else(|| Error::NotText {
        url: url.to_owned(),
        column: fields.text.clone(),
        found: text_column.data_type().to_string(),
    })?;
    Ok(RowPiece { ids, texts })
}

/// Each row's text from a string, binary or dictionary-of-those column; `None` for other types.
fn texts_of(column: &dyn Array, name: &str) -> Option<Vec<RowText>> {
    let from_str = |value: Option<&str>| text_row(value, name);
    let from_bytes = |value: Option<&[u8]>| match value.map(std::str::from_utf8) {
        Some(Err(_)) => RowText::Failed(format!("`{name}` is not valid UTF-8")),
        Some(Ok(text)) => text_row(Some(text), name),
        None => text_row(None, name),
    };
    if let Some(strings) = column.as_string_opt::<i32>() {
        return Some(strings.iter().map(from_str).collect());
    }
    if let Some(strings) = column.as_string_opt::<i64>() {
        return Some(strings.iter().map(from_str).collect());
    }
    if let Some(strings) = column.as_string_view_opt() {
        return Some(strings.iter().map(from_str).collect());
    }
    if let Some(bytes) = column.as_binary_opt::<i32>() {
        return Some(bytes.iter().map(from_bytes).collect());
    }
    if let Some(bytes) = column.as_binary_opt::<i64>() {
        return Some(bytes.iter().map(from_bytes).collect());
    }
    if let Some(bytes) = column.as_binary_view_opt() {
        return Some(bytes.iter().map(from_bytes).collect());
    }
    if let Some(dictionary) = column.as_any_dictionary_opt() {
        let values = texts_of(dictionary.values().as_ref(), name)?;
        if values.is_empty() {
            return Some(vec![text_row(None, name); column.len()]);
        }
        let keys = dictionary.normalized_keys();
        let rows = (0..column.len())
            .map(|row| if column.is_null(row) { text_row(None, name) } else { values[keys[row]].clone() });
        return Some(rows.collect());
    }
    None
}

fn text_row(value: Option<&str>, name: &str) -> RowText {
    match value {
        None => RowText::Failed(format!("`{name}` is null")),
        Some("") => RowText::Failed(format!("`{name}` is empty")),
        Some(text) => RowText::Embed(text.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, BinaryArray, DictionaryArray, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{ObjectStore, ObjectStoreExt as _};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;

    fn failed(text: &str) -> RowText {
        RowText::Failed(text.to_owned())
    }

    fn embed(text: &str) -> RowText {
        RowText::Embed(text.to_owned())
    }

    #[test]
    fn string_binary_and_dictionary_columns_give_texts() {
        let strings = StringArray::from(vec![Some("a"), None, Some("")]);
        assert_eq!(
            texts_of(&strings, "text").unwrap(),
            [embed("a"), failed("`text` is null"), failed("`text` is empty")]
        );
        let bytes = BinaryArray::from(vec![Some(b"ok".as_slice()), Some(b"\xff".as_slice())]);
        assert_eq!(texts_of(&bytes, "body").unwrap(), [embed("ok"), failed("`body` is not valid UTF-8")]);
        let dictionary: DictionaryArray<Int32Type> = vec![Some("x"), None, Some("x"), Some("y")].into_iter().collect();
        assert_eq!(
            texts_of(&dictionary, "text").unwrap(),
            [embed("x"), failed("`text` is null"), embed("x"), embed("y")]
        );
        assert_eq!(texts_of(&Int64Array::from(vec![1]), "text"), None);
    }

    /// A Parquet file of `groups` row groups of `rows_per_group` rows each.
    fn parquet_file(columns: Vec<(&str, ArrayRef)>, rows_per_group: usize) -> Vec<u8> {
        let schema = Arc::new(Schema::new(
            columns.iter().map(|(name, array)| Field::new(*name, array.data_type().clone(), true)).collect::<Vec<_>>(),
        ));
        let batch =
            RecordBatch::try_new(schema.clone(), columns.into_iter().map(|(_, array)| array).collect()).unwrap();
        let properties = WriterProperties::builder().set_max_row_group_row_count(Some(rows_per_group)).build();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, schema, Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        out
    }

    async fn store_with(bytes: Vec<u8>) -> (Store, InputObject) {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("in/part.parquet");
        let size = bytes.len() as u64;
        objects.put(&path, bytes.into()).await.unwrap();
        (Store::new(objects, path.clone(), false, "s3://bucket/"), InputObject { path, size })
    }

    #[tokio::test]
    async fn a_row_group_passes_ids_through_with_their_type() {
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![10, 11, 12, 13, 14]));
        let texts: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), Some("b"), None, Some("d"), Some("e")]));
        let (store, object) = store_with(parquet_file(
            vec![("id", ids), ("text", texts), ("extra", Arc::new(Int64Array::from(vec![0; 5])))],
            2,
        ))
        .await;
        let rows = read_row_group(&store, &object, 1, &Fields::default()).await.unwrap();
        assert_eq!(rows.id_type, DataType::Int64);
        let pieces = rows.pieces;
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].ids.data_type(), &DataType::Int64);
        assert_eq!(pieces[0].ids.as_primitive::<arrow_array::types::Int64Type>().values(), &[12, 13]);
        assert_eq!(pieces[0].texts, [failed("`text` is null"), embed("d")]);
    }

    #[tokio::test]
    async fn a_missing_column_or_a_corrupt_file_names_the_file() {
        let ids: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        let (store, object) = store_with(parquet_file(vec![("id", ids.clone()), ("body", ids)], 10)).await;
        let error = read_row_group(&store, &object, 0, &Fields::default()).await.unwrap_err().to_string();
        assert_eq!(error, "s3://bucket/in/part.parquet: no column `text` (it has: id, body)");

        let (store, object) = store_with(b"PAR1 this is not parquet PAR1".to_vec()).await;
        let error = read_row_group(&store, &object, 0, &Fields::default()).await.unwrap_err().to_string();
        assert!(error.starts_with("s3://bucket/in/part.parquet: "), "{error}");
    }
}
