//! The one place an HTTP request's failure becomes a status code and TEI's (or OpenAI's) error
//! body: the multiplexer's own errors by their [`ErrorKind`], the upstream's answers as TEI's
//! HTTP server gives them, so the gRPC and HTTP fronts tell the same story in their own protocol.

use std::borrow::Cow;
use std::time::Duration;

use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;
use tonic::Code;

use crate::error::{Error, ErrorKind, is_transport_failure};
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

    /// The body did not arrive within the body deadline.
    #[error("the request body did not arrive in time")]
    BodyTimeout,

    /// More inputs than one request may carry: refused whole, before anything is queued.
    #[error("batch size {inputs} > maximum allowed batch size {limit}: send at most {limit} inputs per request")]
    TooManyInputs { inputs: usize, limit: usize },

    /// The answer would be larger than one answer may be: refused before anything is sent.
    #[error(
        "the answer would be about {estimate} bytes, over the limit of {limit}: send fewer or shorter inputs per request"
    )]
    AnswerTooLarge { estimate: u64, limit: u64 },

    /// A field copied into every upstream message (`prompt_name`, `/rerank`'s query) would make
    /// the messages many times the body: refused before any is built (`super::upstream`).
    #[error(
        "the request would be sent upstream as {bytes} bytes, over the limit of {limit}: a long field is copied into every input; shorten it or send fewer inputs"
    )]
    UpstreamTooLarge { bytes: u64, limit: u64 },

    /// The body is not JSON at all (axum's and so TEI's wording, and TEI's 400).
    #[error("Failed to parse the request body as JSON: {0}")]
    NotJson(String),

    /// The body is JSON, but not what the route takes (TEI's 422).
    #[error("Failed to deserialize the JSON body into the target type: {0}")]
    Body(String),

    /// A request TEI would refuse as invalid, caught before it goes anywhere.
    #[error("{0}")]
    Invalid(String),

    /// The model cannot serve this route (TEI checks the model type before its queue).
    #[error("Backend error: {0}")]
    WrongModelType(&'static str),

    /// An answer that could not be encoded as JSON.
    #[error("the answer could not be encoded: {0}")]
    Unencodable(String),

    /// TEI is not serving (health).
    #[error("unhealthy")]
    Unhealthy,

    /// The call failed in the multiplexer or upstream.
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

/// How an HTTP error is answered.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer<'a> {
    pub status: StatusCode,
    pub error_type: ErrorType,
    pub message: Cow<'a, str>,
    /// For overload: how long the client should back off.
    pub retry_after: Option<Duration>,
}

impl HttpError {
    /// What kind of failure this is, as the call is counted.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Empty(_) | Self::NotJson(_) | Self::Body(_) | Self::Invalid(_) | Self::WrongModelType(_) => {
                ErrorKind::InvalidRequest
            }
            Self::PayloadTooLarge { .. }
            | Self::TooManyInputs { .. }
            | Self::AnswerTooLarge { .. }
            | Self::UpstreamTooLarge { .. } => ErrorKind::TooLarge,
            Self::BodyTimeout => ErrorKind::InvalidRequest,
            Self::Unencodable(_) => ErrorKind::Upstream,
            Self::Unhealthy => ErrorKind::Unavailable,
            Self::Call(error) => error.kind(),
        }
    }

    /// Status, TEI error type, message and back-off, as TEI's HTTP server would answer.
    pub fn answer(&self) -> Answer<'_> {
        let own =
            |status, error_type| Answer { status, error_type, message: self.to_string().into(), retry_after: None };
        match self {
            Self::Empty(_) => own(StatusCode::BAD_REQUEST, ErrorType::Empty),
            Self::PayloadTooLarge { .. }
            | Self::TooManyInputs { .. }
            | Self::AnswerTooLarge { .. }
            | Self::UpstreamTooLarge { .. } => own(StatusCode::PAYLOAD_TOO_LARGE, ErrorType::Validation),
            Self::NotJson(_) => own(StatusCode::BAD_REQUEST, ErrorType::Validation),
            Self::BodyTimeout => own(StatusCode::REQUEST_TIMEOUT, ErrorType::Validation),
            Self::Body(_) | Self::Invalid(_) => own(StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Validation),
            Self::WrongModelType(_) | Self::Unencodable(_) => own(StatusCode::FAILED_DEPENDENCY, ErrorType::Backend),
            Self::Unhealthy => own(StatusCode::SERVICE_UNAVAILABLE, ErrorType::Unhealthy),
            Self::Call(Error::Upstream { status, .. }) if self.kind() == ErrorKind::Upstream => tei_answer(status),
            Self::Call(error) => call_answer(error),
        }
    }

    pub fn into_response(self, flavor: Flavor) -> Response {
        let Answer { status, error_type, message, retry_after } = self.answer();
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

/// A failure of the multiplexer's own (or a peer multiplexer's), by its kind.
fn call_answer(error: &Error) -> Answer<'_> {
    let (status, error_type) = match error.kind() {
        ErrorKind::Unauthenticated => (StatusCode::UNAUTHORIZED, ErrorType::Unauthorized),
        ErrorKind::InvalidRequest | ErrorKind::RouteRefused => (StatusCode::BAD_REQUEST, ErrorType::Validation),
        ErrorKind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, ErrorType::Validation),
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, ErrorType::Validation),
        ErrorKind::Shed(_) | ErrorKind::QueueTimedOut => (StatusCode::TOO_MANY_REQUESTS, ErrorType::Overloaded),
        ErrorKind::ExpiredInQueue | ErrorKind::ExpiredAtUpstream => {
            (StatusCode::GATEWAY_TIMEOUT, ErrorType::Overloaded)
        }
        ErrorKind::Unavailable | ErrorKind::Unreachable => (StatusCode::SERVICE_UNAVAILABLE, ErrorType::Unhealthy),
        ErrorKind::Upstream => (StatusCode::FAILED_DEPENDENCY, ErrorType::Backend),
    };
    // The upstream's own words, not the multiplexer's wrapping of them.
    let message = match error {
        Error::Upstream { status, .. } if !is_transport_failure(status) => status.message().into(),
        other => other.for_client().to_string().into(),
    };
    let retry_after = match error {
        Error::Admission { source, .. } => source.retry_after(),
        other => other.retry_after(),
    };
    Answer { status, error_type, message, retry_after }
}

