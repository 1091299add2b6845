//! Per-pool admission control: a budget counted in TEI's own units, a bounded queue that is fair
//! between priorities and tenants, and an in-flight limit that can find itself.
//!
//! Units: since TEI 1.9 every input takes one of TEI's `max-concurrent-requests` slots (a Rerank
//! of 100 texts takes 100, a stream message one), so `max_in_flight` and `max_queued` count
//! inputs. With `max_in_flight_tokens`, a call is also charged its estimated tokens. A call gets
//! all of its [`Cost`] at once or waits (or is refused) as a whole: it never holds part of it
//! while waiting. A call larger than the whole limit is admitted alone once nothing else is in
//! flight, so it is never starved.
//!
//! A request takes a [`Permit`] before it reaches TEI and gives it back by dropping it, whatever
//! happened, so permits cannot leak. Without room it waits in this queue, never in TEI: highest
//! priority first, tenants sharing by weight within a priority (see `queue`). It is refused at
//! once when the queue is full (after evicting from a lower priority or a heavier tenant, if one
//! exists) or when its deadline or the queue timeout cannot be met given the queue ahead of it
//! and the service times observed, and for nothing else: a call that fits is queued. A waiter
//! whose deadline or queue timeout passes, or whose caller goes away, leaves the queue without
//! ever reaching TEI. A standing queue (see `standing`) is reported, never refused for. Two lanes
//! (see `lanes`), `query` and `ingest`, share the pool: queries first, ingest with a floor share
//! and patience. A pool's `deviceTimeCap` bounds how much of TEI's time its calls take (see
//! `device_time`); a pool's share of a time-sliced GPU does so only while a neighbour is busy
//! on it (see `contention`). Limits change live.

mod adaptive;
mod batch_curve;
mod contention;
mod device_time;
mod estimate;
mod ingest_gate;
mod lane;
mod lanes;
pub mod memory;
mod next_batch;
mod priority;
mod queue;
mod returning;
mod standing;
mod tei_batch;
mod tenant_gate;
mod tenants;
mod tokens;
mod types;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

pub use adaptive::{Change, Reason as LimitReason};
pub use batch_curve::Line;
pub use lanes::{
    ADMITTED, DEFAULT_INGEST_SHARE, INGEST_PATIENCE, Lane, LaneObserver, MAX_INGEST_SHARE, MAX_QUERY_RESERVE,
    OUTCOMES as LANE_OUTCOMES, UnknownLane,
};
pub use priority::{Priority, UnknownPriority};
pub use tenants::{DEFAULT_TENANT, MAX_TENANTS, OTHER_TENANT, TenantId};
pub use types::{AdmissionError, Ask, Cost, Limits, Observation, Retry, Snapshot};

use adaptive::Adaptive;
use contention::Contention;
use device_time::DeviceTime;
use estimate::{ServiceTime, pushback};
use ingest_gate::IngestGate;
pub use ingest_gate::IngestWhy;
use lanes::Lanes;
use queue::Grant;
use returning::Returning;
use standing::Standing;
use tei_batch::TeiBatches;
use tenant_gate::TenantGate;
use tenants::Tenants;
use tokens::TokenEstimate;

/// The adaptive limit never goes below this many inputs in flight, nor below one of TEI's batches
/// once TEI has said its batch (see `next_batch`): fewer in flight than TEI batches at once leaves
/// TEI idle for nothing, since it takes a whole batch at once.
pub const ADAPTIVE_FLOOR: usize = 1;

type Observer = Box<dyn Fn(&Snapshot) + Send + Sync>;

/// The admission state of one pool. Cheap to clone; clones share the state.
#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    observer: Option<Observer>,
    lane_observer: Option<Box<dyn LaneObserver>>,
}

struct State {
    limits: Limits,
    in_flight: usize,
    in_flight_tokens: u64,
    queue: Lanes,
    ingest_gate: IngestGate,
    /// TEI's batches, told apart from its answers: what the ingest gate's curve and the GPU
    /// share's neighbour signal read.
    tei_batches: TeiBatches,
    /// TEI time this replica may still take under the pool's `deviceTimeCap`.
    device_time: DeviceTime,
    /// Whether a neighbour on a time-sliced GPU is busy: the pool's `gpu_share` caps it then.
    contention: Contention,
    /// When a task wakes to let waiters through a gate (ingest's, or the device time's), if one
    /// is armed.
    gate_wake: Option<Instant>,
    service_time: ServiceTime,
    standing: Standing,
    returning: Returning,
    adaptive: Option<Adaptive>,
    tokens: TokenEstimate,
    tenants: Tenants,
    /// When the tenant crowding the queue may take room while others come (see `tenant_gate`).
    tenant_gate: TenantGate,
    /// Inputs sibling replicas of the pool take from this queue at once (calls spill to them):
    /// the queue drains that much faster than this replica's own limit says.
    spill_slots: usize,
    /// TEI's batch, as its Info reports it (see `next_batch`).
    backend_batch: Option<usize>,
}

