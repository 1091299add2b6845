//! The other ready replicas of this sidecar's own pool, and how much of their budget this
//! sidecar may use when its own is full: calls spill to a sibling with room instead of queueing
//! here, so a client pinned to one replica (one HTTP/2 connection through a ClusterIP Service)
//! gets the whole pool.
//!
//! A sibling admits a spilled call under its own budget, so the budget holds pool-wide and a call
//! is admitted exactly once; it lets a spilled call wait briefly, in line with its own callers,
//! and otherwise refuses it, and this side serves it instead. This side keeps a window per
//! sibling, like TCP's: how many inputs it may have spilled there at once. It starts at the
//! sibling's share and as many again ([`window_cap`]: one answer's round trip is idle time for
//! the sibling's TEI unless the next call already waits there), each answer gives its inputs back and
//! widens the window by one up to that cap; a refusal (the sibling's own callers took the room)
//! shrinks it to what is still out there, and after [`PROBE_AFTER`] one input is tried again.
//! Waiting calls are woken when room opens at a sibling.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use teifleet_wire::headers::SPILL_REFUSED as SPILL_REFUSED_HEADER;

use crate::error::{Error, is_transport_failure};
use crate::forward::upstream::{Dialer, Upstream};
use crate::gate::peer::PeerKey;
use crate::vocab::SetupError;

/// How long a sibling that refused a spill is left alone before one input is tried again;
/// doubled for each refusal in a row (a sibling that is gone, or full for long), up to
/// [`PROBE_AFTER_AT_MOST`].
pub const PROBE_AFTER: Duration = Duration::from_millis(50);
pub const PROBE_AFTER_AT_MOST: Duration = Duration::from_secs(5);

/// The most inputs spilled to one sibling at once: its share, and as many again waiting there
/// (each at most about one service time), so its TEI never idles for the round trip between an
/// answer and the next spilled call, however slow this side is to send it.
pub fn window_cap(share: usize) -> usize {
    share + share.max(2)
}

/// How long connecting to a sibling may take: replicas share the cluster network, and a call
/// waiting on a sibling that does not answer is a call not served here meanwhile.
const CONNECT_WITHIN: Duration = Duration::from_millis(250);

/// Replicas of the own pool this sidecar may spill to.
#[derive(Default)]
pub struct Siblings {
    state: Mutex<State>,
    /// Woken whenever a window opens: calls waiting in the queue try to spill then.
    room: Notify,
    dialer: Dialer,
    /// What proves a spill to a sibling, and a spill from one, is a sibling's
    /// (`crate::gate::peer`); it also signs what the pool's cache writes to its shared store.
    peer_key: Arc<PeerKey>,
}

#[derive(Default)]
struct State {
    /// By the sibling's gRPC URL.
    siblings: BTreeMap<String, Sibling>,
    /// Inputs a sibling takes at once when it has nobody else's calls: this replica's share.
    share: usize,
}

struct Sibling {
    upstream: Upstream,
    /// Inputs this sidecar may have spilled there at once.
    window: usize,
    /// Inputs spilled there now.
    out: usize,
    /// The sibling left the pool: its leases finish, nothing new goes there.
    gone: bool,
    /// Refusals since its last answer.
    refusals: u32,
}

/// The right to send one call's inputs to a sibling; dropping it gives them back.
pub struct Lease {
    siblings: Arc<Siblings>,
    url: String,
    upstream: Upstream,
    inputs: usize,
    ended: Mutex<Ended>,
}

/// How a spilled call ended at its sibling: what the window learns from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Served there.
    Answered,
    /// Refused for room: the sibling is there, and busy with its own callers.
    Busy,
    /// Unreachable, draining, its TEI gone, or the call cut off there: left alone a while, longer
    /// each time in a row.
    Gone,
}

impl Ended {
    /// The `result` label of `teifleet_spills_total`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Answered => "served",
            Self::Busy => "refused",
            Self::Gone => "unreachable",
        }
    }
}

impl Siblings {
    /// No siblings yet, reached through `dialer` once there are.
    pub fn new(dialer: Dialer) -> Self {
        Self { dialer, ..Self::default() }
    }

    /// The pool's peer key: spills carry it, and a spilled call is believed only with it.
    pub fn peer_key(&self) -> &Arc<PeerKey> {
        &self.peer_key
    }

