//! Per-pool admission control: in-flight permits and a bounded priority queue.
//!
//! A request takes a [`Permit`] before it reaches TEI and gives it back by dropping it, whatever
//! happened (success, error, cancellation), so permits cannot leak. Without a free permit it waits
//! in this queue, never in TEI. It is refused at once when the queue is full (after evicting a
//! lower-priority waiter, if one exists) or when its deadline cannot be met given the queue ahead
//! and the service times observed; a waiter whose deadline or queue timeout passes, or whose
//! caller goes away, leaves the queue without ever reaching TEI. Limits change live.

mod estimate;
mod priority;
mod queue;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::oneshot;

pub use priority::{Priority, UnknownPriority};

use estimate::{ServiceTime, pushback};
use queue::WaitQueue;

/// One pool's limits on this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_in_flight: usize,
    pub max_queued: usize,
    pub queue_timeout: Duration,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    #[error("the queue is full ({queued} waiting)")]
    QueueFull { queued: usize, retry_after: Duration },
    #[error("the deadline cannot be met: about {expected_wait:?} of queue ahead")]
    DeadlineUnmeetable { expected_wait: Duration, retry_after: Duration },
    #[error("waited {waited:?} in the queue, the pool's queue timeout")]
    QueueTimeout { waited: Duration, retry_after: Duration },
    #[error("the request's deadline passed after {waited:?} in the queue")]
    DeadlineExpired { waited: Duration },
    #[error("evicted from the full queue by a higher-priority request")]
    Evicted { retry_after: Duration },
}

impl AdmissionError {
    /// The back-off to suggest to the client, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::QueueFull { retry_after, .. }
            | Self::DeadlineUnmeetable { retry_after, .. }
            | Self::QueueTimeout { retry_after, .. }
            | Self::Evicted { retry_after } => Some(*retry_after),
            Self::DeadlineExpired { .. } => None,
        }
    }
}

/// What the pool looks like right now, for metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub limits: Limits,
    pub in_flight: usize,
    /// Waiters per priority, in [`Priority::ALL`] order.
    pub queued: [usize; 3],
}

impl Snapshot {
    pub fn queued_total(&self) -> usize {
        self.queued.iter().sum()
    }
}

type Observer = Box<dyn Fn(&Snapshot) + Send + Sync>;

/// The admission state of one pool. Cheap to clone; clones share the state.
#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    observer: Option<Observer>,
}

struct State {
    limits: Limits,
    in_flight: usize,
    queue: WaitQueue,
    service_time: ServiceTime,
}

/// The right to have one request in flight to TEI; dropping it frees the slot.
#[must_use = "dropping a permit releases it at once"]
pub struct Permit {
    shared: Arc<Shared>,
    acquired: Instant,
    armed: bool,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("acquired", &self.acquired).finish_non_exhaustive()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            self.shared.release(self.acquired.elapsed());
        }
    }
}

impl Admission {
    pub fn new(limits: Limits) -> Self {
        Self::build(limits, None)
    }

    /// Like [`Admission::new`], calling `observer` with every new state (under the lock: keep it
    /// cheap, e.g. setting gauges).
    pub fn with_observer(limits: Limits, observer: impl Fn(&Snapshot) + Send + Sync + 'static) -> Self {
        Self::build(limits, Some(Box::new(observer)))
    }

    fn build(limits: Limits, observer: Option<Observer>) -> Self {
        let state = State { limits, in_flight: 0, queue: WaitQueue::default(), service_time: ServiceTime::default() };
        let admission = Self { shared: Arc::new(Shared { state: Mutex::new(state), observer }) };
        admission.shared.notify(&admission.shared.lock());
        admission
    }

    pub fn snapshot(&self) -> Snapshot {
        self.shared.lock().snapshot()
    }

    /// Mean service time observed so far.
    pub fn mean_service_time(&self) -> Option<Duration> {
        self.shared.lock().service_time.mean()
    }

    /// Applies new limits without dropping anything: raising admits waiters at once; lowering lets
    /// in-flight work finish and admits no more until below the new limit. Waiters beyond a
    /// smaller queue are evicted, lowest priority and newest first.
    pub fn set_limits(&self, limits: Limits) {
        let mut state = self.shared.lock();
        if state.limits == limits {
            return;
        }
        state.limits = limits;
        while state.queue.len() > limits.max_queued {
            // Dropping the grant tells the waiter it was evicted.
            drop(state.queue.evict_lowest());
        }
        self.shared.dispatch(&mut state);
        self.shared.notify(&state);
    }

