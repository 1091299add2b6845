//! Durations as the API spells them (`queueTimeout: 1m30s`): Go's syntax, which the CRD's CEL rule
//! also accepts, so anything the API server admits parses here.

use std::time::Duration;

/// The text is not a duration such as `500ms`, `2s` or `1m30s`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration such as 500ms, 2s or 1m30s")]
pub struct InvalidDuration(pub String);

/// Parses `<number><unit>` repeated, units `ns`, `us`, `ms`, `s`, `m`, `h`; numbers may have a
/// fraction (`1.5s`).
pub fn parse_duration(text: &str) -> Result<Duration, InvalidDuration> {
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
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h2m3s4ms"), Ok(Duration::from_millis(3_723_004)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
    }

    #[test]
    fn refuses_what_the_schema_refuses() {
        for bad in ["", "10", "soon", "5 s", "1x", "ms", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
