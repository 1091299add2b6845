//! Resuming: a shard whose part exists is done; its counts come from the part's footer, so a
//! restarted worker redoes at most the shard it was on.

use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use parquet::arrow::async_reader::AsyncFileReader as _;

use super::writer::PartCounts;
use super::{FAILED_KEY, ROWS_KEY, SOURCE_KEY};
use crate::store::Store;
use crate::store::parquet_reader::ObjectReader;
use crate::{Error, Result};

/// The counts of the part at `path` if it exists and was written from `source`. A part that is
/// unreadable or lacks this job's footer keys is not counted as done (the shard is redone and the
/// part replaced). A part written from other input means the output prefix holds another job's
/// (or another plan's) parts: mixing them in would corrupt the result, so that is an error.
pub async fn finished_part(output: &Store, path: &Path, source: &str) -> Result<Option<PartCounts>> {
    let url = output.url_of(path);
    let meta = match output.objects().head(path).await {
        Ok(meta) => meta,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(error) => return Err(output.error(path, error)),
    };
    let mut reader = ObjectReader::new(output.objects().clone(), path.clone(), meta.size);
    let metadata = match reader.get_metadata(None).await {
        Ok(metadata) => metadata,
        Err(error) => {
            tracing::warn!(%url, %error, "an existing part is unreadable; redoing its shard");
            return Ok(None);
        }
    };
    let footer = metadata.file_metadata();
    let value = |key: &str| {
        footer.key_value_metadata()?.iter().find(|entry| entry.key == key).and_then(|entry| entry.value.clone())
    };
    let counts = (value(ROWS_KEY).and_then(|v| v.parse().ok()), value(FAILED_KEY).and_then(|v| v.parse().ok()));
    let (Some(rows), Some(failed)) = counts else {
        tracing::warn!(%url, "an existing part lacks this job's counts; redoing its shard");
        return Ok(None);
    };
    match value(SOURCE_KEY) {
        Some(written_from) if written_from == source => Ok(Some(PartCounts { rows, failed })),
        written_from => Err(Error::ForeignPart {
            url,
            written_from: written_from.unwrap_or_else(|| "unknown input".to_owned()),
            expected: source.to_owned(),
        }),
    }
}
