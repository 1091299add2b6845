//! The waiters of one pool: one class per priority, served highest class first; within a class,
//! tenants share by weight (weighted fair queuing on virtual finish tags, in the budget's units),
//! FIFO within a tenant.
//!
//! A waiter's tag is `max(virtual time, its tenant's last tag) + cost / weight`; the class serves
//! the smallest tag (the tenant's oldest waiter) and advances its virtual time to it. A tenant that floods only pushes its own
//! tags further out, so a light tenant arriving later is served next. When the queue is full, the
//! tenant holding the most queue per weight gives up its newest waiter.

use std::collections::{BTreeMap, HashMap, VecDeque};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::priority::Priority;
use super::tenants::TenantId;
use super::{AdmissionError, Cost, Permit};

/// What a waiter is told: its permit, or why it will not get one.
pub(super) type Grant = Result<Permit, AdmissionError>;

/// Tag units per unit of cost at weight 1: keeps integer tags exact for weights up to 1000s.
const SCALE: u64 = 1 << 20;

pub(super) struct Waiter {
    pub id: u64,
    pub tenant: TenantId,
    pub cost: Cost,
    pub enqueued: Instant,
    pub grant: oneshot::Sender<Grant>,
}

/// A turn in a class: `(tag, sequence)`, ordered by tag.
type Turn = (u64, u64);

/// One tenant's waiters in one class, in arrival order, and its turns (one per waiter).
#[derive(Default)]
struct TenantQueue {
    waiters: VecDeque<Waiter>,
    turns: VecDeque<Turn>,
    inputs: usize,
    weight: u32,
    last_tag: u64,
}

#[derive(Default)]
struct Class {
    /// Every tenant's turns, smallest tag first: whose turn it is.
    turns: BTreeMap<Turn, TenantId>,
    tenants: HashMap<TenantId, TenantQueue>,
    virtual_time: u64,
    inputs: usize,
}

impl Class {
    /// Takes `waiter` out of its tenant's accounting, with its tenant's last turn.
    fn account_removed(&mut self, tenant: TenantId, inputs: usize) {
        self.inputs -= inputs;
        let Some(queue) = self.tenants.get_mut(&tenant) else { return };
        queue.inputs -= inputs;
        if let Some(turn) = queue.turns.pop_back() {
            self.turns.remove(&turn);
        }
        queue.last_tag = queue.turns.back().map_or(self.virtual_time, |turn| turn.0);
    }

    fn remove_waiter(&mut self, tenant: TenantId, id: u64) -> Option<Waiter> {
        let queue = self.tenants.get_mut(&tenant)?;
        let at = queue.waiters.iter().position(|w| w.id == id)?;
        let waiter = queue.waiters.remove(at)?;
        self.account_removed(tenant, waiter.cost.inputs as usize);
        Some(waiter)
    }

    fn remove_newest(&mut self, tenant: TenantId) -> Option<Waiter> {
        let waiter = self.tenants.get_mut(&tenant)?.waiters.pop_back()?;
        self.account_removed(tenant, waiter.cost.inputs as usize);
        Some(waiter)
    }

    /// The tenant with the most queued inputs per weight, and that share.
    fn heaviest(&self) -> Option<(TenantId, f64)> {
        self.tenants
            .iter()
            .filter(|(_, t)| t.inputs > 0)
            .map(|(id, t)| (*id, t.inputs as f64 / f64::from(t.weight)))
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
    }

    /// Whose turn it is, and that tenant's oldest waiter.
    fn next(&self) -> Option<&Waiter> {
        let tenant = self.turns.values().next()?;
        self.tenants.get(tenant)?.waiters.front()
    }

    /// The oldest waiter of the tenant, other than `crowd`, whose turn comes first.
    fn next_besides(&self, crowd: TenantId) -> Option<(Turn, TenantId)> {
        self.tenants
            .iter()
            .filter(|(id, _)| **id != crowd)
            .filter_map(|(id, queue)| Some((*queue.turns.front()?, *id)))
            .min()
    }

    /// Whether the tenant whose turn it is holds more than half of the class's queued inputs.
    fn crowding_head(&self) -> Option<TenantId> {
        let tenant = *self.turns.values().next()?;
        let inputs = self.tenants.get(&tenant)?.inputs;
        (2 * inputs > self.inputs).then_some(tenant)
    }

