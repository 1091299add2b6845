//! Back-pressure before admission, per pool: no more of the calls that come through the door are
//! in at once than the pool can serve or queue here; the others wait at the door, each in its
//! connection's line, costing a stream and a parked future but no CPU, and go in as calls finish.
//! The door counts only its own calls: calls that do not wait at it (below) take from the same
//! room without being counted, so beside them the door's calls may queue beyond `max_queued`.
//! It is what `SETTINGS_MAX_CONCURRENT_STREAMS` would do in the client's HTTP/2 layer, with a
//! limit that follows the pool's budget live and holds across every connection.
//!
//! Why not that setting itself: h2 takes it once per connection and cannot change it live, and a
//! limit per connection bounds nothing once a client opens many connections. The door's budget is
//! read at every call (the pool's in-flight limit in force, what its siblings take from it, and
//! its queue), so callers that resend every refusal at once meet a line instead of tens of
//! thousands of refusals a second that take the CPU TEI needs.
//!
//! Both fronts use it (`crate::front::door` says which calls wait): gRPC calls by their
//! connection, HTTP requests by theirs, so an HTTP/1.1 caller is a line of one.
//!
//! Patient calls wait here: those without a deadline, and those whose deadline leaves at least
//! [`PATIENT_DEADLINE_FACTOR`] times the pool's queue timeout ([`is_patient`]). Such a caller has
//! said it will wait: it waits its turn, as it would in its client's HTTP/2 queue, instead of being
//! refused into a resend loop (most load tools and retry loops resend at once, whatever the retry
//! hint says, and most gRPC clients set a deadline). A call with a deadline waits no longer than
//! it: then it leaves its line and is told its deadline passed. A call with a short deadline goes
//! straight on to the queue, which tells it at once whether it can be served in time
//! (deadline-aware shedding with a retry hint), since it has somewhere better to be: a 100 ms
//! query at a full pool hears so at once, not 100 ms later. A call let in goes on to the queue as
//! a patient one (`Ask::patient`): it waits
//! there for room rather than being refused for a full or slow queue, and is refused only when
//! the queue timeout passes. The budget counts what the siblings' windows promise, which their
//! room may not match; an impatient call refused for that would let the next waiting call in,
//! to be refused in turn, and a whole line would be refused in a moment.
//!
//! A line is bounded: the process holds at most [`HoldBounds::max_held`] calls at its doors, each
//! charged [`HELD_CALL_BYTES`] to the process's memory budget, and none longer than
//! [`HoldBounds::max_hold`] (a call without a deadline included); one past either bound is told
//! at once, with a retry hint, that the pool is full.
//!
//! Connections take turns (one call each, round robin), so one connection's flood does not hold
//! up another's calls; within a connection calls go in arrival order. Priorities and tenants are
//! weighed once a call is in, by admission. Critical calls are not held (they may evict from the
//! queue what their line would hold them behind), nor are calls a sibling spilled here or another
//! pool's sidecar forwarded: their door was there.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use prometheus::IntGauge;

use crate::admission::Admission;
use crate::admission::memory::{Charge, MemoryBudget, OverBudget, Use};

/// What one call waiting at a door adds to what its stream is charged already: its place in line
/// and the channel that lets it in.
pub const HELD_CALL_BYTES: u64 = 512;

/// How many calls the doors may hold, and for how long. Declared once: these are the binary's
/// flags.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct DoorSettings {
    /// Calls waiting at the pools' doors at once, in the whole process; one more is refused at
    /// once (RESOURCE_EXHAUSTED / 429) with a retry hint.
    #[arg(long, default_value_t = 4096)]
    pub max_held_at_door: usize,
    /// The longest a call waits at a door, deadline or not; then RESOURCE_EXHAUSTED / 429 with a
    /// retry hint.
    #[arg(long, default_value = "60s", value_parser = teifleet_runtime::duration::parse_flag)]
    pub max_door_hold: Duration,
}

impl Default for DoorSettings {
    fn default() -> Self {
        crate::vocab::flags::defaults()
    }
}

/// The door's bounds and the budget its waiting calls are charged to.
#[derive(Clone, Debug)]
pub struct HoldBounds {
    pub max_held: usize,
    pub max_hold: Duration,
    pub memory: Arc<MemoryBudget>,
}

