//! Writes one part: batches are encoded as they come (so a shard's vectors are not all held as
//! arrays at once), and the finished file is put in one request. A put is atomic in object_store:
//! S3 shows the object whole or not at all, and the local store writes a staging file beside it and
//! renames it. So a part that exists is complete, and resuming can trust it.

use arrow_array::{Array as _, RecordBatch};
use arrow_schema::SchemaRef;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use super::{FAILED_KEY, ROWS_KEY, SOURCE_KEY};
use crate::store::Store;
use crate::{Error, Result};

/// A part's row counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartCounts {
    pub rows: u64,
    pub failed: u64,
}

/// One part being written.
pub struct PartWriter {
    writer: ArrowWriter<Vec<u8>>,
    url: String,
    counts: PartCounts,
}

impl PartWriter {
    /// A part of this schema, to be put at `url` (named in errors).
    pub fn new(schema: SchemaRef, url: String) -> Result<Self> {
        // zstd's lowest level: vectors barely compress, ids and errors do, and it costs little.
        let properties = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
        let writer = ArrowWriter::try_new(Vec::new(), schema, Some(properties))
            .map_err(|source| Error::Parquet { url: url.clone(), source })?;
        Ok(Self { writer, url, counts: PartCounts { rows: 0, failed: 0 } })
    }

    /// Appends a batch (columns `id`, `embedding`, `error`).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.writer.write(batch).map_err(|source| Error::Parquet { url: self.url.clone(), source })?;
        let errors = batch.column(2);
        self.counts.rows += batch.num_rows() as u64;
        self.counts.failed += (errors.len() - errors.null_count()) as u64;
        Ok(())
    }

    /// Closes the file, with the counts and `source` in its footer, and puts it at `path`.
    pub async fn finish(mut self, output: &Store, path: &Path, source: &str) -> Result<PartCounts> {
        let footer = [
            (ROWS_KEY, self.counts.rows.to_string()),
            (FAILED_KEY, self.counts.failed.to_string()),
            (SOURCE_KEY, source.to_owned()),
        ];
        for (key, value) in footer {
            self.writer.append_key_value_metadata(KeyValue::new(key.to_owned(), value));
        }
        let bytes = self.writer.into_inner().map_err(|source| Error::Parquet { url: self.url.clone(), source })?;
        output.objects().put(path, bytes.into()).await.map_err(|source| output.error(path, source))?;
        Ok(self.counts)
    }
}