/// TEI's HTTP answer for an error its gRPC API gave. TEI's gRPC server turns its error types
/// into codes (Empty and Validation: INVALID_ARGUMENT; Tokenizer and Backend:
/// FAILED_PRECONDITION; Overloaded: RESOURCE_EXHAUSTED; Unhealthy: UNAVAILABLE) with the message
/// its HTTP server sends; this undoes that, so HTTP clients read what TEI's HTTP server says.
pub fn tei_answer(status: &tonic::Status) -> Answer<'_> {
    let message = status.message();
    let (code, error_type) = match status.code() {
        Code::InvalidArgument if message.contains("cannot be empty") => (StatusCode::BAD_REQUEST, ErrorType::Empty),
        Code::InvalidArgument => (StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Validation),
        Code::FailedPrecondition if message.starts_with(TOKENIZER_PREFIX) => {
            (StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Tokenizer)
        }
        Code::FailedPrecondition => (StatusCode::FAILED_DEPENDENCY, ErrorType::Backend),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, ErrorType::Overloaded),
        Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, ErrorType::Unhealthy),
        // A peer multiplexer's own refusals, when the call was routed to another pool.
        Code::NotFound => (StatusCode::NOT_FOUND, ErrorType::Validation),
        Code::OutOfRange => (StatusCode::PAYLOAD_TOO_LARGE, ErrorType::Validation),
        // TEI's HTTP server answers every other failure of its backend as 424.
        _ => (StatusCode::FAILED_DEPENDENCY, ErrorType::Backend),
    };
    // TEI's gRPC model-type checks word their message bare; its HTTP server raises the same
    // check as a backend error, prefixed.
    let message = if error_type == ErrorType::Backend
        && status.code() == Code::FailedPrecondition
        && !message.starts_with(BACKEND_PREFIX)
    {
        format!("{BACKEND_PREFIX}{message}").into()
    } else {
        message.into()
    };
    let retry_after = (status.code() == Code::ResourceExhausted).then(|| {
        status
            .metadata()
            .get(RETRY_PUSHBACK_MS)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .map_or(Duration::ZERO, Duration::from_millis)
    });
    Answer { status: code, error_type, message, retry_after }
}

/// How TEI's own error messages begin, by type.
const TOKENIZER_PREFIX: &str = "Tokenizer error";
const BACKEND_PREFIX: &str = "Backend error: ";

#[cfg(test)]
mod tests {
    use tonic::Status;

    use super::*;
    use crate::admission::{AdmissionError, Retry};
    use crate::gate::auth::AuthFailure;

    fn upstream(status: Status) -> HttpError {
        HttpError::Call(Error::Upstream { pool: "p".into(), status })
    }