    /// Waits for a permit. `deadline` is the caller's own (from `grpc-timeout`); the pool's queue
    /// timeout applies as well. Dropping the returned future leaves the queue.
    pub async fn acquire(&self, priority: Priority, deadline: Option<Instant>) -> Result<Permit, AdmissionError> {
        let arrived = Instant::now();
        let (grant, id, patience, queue_timeout) = {
            let mut state = self.shared.lock();
            if state.in_flight < state.limits.max_in_flight && state.queue.is_empty() {
                state.in_flight += 1;
                self.shared.notify(&state);
                return Ok(Permit { shared: self.shared.clone(), acquired: arrived, armed: true });
            }
            let slots = state.limits.max_in_flight;
            let expected_wait = state.service_time.wait_for(state.queue.ahead_of(priority), slots);
            if let (Some(deadline), Some(wait)) = (deadline, expected_wait)
                && arrived + wait > deadline
            {
                return Err(AdmissionError::DeadlineUnmeetable {
                    expected_wait: wait,
                    retry_after: pushback(Some(wait)),
                });
            }
            if state.queue.len() >= state.limits.max_queued {
                let full = AdmissionError::QueueFull {
                    queued: state.queue.len(),
                    retry_after: pushback(state.service_time.wait_for(state.queue.len(), slots)),
                };
                if state.limits.max_queued == 0 {
                    return Err(full);
                }
                match state.queue.evict_below(priority) {
                    Some(victim) => drop(victim),
                    None => return Err(full),
                }
            }
            let (grant, receiver) = oneshot::channel();
            // No dispatch needed: release() and set_limits() keep "nobody waits while a slot is
            // free", and the fast path above admits whenever a slot is free and nobody waits.
            let id = state.queue.push(priority, grant);
            self.shared.notify(&state);
            let queue_timeout = state.limits.queue_timeout;
            let patience = match deadline {
                Some(deadline) => queue_timeout.min(deadline.saturating_duration_since(arrived)),
                None => queue_timeout,
            };
            (receiver, id, patience, queue_timeout)
        };

        let mut waiting = Waiting { shared: self.shared.clone(), priority, id, receiver: Some(grant) };
        let receiver = waiting.receiver.as_mut().expect("set above");
        let outcome = tokio::time::timeout(patience, receiver).await;
        let waited = arrived.elapsed();
        match outcome {
            Ok(Ok(permit)) => {
                waiting.served();
                Ok(permit)
            }
            Ok(Err(_evicted)) => {
                waiting.served();
                Err(AdmissionError::Evicted { retry_after: self.retry_hint() })
            }
            Err(_elapsed) => {
                if let Some(permit) = waiting.give_up() {
                    // Served in the instant between the timeout and taking the lock.
                    return Ok(permit);
                }
                if patience < queue_timeout {
                    Err(AdmissionError::DeadlineExpired { waited })
                } else {
                    Err(AdmissionError::QueueTimeout { waited, retry_after: self.retry_hint() })
                }
            }
        }
    }

    fn retry_hint(&self) -> Duration {
        let state = self.shared.lock();
        pushback(state.service_time.wait_for(state.queue.len(), state.limits.max_in_flight))
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn notify(&self, state: &State) {
        if let Some(observer) = &self.observer {
            observer(&state.snapshot());
        }
    }

    fn release(self: &Arc<Self>, took: Duration) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        state.service_time.observe(took);
        self.dispatch(&mut state);
        self.notify(&state);
    }

    /// Hands free slots to waiters, highest priority and oldest first.
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        while state.in_flight < state.limits.max_in_flight {
            let Some(waiter) = state.queue.pop_next() else { break };
            state.in_flight += 1;
            let permit = Permit { shared: self.clone(), acquired: Instant::now(), armed: true };
            if let Err(mut unwanted) = waiter.grant.send(permit) {
                // The waiter is gone; take the slot back here, without re-entering the lock.
                unwanted.armed = false;
                state.in_flight -= 1;
            }
        }
    }
}

impl State {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            limits: self.limits,
            in_flight: self.in_flight,
            queued: Priority::ALL.map(|priority| self.queue.len_of(priority)),
        }
    }
}

/// A queued request; leaving scope before being served takes it out of the queue.
struct Waiting {
    shared: Arc<Shared>,
    priority: Priority,
    id: u64,
    receiver: Option<oneshot::Receiver<Permit>>,
}

impl Waiting {
    fn served(&mut self) {
        self.receiver = None;
    }

    /// Leaves the queue; returns a permit granted in the meantime, if any.
    fn give_up(&mut self) -> Option<Permit> {
        let removed = {
            let mut state = self.shared.lock();
            let removed = state.queue.remove(self.priority, self.id);
            self.shared.notify(&state);
            removed
        };
        let mut receiver = self.receiver.take()?;
        if removed { None } else { receiver.try_recv().ok() }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.receiver.is_some() {
            // Cancelled while queued. A permit granted meanwhile is released when the receiver
            // drops, after the lock below is let go.
            let _ = self.give_up();
        }
    }
}

#[cfg(test)]
mod tests;
