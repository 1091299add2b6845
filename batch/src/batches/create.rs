//! `POST /v1/batches`: checks the request as OpenAI does (endpoint, completion window, metadata),
//! that the input file is the caller's batch file, reads it once ([`super::scan`]) for duplicate
//! custom ids and its model, finds the pool serving that model, and creates the job.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;

use super::job::{BatchJob, job};
use super::mapping::{Batch, to_batch};
use super::scan::scan;
use super::{COMPLETION_WINDOW, ENDPOINT};
use crate::ids::{BatchId, FileId};
use crate::state::AppState;
use crate::store::BATCH_PURPOSE;
use crate::{Error, Result};

/// OpenAI's metadata bounds.
const MAX_METADATA_PAIRS: usize = 16;
const MAX_METADATA_KEY_CHARS: usize = 64;
const MAX_METADATA_VALUE_CHARS: usize = 512;

#[derive(Debug, Deserialize)]
pub struct CreateBatch {
    input_file_id: Option<String>,
    endpoint: Option<String>,
    completion_window: Option<String>,
    metadata: Option<Value>,
}

pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<CreateBatch>, JsonRejection>,
) -> Result<Json<Batch>> {
    let tenant = state.keys.tenant(&headers)?;
    let Json(request) = body.map_err(|rejection| {
        Error::bad_request(
            format!("We could not parse the JSON body of your request. ({})", rejection.body_text()),
            None,
            None,
        )
    })?;
    let input_file_id = request.input_file_id.ok_or_else(|| Error::missing("input_file_id"))?;
    let endpoint = request.endpoint.ok_or_else(|| Error::missing("endpoint"))?;
    let completion_window = request.completion_window.ok_or_else(|| Error::missing("completion_window"))?;
    one_of("endpoint", &endpoint, ENDPOINT)?;
    one_of("completion_window", &completion_window, COMPLETION_WINDOW)?;
    let metadata = metadata(request.metadata)?;

    // A malformed id, a missing file and another tenant's: the same answer.
    let cannot_find = || {
        Error::bad_request(
            format!(
                "Cannot find file {}, or you do not have access to it.",
                input_file_id.chars().take(64).collect::<String>()
            ),
            Some("input_file_id"),
            None,
        )
    };
    let Some(FileId::Upload(file_id)) = FileId::parse(&input_file_id) else { return Err(cannot_find()) };
    let meta = state.store.meta(&file_id).await?.filter(|meta| meta.tenant == tenant).ok_or_else(cannot_find)?;
    if meta.purpose != BATCH_PURPOSE {
        return Err(Error::bad_request(
            format!("The input file {file_id} must have been uploaded with purpose 'batch'."),
            Some("input_file_id"),
            None,
        ));
    }
    let found = {
        let _place = state.scans.acquire().await.expect("the semaphore is never closed");
        // Deleted since its record was read: as if it never was.
        let bytes = match state.store.read(&state.store.content_path(&file_id)).await {
            Err(Error::Store { source: object_store::Error::NotFound { .. }, .. }) => return Err(cannot_find()),
            read => read?,
        };
        scan(bytes).await?
    };
    if found.lines == 0 {
        return Err(Error::bad_request(
            "The input file is empty: a batch needs at least one request.",
            Some("input_file_id"),
            None,
        ));
    }
    let model = found.model.ok_or_else(|| {
        Error::bad_request("No request in the input file names a model ('body.model').", Some("input_file_id"), None)
    })?;
    let pool = state.cluster.pool_for_model(&model).await?.ok_or_else(|| {
        Error::bad_request(
            format!("The model `{model}` does not exist or you do not have access to it."),
            Some("model"),
            Some("model_not_found"),
        )
    })?;

    let batch = BatchId::new_random();
    let spec = BatchJob {
        batch: &batch,
        tenant: &tenant,
        input_file_id: &file_id,
        pool: &pool,
        requests: found.lines,
        file_bytes: meta.bytes,
        metadata: &metadata,
    };
    let created = state.cluster.create_job(&job(&spec, &state.jobs)).await?;
    tracing::info!(%batch, %tenant, file = %file_id, %pool, requests = found.lines, "batch created");
    Ok(Json(to_batch(&created).expect("the created job is the batch's")))
}

/// OpenAI's refusal of a value outside the supported one.
fn one_of(param: &'static str, value: &str, supported: &str) -> Result<()> {
    if value == supported {
        return Ok(());
    }
    Err(Error::bad_request(
        format!(
            "Invalid value: '{}'. Supported values are: '{supported}'.",
            value.chars().take(128).collect::<String>()
        ),
        Some(param),
        Some("invalid_value"),
    ))
}

/// Metadata: at most 16 string pairs, keys to 64 characters, values to 512 (OpenAI's bounds and
/// words).
fn metadata(value: Option<Value>) -> Result<BTreeMap<String, String>> {
    let object = match value {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(object)) => object,
        Some(_) => {
            return Err(Error::bad_request(
                "Invalid type for 'metadata': expected an object.",
                Some("metadata"),
                Some("invalid_type"),
            ));
        }
    };
    if object.len() > MAX_METADATA_PAIRS {
        return Err(Error::bad_request(
            format!(
                "Invalid 'metadata': too many properties. Expected an object with at most {MAX_METADATA_PAIRS} \
                 properties, but got an object with {} properties instead.",
                object.len()
            ),
            Some("metadata"),
            Some("object_above_max_properties"),
        ));
    }
    let too_long = |what: &str, max: usize, length: usize| {
        Error::bad_request(
            format!(
                "Invalid 'metadata{what}': string too long. Expected a string with maximum length {max}, but got a \
                 string with length {length} instead."
            ),
            Some("metadata"),
            Some("string_above_max_length"),
        )
    };
    let mut pairs = BTreeMap::new();
    for (key, value) in object {
        let key_length = key.chars().count();
        if key_length > MAX_METADATA_KEY_CHARS {
            return Err(too_long(" key", MAX_METADATA_KEY_CHARS, key_length));
        }
        let Value::String(value) = value else {
            return Err(Error::bad_request(
                format!("Invalid type for 'metadata.{key}': expected a string."),
                Some("metadata"),
                Some("invalid_type"),
            ));
        };
        let value_length = value.chars().count();
        if value_length > MAX_METADATA_VALUE_CHARS {
            return Err(too_long(&format!(".{key}"), MAX_METADATA_VALUE_CHARS, value_length));
        }
        pairs.insert(key, value);
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn metadata_within_openais_bounds() {
        assert_eq!(metadata(None).unwrap(), BTreeMap::new());
        let sixteen: serde_json::Map<String, Value> = (0..16).map(|n| (format!("k{n}"), json!("v"))).collect();
        assert_eq!(metadata(Some(Value::Object(sixteen.clone()))).unwrap().len(), 16);
        let mut seventeen = sixteen;
        seventeen.insert("k16".into(), json!("v"));
        let cases = [
            (Value::Object(seventeen), "object_above_max_properties"),
            (json!({ "k".repeat(65): "v" }), "string_above_max_length"),
            (json!({ "k": "v".repeat(513) }), "string_above_max_length"),
            (json!({ "k": 1 }), "invalid_type"),
            (json!(["k"]), "invalid_type"),
        ];
        for (value, expected) in cases {
            let Err(Error::Api { code, .. }) = metadata(Some(value.clone())) else { panic!("{value} accepted") };
            assert_eq!(code, Some(expected), "{value}");
        }
        assert!(metadata(Some(json!({ "k".repeat(64): "v".repeat(512) }))).is_ok());
    }
}
