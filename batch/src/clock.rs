//! The time objects are stamped with.

/// Seconds since the Unix epoch, as OpenAI's `created_at` and the like count them.
pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}
