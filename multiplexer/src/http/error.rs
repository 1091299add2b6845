//! The one place an HTTP request's failure becomes a status code and TEI's (or OpenAI's) error
//! body. Multiplexer errors are mapped here, not where they are raised, so the gRPC and HTTP
//! fronts tell the same story in their own protocol.

use std::time::Duration;

use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;
use tonic::Code;

use crate::Error;
use crate::admission::AdmissionError;
use crate::auth::AuthFailure;
use teifleet_wire::headers::RETRY_PUSHBACK_MS;

/// TEI's error types, spelled as its HTTP API spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ErrorType {
    Empty,
    Validation,
    Tokenizer,
    Backend,
    Overloaded,
    Unhealthy,
    /// No API key, or not one of the pool's (TEI itself answers a bare 401).
    Unauthorized,
}

/// Why an HTTP request was not served.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// TEI's own wording, so clients matching on it keep working.
    #[error("Input validation error: `{0}` cannot be empty")]
    Empty(&'static str),

    #[error("Failed to buffer the request body: length limit exceeded (at most {limit} bytes)")]
    PayloadTooLarge { limit: usize },

    /// The body is not the JSON the route takes.
    #[error("Failed to deserialize the JSON body into the target type: {0}")]
    Body(String),

    /// A request TEI would refuse as invalid, caught before it goes anywhere.
    #[error("{0}")]
    Invalid(String),

    /// TEI answered with something that is not the message its API promises.
    #[error("the upstream answered with an undecodable message: {0}")]
    Undecodable(String),

    /// TEI is not serving (health).
    #[error("unhealthy")]
    Unhealthy,

    /// The call failed in the multiplexer or upstream; already counted by its `Call`.
    #[error(transparent)]
    Call(Error),
}

/// Which error body the route answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `{"error": ..., "error_type": ...}`
    Tei,
    /// `{"message": ..., "code": ..., "type": ...}`, as TEI's OpenAI route answers.
    OpenAi,
}

#[derive(Serialize)]
struct TeiBody<'a> {
    error: &'a str,
    error_type: ErrorType,
}

#[derive(Serialize)]
struct OpenAiBody<'a> {
    message: &'a str,
    code: u16,
    #[serde(rename = "type")]
    error_type: ErrorType,
}

impl HttpError {
    /// Status, TEI error type and, for overload, how long the client should back off.
    pub fn classify(&self) -> (StatusCode, ErrorType, Option<Duration>) {
        match self {
            Self::Empty(_) => (StatusCode::BAD_REQUEST, ErrorType::Empty, None),
            Self::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, ErrorType::Validation, None),
            Self::Body(_) | Self::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Validation, None),
            Self::Undecodable(_) => (StatusCode::FAILED_DEPENDENCY, ErrorType::Backend, None),
            Self::Unhealthy => (StatusCode::SERVICE_UNAVAILABLE, ErrorType::Unhealthy, None),
            Self::Call(error) => classify_call(error),
        }
    }

    pub fn into_response(self, flavor: Flavor) -> Response {
        let (status, error_type, retry_after) = self.classify();
        let message = self.to_string();
        let body = match flavor {
            Flavor::Tei => serde_json::to_vec(&TeiBody { error: &message, error_type }),
            Flavor::OpenAi => serde_json::to_vec(&OpenAiBody { message: &message, code: status.as_u16(), error_type }),
        };
        let mut response = super::json_bytes(status, body.unwrap_or_default());
        if status == StatusCode::UNAUTHORIZED {
            // RFC 6750: a 401 names the scheme the client should use.
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(retry_after) = retry_after {
            // Retry-After counts whole seconds; round up so a client never comes back early, and
            // keep the exact hint beside it, as gRPC's pushback carries it.
            let seconds = retry_after.as_millis().div_ceil(1000).max(1);
            let headers = response.headers_mut();
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds as u64));
            headers.insert(RETRY_PUSHBACK_MS, HeaderValue::from(retry_after.as_millis() as u64));
        }
        response
    }
}