/// The right to have one call's inputs in flight to TEI; dropping it frees them.
#[must_use = "dropping a permit releases it at once"]
pub struct Permit {
    shared: Arc<Shared>,
    lane: Lane,
    cost: Cost,
    acquired: Instant,
    armed: bool,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("cost", &self.cost).field("acquired", &self.acquired).finish_non_exhaustive()
    }
}

impl Permit {
    /// Tells the pool what TEI reported for this call's answer: it teaches the token estimate and
    /// drives the adaptive limit.
    pub fn observe(&self, observation: Observation) {
        self.observe_answer(observation, self.cost.inputs);
    }

    /// Like [`Permit::observe`], for an answer to `inputs` of the permit's inputs (one message of
    /// a bulk call's sub-batch): TEI's batch is told apart by how many inputs rode it.
    pub fn observe_answer(&self, observation: Observation, inputs: u32) {
        self.shared.observe(observation, inputs as usize);
    }

    pub fn cost(&self) -> Cost {
        self.cost
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            self.shared.release(self.lane, self.cost, self.acquired.elapsed());
        }
    }
}

impl Admission {
    pub fn new(limits: Limits) -> Self {
        Self::build(limits, None, None)
    }

    /// Like [`Admission::new`], calling `observer` with every new state (under the lock: keep it
    /// cheap, e.g. setting gauges).
    pub fn with_observer(limits: Limits, observer: impl Fn(&Snapshot) + Send + Sync + 'static) -> Self {
        Self::build(limits, Some(Box::new(observer)), None)
    }

    /// Like [`Admission::with_observer`], also telling `lanes` each lane's queue and decisions.
    pub fn with_observers(
        limits: Limits,
        observer: impl Fn(&Snapshot) + Send + Sync + 'static,
        lanes: impl LaneObserver + 'static,
    ) -> Self {
        Self::build(limits, Some(Box::new(observer)), Some(Box::new(lanes)))
    }

    fn build(limits: Limits, observer: Option<Observer>, lane_observer: Option<Box<dyn LaneObserver>>) -> Self {
        let state = State {
            limits,
            in_flight: 0,
            in_flight_tokens: 0,
            queue: Lanes::default(),
            ingest_gate: IngestGate::default(),
            tei_batches: TeiBatches::default(),
            device_time: DeviceTime::default(),
            contention: Contention::default(),
            gate_wake: None,
            service_time: ServiceTime::default(),
            standing: Standing::default(),
            returning: Returning::default(),
            adaptive: limits.adaptive.then(|| Adaptive::new(ADAPTIVE_FLOOR, limits.max_in_flight)),
            tokens: TokenEstimate::default(),
            tenants: Tenants::default(),
            tenant_gate: TenantGate::default(),
            spill_slots: 0,
            backend_batch: None,
        };
        let admission = Self { shared: Arc::new(Shared { state: Mutex::new(state), observer, lane_observer }) };
        admission.shared.notify(&admission.shared.lock(), None);
        admission
    }

    /// Calls this replica can serve or queue at once: its in-flight limit in force, what its
    /// siblings take from it, and its queue (what the pool's door lets in, `crate::gate::door`).
    pub fn capacity(&self) -> usize {
        let state = self.shared.lock();
        state.draining_slots() + state.limits.max_queued
    }

    pub fn snapshot(&self) -> Snapshot {
        self.shared.lock().snapshot(None)
    }

    /// Mean service time observed so far.
    pub fn mean_service_time(&self) -> Option<Duration> {
        self.shared.lock().service_time.mean()
    }

    /// Estimated tokens of `inputs` inputs with `text_bytes` bytes of text.
    pub fn estimate_tokens(&self, text_bytes: usize, inputs: u32) -> u32 {
        u32::try_from(self.shared.lock().tokens.estimate(text_bytes, inputs)).unwrap_or(u32::MAX)
    }

    /// Whether calls are charged tokens (the pool has a token budget).
    pub fn counts_tokens(&self) -> bool {
        self.shared.lock().limits.max_in_flight_tokens.is_some()
    }

    /// The metric label of a tenant name: configured tenants by name, others as `other`.
    pub fn tenant_label(&self, tenant: Option<&str>) -> String {
        let mut state = self.shared.lock();
        let id = state.tenants.id_of(tenant);
        state.tenants.label(id).to_owned()
    }