    /// Makes the set of siblings `urls` (each one's gRPC URL). A sibling that stays keeps its
    /// window; one that goes finishes the calls it has.
    pub fn sync(self: &Arc<Self>, urls: &[String]) -> Result<(), SetupError> {
        let mut state = self.lock();
        for (url, sibling) in &mut state.siblings {
            sibling.gone = !urls.contains(url);
        }
        for url in urls {
            if !state.siblings.contains_key(url) {
                let upstream = Upstream::lazy_within(url, &self.dialer, CONNECT_WITHIN)?;
                // A whole window, once the first lease says what a share is.
                let sibling = Sibling { upstream, window: usize::MAX, out: 0, gone: false, refusals: 0 };
                state.siblings.insert(url.clone(), sibling);
            }
        }
        state.siblings.retain(|_, sibling| !sibling.gone || sibling.out > 0);
        drop(state);
        self.room.notify_waiters();
        Ok(())
    }

    /// Inputs the siblings take at once as far as their windows say: how much faster than this
    /// replica alone its queue drains.
    pub fn slots(&self) -> usize {
        let state = self.lock();
        let cap = window_cap(state.share);
        state.siblings.values().filter(|sibling| !sibling.gone).map(|sibling| sibling.window.min(cap)).sum()
    }

    /// A lease on the sibling with the most room for `inputs`, if one has it. `share` is this
    /// replica's share of the pool's budget, and so each sibling's: no window grows past
    /// [`window_cap`] of it.
    pub fn try_lease(self: &Arc<Self>, inputs: usize, share: usize) -> Option<Lease> {
        let mut state = self.lock();
        state.share = share;
        let cap = window_cap(share);
        state.siblings.values_mut().for_each(|sibling| sibling.window = sibling.window.min(cap));
        let (url, sibling) = state
            .siblings
            .iter_mut()
            // A sibling with nothing out takes one call larger than its window (never past the
            // cap) while that is not closed: a bulk call's sub-batch may be larger than a window
            // halved by a refusal, and a window grows back only with answers.
            .filter(|(_, sibling)| {
                !sibling.gone
                    && (sibling.out + inputs <= sibling.window
                        || (sibling.out == 0 && sibling.window > 0 && inputs <= cap))
            })
            .max_by_key(|(_, sibling)| sibling.window - sibling.out)?;
        sibling.out += inputs;
        let (url, upstream) = (url.clone(), sibling.upstream.clone());
        Some(Lease { siblings: self.clone(), url, upstream, inputs, ended: Mutex::new(Ended::Answered) })
    }

    /// Resolves the next time room opens at a sibling, counted from this call, not from its
    /// first poll: take it before [`Self::try_lease`], so room that opens in between is not
    /// missed.
    pub fn room(&self) -> tokio::sync::futures::Notified<'_> {
        self.room.notified()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn returned(self: &Arc<Self>, url: &str, inputs: usize, ended: Ended) {
        let mut state = self.lock();
        let share = state.share;
        let Some(sibling) = state.siblings.get_mut(url) else { return };
        sibling.out = sibling.out.saturating_sub(inputs);
        match ended {
            Ended::Answered => {
                sibling.window = (sibling.window + 1).min(window_cap(share));
                sibling.refusals = 0;
            }
            // Its own callers took the room for a while: half as much, as TCP backs off.
            Ended::Busy => sibling.window = (sibling.window / 2).max(1),
            Ended::Gone => {
                sibling.window = sibling.out;
                sibling.refusals = sibling.refusals.saturating_add(1);
            }
        }
        let refused = ended != Ended::Answered;
        if sibling.gone && sibling.out == 0 {
            state.siblings.remove(url);
        } else if refused && sibling.window == 0 {
            let backoff = PROBE_AFTER.saturating_mul(1 << sibling.refusals.saturating_sub(1).min(7));
            let (siblings, url) = (Arc::downgrade(self), url.to_owned());
            tokio::spawn(async move {
                tokio::time::sleep(backoff.min(PROBE_AFTER_AT_MOST)).await;
                if let Some(siblings) = siblings.upgrade() {
                    siblings.probe(&url);
                }
            });
        }
        drop(state);
        if !refused {
            self.room.notify_waiters();
        }
    }

    fn probe(&self, url: &str) {
        let mut state = self.lock();
        if let Some(sibling) = state.siblings.get_mut(url).filter(|sibling| !sibling.gone) {
            sibling.window = sibling.window.max(sibling.out + 1);
            drop(state);
            self.room.notify_waiters();
        }
    }
}

