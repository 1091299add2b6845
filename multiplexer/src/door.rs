//! Back-pressure per gRPC connection, before admission: a connection may have only its share of
//! what the pool can serve or queue here outstanding at once; its further calls wait at its door,
//! in order, costing a stream and a parked future but no CPU, and pass as its own calls finish.
//!
//! Why not HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`: h2 takes that limit once per connection
//! and cannot lower it live, and a limit per connection alone bounds nothing once a client opens
//! many connections. The door's limit is read at every call: the pool's budget here (its in-flight
//! limit in force, what its siblings take from it, and its queue) divided among the connections
//! with calls outstanding or waiting, at least one each. So a storm of callers that resend every
//! refusal at once meets a queue that is never overrun, instead of tens of thousands of refusals
//! a second that take the CPU TEI needs; a call is refused only when it cannot be served in time:
//! when the pool's queue timeout or the call's own deadline passes at the door.
//!
//! Within a connection calls pass in arrival order, as they would from a client's own HTTP/2
//! queue; priorities and tenants are weighed once a call is through, by admission. Calls a sibling
//! spilled here or another pool's sidecar forwarded are not held: their first door was there.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::admission::{Admission, AdmissionError};
use crate::metrics::Metrics;

/// What every connection's door shares: how many connections have calls outstanding or waiting.
pub struct Doors {
    busy: AtomicUsize,
    /// The budget last read from a pool, for doors letting calls through as others finish.
    budget: AtomicUsize,
    metrics: Metrics,
}

impl Doors {
    pub fn new(metrics: Metrics) -> Arc<Self> {
        Arc::new(Self { busy: AtomicUsize::new(0), budget: AtomicUsize::new(usize::MAX), metrics })
    }

    /// A door for a newly accepted connection.
    pub fn door(self: &Arc<Self>) -> Arc<Door> {
        Arc::new(Door { doors: self.clone(), state: Mutex::new(State::default()) })
    }

    /// Each busy connection's share of the budget, at least one call.
    fn share(&self) -> usize {
        let busy = self.busy.load(Ordering::Relaxed).max(1);
        (self.budget.load(Ordering::Relaxed) / busy).max(1)
    }
}

/// One connection's door.
pub struct Door {
    doors: Arc<Doors>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Calls through the door and not yet finished.
    through: usize,
    waiting: VecDeque<Waiter>,
    next_id: u64,
}

struct Waiter {
    id: u64,
    grant: oneshot::Sender<Pass>,
}

impl State {
    fn idle(&self) -> bool {
        self.through == 0 && self.waiting.is_empty()
    }
}

/// Why a call left the door without passing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The pool's queue timeout passed at the door.
    QueueTimeout { waited: Duration },
    /// The call's own deadline passed at the door.
    Deadline { waited: Duration },
}

impl Held {
    /// The answer, as if the call had waited that long in the pool's queue.
    pub fn into_error(self, admission: &Admission, deadline: Option<Instant>) -> AdmissionError {
        match self {
            Self::QueueTimeout { waited } => {
                AdmissionError::QueueTimeout { waited, retry_after: admission.retry_hint(deadline) }
            }
            Self::Deadline { waited } => AdmissionError::DeadlineExpired { waited },
        }
    }
}

/// A call through its connection's door; dropping it lets the next waiting call through.
pub struct Pass {
    door: Arc<Door>,
}

impl Door {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the call may go on to admission: at once while this connection has fewer
    /// than its share of `budget` calls outstanding and none waiting; otherwise in line, for at
    /// most `queue_timeout`, or until `deadline`.
    pub async fn enter(
        self: &Arc<Self>,
        budget: usize,
        queue_timeout: Duration,
        deadline: Option<Instant>,
    ) -> Result<Pass, Held> {
        let arrived = Instant::now();
        let doors = &self.doors;
        doors.budget.store(budget, Ordering::Relaxed);
        let (id, receiver) = {
            let mut state = self.lock();
            if state.idle() {
                doors.busy.fetch_add(1, Ordering::Relaxed);
            }
            if state.waiting.is_empty() && state.through < doors.share() {
                state.through += 1;
                return Ok(Pass { door: self.clone() });
            }
            let (grant, receiver) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            state.waiting.push_back(Waiter { id, grant });
            (id, receiver)
        };
        doors.metrics.held_at_door(1);
        let mut waiting = Waiting { door: self.clone(), id: Some(id) };
        let patience = match deadline {
            Some(deadline) => queue_timeout.min(deadline.saturating_duration_since(arrived)),
            None => queue_timeout,
        };
        let outcome = tokio::time::timeout(patience, receiver).await;
        match outcome {
            Ok(Ok(pass)) => {
                waiting.id = None;
                Ok(pass)
            }
            // The door let it through and then dropped it: only when the door itself went away.
            Ok(Err(_)) => Err(Held::QueueTimeout { waited: arrived.elapsed() }),
            Err(_elapsed) => {
                if let Some(pass) = waiting.give_up() {
                    // Let through in the instant between the timeout and taking the lock.
                    return Ok(pass);
                }
                let waited = arrived.elapsed();
                Err(if patience < queue_timeout { Held::Deadline { waited } } else { Held::QueueTimeout { waited } })
            }
        }
    }

    /// Lets waiting calls through while this connection is under its share; notes when it goes idle.
    fn let_through(self: &Arc<Self>, mut state: MutexGuard<'_, State>) {
        let share = self.doors.share();
        let mut refused = Vec::new();
        while state.through < share
            && let Some(waiter) = state.waiting.pop_front()
        {
            state.through += 1;
            self.doors.metrics.held_at_door(-1);
            if let Err(pass) = waiter.grant.send(Pass { door: self.clone() }) {
                // Its caller left in the meantime: the pass goes back below, outside the lock.
                refused.push(pass);
            }
        }
        if state.idle() {
            self.doors.busy.fetch_sub(1, Ordering::Relaxed);
        }
        drop(state);
        drop(refused);
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut state = self.door.lock();
        state.through -= 1;
        self.door.let_through(state);
    }
}

/// A call in line at a door; leaves the line if its future is dropped (the caller went away).
struct Waiting {
    door: Arc<Door>,
    /// `None` once the call is through or out of line.
    id: Option<u64>,
}

impl Waiting {
    /// Leaves the line after a timeout; the pass, if the door let the call through meanwhile.
    fn give_up(&mut self) -> Option<Pass> {
        let id = self.id.take()?;
        let mut state = self.door.lock();
        match state.waiting.iter().position(|waiter| waiter.id == id) {
            Some(position) => {
                state.waiting.remove(position);
                self.door.doors.metrics.held_at_door(-1);
                if state.idle() {
                    self.door.doors.busy.fetch_sub(1, Ordering::Relaxed);
                }
                None
            }
            // Already let through: its pass is in the channel, which the caller no longer reads,
            // so it was dropped there and went back. Nothing to return.
            None => None,
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.give_up();
    }
}

#[cfg(test)]
mod tests;
