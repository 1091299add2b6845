//! TEI's next batch, kept ready. TEI computes one batch while its queue holds the next, which it
//! starts the moment the first ends. A replica whose static limit is about one of TEI's batches
//! (a tight budget: `maxInFlight` = TEI's `max_batch_requests`) would hand TEI its next inputs
//! only after the last batch's answers came back: TEI idles for a round trip, its request parsing
//! and its tokenization every batch (0.79–0.88× of TEI's direct throughput through
//! `--max-in-flight 4` in front of a CPU TEI batching 4). So beside its limit, a replica lets in
//! as many more inputs as make TEI's queue hold one more batch: `2 × batch − limit`, never more
//! than the limit itself, and none once the limit is two batches or more (TEI's queue then holds
//! the next batch already). The batch is TEI's own (`Info.max_batch_requests`); a TEI that batches
//! by tokens alone reports none, and nothing is added.
//!
//! The adaptive limit finds its own level from TEI's queue times, so nothing is added to it.

/// Inputs let in beyond a static `limit` so TEI's queue holds its next batch of `batch`.
pub fn ready_inputs(limit: usize, batch: Option<usize>) -> usize {
    match batch {
        Some(batch) if batch > 0 => limit.min((2 * batch).saturating_sub(limit)),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_of_one_batch_gets_one_more_batch() {
        assert_eq!(ready_inputs(4, Some(4)), 4);
        assert_eq!(ready_inputs(8, Some(8)), 8);
    }

    #[test]
    fn a_limit_of_two_batches_or_more_gets_nothing() {
        assert_eq!(ready_inputs(16, Some(8)), 0);
        assert_eq!(ready_inputs(64, Some(4)), 0);
    }

    #[test]
    fn between_one_and_two_batches_tops_up_to_two() {
        assert_eq!(ready_inputs(6, Some(4)), 2);
    }

    #[test]
    fn a_small_limit_at_most_doubles() {
        assert_eq!(ready_inputs(2, Some(8)), 2, "a pool's share of a card it shares");
        assert_eq!(ready_inputs(0, Some(8)), 0);
    }

    #[test]
    fn no_batch_reported_adds_nothing() {
        assert_eq!(ready_inputs(4, None), 0);
        assert_eq!(ready_inputs(4, Some(0)), 0);
    }
}
