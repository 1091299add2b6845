//! Counters the tests read, through the library and the admin port.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A snapshot of the simulator's counters since start or the last reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// RPC calls and stream messages that reached a handler, refused ones included (Info and
    /// Tokenize too; health and reflection are not counted).
    pub requests_received: u64,
    /// Inference calls and stream messages that got a slot.
    pub requests_admitted: u64,
    /// Unary inference calls refused with `RESOURCE_EXHAUSTED` because no slot was free.
    pub requests_refused_overloaded: u64,
    /// Requests holding a slot right now (never reset).
    pub in_flight: u64,
    /// High-water mark of `in_flight` since start or the last reset.
    pub max_in_flight_observed: u64,
    /// Calls and stream messages answered successfully (any RPC counted by `requests_received`).
    pub completed: u64,
    /// Batches the simulated device has run.
    pub batches_run: u64,
    /// Time the simulated device spent running batches, in microseconds: how busy this replica
    /// was, to compare replicas' shares of a pool's work.
    pub device_busy_us: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    received: AtomicU64,
    admitted: AtomicU64,
    refused_overloaded: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    completed: AtomicU64,
    batches_run: AtomicU64,
    device_busy_us: AtomicU64,
}

impl Counters {
    pub(crate) fn received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused_overloaded(&self) {
        self.refused_overloaded.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn completed(&self) {
        self.completed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn batch_run(&self, took: std::time::Duration) {
        self.batches_run.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.device_busy_us.fetch_add(micros, Ordering::Relaxed);
    }

    pub(crate) fn admitted(&self) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
    }

    pub(crate) fn released(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            requests_received: self.received.load(Ordering::Relaxed),
            requests_admitted: self.admitted.load(Ordering::Relaxed),
            requests_refused_overloaded: self.refused_overloaded.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::SeqCst),
            max_in_flight_observed: self.max_in_flight.load(Ordering::SeqCst),
            completed: self.completed.load(Ordering::Relaxed),
            batches_run: self.batches_run.load(Ordering::Relaxed),
            device_busy_us: self.device_busy_us.load(Ordering::Relaxed),
        }
    }

    /// Zeroes the totals; the high-water mark restarts from what is in flight now, since those
    /// requests are still occupying slots.
    pub(crate) fn reset(&self) {
        let totals = [
            &self.received,
            &self.admitted,
            &self.refused_overloaded,
            &self.completed,
            &self.batches_run,
            &self.device_busy_us,
        ];
        for counter in totals {
            counter.store(0, Ordering::Relaxed);
        }
        self.max_in_flight.store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}
