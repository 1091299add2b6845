//! `GET /v1/batches` (newest first, `after`/`limit` paging), `GET /v1/batches/{id}` and
//! `POST /v1/batches/{id}/cancel`. A batch is the caller's if its job's tenant label is; any other
//! batch, like a missing one, is "No batch found".

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use teifleet_crds::EmbeddingJob;

use super::mapping::{Batch, to_batch};
use crate::clock::now;
use crate::cluster::{CANCELLING_AT_ANNOTATION, TENANT_LABEL};
use crate::ids::BatchId;
use crate::paging::{Page, limit, page};
use crate::state::AppState;
use crate::{Error, Result};

/// The job of `batch` if `tenant` owns it.
pub async fn tenant_job(state: &AppState, tenant: &str, batch: &BatchId) -> Result<Option<EmbeddingJob>> {
    let job = state.cluster.get_job(&batch.job_name()).await?;
    Ok(job.filter(|job| {
        let labels = job.metadata.labels.as_ref();
        labels.and_then(|l| l.get(TENANT_LABEL)).is_some_and(|owner| owner == tenant)
            && to_batch(job).is_some_and(|found| found.id == batch.as_str())
    }))
}

/// The caller's batch `id`, or 404.
async fn find(state: &AppState, headers: &HeaderMap, id: &str) -> Result<(BatchId, EmbeddingJob)> {
    let tenant = state.keys.tenant(headers)?;
    let batch = BatchId::parse(id).ok_or_else(|| Error::no_such_batch(id))?;
    let job = tenant_job(state, &tenant, &batch).await?.ok_or_else(|| Error::no_such_batch(id))?;
    Ok((batch, job))
}

pub async fn get(State(state): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Json<Batch>> {
    let (_, job) = find(&state, &headers, &id).await?;
    Ok(Json(to_batch(&job).expect("checked by find")))
}

/// Cancelling suspends the job (its finished shards stay) and records when; asking again changes
/// nothing. A batch already over cannot be cancelled: 409, as OpenAI answers.
pub async fn cancel(State(state): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Json<Batch>> {
    let (batch, job) = find(&state, &headers, &id).await?;
    let current = to_batch(&job).expect("checked by find");
    if current.status.is_terminal() {
        return Err(Error::api(
            StatusCode::CONFLICT,
            format!("Cannot cancel a batch with status '{}'.", current.status.as_str()),
            None,
            None,
        ));
    }
    let asked = job.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CANCELLING_AT_ANNOTATION));
    if asked && job.spec.suspend {
        return Ok(Json(current));
    }
    let at = current.cancelling_at.unwrap_or_else(now);
    let cancelled = state.cluster.cancel_job(&batch.job_name(), at).await?;
    tracing::info!(%batch, "batch cancelled");
    Ok(Json(to_batch(&cancelled).expect("the job stays the batch's")))
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<i64>,
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Page<Batch>>> {
    let tenant = state.keys.tenant(&headers)?;
    let Query(query) = query.map_err(|rejection| Error::bad_request(rejection.body_text(), None, None))?;
    let limit = limit(query.limit, 20, 100)?;
    let mut batches: Vec<Batch> = state
        .cluster
        .list_jobs(&tenant)
        .await?
        .iter()
        .filter(|job| job.metadata.labels.as_ref().and_then(|l| l.get(TENANT_LABEL)).is_some_and(|t| *t == tenant))
        .filter_map(to_batch)
        .collect();
    batches.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    Ok(Json(page(batches, |batch: &Batch| &batch.id, query.after.as_deref(), limit)))
}