    /// TEI's batch (`Info.max_batch_requests`), learned from TEI: a static limit of about one
    /// batch lets TEI's next batch wait ready in its queue (see `next_batch`). `None`: TEI batches
    /// by tokens alone, or the pool keeps no batch ready.
    pub fn set_backend_batch(&self, batch: Option<usize>) {
        let mut state = self.shared.lock();
        if state.backend_batch == batch {
            return;
        }
        state.backend_batch = batch;
        let (floor, ceiling) = (state.adaptive_floor(), state.limits.max_in_flight);
        if let Some(adaptive) = &mut state.adaptive {
            adaptive.set_bounds(floor, ceiling);
        }
        self.shared.dispatch(&mut state);
        self.shared.notify(&state, None);
    }

    /// Applies new limits without dropping anything: raising admits waiters at once; lowering lets
    /// in-flight work finish and admits no more until below the new limit. Queries beyond a
    /// smaller queue are evicted, lowest priority and heaviest tenant first; ingest is never
    /// evicted, it waits its turn.
    pub fn set_limits(&self, limits: Limits) {
        let mut state = self.shared.lock();
        if state.limits == limits {
            return;
        }
        state.limits = limits;
        let floor = state.adaptive_floor();
        // A cap set or lifted counts from now.
        state.note_busy(Instant::now());
        match (&mut state.adaptive, limits.adaptive) {
            (Some(adaptive), true) => adaptive.set_bounds(floor, limits.max_in_flight),
            (slot, true) => *slot = Some(Adaptive::new(floor, limits.max_in_flight)),
            (slot, false) => *slot = None,
        }
        while state.queue.queue(Lane::Query).inputs() > limits.max_queued {
            let Some(victim) = state.queue.queue_mut(Lane::Query).evict_lowest() else { break };
            let position = state.queue.queue(Lane::Query).inputs();
            let retry_after = state.retry_hint(position, None);
            drop(victim.grant.send(Err(AdmissionError::Evicted { retry_after })));
        }
        self.shared.dispatch(&mut state);
        self.shared.notify(&state, None);
    }

    /// Tenant weights (by name); tenants not listed weigh 1.
    pub fn set_tenant_weights(&self, weights: BTreeMap<String, u32>) {
        let mut state = self.shared.lock();
        if *state.tenants.weights() != weights {
            state.tenants.set_weights(weights);
        }
    }

    /// Says how many inputs sibling replicas of the pool take from this queue at once (the calls
    /// that spill there), so the waits this queue expects, and the hints it gives, count them.
    pub fn set_spill_slots(&self, slots: usize) {
        self.shared.lock().spill_slots = slots;
    }

    /// A permit for `ask.cost` if there is room now and nobody waits before it, or nothing: a
    /// call takes a local slot this way before it looks for room at a sibling replica.
    pub fn try_acquire(&self, ask: &Ask<'_>) -> Option<Permit> {
        let mut state = self.shared.lock();
        state.arrived(ask.tenant);
        let permit = self.take_if_free(&mut state, ask.lane, ask.cost);
        if permit.is_some() {
            self.shared.decided(ask.lane, ADMITTED);
        }
        permit
    }

    fn take_if_free(&self, state: &mut State, lane: Lane, cost: Cost) -> Option<Permit> {
        let now = Instant::now();
        if !state.queue.newcomer_first(lane, state.floor_share()) {
            return None;
        }
        let entry = state.fits_lane(lane, cost, now)?;
        state.take(lane, cost, now);
        self.shared.let_in(entry);
        state.queue.admitted(lane, cost.inputs);
        self.shared.notify(state, None);
        Some(Permit { shared: self.shared.clone(), lane, cost, acquired: now, armed: true })
    }

    /// Waits for a permit for `ask.cost`. Dropping the returned future leaves the queue.
    pub async fn acquire(&self, ask: Ask<'_>) -> Result<Permit, AdmissionError> {
        let result = self.wait_for(ask).await;
        self.shared.decided(ask.lane, lanes::outcome(result.as_ref().map(drop)));
        result
    }

