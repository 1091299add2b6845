//! `GET /v1/files`: the caller's uploads, newest first unless `order=asc`, filtered by `purpose`,
//! paged by `after` and `limit` (1 to 10,000, OpenAI's default 10,000).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use serde::Deserialize;

use super::FileObject;
use crate::paging::{Page, limit, page};
use crate::state::AppState;
use crate::{Error, Result};

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<i64>,
    order: Option<String>,
    purpose: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Page<FileObject>>> {
    let tenant = state.keys.tenant(&headers)?;
    let Query(query) = query.map_err(|rejection| Error::bad_request(rejection.body_text(), None, None))?;
    let limit = limit(query.limit, 10_000, 10_000)?;
    let descending = match query.order.as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(Error::bad_request(
                format!(
                    "Invalid value: '{}'. Supported values are: 'asc' and 'desc'.",
                    other.chars().take(64).collect::<String>()
                ),
                Some("order"),
                Some("invalid_value"),
            ));
        }
    };
    let mut metas: Vec<_> = state
        .store
        .metas()
        .await?
        .into_iter()
        .filter(|meta| meta.tenant == tenant && query.purpose.as_ref().is_none_or(|purpose| &meta.purpose == purpose))
        .collect();
    metas.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    if descending {
        metas.reverse();
    }
    let objects = metas.iter().map(FileObject::from).collect();
    Ok(Json(page(objects, |file: &FileObject| &file.id, query.after.as_deref(), limit)))
}
