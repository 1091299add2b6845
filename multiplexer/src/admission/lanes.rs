//! Two lanes share a pool: `query` (interactive calls, the default) and `ingest` (bulk work: a
//! re-index, a nightly sync), named by `x-teifleet-lane`.
//!
//! Each lane has a queue of its own (priorities and tenants order it as before). Queries are
//! served before waiting ingest, so ingest takes exactly the room queries leave; but a waiting
//! ingest call of `c` inputs may be passed by at most `allowed_overtakes(share) × c` inputs of
//! queries before it is owed the next turn, so under query overload ingest still gets `share`
//! percent of the inputs admitted. Counted in inputs, not calls: a bulk call's sub-batch of 32
//! texts is 32 units of TEI's work, and a turn per nine one-text queries would give it 78% of the
//! pool instead of a tenth. The bound works both ways: a query waits behind at most one ingest
//! admission per that many query inputs, beside the ingest already in flight. Each lane's queue is bounded by `maxQueued` on
//! its own and evicts only within itself: a flood of queries never evicts ingest, and ingest
//! never fills the queries' room.

use tokio::time::Instant;

use super::ingest_gate::IngestWhy;
pub use super::lane::{DEFAULT_INGEST_SHARE, INGEST_PATIENCE, Lane, MAX_INGEST_SHARE, MAX_QUERY_RESERVE, UnknownLane};
use super::priority::Priority;
use super::queue::{WaitQueue, Waiter};
use super::tenants::TenantId;
use super::types::{AdmissionError, Cost};

/// Sees, per lane, what admission holds and decides: the queue gauges and counters of
/// `teifleet_lane_admissions_total`. Called under the pool's lock: keep it cheap.
pub trait LaneObserver: Send + Sync {
    /// The lane's queued inputs per priority, in [`Priority::ALL`] order, after every change.
    fn queued(&self, lane: Lane, queued: [usize; 3]);
    /// How one ask of the lane ended ([`outcome`]).
    fn decided(&self, lane: Lane, outcome: &'static str);
    /// Why an ingest call went in flight.
    fn ingest_let_in(&self, why: IngestWhy) {
        let _ = why;
    }
}

/// An ask given its permit.
pub const ADMITTED: &str = "admitted";
/// An ask whose caller went away while it waited.
pub const CANCELLED: &str = "cancelled";

/// The label of how an ask ended: [`ADMITTED`], or why it was not.
pub fn outcome(result: Result<(), &AdmissionError>) -> &'static str {
    match result {
        Ok(()) => ADMITTED,
        Err(AdmissionError::QueueFull { .. }) => "shed_queue_full",
        Err(AdmissionError::DeadlineUnmeetable { .. }) => "shed_deadline",
        Err(AdmissionError::QueueTimeoutUnmeetable { .. }) => "shed_queue_timeout",
        Err(AdmissionError::QueueTimeout { .. }) => "queue_timeout",
        Err(AdmissionError::DeadlineExpired { .. }) => "expired_in_queue",
        Err(AdmissionError::Evicted { .. }) => "evicted",
    }
}

/// Every label [`outcome`] and the cancelled waiters give, for series made up front.
pub const OUTCOMES: [&str; 8] = [
    ADMITTED,
    "shed_queue_full",
    "shed_deadline",
    "shed_queue_timeout",
    "queue_timeout",
    "expired_in_queue",
    "evicted",
    CANCELLED,
];

/// Query inputs that may pass a waiting ingest call before it is owed a turn, per input of that
/// call, for a floor of `share` percent (rounded down, so ingest gets at least its share); `None`
/// without a floor.
pub fn allowed_overtakes(share: u8) -> Option<u32> {
    let share = u32::from(share.min(MAX_INGEST_SHARE));
    (share > 0).then(|| (100 - share) / share)
}

/// The waiters of both lanes, and how many queries have passed waiting ingest.
#[derive(Default)]
pub(super) struct Lanes {
    queues: [WaitQueue; 2],
    /// Query inputs admitted since ingest last was, while ingest waited.
    overtaken: usize,
}

impl Lanes {
    pub fn queue(&self, lane: Lane) -> &WaitQueue {
        &self.queues[lane.index()]
    }

    pub fn queue_mut(&mut self, lane: Lane) -> &mut WaitQueue {
        &mut self.queues[lane.index()]
    }

    pub fn is_empty(&self) -> bool {
        self.queues.iter().all(WaitQueue::is_empty)
    }

    /// Queued inputs, in both lanes.
    pub fn inputs(&self) -> usize {
        self.queues.iter().map(WaitQueue::inputs).sum()
    }

    /// Queued inputs of `priority`, in both lanes.
    pub fn inputs_of(&self, priority: Priority) -> usize {
        self.queues.iter().map(|queue| queue.inputs_of(priority)).sum()
    }