    async fn wait_for(&self, ask: Ask<'_>) -> Result<Permit, AdmissionError> {
        let arrived = Instant::now();
        // Ingest without a deadline has said it would rather wait than hear "come back": it is
        // not refused for load, and waits longer than the queries' queue timeout.
        let patient = ask.patient || (ask.lane == Lane::Ingest && ask.deadline.is_none());
        let (grant, id, patience, queue_timeout) = {
            let mut state = self.shared.lock();
            let cost = ask.cost;
            let tenant = state.arrived(ask.tenant);
            if let Some(permit) = self.take_if_free(&mut state, ask.lane, cost) {
                return Ok(permit);
            }
            let weight = state.tenants.weight(tenant);
            let share = state.floor_share();
            let ahead = state.queue.ahead_of(ask.lane, ask.priority, tenant, weight, cost, share);
            let expected_wait = state.expected_wait(ahead);
            let queue_timeout = match ask.lane {
                Lane::Ingest if patient => state.limits.queue_timeout.max(INGEST_PATIENCE),
                _ => state.limits.queue_timeout,
            };
            if let Some(wait) = expected_wait.filter(|_| !patient) {
                // A call whose turn comes after its deadline or the queue timeout would only
                // leave the queue at that moment, unserved: it is told at once instead. These,
                // and a full queue, are the only refusals for load: a call that fits waits.
                if ask.deadline.is_some_and(|deadline| arrived + wait > deadline) {
                    return Err(AdmissionError::DeadlineUnmeetable {
                        expected_wait: wait,
                        retry_after: state.retry_hint(ahead, ask.deadline),
                    });
                }
                if wait > queue_timeout {
                    return Err(AdmissionError::QueueTimeoutUnmeetable {
                        expected_wait: wait,
                        queue_timeout,
                        retry_after: state.retry_hint(ahead, ask.deadline),
                    });
                }
            }
            if !patient {
                state.make_room(&ask, tenant, weight)?;
            }
            let (grant, receiver) = oneshot::channel();
            let units = if state.limits.max_in_flight_tokens.is_some() {
                u64::from(cost.tokens)
            } else {
                u64::from(cost.inputs)
            };
            // Release() and set_limits() keep "nobody waits while there is room" but for waiters
            // a gate holds (ingest's, or the crowd's, see `tenant_gate`), which a timer lets
            // through; the fast path above admits whenever there is room and nobody waits before
            // the newcomer. A newcomer queued behind a crowd its gate holds (or whose turn comes
            // before the held crowd's) may go at once: dispatch, which arms the gates' timer.
            let id = state.queue.push(ask.lane, ask.priority, tenant, weight, cost, units, grant);
            self.shared.dispatch(&mut state);
            self.shared.notify(&state, None);
            let patience = match ask.deadline {
                Some(deadline) => queue_timeout.min(deadline.saturating_duration_since(arrived)),
                None => queue_timeout,
            };
            (receiver, id, patience, queue_timeout)
        };

        let mut waiting = Waiting { shared: self.shared.clone(), lane: ask.lane, id, receiver: Some(grant) };
        let receiver = waiting.receiver.as_mut().expect("set above");
        let outcome = tokio::time::timeout(patience, receiver).await;
        let waited = arrived.elapsed();
        match outcome {
            Ok(Ok(granted)) => {
                waiting.served();
                granted
            }
            Ok(Err(_)) => {
                // The queue went away without a word: the pool itself was dropped.
                waiting.served();
                Err(AdmissionError::Evicted { retry_after: self.retry_hint(ask.deadline) })
            }
            Err(_elapsed) => {
                if let Some(permit) = waiting.give_up() {
                    // Served in the instant between the timeout and taking the lock.
                    return Ok(permit);
                }
                if patience < queue_timeout {
                    Err(AdmissionError::DeadlineExpired { waited })
                } else {
                    Err(AdmissionError::QueueTimeout { waited, retry_after: self.retry_hint(ask.deadline) })
                }
            }
        }
    }

    fn retry_hint(&self, deadline: Option<Instant>) -> Retry {
        let mut state = self.shared.lock();
        let position = state.queue.inputs();
        state.retry_hint(position, deadline)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn notify(&self, state: &State, change: Option<Change>) {
        if let Some(observer) = &self.observer {
            observer(&state.snapshot(change));
        }
        if let Some(lanes) = &self.lane_observer {
            for lane in Lane::ALL {
                let queue = state.queue.queue(lane);
                lanes.queued(lane, Priority::ALL.map(|priority| queue.inputs_of(priority)));
            }
        }
    }

    fn let_in(&self, entry: Entry) {
        if let (Entry::Ingest(why), Some(lanes)) = (entry, &self.lane_observer) {
            lanes.ingest_let_in(why);
        }
    }

    fn decided(&self, lane: Lane, outcome: &'static str) {
        if let Some(lanes) = &self.lane_observer {
            lanes.decided(lane, outcome);
        }
    }

    fn release(self: &Arc<Self>, lane: Lane, cost: Cost, took: Duration) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(cost.inputs as usize);
        state.in_flight_tokens = state.in_flight_tokens.saturating_sub(u64::from(cost.tokens));
        let query_inputs = if lane == Lane::Query { cost.inputs as usize } else { 0 };
        let now = Instant::now();
        state.ingest_gate.released(query_inputs, now);
        state.device_time.answered(cost.inputs as usize);
        state.note_busy(now);
        state.service_time.observe(took);
        self.dispatch(&mut state);
        if state.queue.is_empty() && state.in_flight < state.effective_limit() {
            state.returning.clear();
        }
        self.notify(&state, None);
    }

