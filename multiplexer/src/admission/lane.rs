//! A call's lane, from the `x-teifleet-lane` metadata: `query` (the default) or `ingest`, and the
//! lanes' settings (how the two share a pool: `lanes`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Which lane a call travels in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    #[default]
    Query,
    Ingest,
}

impl Lane {
    pub const ALL: [Lane; 2] = [Lane::Query, Lane::Ingest];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Query => "query",
            Self::Ingest => "ingest",
        }
    }

    pub(super) fn other(self) -> Lane {
        match self {
            Self::Query => Self::Ingest,
            Self::Ingest => Self::Query,
        }
    }

    /// Position in [`Lane::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The value was neither `query` nor `ingest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("x-teifleet-lane must be query or ingest (got {0:?})")]
pub struct UnknownLane(pub String);

impl FromStr for Lane {
    type Err = UnknownLane;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim().to_ascii_lowercase().as_str() {
            "query" => Ok(Self::Query),
            "ingest" => Ok(Self::Ingest),
            _ => Err(UnknownLane(value.to_owned())),
        }
    }
}

/// Percent of admissions ingest is owed under query overload, unless the pool says otherwise:
/// about a tenth keeps a bulk job moving while costing queries one turn in ten at most.
pub const DEFAULT_INGEST_SHARE: u8 = 10;
/// The most a pool may give ingest: beyond half, queries would be the lane that waits.
pub const MAX_INGEST_SHARE: u8 = 50;
/// The most of a replica's in-flight budget a pool may keep for queries from ingest: beyond half,
/// a bulk job beside a trickle of queries would idle most of TEI.
pub const MAX_QUERY_RESERVE: u8 = 50;
/// How long an ingest call without a deadline may wait in the queue: as long as a pool's door
/// holds a call by default (`--max-door-hold`). Bulk callers would rather wait than be told to
/// come back, and the queue timeout is the interactive callers' promise, not theirs.
pub const INGEST_PATIENCE: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_two_lanes() {
        assert_eq!("Ingest".parse(), Ok(Lane::Ingest));
        assert_eq!(" query ".parse(), Ok(Lane::Query));
        assert!("bulk".parse::<Lane>().unwrap_err().to_string().contains("query or ingest"));
        assert_eq!(Lane::default(), Lane::Query);
    }
}
