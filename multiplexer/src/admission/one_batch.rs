//! One batch in flight while a pool's GPU share holds it: the share bounds how often a pool's
//! batches run, this bounds how many of them stand in line on the device at once.
//!
//! A time-sliced GPU runs one process's batch at a time, so a neighbour's call that comes while
//! this pool has work waits for this pool's batch on the device and for any batch of it queued
//! behind. A static limit keeps TEI's next batch ready in its queue (see `next_batch`), which is
//! what a pool alone wants (TEI never idles between batches) and exactly what a neighbour pays
//! for: scenario 17's light pools, beside a flood whose sidecar kept two batches in flight, had
//! their p99 at 1.25–1.85× alone with the share in force, and 0.84–1.51× where the adaptive limit
//! (which keeps no batch ready) ran the same flood. So while a neighbour is busy (see
//! `contention`), a pool with a GPU share lets in at most one of TEI's batches: its limit without
//! the next batch kept ready, and never more than TEI's batch (`Info.max_batch_requests`; a TEI
//! that batches by tokens alone reports none, and the limit stands).
//!
//! What it costs: between two of this pool's batches TEI waits a round trip for the next one,
//! time the busy neighbours take the device in; while the device is quiet nothing is bounded, so
//! a pool alone keeps its whole throughput. An explicit `deviceTimeCap` keeps its own meaning
//! (a cap on time, no bound on batches).

/// The in-flight limit while a busy neighbour shares the device: `limit` (kept without TEI's
/// next batch ready) at most TEI's `batch`.
pub fn one_batch(limit: usize, batch: Option<usize>) -> usize {
    match batch {
        Some(batch) if batch > 0 => limit.min(batch),
        _ => limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_above_a_batch_is_cut_to_one_batch() {
        assert_eq!(one_batch(16, Some(8)), 8);
        assert_eq!(one_batch(64, Some(4)), 4);
    }

    #[test]
    fn a_limit_within_a_batch_stands() {
        assert_eq!(one_batch(2, Some(8)), 2, "a pool's share of a card it shares");
        assert_eq!(one_batch(8, Some(8)), 8);
    }

    #[test]
    fn no_batch_reported_leaves_the_limit() {
        assert_eq!(one_batch(16, None), 16);
        assert_eq!(one_batch(16, Some(0)), 16);
    }
}
