//! One attempt's answer, over gRPC or HTTP: what a call's retry loop reads (call.rs) and TEI's
//! HTTP API client builds (tei_http.rs), below both.

use teifleet_wire::headers;
use tonic::{Code, Status};

use crate::report::ServerTiming;
use crate::retry::Hint;

/// One attempt's answer.
pub(super) struct Attempt {
    pub(super) code: Code,
    pub(super) server: Vec<ServerTiming>,
    pub(super) hint: Hint,
    /// The server had started answering (response headers came): gRPC never retries such a
    /// call, since the client may already have acted on part of it.
    pub(super) committed: bool,
}

impl Attempt {
    pub(super) fn ok(server: Vec<ServerTiming>) -> Self {
        Self { code: Code::Ok, server, hint: Hint::Absent, committed: true }
    }

    pub(super) fn failed(status: &Status, server: Vec<ServerTiming>) -> Self {
        let hint = Hint::parse(status.metadata().get(headers::RETRY_PUSHBACK_MS).and_then(|v| v.to_str().ok()));
        Self { code: status.code(), server, hint, committed: false }
    }

    /// A refusal or failure that is not a gRPC status (an HTTP answer, a broken connection).
    pub(super) fn refused(code: Code, hint: Hint) -> Self {
        Self { code, server: vec![], hint, committed: false }
    }

    pub(super) fn committed(self) -> Self {
        Self { committed: true, ..self }
    }
}