impl HoldBounds {
    pub fn new(settings: &DoorSettings, memory: Arc<MemoryBudget>) -> Self {
        Self { max_held: settings.max_held_at_door, max_hold: settings.max_door_hold, memory }
    }
}

impl Default for HoldBounds {
    fn default() -> Self {
        Self::new(&DoorSettings::default(), MemoryBudget::unbounded())
    }
}

/// A call whose deadline leaves at least this many queue timeouts waits at the door. The queue
/// makes no call wait longer than its timeout; a caller that gave several times that has said it
/// would rather wait than be told to come back, while a deadline within a few queue timeouts is
/// an interactive caller's, owed a prompt answer (`make bench` scenario 2's callers give 2).
pub const PATIENT_DEADLINE_FACTOR: u32 = 4;

/// Whether a call with `deadline` (none: it waits as long as it takes) waits at the door of a pool
/// whose queue timeout is `queue_timeout`.
pub fn is_patient(deadline: Option<Instant>, queue_timeout: Duration, now: Instant) -> bool {
    deadline.is_none_or(|deadline| deadline.saturating_duration_since(now) >= queue_timeout * PATIENT_DEADLINE_FACTOR)
}

/// Which accepted connection a call came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectionId(pub u64);

/// One pool's door.
pub struct Door {
    lobby: Mutex<Lobby>,
    /// `teifleet_held_at_door`: the calls waiting at every door of the process.
    held: IntGauge,
}

#[derive(Default)]
struct Lobby {
    /// The budget last read from the pool.
    budget: usize,
    /// Calls in and not yet answered.
    inside: usize,
    lines: HashMap<ConnectionId, VecDeque<Waiter>>,
    /// Connections with calls waiting, in the order of their turns.
    turns: VecDeque<ConnectionId>,
    next_waiter: u64,
}

struct Waiter {
    id: u64,
    grant: oneshot::Sender<Pass>,
}

/// A call the door did not let in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DoorRefusal {
    /// Its deadline came while it waited: it left its line unserved.
    #[error("the call's deadline passed while it waited at the door")]
    Deadline,
    /// The doors hold as many calls as they may.
    #[error("{held} calls wait at the door already, the most this process holds; retry shortly")]
    Full { held: usize },
    /// Its place in line would take the process past its memory budget.
    #[error(transparent)]
    Memory(OverBudget),
    /// It waited the longest a call may.
    #[error("the call waited at the door for {waited:?}, the longest a call may; retry shortly")]
    HeldTooLong { waited: Duration },
}

impl DoorRefusal {
    /// When the caller may try again (none for a passed deadline).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Deadline => None,
            Self::Full { .. } | Self::HeldTooLong { .. } => Some(Duration::from_secs(1)),
            Self::Memory(over) => Some(over.retry_after()),
        }
    }
}

/// A call through the door; dropping it lets the next waiting call in.
pub struct Pass {
    door: Arc<Door>,
}

impl Door {
    pub fn new(held: IntGauge) -> Arc<Self> {
        Arc::new(Self { lobby: Mutex::new(Lobby::default()), held })
    }

