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
    /// `columns`: the first few names, each cut short, and how many more (a schema of 1,000 long
    /// names would not fit in a status).
    #[error("the RecordBatch has no `text` column (Utf8 or LargeUtf8); its columns: {columns}")]
    NoTextColumn { columns: String },
    #[error("Arrow IPC this sidecar does not read: {0}")]
    Unserved(String),
    #[error("the RecordBatch has {rows} rows, over the {limit} one call may have: send fewer rows per call")]
    TooManyRows { rows: i64, limit: i64 },
    #[error(
        "the `text` column would inflate to {bytes} bytes, over the {limit} one call may decode: send fewer rows per call"
    )]
    InflatesTooLarge { bytes: u64, limit: u64 },
    #[error("the `text` column must be Utf8 or LargeUtf8, not {0}")]
    TextNotUtf8(String),
    #[error("unknown {field} value {value}")]
    UnknownEnum { field: &'static str, value: i32 },
    #[error("prompt_name is {bytes} bytes, over the {limit} a prompt's name may have")]
    PromptNameTooLong { bytes: usize, limit: usize },
    #[error(
        "row {row}'s text is {bytes} bytes, over the largest message TEI takes ({limit} bytes): split or truncate it"
    )]
    RowTooLarge { row: usize, bytes: usize, limit: usize },
    #[error(
        "the answer would be {bytes} bytes, over the largest message this port sends ({limit} bytes): send fewer rows per call"
    )]
    AnswerTooLarge { bytes: usize, limit: usize },
    /// A row TEI refused once a streamed answer had begun (its header says every row sent to TEI
    /// is answered): the call ends with this, never with a wrong answer.
    #[error("row {row}: {reason} (the answer was being streamed: send this row apart, or truncate it)")]
    RowRefused { row: usize, reason: String },
    #[error("inconsistent embedding dimensions: {first} vs {now}")]
    InconsistentDimensions { first: usize, now: usize },
    #[error("Failed to create RecordBatch: {0}")]
    Build(String),
    #[error(transparent)]
    Call(#[from] Error),
}

/// Column names a `NoTextColumn` refusal shows, and how many characters of each.
pub const NAMES_SHOWN: usize = 8;
const NAME_CHARS: usize = 64;

impl ManagerError {
    /// `names`: the schema's first column names (at most [`NAMES_SHOWN`] are shown), of `total`.
    pub fn no_text_column(names: Vec<String>, total: usize) -> Self {
        let shown: Vec<String> = names
            .iter()
            .take(NAMES_SHOWN)
            .map(|name| match name.char_indices().nth(NAME_CHARS) {
                Some((cut, _)) => format!("{}…", &name[..cut]),
                None => name.clone(),
            })
            .collect();
        let mut columns = format!("{shown:?}");
        if total > shown.len() {
            columns.push_str(&format!(" and {} more", total - shown.len()));
        }
        Self::NoTextColumn { columns }
    }

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
            | Self::Unserved(_)
            | Self::TextNotUtf8(_)
            | Self::UnknownEnum { .. }
            | Self::PromptNameTooLong { .. }
            | Self::RowRefused { .. } => Status::invalid_argument(message),
            // tonic's own words and code for a message over the limit.
            Self::AnswerTooLarge { .. }
            | Self::TooManyRows { .. }
            | Self::InflatesTooLarge { .. }
            | Self::RowTooLarge { .. } => Status::out_of_range(message),
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
            | Self::Unserved(_)
            | Self::TooManyRows { .. }
            | Self::InflatesTooLarge { .. }
            | Self::TextNotUtf8(_)
            | Self::UnknownEnum { .. }
            | Self::PromptNameTooLong { .. }
            | Self::RowTooLarge { .. }
            | Self::AnswerTooLarge { .. }
            | Self::RowRefused { .. }
            | Self::InconsistentDimensions { .. }
            | Self::Build(_)
            | Self::Call(_) => None,
        }
    }
}
