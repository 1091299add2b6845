//! What the gRPC handlers, the admin port and the handle share.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::batcher::{Entry, Slowdown};
use crate::config::{Fault, SimConfig};
use crate::metrics::Metrics;
use crate::stats::Counters;

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) config: SimConfig,
    /// Admission slots, as TEI's `max_concurrent_requests` permits.
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) counters: Arc<Counters>,
    /// A watch so stalled requests and health watchers wake up the moment the fault changes.
    pub(crate) fault: watch::Sender<Fault>,
    pub(crate) metrics: Metrics,
    pub(crate) queue: mpsc::UnboundedSender<Entry>,
    /// The device's current slowdown, shared with the batcher.
    pub(crate) slowdown: Arc<Slowdown>,
    pub(crate) shutdown: CancellationToken,
}

impl State {
    pub(crate) fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    pub(crate) fn set_fault(&self, fault: Fault) {
        let previous = self.fault.send_replace(fault);
        if previous != fault {
            tracing::info!(%previous, %fault, "fault changed");
        }
    }
}
