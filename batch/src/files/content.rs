//! `GET /v1/files/{id}/content`: the bytes, streamed from the store; a batch's result file is its
//! parts one after the other, never copied.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, StreamExt as _, TryStreamExt as _};

use super::{Found, find};
use crate::Result;
use crate::state::AppState;

pub async fn content(State(state): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Response> {
    let tenant = state.keys.tenant(&headers)?;
    let (paths, length) = match find(&state, &tenant, &id).await? {
        Found::Upload(meta) => (vec![state.store.content_path(&meta.id)], Some(meta.bytes)),
        Found::Result { object, parts } => (parts, Some(object.bytes)),
    };
    let store = state.store.clone();
    // Opened one after the other as the body is read: one part's stream at a time.
    let body = stream::iter(paths).then(move |path| {
        let store = store.clone();
        async move { store.read(&path).await }
    });
    let mut response = Body::from_stream(body.try_flatten()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Some(length) = length {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    Ok(response)
}
