//! Request priority classes, from the `x-teifleet-priority` metadata.

use std::fmt;
use std::str::FromStr;

/// Higher priority is served first; a full queue evicts the lowest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    Critical,
    #[default]
    Standard,
    Sheddable,
}

impl Priority {
    /// Highest first.
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Standard => "standard",
            Self::Sheddable => "sheddable",
        }
    }

    /// Position in [`Priority::ALL`]: 0 is served first.
    pub fn rank(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The value was none of `critical`, `standard`, `sheddable`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("x-teifleet-priority must be one of critical, standard, sheddable (got {0:?})")]
pub struct UnknownPriority(pub String);

impl FromStr for Priority {
    type Err = UnknownPriority;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim().to_ascii_lowercase().as_str() {
            "critical" => Ok(Self::Critical),
            "standard" => Ok(Self::Standard),
            "sheddable" => Ok(Self::Sheddable),
            _ => Err(UnknownPriority(value.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_classes_case_insensitively() {
        assert_eq!("Critical".parse(), Ok(Priority::Critical));
        assert_eq!(" standard ".parse(), Ok(Priority::Standard));
        assert_eq!("SHEDDABLE".parse(), Ok(Priority::Sheddable));
        let error = "urgent".parse::<Priority>().unwrap_err();
        assert!(error.to_string().contains("critical, standard, sheddable"));
    }

    #[test]
    fn critical_ranks_first() {
        assert!(Priority::Critical.rank() < Priority::Standard.rank());
        assert!(Priority::Standard.rank() < Priority::Sheddable.rank());
    }
}
