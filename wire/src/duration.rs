//! Durations in Go's syntax (`500ms`, `2s`, `1m30s`): what the EmbeddingPool API accepts for
//! `queueTimeout` (the CRD's CEL rule admits the same texts) and what every binary's duration flags
//! take, so one spelling works everywhere.

use std::fmt;
use std::time::Duration;

/// The text is not a duration such as `500ms`, `2s` or `1m30s`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidDuration(pub String);

impl fmt::Display for InvalidDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a duration such as 500ms, 2s or 1m30s", self.0)
    }
}

impl std::error::Error for InvalidDuration {}

/// Parses `<number><unit>` repeated, units `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`; numbers may
/// have a fraction (`1.5s`). A bare number is refused: without a unit it is ambiguous.
pub fn parse(text: &str) -> Result<Duration, InvalidDuration> {
    let invalid = || InvalidDuration(text.to_owned());
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(invalid)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += number * seconds_per_unit;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("1h2m3s4ms"), Ok(Duration::from_millis(3_723_004)));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse("20µs"), Ok(Duration::from_micros(20)));
        assert_eq!(parse("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_what_the_schema_refuses() {
        for bad in ["", "10", "soon", "5 s", "1x", "ms", "-1s"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_error_names_the_text_and_the_syntax() {
        assert_eq!(parse("soon").unwrap_err().to_string(), r#""soon" is not a duration such as 500ms, 2s or 1m30s"#);
    }
}
