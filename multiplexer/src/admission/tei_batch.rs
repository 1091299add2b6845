//! TEI's batches, told apart from its answers. TEI's answers do not say how many inputs rode a
//! batch, and what the sidecar let in meanwhile is a poor stand-in: TEI's router hands its
//! backend a batch as soon as it holds one request (what was sent as 4 runs as 1 and 3), and a
//! replica keeps TEI's next batch ready beside the running one. But TEI times a batch once and
//! gives every call in it that `inference_time`, to the nanosecond (the simulator does the same):
//! answers in a row with one time rode one batch, and their inputs are its size. Two batches a
//! batch apart that happen to take the same time are told apart by when they came back.
//!
//! What reads them: the ingest gate's batch-time curve (`batch_curve`) and the GPU share's
//! neighbour signal (`contention`).

use std::time::Duration;

use tokio::time::Instant;

/// One of TEI's batches, all of whose answers came back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Batch {
    pub inputs: usize,
    /// TEI's `inference_time` for it.
    pub time: Duration,
}

/// The batch whose answers are coming back now.
#[derive(Clone, Copy, Debug)]
struct Open {
    batch: Batch,
    first_back: Instant,
}

#[derive(Debug, Default)]
pub(super) struct TeiBatches {
    open: Option<Open>,
}

impl TeiBatches {
    /// A call of `inputs` inputs came back at `now`, TEI having timed its batch at `time`: the
    /// batch before it, complete, if this is the first answer of another one. A call back within
    /// half its batch's time of that batch's first answer, with the same time, is one more of it.
    pub fn answered(&mut self, time: Duration, inputs: usize, now: Instant) -> Option<Batch> {
        if time.is_zero() {
            return None;
        }
        match &mut self.open {
            Some(open) if open.batch.time == time && now.saturating_duration_since(open.first_back) < time / 2 => {
                open.batch.inputs += inputs;
                None
            }
            open => open.replace(Open { batch: Batch { inputs, time }, first_back: now }).map(|done| done.batch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn answers_with_one_time_are_one_batch_told_when_the_next_begins() {
        let mut batches = TeiBatches::default();
        let now = Instant::now();
        let (first, second) = (30 * MS + Duration::from_nanos(7), 30 * MS + Duration::from_nanos(8));
        assert_eq!(batches.answered(first, 1, now), None);
        assert_eq!(batches.answered(first, 3, now + MS), None, "a call of three inputs in the same batch");
        assert_eq!(batches.answered(second, 1, now + 30 * MS), Some(Batch { inputs: 4, time: first }));
    }

    #[test]
    fn equal_times_a_batch_apart_are_two_batches() {
        let mut batches = TeiBatches::default();
        let now = Instant::now();
        assert_eq!(batches.answered(20 * MS, 2, now), None);
        assert_eq!(batches.answered(20 * MS, 2, now + 20 * MS), Some(Batch { inputs: 2, time: 20 * MS }));
    }

    #[test]
    fn answers_without_timing_change_nothing() {
        let mut batches = TeiBatches::default();
        let now = Instant::now();
        assert_eq!(batches.answered(Duration::ZERO, 1, now), None);
        assert!(batches.open.is_none());
    }
}