    fn ingest_owed(&self, share: u8) -> bool {
        let Some(next) = self.queue(Lane::Ingest).peek_next() else { return false };
        let turn = next.cost.inputs.max(1) as usize;
        allowed_overtakes(share).is_some_and(|n| self.overtaken >= n as usize * turn)
    }

    /// The lane whose waiter goes next: queries, unless ingest is owed its turn.
    pub fn next_lane(&self, share: u8) -> Option<Lane> {
        match (self.queue(Lane::Query).is_empty(), self.queue(Lane::Ingest).is_empty()) {
            (true, true) => None,
            (false, true) => Some(Lane::Query),
            (true, false) => Some(Lane::Ingest),
            (false, false) if self.ingest_owed(share) => Some(Lane::Ingest),
            (false, false) => Some(Lane::Query),
        }
    }

    /// Whether a newcomer of `lane` goes before every waiter: a query when no query waits and
    /// ingest is not owed its turn, ingest when nobody waits.
    pub fn newcomer_first(&self, lane: Lane, share: u8) -> bool {
        match lane {
            Lane::Query => self.queue(Lane::Query).is_empty() && !self.ingest_owed(share),
            Lane::Ingest => self.is_empty(),
        }
    }

    /// Keeps the count of query inputs passing waiting ingest, for a call of `lane` and `inputs`
    /// just admitted.
    pub fn admitted(&mut self, lane: Lane, inputs: u32) {
        match lane {
            Lane::Query if !self.queue(Lane::Ingest).is_empty() => self.overtaken += inputs as usize,
            Lane::Query => self.overtaken = 0,
            Lane::Ingest => self.overtaken = 0,
        }
    }

    /// Queues a waiter of `lane`; see [`WaitQueue::push`].
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        lane: Lane,
        priority: Priority,
        tenant: TenantId,
        weight: u32,
        cost: Cost,
        units: u64,
        grant: tokio::sync::oneshot::Sender<super::queue::Grant>,
    ) -> u64 {
        if lane == Lane::Ingest && self.queue(Lane::Ingest).is_empty() {
            // Queries passed nobody while no ingest waited.
            self.overtaken = 0;
        }
        self.queue_mut(lane).push(priority, tenant, weight, cost, units, grant)
    }

    /// Inputs that would be served before a newcomer of `lane` (see [`WaitQueue::ahead_of`]):
    /// those of its own lane, and what the other lane takes meanwhile: for a query, the ingest
    /// turns the floor owes among the queries ahead; for ingest, every waiting query, or with a
    /// floor the queries that may pass it.
    pub fn ahead_of(
        &self,
        lane: Lane,
        priority: Priority,
        tenant: TenantId,
        weight: u32,
        cost: Cost,
        share: u8,
    ) -> usize {
        let own = self.queue(lane).ahead_of(priority, tenant, weight, cost);
        let (mine, other) = (self.queue(lane), self.queue(lane.other()));
        let calls_ahead = own / mine.mean_cost();
        let taken_by_other = match (lane, allowed_overtakes(share)) {
            (_, _) if other.is_empty() => 0,
            (Lane::Query, None) => 0,
            // An ingest turn of the mean ingest call per `n` of its inputs of queries ahead.
            (Lane::Query, Some(n)) => {
                let turn = n as usize * other.mean_cost();
                (self.overtaken + own) / turn * other.mean_cost()
            }
            (Lane::Ingest, None) => other.inputs(),
            (Lane::Ingest, Some(n)) => (calls_ahead + 1) * n as usize * mine.mean_cost(),
        };
        own + taken_by_other.min(other.inputs())
    }

    /// The lane and waiter to serve next.
    pub fn peek_next(&self, share: u8) -> Option<(Lane, &Waiter)> {
        let lane = self.next_lane(share)?;
        Some((lane, self.queue(lane).peek_next()?))
    }

    /// When the oldest query waiting arrived (ingest stands whenever a bulk job runs, so only the
    /// queries' queue can be said to stand).
    pub fn oldest_query(&self) -> Option<Instant> {
        self.queue(Lane::Query).oldest()
    }

    pub fn forget_idle_tenants(&mut self) {
        self.queues.iter_mut().for_each(WaitQueue::forget_idle_tenants);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_owes_ingest_at_least_its_share() {
        assert_eq!(allowed_overtakes(0), None);
        assert_eq!(allowed_overtakes(10), Some(9), "one turn in ten");
        assert_eq!(allowed_overtakes(30), Some(2), "a third: at least the share");
        assert_eq!(allowed_overtakes(50), Some(1), "turn about");
        assert_eq!(allowed_overtakes(90), Some(1), "never more than half");
    }
}