    #[test]
    fn overload_is_429_with_retry_after_rounded_up() {
        let error = HttpError::Call(Error::Admission {
            pool: "bge".into(),
            source: AdmissionError::QueueFull { queued: 3, retry_after: Retry::After(Duration::from_millis(1200)) },
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
        let missing = HttpError::Call(Error::Auth(AuthFailure::Missing));
        assert_eq!(
            (missing.answer().status, missing.answer().error_type),
            (StatusCode::UNAUTHORIZED, ErrorType::Unauthorized)
        );
        let waiting = HttpError::Call(Error::Auth(AuthFailure::KeysNotLoaded));
        assert_eq!(
            waiting.answer().status,
            StatusCode::SERVICE_UNAVAILABLE,
            "the keys not read yet: retry, not a bad key"
        );
        let routed = upstream(Status::unauthenticated("no"));
        assert_eq!(routed.answer().status, StatusCode::UNAUTHORIZED, "the pool routed to refused the key");
    }

    /// A route from a TLS pool to one in plain text is the caller's to change: 400 in TEI's shape,
    /// naming the pool it asked for.
    #[test]
    fn a_route_refused_in_plain_text_is_a_400_naming_the_pool() {
        let error = HttpError::Call(Error::PlaintextRoute { pool: "gte".into() });
        let answer = error.answer();
        assert_eq!((answer.status, answer.error_type), (StatusCode::BAD_REQUEST, ErrorType::Validation));
        assert!(answer.message.starts_with("pool gte is served in plain text"), "{}", answer.message);
    }

    /// An HTTP client is told the upstream is unreachable, not where it lives (the log says).
    #[test]
    fn an_unreachable_upstream_names_no_address() {
        let error = HttpError::Call(Error::Unreachable {
            pool: "bge".into(),
            reason: "http://10.1.2.3:8080: connection refused".into(),
        });
        let answer = error.answer();
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.message, "upstream bge is unreachable");
    }

    /// At the activator, a request naming no pool is 404 in TEI's shape, with no retry hint.
    #[test]
    fn a_call_naming_no_pool_is_404_not_a_retry() {
        let response = HttpError::Call(Error::NoPoolNamed).into_response(Flavor::Tei);
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert!(!response.headers().contains_key(header::RETRY_AFTER));
        let answer = HttpError::Call(Error::NoPoolNamed);
        assert_eq!(answer.answer().error_type, ErrorType::Validation);
        assert!(answer.answer().message.contains("x-teifleet-pool"), "{}", answer.answer().message);
    }

    /// What TEI 1.9's HTTP server answers for each of its error types, given what its gRPC
    /// server answers for the same error.
    #[test]
    fn teis_grpc_errors_become_what_its_http_server_answers() {
        let cases = [
            (
                Status::invalid_argument("Input validation error: `inputs` cannot be empty"),
                400,
                ErrorType::Empty,
                "Input validation error: `inputs` cannot be empty",
            ),
            (
                Status::invalid_argument("Input validation error: `inputs` must have less than 512 tokens. Given: 700"),
                422,
                ErrorType::Validation,
                "Input validation error: `inputs` must have less than 512 tokens. Given: 700",
            ),
            (
                Status::failed_precondition("Tokenizer error: bad input"),
                422,
                ErrorType::Tokenizer,
                "Tokenizer error: bad input",
            ),
            (
                Status::failed_precondition("Backend error: Inference failed: cuda"),
                424,
                ErrorType::Backend,
                "Backend error: Inference failed: cuda",
            ),
            (
                Status::failed_precondition("model is not a re-ranker model"),
                424,
                ErrorType::Backend,
                "Backend error: model is not a re-ranker model",
            ),
            (Status::resource_exhausted("Model is overloaded"), 429, ErrorType::Overloaded, "Model is overloaded"),
            (Status::unavailable("unhealthy"), 503, ErrorType::Unhealthy, "unhealthy"),
            (Status::internal("cuda"), 424, ErrorType::Backend, "cuda"),
            (Status::deadline_exceeded("late"), 504, ErrorType::Overloaded, "late"),
        ];
        for (status, code, error_type, message) in cases {
            let error = upstream(status);
            let answer = error.answer();
            assert_eq!((answer.status.as_u16(), answer.error_type, &*answer.message), (code, error_type, message));
        }
        let overloaded = upstream(Status::resource_exhausted("Model is overloaded"));
        assert_eq!(overloaded.answer().retry_after, Some(Duration::ZERO), "a Retry-After of one second");
    }

    #[test]
    fn a_body_that_is_not_json_is_400_and_wrong_json_422_as_in_tei() {
        assert_eq!(HttpError::NotJson("expected value".into()).answer().status, StatusCode::BAD_REQUEST);
        assert_eq!(HttpError::Body("missing field `inputs`".into()).answer().status, StatusCode::UNPROCESSABLE_ENTITY);
        let too_many = HttpError::TooManyInputs { inputs: 60_000, limit: 2048 };
        assert_eq!(too_many.answer().status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(too_many.kind(), ErrorKind::TooLarge);
    }
}