fn classify_call(error: &Error) -> (StatusCode, ErrorType, Option<Duration>) {
    match error {
        Error::Auth(AuthFailure::KeysNotLoaded) => (StatusCode::SERVICE_UNAVAILABLE, ErrorType::Unhealthy, None),
        Error::Auth(_) => (StatusCode::UNAUTHORIZED, ErrorType::Unauthorized, None),
        Error::Admission { source: AdmissionError::DeadlineExpired { .. }, .. } | Error::DeadlineAtUpstream { .. } => {
            (StatusCode::GATEWAY_TIMEOUT, ErrorType::Overloaded, None)
        }
        // Shed: overloaded, with the same back-off gRPC callers get as grpc-retry-pushback-ms.
        Error::Admission { source, .. } => (StatusCode::TOO_MANY_REQUESTS, ErrorType::Overloaded, source.retry_after()),
        Error::InvalidPriority(_) | Error::InvalidMetadata { .. } | Error::ForwardingLoop { .. } => {
            (StatusCode::BAD_REQUEST, ErrorType::Validation, None)
        }
        Error::UnknownPool { .. } | Error::UnknownModel { .. } => (StatusCode::NOT_FOUND, ErrorType::Validation, None),
        Error::PoolNotReady(_) | Error::Draining | Error::Unreachable { .. } => {
            (StatusCode::SERVICE_UNAVAILABLE, ErrorType::Unhealthy, None)
        }
        Error::Upstream { status, .. } => match status.code() {
            // TEI's gRPC API says INVALID_ARGUMENT for both; its HTTP API tells empty input apart.
            Code::InvalidArgument if status.message().contains("cannot be empty") => {
                (StatusCode::BAD_REQUEST, ErrorType::Empty, None)
            }
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                (StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Validation, None)
            }
            Code::ResourceExhausted => {
                let pushback = status
                    .metadata()
                    .get(RETRY_PUSHBACK_MS)
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .map(Duration::from_millis);
                (StatusCode::TOO_MANY_REQUESTS, ErrorType::Overloaded, pushback.or(Some(Duration::ZERO)))
            }
            Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, ErrorType::Unhealthy, None),
            // The pool this call was routed to refused its key.
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, ErrorType::Unauthorized, None),
            Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, ErrorType::Overloaded, None),
            _ => (StatusCode::FAILED_DEPENDENCY, ErrorType::Backend, None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overload_is_429_with_retry_after_rounded_up() {
        let error = HttpError::Call(Error::Admission {
            pool: "bge".into(),
            source: AdmissionError::QueueFull {
                queued: 3,
                retry_after: crate::admission::Retry::After(Duration::from_millis(1200)),
            },
        });
        let response = error.into_response(Flavor::Tei);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(response.headers()[RETRY_PUSHBACK_MS], "1200");
    }

    #[test]
    fn a_refused_key_is_401_in_either_shape() {
        let response = HttpError::Call(Error::Auth(AuthFailure::InvalidKey)).into_response(Flavor::OpenAi);
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let (status, error_type, _) = HttpError::Call(Error::Auth(AuthFailure::Missing)).classify();
        assert_eq!((status, error_type), (StatusCode::UNAUTHORIZED, ErrorType::Unauthorized));
        let waiting = HttpError::Call(Error::Auth(AuthFailure::KeysNotLoaded)).classify().0;
        assert_eq!(waiting, StatusCode::SERVICE_UNAVAILABLE, "the keys not read yet: retry, not a bad key");
        let routed =
            HttpError::Call(Error::Upstream { pool: "p".into(), status: tonic::Status::unauthenticated("no") });
        assert_eq!(routed.classify().0, StatusCode::UNAUTHORIZED, "the pool routed to refused the key");
    }

    #[test]
    fn upstream_codes_become_tei_statuses() {
        let upstream = |status| HttpError::Call(Error::Upstream { pool: "p".into(), status }).classify().0;
        assert_eq!(upstream(tonic::Status::invalid_argument("`inputs` cannot be empty")), StatusCode::BAD_REQUEST);
        assert_eq!(upstream(tonic::Status::invalid_argument("too long")), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(upstream(tonic::Status::resource_exhausted("Model is overloaded")), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(upstream(tonic::Status::internal("cuda")), StatusCode::FAILED_DEPENDENCY);
        assert_eq!(upstream(tonic::Status::unavailable("down")), StatusCode::SERVICE_UNAVAILABLE);
    }
}
