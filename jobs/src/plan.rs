//! The job's shards, numbered the same way by every worker from the listing alone: JSONL files cut
//! into byte ranges (sizes only, no scan), Parquet files into their row groups (footers only).
//! Worker `w` of `n` takes the shards whose number is `w` modulo `n`.

use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use parquet::arrow::async_reader::AsyncFileReader as _;
use parquet::file::metadata::ParquetMetaData;

use crate::listing::{InputObject, list_inputs};
use crate::progress;
use crate::settings::{Fields, InputFormat};
use crate::store::Store;
use crate::store::parquet_reader::ObjectReader;
use crate::{Error, Result};

/// How many Parquet footers are read at once while planning.
const FOOTERS_IN_FLIGHT: usize = 8;

/// One unit of work: what to read, and the number its output part is named after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub number: u32,
    pub object: Arc<InputObject>,
    pub part: ShardPart,
}

/// Which part of its object a shard reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardPart {
    /// The JSONL lines whose first byte lies in `start..end`.
    ByteRange { start: u64, end: u64 },
    /// One Parquet row group, with its row count and compressed size from the footer.
    RowGroup { index: usize, rows: u64, bytes: u64 },
}

impl Shard {
    /// The input bytes this shard covers (for progress).
    pub fn bytes(&self) -> u64 {
        match self.part {
            ShardPart::ByteRange { start, end } => end - start,
            ShardPart::RowGroup { bytes, .. } => bytes,
        }
    }

    /// What the shard reads, written into its output so a resumed run can tell the part was made
    /// from this same input.
    pub fn source(&self, input: &Store) -> String {
        let url = input.url_of(&self.object.path);
        match self.part {
            ShardPart::ByteRange { start, end } => format!("{url}#bytes={start}-{end}"),
            ShardPart::RowGroup { index, .. } => format!("{url}#row-group={index}"),
        }
    }
}

/// Every shard of the job, in number order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPlan {
    pub shards: Vec<Shard>,
    /// Known for Parquet (from the footers), not for JSONL (it would take a scan).
    pub rows: Option<u64>,
}

impl JobPlan {
    /// Lists the input and cuts it into shards.
    pub async fn make(input: &Store, format: InputFormat, fields: &Fields, shard_bytes: u64) -> Result<Self> {
        let objects = list_inputs(input).await?;
        match format {
            InputFormat::Jsonl | InputFormat::OpenaiBatch => Self::jsonl(objects, shard_bytes),
            InputFormat::Parquet => Self::parquet(input, objects, fields).await,
        }
    }

    /// Each file in `shard_bytes` ranges; the last one of a file is shorter.
    pub fn jsonl(objects: Vec<InputObject>, shard_bytes: u64) -> Result<Self> {
        if shard_bytes == 0 {
            return Err(Error::flag("shard-bytes", "must be at least 1"));
        }
        let mut shards = Vec::new();
        for object in objects.into_iter().map(Arc::new) {
            for start in (0..object.size).step_by(usize::try_from(shard_bytes).unwrap_or(usize::MAX)) {
                let end = start.saturating_add(shard_bytes).min(object.size);
                let part = ShardPart::ByteRange { start, end };
                shards.push(Shard { number: next_number(&shards)?, object: object.clone(), part });
            }
        }
        Ok(Self { shards, rows: None })
    }

    /// Each row group of each file. Reads every footer, so a corrupt file or one without the
    /// id or text column fails the run before anything is embedded.
    pub async fn parquet(input: &Store, objects: Vec<InputObject>, fields: &Fields) -> Result<Self> {
        let footers: Vec<(InputObject, Arc<ParquetMetaData>)> = futures::stream::iter(objects)
            .map(|object| async move {
                let metadata = read_footer(input, &object).await?;
                check_columns(input, &object, &metadata, fields)?;
                Ok::<_, Error>((object, metadata))
            })
            .buffered(FOOTERS_IN_FLIGHT)
            .try_collect()
            .await?;
        let mut shards = Vec::new();
        let mut rows = 0u64;
        for (object, metadata) in footers {
            let object = Arc::new(object);
            for (index, row_group) in metadata.row_groups().iter().enumerate() {
                let group_rows = u64::try_from(row_group.num_rows()).unwrap_or(0);
                rows += group_rows;
                let bytes = u64::try_from(row_group.compressed_size()).unwrap_or(0);
                let part = ShardPart::RowGroup { index, rows: group_rows, bytes };
                shards.push(Shard { number: next_number(&shards)?, object: object.clone(), part });
            }
        }
        Ok(Self { shards, rows: Some(rows) })
    }

    /// The shards worker `worker` of `workers` does.
    pub fn for_worker(&self, worker: u32, workers: u32) -> impl Iterator<Item = &Shard> {
        self.shards.iter().filter(move |shard| shard.number % workers == worker)
    }

