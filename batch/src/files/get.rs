//! `GET /v1/files/{id}`: the FileObject.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;

use super::{FileObject, Found, find};
use crate::Result;
use crate::state::AppState;

pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<FileObject>> {
    let tenant = state.keys.tenant(&headers)?;
    Ok(Json(match find(&state, &tenant, &id).await? {
        Found::Upload(meta) => FileObject::from(&meta),
        Found::Result { object, .. } => object,
    }))
}