    fn lock(&self) -> MutexGuard<'_, Lobby> {
        self.lobby.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the call may go on to `admission`: at once while fewer calls are in than the
    /// pool can serve or queue and nobody waits; otherwise in `connection`'s line, for its turn,
    /// until `deadline` at the latest (then it has waited in vain, and leaves its line).
    pub async fn enter(
        self: &Arc<Self>,
        admission: &Admission,
        connection: ConnectionId,
        deadline: Option<Instant>,
        bounds: &HoldBounds,
    ) -> Result<Pass, DoorRefusal> {
        let budget = admission.capacity();
        let (id, receiver, unclaimed, charge) = {
            let mut lobby = self.lock();
            lobby.budget = budget;
            if lobby.turns.is_empty() && lobby.inside < budget {
                lobby.inside += 1;
                return Ok(Pass { door: self.clone() });
            }
            // The gauge counts every door of the process: the cap is the process's. At the cap,
            // a connection with fewer calls waiting than the longest line here takes the place
            // of that line's newest call: one flooding client fills the door, never keeps others
            // out of it.
            let held = usize::try_from(self.held.get()).unwrap_or(0);
            if held >= bounds.max_held && !Self::make_room(&mut lobby, connection, &self.held) {
                return Err(DoorRefusal::Full { held });
            }
            let charge = bounds.memory.charge(Use::Door, HELD_CALL_BYTES).map_err(DoorRefusal::Memory)?;
            let (grant, receiver) = oneshot::channel();
            let id = lobby.next_waiter;
            lobby.next_waiter += 1;
            let line = lobby.lines.entry(connection).or_default();
            line.push_back(Waiter { id, grant });
            if line.len() == 1 {
                lobby.turns.push_back(connection);
            }
            self.held.inc();
            // The budget may have grown since the last call went in.
            let unclaimed = self.let_in(&mut lobby);
            (id, receiver, unclaimed, charge)
        };
        drop(unclaimed);
        let mut waiting = Waiting { door: self.clone(), connection, id: Some(id), _charge: charge };
        let held_until = Instant::now() + bounds.max_hold;
        let until = deadline.map_or(held_until, |deadline| deadline.min(held_until));
        let granted = match tokio::time::timeout_at(until, receiver).await {
            Ok(granted) => granted,
            Err(_) if deadline.is_some_and(|deadline| deadline <= held_until) => return Err(DoorRefusal::Deadline),
            Err(_) => return Err(DoorRefusal::HeldTooLong { waited: bounds.max_hold }),
        };
        waiting.id = None;
        // A waiter leaves its line with a pass, by its own hand, or made room for another
        // connection's call at a full door (`make_room`), its grant dropped.
        granted.map_err(|_| DoorRefusal::Full { held: bounds.max_held })
    }

    /// At a full door, refuses the newest call of the longest line, when it is longer than
    /// `connection`'s would be with one more: whether a place was freed.
    fn make_room(lobby: &mut Lobby, connection: ConnectionId, held: &IntGauge) -> bool {
        let own = lobby.lines.get(&connection).map_or(0, VecDeque::len);
        let Some((&longest, line)) = lobby.lines.iter_mut().max_by_key(|(_, line)| line.len()) else { return false };
        if line.len() <= own + 1 {
            return false;
        }
        // Dropping its grant tells the waiter it was refused; its line keeps its turn.
        drop(line.pop_back());
        held.dec();
        tracing::debug!(connection = longest.0, "a full door refused the newest call of its longest line");
        true
    }

    /// Lets waiting calls in while there is room, one per connection in turn. Returns the passes
    /// of callers that left meanwhile, to be dropped once the lock is released.
    fn let_in(self: &Arc<Self>, lobby: &mut Lobby) -> Vec<Pass> {
        let mut unclaimed = Vec::new();
        while lobby.inside < lobby.budget
            && let Some(connection) = lobby.turns.pop_front()
        {
            let line = lobby.lines.get_mut(&connection).expect("a connection with a turn has a line");
            let waiter = line.pop_front().expect("a line with a turn is not empty");
            if line.is_empty() {
                lobby.lines.remove(&connection);
            } else {
                lobby.turns.push_back(connection);
            }
            lobby.inside += 1;
            self.held.dec();
            if let Err(pass) = waiter.grant.send(Pass { door: self.clone() }) {
                unclaimed.push(pass);
            }
        }
        unclaimed
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let unclaimed = {
            let mut lobby = self.door.lock();
            lobby.inside -= 1;
            self.door.let_in(&mut lobby)
        };
        drop(unclaimed);
    }
}

/// A call in its connection's line; leaves the line if its future is dropped (the caller went away).
struct Waiting {
    door: Arc<Door>,
    connection: ConnectionId,
    /// `None` once the call is in or out of line.
    id: Option<u64>,
    /// Its place in line, charged to the memory budget until it goes in or leaves.
    _charge: Charge,
}

impl Waiting {
    fn leave(&mut self) {
        let Some(id) = self.id.take() else { return };
        let mut lobby = self.door.lock();
        let Some(line) = lobby.lines.get_mut(&self.connection) else { return };
        let Some(position) = line.iter().position(|waiter| waiter.id == id) else { return };
        line.remove(position);
        let emptied = line.is_empty();
        self.door.held.dec();
        if emptied {
            lobby.lines.remove(&self.connection);
            lobby.turns.retain(|connection| *connection != self.connection);
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests;
