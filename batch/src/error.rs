//! The crate's one error type, and how it answers: every refusal in OpenAI's shape,
//! `{"error":{"message","type","param","code"}}`, with OpenAI's status and words, so the SDKs raise
//! the exception they raise against OpenAI (`NotFoundError`, `BadRequestError`, ...).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Why a request failed. [`Error::Api`] is a refusal the caller can act on; the others are the
/// server's own failures (a store or the API server unreachable), answered as 500 without their
/// details, which go to the log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A refusal, in OpenAI's terms.
    #[error("{status}: {message}")]
    Api {
        status: StatusCode,
        message: String,
        param: Option<&'static str>,
        code: Option<&'static str>,
        /// Seconds for `retry-after` (429 only).
        retry_after: Option<u32>,
    },

    /// A flag's value is unusable.
    #[error("--{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },

    /// The store failed (listing, reading or writing `path`).
    #[error("store: {path}: {source}")]
    Store {
        path: String,
        #[source]
        source: object_store::Error,
    },

    /// The jobs crate could not open the store.
    #[error(transparent)]
    Job(#[from] teifleet_job::Error),

    /// A file's metadata in the store does not parse.
    #[error("store: {path}: {source}")]
    Meta {
        path: String,
        #[source]
        source: serde_json::Error,
    },

    /// The Kubernetes API server refused or failed a call.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),

    /// The API keys directory could not be read.
    #[error("API keys {path}: {source}")]
    Keys {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>, code: Option<&'static str>) -> Self {
        Self::api(StatusCode::BAD_REQUEST, message, param, code)
    }

    /// A refusal with any status.
    pub fn api(
        status: StatusCode,
        message: impl Into<String>,
        param: Option<&'static str>,
        code: Option<&'static str>,
    ) -> Self {
        Self::Api { status, message: message.into(), param, code, retry_after: None }
    }

    /// OpenAI's answer for a file that does not exist, which is also the answer for another
    /// tenant's file and for an id that is not a file id: nothing tells them apart.
    pub fn no_such_file(id: &str) -> Self {
        Self::api(StatusCode::NOT_FOUND, format!("No such File object: {}", shown_id(id)), Some("id"), None)
    }

    /// OpenAI's answer for a batch that does not exist (or is another tenant's).
    pub fn no_such_batch(id: &str) -> Self {
        Self::api(StatusCode::NOT_FOUND, format!("No batch found with id '{}'.", shown_id(id)), Some("batch_id"), None)
    }

    /// `Missing required parameter: 'x'.`, as OpenAI says it.
    pub fn missing(param: &'static str) -> Self {
        Self::bad_request(
            format!("Missing required parameter: '{param}'."),
            Some(param),
            Some("missing_required_parameter"),
        )
    }

    /// A failed store operation on `path`.
    pub fn store(path: &object_store::path::Path, source: object_store::Error) -> Self {
        Self::Store { path: path.to_string(), source }
    }

    /// The status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Api { status, .. } => *status,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An id as a message quotes it: the caller's own text, cut short so a hostile one cannot make
/// the answer large.
fn shown_id(id: &str) -> String {
    id.chars().take(64).collect()
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, body, retry_after) = match self {
            Self::Api { status, message, param, code, retry_after } => (
                status,
                json!({ "error": { "message": message, "type": "invalid_request_error", "param": param, "code": code } }),
                retry_after,
            ),
            internal => {
                tracing::error!(error = %internal, "request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({ "error": {
                        "message": "The server had an error while processing your request. Sorry about that!",
                        "type": "server_error", "param": null, "code": null,
                    } }),
                    None,
                )
            }
        };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(seconds) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
