//! Byte sizes as Kubernetes quantities spell them (`8Mi`, `512Ki`, `1G`) or as plain numbers: the
//! operator copies `--shard-bytes` from the EmbeddingJob's spec, where users write quantities.

/// Parses a plain number of bytes, or a number with a binary (`Ki`, `Mi`, `Gi`, `Ti`, optionally
/// followed by `B`) or decimal (`k`/`K`, `M`, `G`, `T`, optionally followed by `B`) suffix.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    let invalid = || format!("{text:?} is not a size such as 8Mi, 512Ki or 1048576");
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let multiplier: u64 = match suffix.strip_suffix('B').unwrap_or(suffix) {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(invalid()),
    };
    number.checked_mul(multiplier).ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_plain_numbers() {
        assert_eq!(parse_bytes("8Mi"), Ok(8 << 20));
        assert_eq!(parse_bytes("8MiB"), Ok(8 << 20));
        assert_eq!(parse_bytes("512Ki"), Ok(512 << 10));
        assert_eq!(parse_bytes("2Gi"), Ok(2 << 30));
        assert_eq!(parse_bytes("1048576"), Ok(1_048_576));
        assert_eq!(parse_bytes("5M"), Ok(5_000_000));
        assert_eq!(parse_bytes("5k"), Ok(5_000));
        assert_eq!(parse_bytes("64KB"), Ok(64_000));
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for bad in ["", "Mi", "8 Mi", "8mb", "-1", "1.5Mi", "8Xi", "99999999999Ti"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }
}