    /// The plan as progress reports carry it.
    pub fn summary(&self) -> progress::Plan {
        progress::Plan {
            shards: u32::try_from(self.shards.len()).unwrap_or(u32::MAX),
            bytes: self.shards.iter().map(Shard::bytes).sum(),
            rows: self.rows,
        }
    }
}

/// The number the next shard gets; shards are counted in `u32`, as Indexed Jobs count pods.
fn next_number(shards: &[Shard]) -> Result<u32> {
    u32::try_from(shards.len()).map_err(|_| Error::flag("shard-bytes", "more than 2^32 shards: use larger shards"))
}

/// A Parquet object's footer.
pub(crate) async fn read_footer(input: &Store, object: &InputObject) -> Result<Arc<ParquetMetaData>> {
    let mut reader = ObjectReader::new(input.objects().clone(), object.path.clone(), object.size);
    reader.get_metadata(None).await.map_err(|source| Error::Parquet { url: input.url_of(&object.path), source })
}

/// Refuses a file that lacks the id or text column (top-level columns only).
fn check_columns(input: &Store, object: &InputObject, metadata: &ParquetMetaData, fields: &Fields) -> Result<()> {
    let columns: Vec<&str> =
        metadata.file_metadata().schema_descr().root_schema().get_fields().iter().map(|field| field.name()).collect();
    for wanted in [&fields.id, &fields.text] {
        if !columns.contains(&wanted.as_str()) {
            return Err(Error::MissingColumn {
                url: input.url_of(&object.path),
                column: wanted.clone(),
                available: columns.join(", "),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use object_store::path::Path;

    use super::*;

    fn object(path: &str, size: u64) -> InputObject {
        InputObject { path: Path::from(path), size }
    }

    fn parts(plan: &JobPlan) -> Vec<(u32, &str, u64, u64)> {
        plan.shards
            .iter()
            .map(|shard| match shard.part {
                ShardPart::ByteRange { start, end } => (shard.number, shard.object.path.as_ref(), start, end),
                ShardPart::RowGroup { .. } => unreachable!("a JSONL plan"),
            })
            .collect()
    }

    #[test]
    fn jsonl_files_are_cut_into_ranges_numbered_across_files() {
        let plan = JobPlan::jsonl(vec![object("a", 25), object("b", 10), object("c", 20)], 10).unwrap();
        assert_eq!(
            parts(&plan),
            [(0, "a", 0, 10), (1, "a", 10, 20), (2, "a", 20, 25), (3, "b", 0, 10), (4, "c", 0, 10), (5, "c", 10, 20)]
        );
        assert_eq!(plan.summary(), progress::Plan { shards: 6, bytes: 55, rows: None });
    }

    #[test]
    fn workers_split_the_shards_between_them_without_overlap() {
        let plan = JobPlan::jsonl(vec![object("a", 95)], 10).unwrap();
        let mut seen: Vec<u32> = Vec::new();
        for worker in 0..3 {
            let mine: Vec<u32> = plan.for_worker(worker, 3).map(|shard| shard.number).collect();
            assert!(mine.iter().all(|number| number % 3 == worker), "{mine:?}");
            seen.extend(mine);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<u32>>());
    }

    #[test]
    fn the_plan_is_the_same_every_time() {
        let objects = || vec![object("x/1.jsonl", 8 << 20), object("x/2.jsonl", 1), object("x/3.jsonl", 3 << 20)];
        let first = JobPlan::jsonl(objects(), 1 << 20).unwrap();
        let second = JobPlan::jsonl(objects(), 1 << 20).unwrap();
        assert_eq!(first, second);
        assert_eq!(first.shards.len(), 8 + 1 + 3);
    }

    #[tokio::test]
    async fn the_plan_does_not_depend_on_the_order_objects_were_written_in() {
        use object_store::memory::InMemory;
        use object_store::{ObjectStore, ObjectStoreExt as _};

        let names = ["in/b.jsonl", "in/a/2.jsonl", "in/a/10.jsonl", "in/c.jsonl"];
        let mut plans = Vec::new();
        for order in [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]] {
            let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            for index in order {
                objects.put(&Path::from(names[index]), vec![b'x'; 10 + index].into()).await.unwrap();
            }
            let store = Store::new(objects, Path::from("in"), true, "s3://bucket/");
            plans.push(JobPlan::make(&store, InputFormat::Jsonl, &Fields::default(), 4).await.unwrap());
        }
        assert_eq!(plans[0], plans[1]);
        assert_eq!(plans[0], plans[2]);
        let first_of_each: Vec<&str> = plans[0]
            .shards
            .iter()
            .filter(|shard| matches!(shard.part, ShardPart::ByteRange { start: 0, .. }))
            .map(|shard| shard.object.path.as_ref())
            .collect();
        assert_eq!(first_of_each, ["in/a/10.jsonl", "in/a/2.jsonl", "in/b.jsonl", "in/c.jsonl"]);
    }

    #[test]
    fn zero_shard_bytes_is_refused() {
        assert!(JobPlan::jsonl(vec![object("a", 1)], 0).is_err());
    }
}
