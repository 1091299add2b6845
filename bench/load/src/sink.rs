//! Where a run's concurrent requests deliver their answers: what the driver records and the
//! progress line reads, below both.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use tokio::time::Instant;

use crate::report::{Answer, Recorder};

/// Where concurrent requests deliver their answers.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    state: Mutex<(Recorder, Option<Instant>)>,
    pub(crate) sent: AtomicU64,
}

impl Sink {
    pub(crate) fn record(&self, answer: &Answer, at: Instant) {
        // A poisoned lock only means another request panicked mid-record; keep counting.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0.record(answer);
        state.1 = Some(state.1.map_or(at, |last| last.max(at)));
    }

    pub(crate) fn counts(&self) -> (u64, u64) {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (state.0.answered(), state.0.ok())
    }

    pub(crate) fn into_parts(self) -> (Recorder, Option<Instant>) {
        self.state.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}