    fn observe(self: &Arc<Self>, observation: Observation, inputs: usize) {
        let mut state = self.lock();
        state.tokens.observe(observation.chars, observation.tokens);
        let now = Instant::now();
        state.ingest_gate.answered_in(observation.tei_inference);
        if let Some(batch) = state.tei_batches.answered(observation.tei_inference, inputs, now) {
            state.ingest_gate.batch_ended(batch);
            if state.limits.gpu_share.is_some() && state.contention.batch_ended(batch, now) {
                // The share's cap starts (from a full burst) or lifts, from now.
                state.note_busy(now);
                self.dispatch(&mut state);
                self.notify(&state, None);
            }
        }
        let demand = !state.queue.is_empty() || state.in_flight >= state.effective_limit();
        let (floor, ceiling) = (state.adaptive_floor(), state.limits.max_in_flight);
        let Some(adaptive) = &mut state.adaptive else { return };
        let change = adaptive.observe(observation.tei_queue, observation.tei_inference, demand, floor, ceiling);
        if change.is_some() {
            self.dispatch(&mut state);
            self.notify(&state, change);
        }
    }

    /// Hands room to waiters: queries before ingest (but for the turns ingest is owed), then
    /// highest priority and fairest first.
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        let now = Instant::now();
        loop {
            let oldest = state.queue.oldest_query().map(|enqueued| now.saturating_duration_since(enqueued));
            state.standing.update(oldest, now, state.service_time.mean());
            let share = state.floor_share();
            let Some((lane, next)) = state.queue.peek_next(share) else {
                state.queue.forget_idle_tenants();
                break;
            };
            // The crowd's turn waits for its gate; another tenant's waiter may take the room.
            let crowd = state.crowd_held(now).map(|(crowd, _)| crowd).filter(|_| lane == Lane::Query);
            let next = match crowd {
                Some(crowd) => state.queue.queue(lane).peek_next_besides(crowd),
                None => Some(next),
            };
            let Some(next) = next else { break };
            let Some(entry) = state.fits_lane(lane, next.cost, now) else { break };
            let queue = state.queue.queue_mut(lane);
            let waiter = match crowd {
                Some(crowd) => queue.pop_next_besides(crowd),
                None => queue.pop_next(),
            }
            .expect("peeked");
            if lane == Lane::Query {
                state.ingest_gate.query_waited(now);
            }
            state.take(lane, waiter.cost, now);
            state.queue.admitted(lane, waiter.cost.inputs);
            let permit = Permit { shared: self.clone(), lane, cost: waiter.cost, acquired: now, armed: true };
            match waiter.grant.send(Ok(permit)) {
                Ok(()) => self.let_in(entry),
                Err(Ok(mut unwanted)) => {
                    // The waiter is gone; take the room back here, without re-entering the lock.
                    unwanted.armed = false;
                    state.untake(lane, unwanted.cost, now);
                }
                Err(Err(_)) => {}
            }
        }
        self.wake_when_a_gate_opens(state, now);
    }

    /// Waiters stopped by a closed gate (ingest's, see `ingest_gate`, or the device time's, see
    /// `device_time`) are let through by a timer when it opens, since no permit may come back
    /// then to dispatch them. One timer at a time: one that fires no later than a gate opens
    /// re-arms itself if a gate is still closed then.
    fn wake_when_a_gate_opens(self: &Arc<Self>, state: &mut State, now: Instant) {
        // Ingest the next batch's count holds back goes once that count is stale, and ingest the
        // queries' rules hold goes once they have stopped (a wake that finds it fitting earlier,
        // or not at all, only dispatches again).
        let ingest = match state.queue.queue(Lane::Ingest).is_empty() {
            true => None,
            false => {
                let gate = &state.ingest_gate;
                let rationed = gate.rationed_until(state.effective_limit(), state.limits.query_reserve, now);
                let closed =
                    gate.closed_until(now, state.in_flight).or_else(|| gate.stale_at().filter(|stale| *stale > now));
                let stops = gate.stops_at().filter(|stops| *stops > now && gate.queries_come(now));
                closed.into_iter().chain(rationed).chain(stops).min()
            }
        };
        let device = match state.queue.is_empty() {
            true => None,
            false => state.device_time.closed_until(state.device_time_cap(), now),
        };
        let crowd = state.crowd_held(now).and_then(|(_, opens)| opens);
        let Some(opens) = [ingest, device, crowd].into_iter().flatten().min() else { return };
        if state.gate_wake.is_some_and(|armed| armed <= opens) {
            return;
        }
        // Outside a runtime nothing can wait: the next permit back dispatches instead.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        state.gate_wake = Some(opens);
        let shared = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep_until(opens).await;
            let Some(shared) = shared.upgrade() else { return };
            let mut state = shared.lock();
            if state.gate_wake == Some(opens) {
                state.gate_wake = None;
            }
            shared.dispatch(&mut state);
            shared.notify(&state, None);
        });
    }
}

