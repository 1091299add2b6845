//! Parquet's async reader over a store: ranged reads of one object whose size the listing gave, so
//! the footer is found without a request for the size. (parquet's own `ParquetObjectReader` is
//! deprecated in favour of this: implementing `AsyncFileReader` directly.)

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

/// How much of a file's end the first read takes, hoping to hold the whole footer: most footers
/// are a few KiB, and one read beats two.
const FOOTER_PREFETCH: usize = 64 * 1024;

/// One Parquet object of known size.
#[derive(Debug, Clone)]
pub struct ObjectReader {
    objects: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
}

impl ObjectReader {
    pub fn new(objects: Arc<dyn ObjectStore>, path: Path, size: u64) -> Self {
        Self { objects, path, size }
    }
}

fn parquet_error(error: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(error))
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move { self.objects.get_range(&self.path, range).await.map_err(parquet_error) }.boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        // object_store merges nearby ranges into fewer requests.
        async move { self.objects.get_ranges(&self.path, &ranges).await.map_err(parquet_error) }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .with_prefetch_hint(Some(FOOTER_PREFETCH))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}
