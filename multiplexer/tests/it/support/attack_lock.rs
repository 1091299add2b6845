//! One attack at a time in the test process: each test that measures a steady caller's p99 beside
//! an attack holds this for its whole run, so that two attacks (cargo runs tests two at a time)
//! never share the machine's cores, and the p99 bound measures the sidecar, not the
//! neighbouring test.

use std::sync::{Mutex, MutexGuard};

static ATTACK: Mutex<()> = Mutex::new(());

/// A test's turn to attack, until dropped. Held across awaits on purpose: it guards no data, only
/// the turn, and the other tests wait for it on their own threads (cargo's test threads).
#[must_use = "the turn ends when this is dropped"]
pub struct AttackTurn {
    _turn: MutexGuard<'static, ()>,
}

/// Waits for the other attacks to end. A test that failed while holding the turn poisons the
/// lock; the next one takes it all the same (nothing is guarded but the turn).
pub fn attack_lock() -> AttackTurn {
    AttackTurn { _turn: ATTACK.lock().unwrap_or_else(std::sync::PoisonError::into_inner) }
}
