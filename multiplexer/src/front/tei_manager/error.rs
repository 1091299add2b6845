//! tei-manager's own refusals, typed where they are raised, and the one place each becomes a gRPC
//! status (in tei-manager's words where it has them); a call's errors on the way through the gate,
//! admission and forwarding are the crate's [`Error`], answered as every tei.v1 call's are.

use tonic::Status;

use crate::error::Error;
use crate::report::status;

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("Missing target")]
    MissingTarget,
    #[error("No routing specified")]
    NoRouting,
    #[error("Instance name cannot be empty")]
    EmptyInstance,
    #[error("Model id cannot be empty")]
    EmptyModel,
    #[error(
        "instance_index routing is not served here: name the pool in target.instance_name, or its model in \
         target.model_id"
    )]
    InstanceIndex,
    #[error("Empty stream")]
    EmptyStream,
    #[error("the request message is not a valid {what}")]
    Undecodable { what: &'static str },
    #[error("Invalid Arrow IPC: {0}")]
    MalformedIpc(String),
    #[error("the RecordBatch has no `text` column (Utf8 or LargeUtf8); its columns: {columns:?}")]
    NoTextColumn { columns: Vec<String> },
    #[error("the `text` column must be Utf8 or LargeUtf8, not {0}")]
    TextNotUtf8(String),
    #[error("unknown {field} value {value}")]
    UnknownEnum { field: &'static str, value: i32 },
    #[error(
        "the answer would be {bytes} bytes, over the largest message this port sends ({limit} bytes): send fewer rows per call"
    )]
    AnswerTooLarge { bytes: usize, limit: usize },
    #[error("inconsistent embedding dimensions: {first} vs {now}")]
    InconsistentDimensions { first: usize, now: usize },
    #[error("Failed to create RecordBatch: {0}")]
    Build(String),
    #[error(transparent)]
    Call(#[from] Error),
}

impl ManagerError {
    /// Every variant placed on purpose: no wildcard arm.
    pub fn into_status(self) -> Status {
        let message = self.to_string();
        match self {
            Self::MissingTarget
            | Self::NoRouting
            | Self::EmptyInstance
            | Self::EmptyModel
            | Self::InstanceIndex
            | Self::EmptyStream
            | Self::Undecodable { .. }
            | Self::MalformedIpc(_)
            | Self::NoTextColumn { .. }
            | Self::TextNotUtf8(_)
            | Self::UnknownEnum { .. } => Status::invalid_argument(message),
            // tonic's own words and code for a message over the limit.
            Self::AnswerTooLarge { .. } => Status::out_of_range(message),
            Self::InconsistentDimensions { .. } | Self::Build(_) => Status::internal(message),
            Self::Call(error) => status::into_status(error),
        }
    }

    /// The `reason` a refusal before the call is routed is counted under in
    /// `teifleet_refused_input_total`; none for the call's own errors, which the call counts.
    pub fn refused_reason(&self) -> Option<&'static str> {
        match self {
            Self::MissingTarget | Self::NoRouting | Self::EmptyInstance | Self::EmptyModel | Self::InstanceIndex => {
                Some("tei_manager_target")
            }
            Self::EmptyStream | Self::Undecodable { .. } => Some("tei_manager_message"),
            Self::MalformedIpc(_)
            | Self::NoTextColumn { .. }
            | Self::TextNotUtf8(_)
            | Self::UnknownEnum { .. }
            | Self::AnswerTooLarge { .. }
            | Self::InconsistentDimensions { .. }
            | Self::Build(_)
            | Self::Call(_) => None,
        }
    }
}