    fn pop(&mut self) -> Option<Waiter> {
        let (turn, tenant) = self.turns.pop_first()?;
        self.serve(turn, tenant)
    }

    /// Serves `tenant`'s oldest waiter, whose turn is `turn` (not necessarily the class's first).
    fn serve(&mut self, turn: Turn, tenant: TenantId) -> Option<Waiter> {
        self.turns.remove(&turn);
        self.virtual_time = self.virtual_time.max(turn.0);
        let queue = self.tenants.get_mut(&tenant)?;
        queue.turns.pop_front();
        let waiter = queue.waiters.pop_front()?;
        debug_assert_eq!(waiter.tenant, tenant, "a turn serves its own tenant");
        queue.inputs -= waiter.cost.inputs as usize;
        self.inputs -= waiter.cost.inputs as usize;
        Some(waiter)
    }
}

#[derive(Default)]
pub(super) struct WaitQueue {
    classes: [Class; 3],
    /// Where each waiter is: its class and tenant.
    index: HashMap<u64, (Priority, TenantId)>,
    next_id: u64,
}

impl WaitQueue {
    /// Waiters.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Inputs per waiter, rounded up (1 when empty): how much one turn takes.
    pub fn mean_cost(&self) -> usize {
        self.inputs().div_ceil(self.index.len().max(1)).max(1)
    }

    /// Queued inputs, in all classes.
    pub fn inputs(&self) -> usize {
        self.classes.iter().map(|c| c.inputs).sum()
    }

    pub fn inputs_of(&self, priority: Priority) -> usize {
        self.classes[priority.rank()].inputs
    }

    /// Inputs that would be served before a newcomer of `tenant` (weight `weight`, `cost`) in class
    /// `priority`: every higher class, and in its own class each tenant's queue up to the point
    /// where fair sharing reaches the newcomer.
    pub fn ahead_of(&self, priority: Priority, tenant: TenantId, weight: u32, cost: Cost) -> usize {
        let higher: usize = self.classes[..priority.rank()].iter().map(|c| c.inputs).sum();
        let class = &self.classes[priority.rank()];
        let own = class.tenants.get(&tenant).map_or(0, |t| t.inputs);
        let rounds = (own + cost.inputs as usize) as f64 / f64::from(weight.max(1));
        let others: usize = class
            .tenants
            .iter()
            .filter(|(id, _)| **id != tenant)
            .map(|(_, t)| t.inputs.min((rounds * f64::from(t.weight)).ceil() as usize))
            .sum();
        higher + own + others
    }

