//! The one place a multiplexer error becomes a gRPC status, and the outcome a call is counted
//! as: both small maps from [`ErrorKind`].

use base64::Engine as _;
use bytes::Bytes;
use http::HeaderValue;
use percent_encoding::{AsciiSet, CONTROLS, percent_encode};
use std::fmt::Write as _;

use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::admission::Retry;
use crate::error::Error;
use crate::error::is_transport_failure;
use crate::gate::request_meta::remove_all;
use crate::vocab::Outcome;
use crate::vocab::framing::{GRPC_MESSAGE, GRPC_STATUS, RESERVED_IN_ANSWERS};
use teifleet_wire::headers::{RETRY_PUSHBACK_MS as RETRY_PUSHBACK_HEADER, SPILL_REFUSED as SPILL_REFUSED_HEADER};

/// The outcome an error is counted as.
pub fn outcome(error: &Error) -> Outcome {
    error.kind().into()
}

/// Room for an error's message: most fit (a pool's name, a figure or two, a retry hint).
const MESSAGE_ROOM: usize = 192;

/// The status the client receives. The upstream's own answers pass through as the upstream sent
/// them (code, message, details and metadata); only a connection that failed becomes
/// UNAVAILABLE, since that is the backend being unavailable whatever the transport says.
pub fn into_status(error: Error) -> Status {
    let error = match error {
        Error::Upstream { status, .. } if !is_transport_failure(&status) => return status,
        Error::Message(status) => return status,
        other => other,
    };
    // Written into room for a typical message at once, not grown a few bytes at a time: every
    // refusal of a storm writes one.
    let mut message = String::with_capacity(MESSAGE_ROOM);
    let _ = write!(message, "{}", error.for_client());
    let mut status = Status::new(error.code(), message);
    if let Error::ColdStart { .. } = &error {
        let millis = u64::try_from(crate::error::COLD_START_RETRY.as_millis()).unwrap_or(u64::MAX);
        status.metadata_mut().insert(RETRY_PUSHBACK_HEADER, MetadataValue::from(millis));
    }
    // The process's own bounds (its memory budget, the doors' and the activator's holds).
    if let Error::Memory(_) | Error::Door { .. } | Error::HoldsFull { .. } = &error
        && let Some(after) = error.retry_after()
    {
        let millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        status.metadata_mut().insert(RETRY_PUSHBACK_HEADER, MetadataValue::from(millis));
    }
    if let Error::SpillRefused { .. } = &error {
        status.metadata_mut().insert(SPILL_REFUSED_HEADER, MetadataValue::from_static("1"));
    }
    if let Error::Admission { source, .. } = &error
        && let Some(retry) = source.retry()
    {
        // gRPC's retry policy (A6) stops retrying on a negative pushback.
        let value = match retry {
            Retry::After(after) => MetadataValue::from(u64::try_from(after.as_millis()).unwrap_or(u64::MAX)),
            Retry::Futile => MetadataValue::from_static("-1"),
        };
        status.metadata_mut().insert(RETRY_PUSHBACK_HEADER, value);
    }
    status
}

/// What tonic percent-encodes in `grpc-message` (the gRPC spec: anything outside visible ASCII,
/// `%`, and what HTTP/2 header values should not carry), so its clients decode what they always
/// have.
const MESSAGE_ENCODING: &AsciiSet =
    &CONTROLS.add(b' ').add(b'"').add(b'#').add(b'%').add(b'<').add(b'>').add(b'`').add(b'?').add(b'{').add(b'}');

/// `grpc-status`'s value for each code.
const CODES: [&str; 17] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"];

