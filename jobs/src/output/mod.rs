//! The output: one Parquet part per shard, `part-NNNNNN.parquet` under the output prefix, with
//! columns `id`, `embedding` and `error`, and in its footer the counts and the input it was made
//! from (what a resumed run reads instead of redoing the shard).

pub mod columns;
pub mod existing;
pub mod writer;

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use object_store::path::Path;

use crate::settings::Dtype;

/// Footer key: rows in the part.
pub const ROWS_KEY: &str = "teifleet.job.rows";
/// Footer key: rows whose `error` is set.
pub const FAILED_KEY: &str = "teifleet.job.failed";
/// Footer key: the input the part was made from (a URL with its byte range or row group).
pub const SOURCE_KEY: &str = "teifleet.job.source";

/// Where shard `shard`'s part goes.
pub fn part_path(prefix: &Path, shard: u32) -> Path {
    prefix.clone().join(format!("part-{shard:06}.parquet"))
}

/// The parts' schema: the id as the input has it, the vectors, the row's error.
pub fn part_schema(id_type: &DataType, dtype: Dtype, dimensions: usize) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", id_type.clone(), true),
        Field::new("embedding", DataType::FixedSizeList(vector_item(dtype), dimensions as i32), true),
        Field::new("error", DataType::Utf8, true),
    ]))
}

/// The `embedding` list's element field.
pub fn vector_item(dtype: Dtype) -> Arc<Field> {
    let value_type = match dtype {
        Dtype::F32 => DataType::Float32,
        Dtype::F16 => DataType::Float16,
    };
    Arc::new(Field::new("item", value_type, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_numbered_with_six_digits() {
        assert_eq!(part_path(&Path::from("out/run"), 7).as_ref(), "out/run/part-000007.parquet");
        assert_eq!(part_path(&Path::from("out"), 1_234_567).as_ref(), "out/part-1234567.parquet");
    }
}
