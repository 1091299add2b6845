//! Instruction counts from `valgrind --tool=callgrind`: the total of a callgrind output file.
//! Counting instructions instead of timing makes a per-call cost that does not move with the
//! machine's load, so a regression of a few percent shows.

use std::path::Path;

use crate::{Error, Result};

/// Total instructions (`Ir`) recorded in the callgrind output file at `path`.
pub fn read_total(path: &Path) -> Result<u64> {
    let text =
        std::fs::read_to_string(path).map_err(|source| Error::File { what: "reading", path: path.into(), source })?;
    parse_total(&text).ok_or_else(|| Error::Process(format!("no totals line in {}", path.display())))
}

/// The first event count of the `totals:` line (or `summary:`, which older valgrinds write); the
/// first event is `Ir` unless other events were asked for.
pub fn parse_total(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("totals:").or_else(|| line.strip_prefix("summary:")))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_or_summary_line() {
        let out = "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfn=(1) main\n3 10\n\
                   totals: 123456789\n";
        assert_eq!(parse_total(out), Some(123_456_789));
        assert_eq!(parse_total("events: Ir\nsummary: 42 7\n"), Some(42));
        assert_eq!(parse_total("events: Ir\n"), None);
    }
}
