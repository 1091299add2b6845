//! A shard's rows, read from its input: each row's id as the output will carry it, and its text or
//! why it has none. Bad input never stops a shard; it becomes the row's error.

pub mod jsonl;
pub mod jsonl_row;
pub mod lines;
pub mod parquet;

use arrow_array::ArrayRef;
use arrow_schema::DataType;

use crate::Result;
use crate::plan::{Shard, ShardPart};
use crate::settings::Fields;
use crate::store::Store;

/// One row's text, or why the row cannot be embedded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowText {
    Embed(String),
    Failed(String),
}

/// Consecutive rows of a shard: their ids as one Arrow column and their texts. A shard is one
/// piece or several (Parquet's reader may hand a row group over in batches); pieces are kept as
/// they come rather than concatenated, so ids pass through uncopied.
#[derive(Debug, Clone)]
pub struct RowPiece {
    pub ids: ArrayRef,
    pub texts: Vec<RowText>,
}

/// A shard's rows, in input order.
#[derive(Debug, Clone)]
pub struct ShardRows {
    /// The ids' type (known even when the shard has no rows, so its part has the right schema).
    pub id_type: DataType,
    pub pieces: Vec<RowPiece>,
}

/// Reads a shard's rows.
pub async fn read_shard(input: &Store, shard: &Shard, fields: &Fields) -> Result<ShardRows> {
    match shard.part {
        ShardPart::ByteRange { start, end } => {
            let piece = jsonl::read_range(input, &shard.object, start..end, fields).await?;
            Ok(ShardRows { id_type: DataType::Utf8, pieces: vec![piece] })
        }
        ShardPart::RowGroup { index, .. } => parquet::read_row_group(input, &shard.object, index, fields).await,
    }
}