impl Lease {
    /// The sibling's multiplexer.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The sibling's URL, for logs and metrics.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A call under this lease was not served there, for this reason (the worst of several calls
    /// under one lease counts).
    pub fn refused(&self, why: Ended) {
        let mut ended = self.ended.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *ended != Ended::Gone {
            *ended = why;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let ended = *self.ended.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.siblings.returned(&self.url, self.inputs, ended);
    }
}

/// Whether a spilled call's failure means the sibling could not serve it, and so the sender
/// serves it itself without the caller hearing of it: refused for room (`Busy`), or going away,
/// its TEI unreachable (UNAVAILABLE), the call cut off on its side (CANCELLED: the caller here is
/// still waiting, so not the caller's doing) or the sibling unreachable (`Gone`). `None`: an answer
/// for the caller (TEI's own error, a deadline), passed on as it came.
pub fn spill_ended(error: &Error) -> Option<Ended> {
    match error {
        Error::Upstream { status, .. } if status.metadata().contains_key(SPILL_REFUSED_HEADER) => Some(Ended::Busy),
        Error::Upstream { status, .. }
            if is_transport_failure(status)
                || matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Cancelled) =>
        {
            Some(Ended::Gone)
        }
        Error::Unreachable { .. } => Some(Ended::Gone),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn siblings(urls: &[&str]) -> Arc<Siblings> {
        let siblings = Arc::new(Siblings::default());
        let urls: Vec<String> = urls.iter().map(|url| (*url).to_owned()).collect();
        siblings.sync(&urls).unwrap();
        siblings
    }

    const SHARE: usize = 2;

    #[tokio::test]
    async fn leases_go_where_the_most_room_is_up_to_each_share() {
        let siblings = siblings(&["http://10.0.0.2:50051", "http://10.0.0.3:50051"]);
        let cap = window_cap(SHARE);
        let leases: Vec<Lease> = (0..2 * cap).map(|_| siblings.try_lease(1, SHARE).expect("room")).collect();
        let on_first = leases.iter().filter(|lease| lease.url().contains(".2:")).count();
        assert_eq!(on_first, cap, "spread over both");
        assert!(siblings.try_lease(1, SHARE).is_none(), "both full");
        drop(leases);
        assert!(siblings.try_lease(cap, SHARE).is_some(), "answers give the room back");
        assert!(siblings.try_lease(cap + 1, SHARE).is_none(), "never more than a window at once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sibling_that_seems_gone_is_left_alone_until_a_probe() {
        let siblings = siblings(&["http://10.0.0.2:50051"]);
        let lease = siblings.try_lease(1, SHARE).unwrap();
        lease.refused(Ended::Gone);
        drop(lease);
        assert!(siblings.try_lease(1, SHARE).is_none(), "closed while it seems gone");
        let woken = siblings.room();
        tokio::time::sleep(PROBE_AFTER * 2).await;
        woken.await;
        let probe = siblings.try_lease(1, SHARE).expect("one input probes");
        assert!(siblings.try_lease(1, SHARE).is_none(), "only one");
        drop(probe);
        assert!(siblings.try_lease(2, SHARE).is_some(), "each answer widens the window by one");
    }

    #[tokio::test]
    async fn a_sibling_that_leaves_takes_no_new_calls_and_finishes_its_own() {
        let siblings = siblings(&["http://10.0.0.2:50051"]);
        let lease = siblings.try_lease(1, SHARE).unwrap();
        siblings.sync(&[]).unwrap();
        assert_eq!(siblings.slots(), 0);
        assert!(siblings.try_lease(1, SHARE).is_none());
        drop(lease);
        assert!(siblings.lock().siblings.is_empty(), "forgotten once its calls are back");
    }

    #[tokio::test]
    async fn a_busy_sibling_halves_the_window() {
        let siblings = siblings(&["http://10.0.0.2:50051"]);
        let cap = window_cap(SHARE);
        let leases: Vec<Lease> = (0..cap).map(|_| siblings.try_lease(1, SHARE).unwrap()).collect();
        // The last answer is the refusal: the others widened the window back to its cap first.
        leases[cap - 1].refused(Ended::Busy);
        drop(leases);
        assert_eq!(siblings.slots(), cap / 2, "half the window");
        let half = siblings.try_lease(cap / 2, SHARE).expect("and no pause: the sibling is there");
        assert!(siblings.try_lease(1, SHARE).is_none(), "the halved window is full");
        drop(half);
        let larger = siblings.try_lease(cap / 2 + 1, SHARE);
        assert!(
            larger.is_some(),
            "nothing out: one call larger than the window, so a sub-batch is not shut out for good"
        );
        assert!(siblings.try_lease(1, SHARE).is_none(), "and only one");
    }
}
