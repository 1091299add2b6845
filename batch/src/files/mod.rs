//! OpenAI's Files API over the store: upload, list, get, content, delete. A tenant sees its own
//! uploads and its batches' result files (`<batch_id>-output`, `<batch_id>-errors`, made on the
//! fly from the batch's parts); anything else is "No such File object", whatever the reason.

pub mod content;
pub mod delete;
pub mod get;
pub mod list;
pub mod upload;

use serde::Serialize;

use crate::ids::{BatchId, FileId};
use crate::state::AppState;
use crate::store::FileMeta;
use crate::{Error, Result, batches};

pub use crate::store::BATCH_PURPOSE;
/// A batch's result files' purpose, as OpenAI names it.
pub const BATCH_OUTPUT_PURPOSE: &str = "batch_output";

/// OpenAI's FileObject.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FileObject {
    pub id: String,
    pub object: &'static str,
    pub bytes: u64,
    pub created_at: i64,
    pub filename: String,
    pub purpose: String,
    /// Always `processed`: a file is listed once it is whole.
    pub status: &'static str,
}

impl From<&FileMeta> for FileObject {
    fn from(meta: &FileMeta) -> Self {
        Self {
            id: meta.id.clone(),
            object: "file",
            bytes: meta.bytes,
            created_at: meta.created_at,
            filename: meta.filename.clone(),
            purpose: meta.purpose.clone(),
            status: "processed",
        }
    }
}

/// A file the caller may read.
pub enum Found {
    Upload(FileMeta),
    /// A batch's output or error file: its parts in order, their bytes, and its object.
    Result {
        object: FileObject,
        parts: Vec<object_store::path::Path>,
    },
}

/// The file `id` if it is `tenant`'s, else the same 404 for a bad id, a missing file and another
/// tenant's.
pub async fn find(state: &AppState, tenant: &str, id: &str) -> Result<Found> {
    let not_found = || Error::no_such_file(id);
    match FileId::parse(id).ok_or_else(not_found)? {
        FileId::Upload(id) => match state.store.meta(&id).await? {
            Some(meta) if meta.tenant == tenant => Ok(Found::Upload(meta)),
            _ => Err(not_found()),
        },
        FileId::Output(batch) => result_file(state, tenant, &batch, false).await?.ok_or_else(not_found),
        FileId::Errors(batch) => result_file(state, tenant, &batch, true).await?.ok_or_else(not_found),
    }
}

/// A batch's output (or error) file, if the batch is `tenant`'s.
async fn result_file(state: &AppState, tenant: &str, batch: &BatchId, errors: bool) -> Result<Option<Found>> {
    let Some(job) = batches::handlers::tenant_job(state, tenant, batch).await? else { return Ok(None) };
    let parts = state.store.parts(batch, errors).await?;
    let (id, name) = match errors {
        false => (batch.output_file_id(), "output"),
        true => (batch.errors_file_id(), "errors"),
    };
    let created_at = batches::mapping::to_batch(&job)
        .map(|batch| {
            batch
                .completed_at
                .or(batch.cancelled_at)
                .or(batch.failed_at)
                .or(batch.expired_at)
                .unwrap_or(batch.created_at)
        })
        .unwrap_or_default();
    let object = FileObject {
        filename: format!("{batch}_{name}.jsonl"),
        id,
        object: "file",
        bytes: parts.iter().map(|(_, size)| size).sum(),
        created_at,
        purpose: BATCH_OUTPUT_PURPOSE.to_owned(),
        status: "processed",
    };
    Ok(Some(Found::Result { object, parts: parts.into_iter().map(|(path, _)| path).collect() }))
}
