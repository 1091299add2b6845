//! `DELETE /v1/files/{id}`: an upload goes, record first. A batch's result files are its job's
//! parts, which a worker still writing would write again: they are not deleted this way.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::{Found, find};
use crate::state::AppState;
use crate::{Error, Result};

pub async fn delete(State(state): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Json<Value>> {
    let tenant = state.keys.tenant(&headers)?;
    match find(&state, &tenant, &id).await? {
        Found::Upload(meta) => {
            state.store.delete(&meta.id).await?;
            Ok(Json(json!({ "id": meta.id, "object": "file", "deleted": true })))
        }
        Found::Result { .. } => Err(Error::bad_request(
            "A batch's output and error files are read from its job's parts and cannot be deleted on their own.",
            Some("file_id"),
            None,
        )),
    }
}