/// How a call may go in flight (see [`State::fits_lane`]).
#[derive(Clone, Copy, Debug)]
enum Entry {
    Query,
    Ingest(IngestWhy),
}

impl State {
    /// The static limit with TEI's next batch kept ready (see `next_batch`), or the adaptive one.
    fn effective_limit(&self) -> usize {
        match &self.adaptive {
            Some(adaptive) => adaptive.limit(self.adaptive_floor(), self.limits.max_in_flight),
            None => self.limits.max_in_flight + next_batch::ready_inputs(self.limits.max_in_flight, self.backend_batch),
        }
    }

    /// The ingest floor in force: `ingestShare` while the queries' queue stands (see `standing`:
    /// queries would take every admission), none while their waits are bursts that drain. A
    /// floor turn goes in exactly while queries wait, so every query of the burst behind it waits
    /// its work too; on a device whose batches save little (TEI on a CPU) that is a whole batch
    /// time. Beside queries at 0.6× of a real TEI's capacity such turns were 29–42 of the 47–48
    /// ingest let-ins while queries came. Between bursts ingest has the room queries leave; the
    /// floor is for when they leave none.
    fn floor_share(&self) -> u8 {
        if self.standing.standing() { self.limits.ingest_share } else { 0 }
    }

    /// Notes a call of `tenant` (see `tenant_gate`), and returns its id.
    fn arrived(&mut self, tenant: Option<&str>) -> TenantId {
        let tenant = self.tenants.id_of(tenant);
        self.tenant_gate.arrived(tenant, Instant::now());
        tenant
    }

    /// The tenant crowding the query queue, when its gate holds it at `now`, and when that opens
    /// (see `tenant_gate`); `None` for when: held by the share of TEI's next batch it leaves to a
    /// quiet tenant weighing more while that tenant's calls wait, or past the running batch's
    /// expected end, until a dispatch finds it otherwise (a call served, a batch ending).
    fn crowd_held(&self, now: Instant) -> Option<(TenantId, Option<Instant>)> {
        let queue = self.queue.queue(Lane::Query);
        let crowd = queue.crowding_head()?;
        let last_part = self.ingest_gate.last_part_from();
        if let Some(opens) = self.tenant_gate.closed_until(crowd, last_part, self.in_flight, now) {
            return Some((crowd, Some(opens)));
        }
        let quiet = self.tenant_gate.other_coming(crowd, now)?;
        let reserve = tenant_gate::quiet_reserve(self.tenants.weight(quiet), self.tenants.weight(crowd));
        let inputs = queue.peek_next()?.cost.inputs as usize;
        let fits =
            self.ingest_gate.ingest_fits(inputs, self.in_flight, self.effective_limit(), Some(reserve), now).is_some();
        if fits {
            return None;
        }
        // The places kept would run empty at the batch's end: the crowd takes them then, unless
        // another tenant waits, or the batch's end passed unseen.
        let handover = tenant_gate::handover(|share| self.ingest_gate.running_batch_at(share))?;
        if now < handover.start {
            return Some((crowd, Some(handover.start)));
        }
        let others_wait = queue.peek_next_besides(crowd).is_some();
        (others_wait || now >= handover.end).then_some((crowd, None))
    }

    /// [`ADAPTIVE_FLOOR`], or TEI's batch when it said it (never above the ceiling).
    fn adaptive_floor(&self) -> usize {
        self.backend_batch.unwrap_or(0).min(self.limits.max_in_flight).max(ADAPTIVE_FLOOR)
    }

