//! The one place a multiplexer error becomes a gRPC status, and the outcome a call is counted
//! as: both small maps from [`ErrorKind`].

use tonic::Status;

use crate::admission::Retry;
use crate::error::Error;
use crate::error::is_transport_failure;
use crate::vocab::Outcome;
use teifleet_wire::headers::{RETRY_PUSHBACK_MS as RETRY_PUSHBACK_HEADER, SPILL_REFUSED as SPILL_REFUSED_HEADER};

/// The outcome an error is counted as.
pub fn outcome(error: &Error) -> Outcome {
    error.kind().into()
}

/// The status the client receives. The upstream's own answers pass through as the upstream sent
/// them (code, message, details and metadata); only a connection that failed becomes
/// UNAVAILABLE, since that is the backend being unavailable whatever the transport says.
pub fn into_status(error: Error) -> Status {
    let error = match error {
        Error::Upstream { status, .. } if !is_transport_failure(&status) => return status,
        Error::Message(status) => return status,
        other => other,
    };
    let mut status = Status::new(error.code(), error.to_string());
    if let Error::ColdStart { .. } = &error {
        let millis = crate::error::COLD_START_RETRY.as_millis().to_string();
        if let Ok(value) = millis.parse() {
            status.metadata_mut().insert(RETRY_PUSHBACK_HEADER, value);
        }
    }
    if let Error::SpillRefused { .. } = &error {
        status.metadata_mut().insert(SPILL_REFUSED_HEADER, tonic::metadata::MetadataValue::from_static("1"));
    }
    if let Error::Admission { source, .. } = &error
        && let Some(retry) = source.retry()
    {
        // gRPC's retry policy (A6) stops retrying on a negative pushback.
        let millis = match retry {
            Retry::After(after) => after.as_millis().to_string(),
            Retry::Futile => "-1".to_owned(),
        };
        if let Ok(value) = millis.parse() {
            status.metadata_mut().insert(RETRY_PUSHBACK_HEADER, value);
        }
    }
    status
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
            (Error::ForwardingLoop { by: "pod".into() }, Code::FailedPrecondition),
            (Error::Draining, Code::Unavailable),
            (Error::Auth(AuthFailure::InvalidKey), Code::Unauthenticated),
            (Error::Auth(AuthFailure::Missing), Code::Unauthenticated),
            (Error::Auth(AuthFailure::KeysNotLoaded), Code::Unavailable),
            (Error::Upstream { pool: "p".into(), status: Status::unavailable("down") }, Code::Unavailable),
            (Error::Upstream { pool: "p".into(), status: Status::resource_exhausted("full") }, Code::ResourceExhausted),
        ];
        for (error, code) in cases {
            let shown = error.to_string();
            assert_eq!(into_status(error).code(), code, "{shown}");
        }
    }
}
