//! gRPC status codes by their canonical names (`RESOURCE_EXHAUSTED`), as people read them in
//! logs and in the multiplexer's docs, rather than tonic's Rust variant names.

use tonic::Code;

/// A request that never got an answer before the run's grace period ended (counted, not hidden).
pub const UNFINISHED: &str = "UNFINISHED";

pub fn name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_canonical() {
        assert_eq!(name(Code::Ok), "OK");
        assert_eq!(name(Code::ResourceExhausted), "RESOURCE_EXHAUSTED");
        assert_eq!(name(Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
        assert_eq!(name(Code::from_i32(14)), "UNAVAILABLE");
    }
}