    /// Whether a call of `lane` costing `cost` can go in flight at `now`, and for ingest why:
    /// ingest waits while the gate kept for queries is closed (see `ingest_gate`) unless queries
    /// wait, when it goes only on the turns its floor is owed, and those it takes whole.
    fn fits_lane(&self, lane: Lane, cost: Cost, now: Instant) -> Option<Entry> {
        if self.device_time.closed_until(self.device_time_cap(), now).is_some() {
            return None;
        }
        let limit = self.effective_limit();
        let entry = match lane {
            Lane::Query => Entry::Query,
            Lane::Ingest if !self.queue.queue(Lane::Query).is_empty() => Entry::Ingest(IngestWhy::FloorTurn),
            Lane::Ingest => {
                if self.ingest_gate.closed_until(now, self.in_flight).is_some()
                    || self.ingest_gate.rationed_until(limit, self.limits.query_reserve, now).is_some()
                {
                    return None;
                }
                let inputs = cost.inputs as usize;
                Entry::Ingest(self.ingest_gate.ingest_fits(
                    inputs,
                    self.in_flight,
                    limit,
                    self.limits.query_reserve,
                    now,
                )?)
            }
        };
        self.fits_under(cost, limit).then_some(entry)
    }

    /// Whether `cost` can go in flight under `limit` inputs. A call larger than a whole limit goes
    /// alone.
    fn fits_under(&self, cost: Cost, limit: usize) -> bool {
        let inputs = self.in_flight == 0 || self.in_flight + cost.inputs as usize <= limit;
        let tokens = match self.limits.max_in_flight_tokens {
            Some(max) => self.in_flight_tokens == 0 || self.in_flight_tokens + u64::from(cost.tokens) <= max as u64,
            None => true,
        };
        inputs && tokens && self.limits.max_in_flight > 0
    }

    fn take(&mut self, lane: Lane, cost: Cost, now: Instant) {
        self.in_flight += cost.inputs as usize;
        self.in_flight_tokens += u64::from(cost.tokens);
        self.ingest_gate.took(lane, cost.inputs as usize, now);
        if lane == Lane::Ingest {
            let limit = self.effective_limit();
            self.ingest_gate.ingest_took(cost.inputs as usize, limit, self.limits.query_reserve, now);
        }
        self.note_busy(now);
    }

    /// Tells the device time's credit whether calls are in flight from `now` on.
    fn note_busy(&mut self, now: Instant) {
        self.device_time.set_busy(self.in_flight > 0, self.device_time_cap(), self.device_time_charge(), now);
    }

    /// The share of wall time in flight the cap charges: all of it under a `deviceTimeCap`; under a
    /// GPU share only this replica's own device time, so its waits for a busy neighbour's turn
    /// do not count against it (see `contention`).
    fn device_time_charge(&self) -> f64 {
        match self.limits.device_time_cap {
            Some(_) => 1.0,
            None => self.contention.own_share(),
        }
    }

    /// The cap on TEI time in force: the pool's `deviceTimeCap` always, or else its share of a
    /// time-sliced GPU while a neighbour is busy there (see `contention`).
    fn device_time_cap(&self) -> Option<u8> {
        let share = self.limits.gpu_share.filter(|_| self.contention.neighbour_busy());
        self.limits.device_time_cap.or(share)
    }

    fn untake(&mut self, lane: Lane, cost: Cost, now: Instant) {
        self.in_flight -= cost.inputs as usize;
        self.in_flight_tokens -= u64::from(cost.tokens);
        self.ingest_gate.untook(lane, cost.inputs as usize, now);
        self.note_busy(now);
    }

    /// Expected wait for a newcomer with `ahead` queued inputs before it.
    /// While the device-time cap holds the pool back, the queue starts moving when the credit is
    /// back and then drains at the cap's pace (see `device_time`), not the in-flight limit's.
    fn expected_wait(&self, ahead: usize) -> Option<Duration> {
        let wait = self.service_time.wait_for(ahead, self.draining_slots());
        let cap = self.device_time_cap();
        if cap.is_none() {
            return wait;
        }
        let now = Instant::now();
        if !self.device_time.binding(cap, now) {
            return wait;
        }
        // The credit back, the inputs ahead let through at the cap's pace, then its own call.
        let opens = self.device_time.closed_until(cap, now).map_or(Duration::ZERO, |opens| opens - now);
        let own = self.service_time.mean().unwrap_or_default();
        match self.device_time.drain_time(ahead, cap) {
            Some(drain) => Some(opens + drain + own),
            None => Some(opens + wait.unwrap_or_default()),
        }
    }

    /// Inputs that drain the queue at once: this replica's own limit, and what its siblings take.
    fn draining_slots(&self) -> usize {
        self.effective_limit() + self.spill_slots
    }

