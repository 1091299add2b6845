//! The server's store (`--store`, opened by the jobs crate as `teifleet-job --input` opens its
//! own): `files/<file_id>/content` and `files/<file_id>/meta.json` for uploads, and each batch's
//! parts under `batches/<batch_id>/`, written by its job's workers.

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt as _, TryStreamExt as _};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, WriteMultipart};
use serde::{Deserialize, Serialize};
use teifleet_job::store::Store;

use crate::ids::BatchId;
use crate::{Error, Result};

/// The only purpose this deployment stores.
pub const BATCH_PURPOSE: &str = "batch";

/// An upload's record, written beside its content once the content is whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    pub id: String,
    pub bytes: u64,
    pub created_at: i64,
    pub filename: String,
    pub purpose: String,
    pub tenant: String,
    /// Requests in it: its lines that hold more than blanks.
    pub lines: u64,
}

/// Bytes of each part of a streamed upload (S3's multipart parts; one buffer on a claim).
const UPLOAD_CHUNK: usize = 8 << 20;

/// The store and the layout in it.
#[derive(Debug, Clone)]
pub struct FileStore {
    store: Store,
}

impl FileStore {
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// The jobs crate's store (its root is the server's `--store`).
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn objects(&self) -> &dyn ObjectStore {
        self.store.objects().as_ref()
    }

    /// `<root>/<parts...>`. Callers pass ids already checked ([`crate::ids`]).
    fn path(&self, parts: &[&str]) -> Path {
        parts.iter().fold(self.store.root().clone(), |path, part| path.clone().join(*part))
    }

    /// Where an upload's bytes are, relative to the store's root (what a job's `input.path` is).
    pub fn content_key(id: &str) -> String {
        format!("files/{id}/content")
    }

    /// Where a batch's job writes, relative to the store's root.
    pub fn batch_key(batch: &BatchId) -> String {
        format!("batches/{batch}/")
    }

    pub fn content_path(&self, id: &str) -> Path {
        self.path(&["files", id, "content"])
    }

    fn meta_path(&self, id: &str) -> Path {
        self.path(&["files", id, "meta.json"])
    }

    /// A streamed write of `path`: parts as they fill on S3, a staged file renamed on completion
    /// on a claim (object_store's local multipart), so a half-written upload is never the file.
    pub async fn writer(&self, path: &Path) -> Result<WriteMultipart> {
        let upload = self.objects().put_multipart(path).await.map_err(|e| Error::store(path, e))?;
        Ok(WriteMultipart::new_with_chunk_size(upload, UPLOAD_CHUNK))
    }

    pub async fn put_meta(&self, meta: &FileMeta) -> Result<()> {
        let path = self.meta_path(&meta.id);
        let json = serde_json::to_vec(meta).expect("a FileMeta serializes");
        self.objects().put(&path, json.into()).await.map_err(|e| Error::store(&path, e))?;
        Ok(())
    }

    /// An upload's record; none if it does not exist (or is being deleted).
    pub async fn meta(&self, id: &str) -> Result<Option<FileMeta>> {
        let path = self.meta_path(id);
        let bytes = match self.objects().get(&path).await {
            Ok(found) => found.bytes().await.map_err(|e| Error::store(&path, e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(Error::store(&path, error)),
        };
        let meta = serde_json::from_slice(&bytes).map_err(|source| Error::Meta { path: path.to_string(), source })?;
        Ok(Some(meta))
    }

    /// Every upload's record.
    pub async fn metas(&self) -> Result<Vec<FileMeta>> {
        let prefix = self.path(&["files"]);
        let listed: Vec<_> = match self.objects().list(Some(&prefix)).try_collect().await {
            Ok(listed) => listed,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(error) => return Err(Error::store(&prefix, error)),
        };
        let mut metas = Vec::new();
        for object in listed {
            if object.location.filename() != Some("meta.json") {
                continue;
            }
            let Some(id) = object.location.prefix_match(&prefix).and_then(|mut parts| parts.next()) else { continue };
            // A record deleted since the listing is no file any more.
            if let Some(meta) = self.meta(id.as_ref()).await? {
                metas.push(meta);
            }
        }
        Ok(metas)
    }

    /// Deletes an upload: its record first, so a deletion cut short leaves no visible file.
    pub async fn delete(&self, id: &str) -> Result<()> {
        for path in [self.meta_path(id), self.content_path(id)] {
            match self.objects().delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(Error::store(&path, error)),
            }
        }
        Ok(())
    }

    /// An object's bytes, as they come.
    pub async fn read(&self, path: &Path) -> Result<BoxStream<'static, Result<Bytes>>> {
        let found = self.objects().get(path).await.map_err(|e| Error::store(path, e))?;
        let path = path.clone();
        Ok(found.into_stream().map_err(move |e| Error::store(&path, e)).boxed())
    }

    /// A batch's finished parts in name order: its `part-NNNNNN.jsonl` files, or (`errors`) the
    /// `part-NNNNNN.errors.jsonl` of the shards whose output part exists (an errors part is
    /// written first, and its shard is not done until the output part is there).
    pub async fn parts(&self, batch: &BatchId, errors: bool) -> Result<Vec<(Path, u64)>> {
        let prefix = self.path(&["batches", batch.as_str()]);
        let listed: Vec<_> = match self.objects().list(Some(&prefix)).try_collect().await {
            Ok(listed) => listed,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(error) => return Err(Error::store(&prefix, error)),
        };
        let done: Vec<String> = listed
            .iter()
            .filter_map(|object| {
                object.location.filename()?.strip_suffix(".jsonl").filter(|s| is_shard(s)).map(str::to_owned)
            })
            .collect();
        let mut parts: Vec<(Path, u64)> = listed
            .into_iter()
            .filter(|object| {
                let Some(name) = object.location.filename() else { return false };
                match errors {
                    false => name.strip_suffix(".jsonl").is_some_and(is_shard),
                    true => name.strip_suffix(".errors.jsonl").is_some_and(|shard| done.iter().any(|d| d == shard)),
                }
            })
            .map(|object| (object.location, object.size))
            .collect();
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(parts)
    }
}

/// `part-` and six digits.
fn is_shard(name: &str) -> bool {
    name.strip_prefix("part-").is_some_and(|n| n.len() == 6 && n.bytes().all(|b| b.is_ascii_digit()))
}
