//! Which calls of either front wait at their pool's door (`crate::gate::door`), and going
//! through it: one rule for a gRPC call and an HTTP request alike, so a client's protocol does not
//! decide whether it is held or refused into a resend loop.

use tokio::time::Instant;

use crate::admission::{AdmissionError, Priority};
use crate::error::Error;
use crate::forward::pools::Pool;
use crate::gate::door::{self, ConnectionId, DoorRefusal, HoldBounds, Pass};
use crate::gate::request_meta::RequestMeta;
use crate::vocab::rpc::{Admit, Rpc, Shape};

/// Whether a call of `rpc` with `meta` waits at `pool`'s door when the pool is full. Patient
/// unary calls for a budget kept here (no deadline, or one of several queue timeouts:
/// `door::is_patient`) wait their turn; calls with a shorter deadline are told at once by the
/// queue whether they can be served in time. Calls a sibling spilled here (the claim checked
/// against the peer key by `Forwarder::route`) do not wait, nor do critical calls (a ceiling the
/// gate grants by identity): a connection's line is in arrival order, and a critical call must
/// not wait behind the lower-priority calls it may evict from the queue. Calls bound for another
/// pool's sidecar wait at its door instead. A call another pool's sidecar forwarded here waits
/// like any other: its hop mark is anyone's to write.
pub fn holds_at_door(rpc: &Rpc, meta: &RequestMeta, pool: &Pool) -> bool {
    rpc.shape == Shape::Unary
        && rpc.admit == Admit::Permit
        && meta.priority != Priority::Critical
        && !pool.spec.remote
        && meta.spilled_from.is_none()
        // The queue timeout in force is the spec's (limits change only with it, the pool with
        // them): no lock taken. A pool without limits yet has no queue to be patient for.
        && (meta.deadline.is_none()
            || pool.spec.limits.is_some_and(|limits| door::is_patient(meta.deadline, limits.queue_timeout, Instant::now())))
}

/// Takes the call through `pool`'s door when [`holds_at_door`] says it waits there: its pass
/// (held until the call is answered; the next call goes in when it drops), marking `meta` as
/// having come through (admission then waits for room rather than refusing it); `None` for a
/// call the door does not hold. A call whose deadline passes at the door ends as expired in the
/// queue, one the door cannot hold is refused with the door's reason.
pub async fn go_through(
    rpc: &Rpc,
    meta: &mut RequestMeta,
    pool: &Pool,
    connection: ConnectionId,
    bounds: &HoldBounds,
    arrived: Instant,
) -> Result<Option<Pass>, Error> {
    if !holds_at_door(rpc, meta, pool) {
        return Ok(None);
    }
    match pool.door.enter(&pool.admission, connection, meta.deadline, bounds).await {
        Ok(pass) => {
            meta.through_door = true;
            Ok(Some(pass))
        }
        Err(DoorRefusal::Deadline) => Err(Error::Admission {
            pool: pool.spec.name.clone(),
            source: AdmissionError::DeadlineExpired { waited: arrived.elapsed() },
        }),
        Err(source) => Err(Error::Door { pool: pool.spec.name.clone(), source }),
    }
}