/// A status as a trailers-only gRPC answer: what tonic's `Status::into_http` writes (the status's
/// metadata less gRPC's reserved headers, `content-type`, `grpc-status`, the percent-encoded
/// `grpc-message`, the details), built on the status's own metadata instead of a copy of it and
/// with the message encoded into one buffer of its size. Every refusal is answered this way, and
/// a storm of refusals is what the pool can least afford: 27 allocations a refusal with tonic's,
/// 10 with this (`tests/refusal_allocations.rs`).
pub fn into_http<B: Default>(mut status: Status) -> http::Response<B> {
    let mut headers = std::mem::take(status.metadata_mut()).into_headers();
    remove_all(&mut headers, &RESERVED_IN_ANSWERS);
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from_static(CODES[status.code() as usize]));
    if !status.message().is_empty() {
        let encoded = percent_encode(status.message().as_bytes(), MESSAGE_ENCODING);
        let mut message = String::with_capacity(encoded.clone().map(str::len).sum());
        message.extend(encoded);
        let value = HeaderValue::from_maybe_shared(Bytes::from(message));
        headers.insert(GRPC_MESSAGE, value.expect("percent-encoded text is a header value"));
    }
    if !status.details().is_empty() {
        let details = base64::engine::general_purpose::STANDARD_NO_PAD.encode(status.details());
        if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(details)) {
            headers.insert(http::HeaderName::from_static("grpc-status-details-bin"), value);
        }
    }
    let mut response = http::Response::new(B::default());
    *response.headers_mut() = headers;
    response
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        into_status(error)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic::Code;

    use super::*;
    use crate::admission::AdmissionError;
    use crate::gate::auth::AuthFailure;
    use crate::gate::request_meta::InvalidMetadata;

    fn admission(source: AdmissionError) -> Error {
        Error::Admission { pool: "bge".into(), source }
    }

    #[test]
    fn overload_is_resource_exhausted_with_a_pushback_hint() {
        let status = into_status(admission(AdmissionError::QueueFull {
            queued: 9,
            retry_after: Retry::After(Duration::from_millis(250)),
        }));
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.metadata().get(RETRY_PUSHBACK_HEADER).unwrap(), "250");
        assert!(status.message().contains("pool bge"), "{}", status.message());
        let futile = into_status(admission(AdmissionError::DeadlineUnmeetable {
            expected_wait: Duration::from_secs(5),
            retry_after: Retry::Futile,
        }));
        assert_eq!(
            futile.metadata().get(RETRY_PUSHBACK_HEADER).unwrap(),
            "-1",
            "A6: a negative pushback stops retries"
        );
    }

    #[test]
    fn upstream_answers_pass_through_unchanged() {
        let mut upstream = Status::with_details(Code::InvalidArgument, "Input validation error: empty", "why".into());
        upstream.metadata_mut().insert("x-tei-detail", "kept".parse().unwrap());
        let status = into_status(Error::Upstream { pool: "bge".into(), status: upstream });
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "Input validation error: empty");
        assert_eq!(status.details(), b"why");
        assert_eq!(status.metadata().get("x-tei-detail").unwrap(), "kept");
    }

    #[test]
    fn another_pools_key_refusal_passes_through_as_the_callers_doing() {
        let error = Error::Upstream { pool: "gte".into(), status: Status::unauthenticated("invalid API key") };
        assert_eq!(outcome(&error), Outcome::Rejected, "not an upstream error: no alert fires for it");
        assert_eq!(into_status(error).code(), Code::Unauthenticated);
    }

    #[test]
    fn the_multiplexers_own_state_is_not_counted_as_the_callers_fault() {
        for error in [Error::Draining, Error::PoolNotReady("p".into()), Error::Auth(AuthFailure::KeysNotLoaded)] {
            assert_eq!(outcome(&error), Outcome::Unavailable, "{error}");
            assert_eq!(into_status(error).code(), Code::Unavailable);
        }
        let tei = Error::Upstream { pool: "p".into(), status: Status::failed_precondition("model is not a re-ranker") };
        assert_eq!(outcome(&tei), Outcome::UpstreamError, "TEI's own error: an upstream error, alerts fire");
    }

    #[test]
    fn every_error_has_its_code() {
        let cases = [
            (admission(AdmissionError::DeadlineExpired { waited: Duration::ZERO }), Code::DeadlineExceeded),
            (
                admission(AdmissionError::DeadlineUnmeetable {
                    expected_wait: Duration::from_secs(1),
                    retry_after: Retry::After(Duration::from_secs(1)),
                }),
                Code::ResourceExhausted,
            ),
            (Error::InvalidMetadata(InvalidMetadata { header: "x", reason: "y".into() }), Code::InvalidArgument),
            (Error::UnknownPool { requested: "a".into(), known: "b".into() }, Code::NotFound),
            (Error::NoPoolNamed, Code::NotFound),
            (Error::ForwardingLoop { by: "pod".into() }, Code::FailedPrecondition),
            (Error::PlaintextRoute { pool: "p".into() }, Code::FailedPrecondition),
            (Error::Draining, Code::Unavailable),
            (Error::Auth(AuthFailure::InvalidKey), Code::Unauthenticated),
            (Error::Auth(AuthFailure::Missing), Code::Unauthenticated),
            (Error::Auth(AuthFailure::KeysNotLoaded), Code::Unavailable),
            (Error::CertificateRequired { pool: "p".into() }, Code::Unauthenticated),
            (Error::Upstream { pool: "p".into(), status: Status::unavailable("down") }, Code::Unavailable),
            (Error::Upstream { pool: "p".into(), status: Status::resource_exhausted("full") }, Code::ResourceExhausted),
        ];
        for (error, code) in cases {
            let shown = error.to_string();
            assert_eq!(into_status(error).code(), code, "{shown}");
        }
    }

    /// The status names no upstream URL, pod address or pod name: what a caller outside the
    /// cluster must not learn of it. The error itself (what the log writes) keeps them.
    #[test]
    fn a_status_names_nothing_inside_the_deployment() {
        let inside = ["10.1.2.3", "bge-7c9f-abcde"];
        let errors = [
            Error::Unreachable { pool: "bge".into(), reason: "http://10.1.2.3:8080: connection refused".into() },
            Error::ForwardingLoop { by: "bge-7c9f-abcde".into() },
            Error::SpillRefused { pool: "bge".into(), from: "10.1.2.3".into() },
        ];
        for error in errors {
            let logged = error.to_string();
            assert!(inside.iter().any(|name| logged.contains(name)), "the log keeps it: {logged}");
            let told = into_status(error).message().to_owned();
            assert!(inside.iter().all(|name| !told.contains(name)), "{told}");
        }
    }

    /// Ours and tonic's side by side: the same headers, byte for byte, for messages that need
    /// encoding, details, and metadata that names reserved headers.
    #[test]
    fn a_status_is_answered_as_tonic_answers_it() {
        let mut with_metadata = Status::with_details(
            Code::ResourceExhausted,
            "pool a: the queue is full (100% of 8 in flight) — retry in 5 ms? {\"x\": `y`} #1 <a>",
            bytes::Bytes::from_static(b"\x08\x01details"),
        );
        with_metadata.metadata_mut().insert(RETRY_PUSHBACK_HEADER, MetadataValue::from(5u64));
        with_metadata.metadata_mut().insert("content-type", MetadataValue::from_static("text/plain"));
        with_metadata.metadata_mut().insert("grpc-status", MetadataValue::from_static("0"));
        let statuses = [
            with_metadata,
            Status::new(Code::Unavailable, ""),
            Status::deadline_exceeded("plain"),
            Status::new(Code::InvalidArgument, "tab\tnewline\nand é"),
        ];
        for status in statuses {
            let theirs: http::Response<()> = status.clone().into_http();
            let ours: http::Response<()> = into_http(status);
            let sorted = |response: &http::Response<()>| {
                let mut headers: Vec<_> = response.headers().iter().map(|(n, v)| (n.clone(), v.clone())).collect();
                headers.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
                headers
            };
            assert_eq!(sorted(&ours), sorted(&theirs));
        }
    }
}
