//! The waiters of one pool: a FIFO per priority class.

use std::collections::VecDeque;

use tokio::sync::oneshot;

use super::Permit;
use super::priority::Priority;

pub(super) struct Waiter {
    pub id: u64,
    pub grant: oneshot::Sender<Permit>,
}

#[derive(Default)]
pub(super) struct WaitQueue {
    classes: [VecDeque<Waiter>; 3],
    next_id: u64,
}

impl WaitQueue {
    pub fn len(&self) -> usize {
        self.classes.iter().map(VecDeque::len).sum()
    }

    pub fn len_of(&self, priority: Priority) -> usize {
        self.classes[priority.rank()].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waiters that would be served before a new arrival of `priority`.
    pub fn ahead_of(&self, priority: Priority) -> usize {
        self.classes[..=priority.rank()].iter().map(VecDeque::len).sum()
    }

    pub fn push(&mut self, priority: Priority, grant: oneshot::Sender<Permit>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.classes[priority.rank()].push_back(Waiter { id, grant });
        id
    }

    /// The next waiter to serve: highest priority, oldest first.
    pub fn pop_next(&mut self) -> Option<Waiter> {
        self.classes.iter_mut().find_map(VecDeque::pop_front)
    }

    /// Removes a waiter that gave up; false when it was already served or evicted.
    pub fn remove(&mut self, priority: Priority, id: u64) -> bool {
        let class = &mut self.classes[priority.rank()];
        match class.iter().position(|w| w.id == id) {
            Some(index) => class.remove(index).is_some(),
            None => false,
        }
    }

    /// Takes out the newest waiter of the lowest class strictly below `priority`, to make room.
    pub fn evict_below(&mut self, priority: Priority) -> Option<(Priority, Waiter)> {
        Priority::ALL
            .iter()
            .rev()
            .filter(|class| class.rank() > priority.rank())
            .find_map(|class| self.classes[class.rank()].pop_back().map(|w| (*class, w)))
    }

    /// Takes out the newest waiter of the lowest non-empty class.
    pub fn evict_lowest(&mut self) -> Option<(Priority, Waiter)> {
        Priority::ALL.iter().rev().find_map(|class| self.classes[class.rank()].pop_back().map(|w| (*class, w)))
    }
}