    /// What to tell a caller refused at `position` (inputs ahead of where it would wait), with
    /// `deadline`: its turn behind the queue and behind the callers refused before it (see
    /// `returning`), or, when that turn comes after its deadline, that retrying is futile. A
    /// caller without a deadline is told at most the queue timeout and then not counted in line.
    fn retry_hint(&mut self, position: usize, deadline: Option<Instant>) -> Retry {
        let slots = self.draining_slots();
        let Some(service) = self.service_time.mean().filter(|service| !service.is_zero()) else {
            return Retry::After(pushback(None, Duration::ZERO));
        };
        let now = Instant::now();
        let ahead = position + self.returning.ahead(now, slots as f64 / service.as_secs_f64());
        let turn = self.service_time.wait_for(ahead, slots).unwrap_or(service);
        let window = self.service_time.wait_for(self.limits.max_queued.saturating_sub(1), slots).unwrap_or(service);
        match deadline {
            Some(deadline) if now + turn > deadline => Retry::Futile,
            None if turn > self.limits.queue_timeout => Retry::After(pushback(Some(self.limits.queue_timeout), window)),
            _ => {
                self.returning.join();
                Retry::After(pushback(Some(turn), window))
            }
        }
    }

    /// Frees space for `cost` in its lane's queue, evicting lower priorities or heavier tenants
    /// of that lane, or refuses. Each lane holds up to `max_queued` inputs of its own, so neither
    /// fills the other's room, and a query never evicts ingest.
    fn make_room(&mut self, ask: &Ask<'_>, tenant: TenantId, weight: u32) -> Result<(), AdmissionError> {
        let (priority, cost, deadline, lane) = (ask.priority, ask.cost, ask.deadline, ask.lane);
        let full = |state: &mut Self| {
            let queued = state.queue.queue(lane).inputs();
            AdmissionError::QueueFull { queued, retry_after: state.retry_hint(queued, deadline) }
        };
        if cost.inputs as usize > self.limits.max_queued {
            return Err(full(self));
        }
        while self.queue.queue(lane).inputs() + cost.inputs as usize > self.limits.max_queued {
            let queue = self.queue.queue_mut(lane);
            let share = (queue.inputs_of_tenant(priority, tenant) + cost.inputs as usize) as f64 / f64::from(weight);
            match queue.evict_for(priority, tenant, share) {
                Some(victim) => {
                    let position = self.queue.queue(lane).inputs();
                    let retry_after = self.retry_hint(position, None);
                    drop(victim.grant.send(Err(AdmissionError::Evicted { retry_after })));
                }
                None => return Err(full(self)),
            }
        }
        Ok(())
    }

    fn snapshot(&self, change: Option<Change>) -> Snapshot {
        Snapshot {
            limits: self.limits,
            effective_limit: self.effective_limit(),
            in_flight: self.in_flight,
            in_flight_tokens: self.in_flight_tokens,
            queued: Priority::ALL.map(|priority| self.queue.inputs_of(priority)),
            chars_per_token: self.tokens.chars_per_token(),
            standing_queue: self.standing.standing(),
            device_time_cap: self.device_time_cap(),
            batch_line: self.ingest_gate.line(),
            ingest_places: self.ingest_gate.places_with(
                self.effective_limit(),
                self.limits.query_reserve,
                Instant::now(),
            ),
            change,
        }
    }
}

/// A queued request; leaving scope before being served takes it out of the queue.
struct Waiting {
    shared: Arc<Shared>,
    lane: Lane,
    id: u64,
    receiver: Option<oneshot::Receiver<Grant>>,
}

impl Waiting {
    fn served(&mut self) {
        self.receiver = None;
    }

    /// Leaves the queue; returns a permit granted in the meantime, if any.
    fn give_up(&mut self) -> Option<Permit> {
        let removed = {
            let mut state = self.shared.lock();
            let removed = state.queue.queue_mut(self.lane).remove(self.id);
            self.shared.notify(&state, None);
            removed
        };
        let mut receiver = self.receiver.take()?;
        if removed { None } else { receiver.try_recv().ok().and_then(Result::ok) }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.receiver.is_some() {
            // Cancelled while queued. A permit granted meanwhile is released when the receiver
            // drops, after the lock below is let go.
            let _ = self.give_up();
            self.shared.decided(self.lane, lanes::CANCELLED);
        }
    }
}

#[cfg(test)]
mod device_time_tests;
#[cfg(test)]
mod gpu_share_tests;
#[cfg(test)]
mod lane_tests;
#[cfg(test)]
mod tenant_gate_tests;
#[cfg(test)]
mod tests;