    /// Queues a waiter; `units` is its cost in the unit fairness is measured in.
    pub fn push(
        &mut self,
        priority: Priority,
        tenant: TenantId,
        weight: u32,
        cost: Cost,
        units: u64,
        grant: oneshot::Sender<Grant>,
    ) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let class = &mut self.classes[priority.rank()];
        let queue = class.tenants.entry(tenant).or_default();
        queue.weight = weight.max(1);
        let tag = class.virtual_time.max(queue.last_tag) + units.max(1) * SCALE / u64::from(queue.weight);
        queue.last_tag = tag;
        queue.turns.push_back((tag, id));
        queue.inputs += cost.inputs as usize;
        queue.waiters.push_back(Waiter { id, tenant, cost, enqueued: Instant::now(), grant });
        class.inputs += cost.inputs as usize;
        class.turns.insert((tag, id), tenant);
        self.index.insert(id, (priority, tenant));
        id
    }

    fn next_class(&self) -> Option<usize> {
        self.classes.iter().position(|class| !class.turns.is_empty())
    }

    /// The waiter to serve next: highest class first; within it the tenant whose turn it is, and
    /// its oldest waiter.
    pub fn peek_next(&self) -> Option<&Waiter> {
        self.classes[self.next_class()?].next()
    }

    pub fn pop_next(&mut self) -> Option<Waiter> {
        let rank = self.next_class()?;
        let waiter = self.classes[rank].pop()?;
        self.index.remove(&waiter.id);
        Some(waiter)
    }

    /// The tenant whose turn it is in the highest non-empty class, when it holds more than half of
    /// that class's queued inputs: the crowd (see `tenant_gate`).
    pub fn crowding_head(&self) -> Option<TenantId> {
        self.classes[self.next_class()?].crowding_head()
    }

    /// The next waiter of the highest non-empty class that is not `crowd`'s.
    pub fn peek_next_besides(&self, crowd: TenantId) -> Option<&Waiter> {
        let class = &self.classes[self.next_class()?];
        let (_, tenant) = class.next_besides(crowd)?;
        class.tenants.get(&tenant)?.waiters.front()
    }

    pub fn pop_next_besides(&mut self, crowd: TenantId) -> Option<Waiter> {
        let class = &mut self.classes[self.next_class()?];
        let (turn, tenant) = class.next_besides(crowd)?;
        let waiter = class.serve(turn, tenant)?;
        self.index.remove(&waiter.id);
        Some(waiter)
    }

    /// When the oldest waiter of the highest non-empty class arrived.
    pub fn oldest(&self) -> Option<Instant> {
        let class = &self.classes[self.next_class()?];
        class.tenants.values().filter_map(|t| t.waiters.front()).map(|w| w.enqueued).min()
    }

    /// Removes a waiter that gave up; false when it was already served or evicted.
    pub fn remove(&mut self, id: u64) -> bool {
        let Some((priority, tenant)) = self.index.remove(&id) else { return false };
        self.classes[priority.rank()].remove_waiter(tenant, id).is_some()
    }

    /// Makes room for a newcomer of `priority` and `tenant` (whose queued inputs per weight would
    /// be `share` once it joined): takes out the newest waiter of the heaviest tenant of the lowest
    /// class below `priority`, or else of a heavier tenant in the newcomer's own class. `None`
    /// when the newcomer itself is the one that should give way.
    pub fn evict_for(&mut self, priority: Priority, tenant: TenantId, share: f64) -> Option<Waiter> {
        let lower = Priority::ALL.iter().rev().filter(|class| class.rank() > priority.rank());
        for class in lower {
            if let Some(waiter) = self.evict_heaviest(*class) {
                return Some(waiter);
            }
        }
        let (heaviest, heaviest_share) = self.classes[priority.rank()].heaviest()?;
        if heaviest == tenant || heaviest_share <= share {
            return None;
        }
        self.evict_heaviest(priority)
    }

    /// Takes out the newest waiter of the heaviest tenant of the lowest non-empty class.
    pub fn evict_lowest(&mut self) -> Option<Waiter> {
        Priority::ALL.iter().rev().find_map(|class| self.evict_heaviest(*class))
    }

    fn evict_heaviest(&mut self, priority: Priority) -> Option<Waiter> {
        let class = &mut self.classes[priority.rank()];
        let (tenant, _) = class.heaviest()?;
        let waiter = class.remove_newest(tenant)?;
        self.index.remove(&waiter.id);
        Some(waiter)
    }

    /// Queued inputs of `tenant` in class `priority`.
    pub fn inputs_of_tenant(&self, priority: Priority, tenant: TenantId) -> usize {
        self.classes[priority.rank()].tenants.get(&tenant).map_or(0, |t| t.inputs)
    }

    /// Forgets tenants with nothing queued and no turn ahead of the class, so the per-class maps
    /// stay as small as the set of tenants that are waiting.
    pub fn forget_idle_tenants(&mut self) {
        for class in &mut self.classes {
            let virtual_time = class.virtual_time;
            class.tenants.retain(|_, t| !t.waiters.is_empty() || t.last_tag > virtual_time);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(queue: &mut WaitQueue, priority: Priority, tenant: u32, weight: u32) -> u64 {
        let (grant, _) = oneshot::channel();
        queue.push(priority, TenantId(tenant), weight, Cost::ONE, 1, grant)
    }

    fn serve_order(queue: &mut WaitQueue) -> Vec<u32> {
        std::iter::from_fn(|| queue.pop_next()).map(|w| w.tenant.0).collect()
    }

    #[test]
    fn a_flooding_tenant_does_not_delay_a_light_one() {
        let mut queue = WaitQueue::default();
        for _ in 0..10 {
            push(&mut queue, Priority::Standard, 1, 1);
        }
        push(&mut queue, Priority::Standard, 2, 1);
        let order = serve_order(&mut queue);
        assert_eq!(&order[..2], &[1, 2], "the light tenant goes second, not eleventh: {order:?}");
    }

    #[test]
    fn weights_share_the_service() {
        let mut queue = WaitQueue::default();
        for _ in 0..30 {
            push(&mut queue, Priority::Standard, 1, 1);
            push(&mut queue, Priority::Standard, 2, 2);
        }
        let first: Vec<u32> = serve_order(&mut queue).into_iter().take(30).collect();
        let heavy = first.iter().filter(|t| **t == 2).count();
        assert_eq!(heavy, 20, "weight 2 gets two thirds: {first:?}");
    }

    #[test]
    fn priority_comes_before_fairness() {
        let mut queue = WaitQueue::default();
        push(&mut queue, Priority::Sheddable, 1, 100);
        push(&mut queue, Priority::Standard, 2, 1);
        push(&mut queue, Priority::Critical, 3, 1);
        assert_eq!(serve_order(&mut queue), [3, 2, 1]);
    }

    #[test]
    fn a_full_queue_evicts_the_heaviest_tenants_newest() {
        let mut queue = WaitQueue::default();
        let a: Vec<u64> = (0..3).map(|_| push(&mut queue, Priority::Standard, 1, 1)).collect();
        push(&mut queue, Priority::Standard, 2, 1);
        let evicted = queue.evict_for(Priority::Standard, TenantId(2), 2.0).unwrap();
        assert_eq!(evicted.id, a[2], "the flood's newest");
        assert!(queue.evict_for(Priority::Standard, TenantId(1), 3.0).is_none(), "the flood sheds itself");
        push(&mut queue, Priority::Sheddable, 3, 1);
        assert_eq!(
            queue.evict_for(Priority::Standard, TenantId(1), 3.0).unwrap().tenant,
            TenantId(3),
            "lower class first"
        );
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.inputs(), 3);
    }

    #[test]
    fn another_tenant_can_be_served_past_the_crowd() {
        let mut queue = WaitQueue::default();
        for _ in 0..6 {
            push(&mut queue, Priority::Standard, 1, 1);
        }
        assert_eq!(queue.crowding_head(), Some(TenantId(1)));
        assert!(queue.peek_next_besides(TenantId(1)).is_none(), "nobody else waits");
        push(&mut queue, Priority::Standard, 2, 1);
        push(&mut queue, Priority::Standard, 2, 1);
        push(&mut queue, Priority::Sheddable, 3, 1);
        assert_eq!(queue.peek_next_besides(TenantId(1)).map(|w| w.tenant), Some(TenantId(2)));
        assert_eq!(queue.pop_next_besides(TenantId(1)).map(|w| w.tenant), Some(TenantId(2)));
        assert_eq!(queue.pop_next_besides(TenantId(1)).map(|w| w.tenant), Some(TenantId(2)));
        assert!(queue.pop_next_besides(TenantId(1)).is_none(), "a lower priority never passes");
        assert_eq!((queue.len(), queue.inputs(), queue.inputs_of(Priority::Standard)), (7, 7, 6));
        assert_eq!(serve_order(&mut queue), [1, 1, 1, 1, 1, 1, 3], "the crowd's turns stay in order");
    }

    #[test]
    fn a_tenant_holding_half_or_less_does_not_crowd() {
        let mut queue = WaitQueue::default();
        push(&mut queue, Priority::Standard, 1, 1);
        push(&mut queue, Priority::Standard, 2, 1);
        assert_eq!(queue.crowding_head(), None, "half each");
        push(&mut queue, Priority::Standard, 2, 1);
        assert_eq!(queue.crowding_head(), None, "tenant 1's turn, and it holds a third");
        queue.pop_next();
        assert_eq!(queue.crowding_head(), Some(TenantId(2)));
    }

    #[test]
    fn removal_and_counts_stay_consistent() {
        let mut queue = WaitQueue::default();
        let id = push(&mut queue, Priority::Standard, 1, 1);
        push(&mut queue, Priority::Critical, 2, 1);
        assert!(queue.remove(id));
        assert!(!queue.remove(id), "only once");
        assert_eq!((queue.len(), queue.inputs(), queue.inputs_of(Priority::Critical)), (1, 1, 1));
        assert_eq!(queue.ahead_of(Priority::Standard, TenantId(1), 1, Cost::ONE), 1);
        assert_eq!(queue.ahead_of(Priority::Critical, TenantId(1), 1, Cost::ONE), 1, "the other critical tenant");
        queue.pop_next();
        queue.forget_idle_tenants();
        assert!(queue.is_empty());
    }
}
