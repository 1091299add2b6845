//! Duration flags, in the API's own syntax (`500ms`, `2s`, `1m30s`), so a value copied from an
//! EmbeddingPool works as a flag and the other way round.

use std::time::Duration;

pub use teifleet_wire::duration::InvalidDuration;

/// For clap: `#[arg(long, value_parser = teifleet_runtime::duration::parse_flag)]`. A refused
/// value is reported by clap with the flag's name and the expected syntax.
pub fn parse_flag(text: &str) -> Result<Duration, InvalidDuration> {
    teifleet_wire::duration::parse(text)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[arg(long, default_value = "1m30s", value_parser = parse_flag)]
        timeout: Duration,
    }

    #[test]
    fn clap_takes_and_refuses_durations() {
        assert_eq!(Flags::try_parse_from(["bin"]).unwrap().timeout, Duration::from_secs(90));
        assert_eq!(Flags::try_parse_from(["bin", "--timeout", "250ms"]).unwrap().timeout, Duration::from_millis(250));
        let refused = Flags::try_parse_from(["bin", "--timeout", "5"]).unwrap_err().to_string();
        assert!(refused.contains("--timeout") && refused.contains("such as 500ms"), "{refused}");
    }
}
