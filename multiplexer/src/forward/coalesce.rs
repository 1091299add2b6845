//! Identical unary calls in flight at the same time share one upstream call and one permit.
//!
//! Calls are identical when they have the same path, the same priority, the same request bytes
//! and the same caller (the pool is already chosen: each pool has its own coalescer): a caller
//! only ever joins a call made with its own key and tenant, so an answer never reaches anyone
//! whom the pool's gate would not have let in. Only the pool's own sidecars coalesce, after that
//! gate: a call routed on to another pool is that pool's to check. The first caller leads:
//! its call is admitted and sent upstream as a shared future; later callers join it and every one
//! of them gets the answer or the error. Each caller keeps its own deadline and can leave on its
//! own; the shared call is dropped (its permit released, its upstream stream reset) only when the
//! last caller has left. The table holds the shared call weakly, so a call nobody waits for
//! disappears with its last caller.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared, WeakShared};
use tokio::time::Instant;
use tonic::metadata::MetadataMap;

use crate::admission::{AdmissionError, Priority};
use crate::error::Error;
use crate::vocab::framing::Framed;

/// What identical calls have in common.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub path: &'static str,
    pub priority: Priority,
    pub request: Framed,
    /// Who asks: the caller's `authorization` and tenant, as the gate left them.
    pub caller: Caller,
}

/// The headers that say who a caller is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caller {
    pub authorization: Option<http::HeaderValue>,
    pub tenant: Option<http::HeaderValue>,
}

impl Caller {
    pub fn of(headers: &http::HeaderMap) -> Self {
        Self {
            authorization: headers.get(http::header::AUTHORIZATION).cloned(),
            tenant: headers.get(teifleet_wire::headers::TENANT).cloned(),
        }
    }
}

/// The upstream's answer to a shared call, and when the call was admitted.
#[derive(Debug)]
pub struct Answer {
    pub metadata: MetadataMap,
    pub message: Framed,
    pub admitted: Instant,
}

pub type SharedAnswer = Shared<BoxFuture<'static, Result<Arc<Answer>, Error>>>;

/// How a caller takes part in a shared call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    /// Joined a call led by a caller whose deadline was this.
    Follower {
        leader_deadline: Option<Instant>,
    },
}

#[derive(Default)]
pub struct Coalescer {
    calls: Mutex<HashMap<Key, Entry>>,
    next_id: AtomicU64,
}

struct Entry {
    id: u64,
    deadline: Option<Instant>,
    answer: WeakShared<BoxFuture<'static, Result<Arc<Answer>, Error>>>,
}

impl Coalescer {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Joins the identical call in flight, or starts `lead` as the shared call for `key`.
    pub fn join_or_lead<F>(self: &Arc<Self>, key: Key, deadline: Option<Instant>, lead: F) -> (SharedAnswer, Role)
    where
        F: FnOnce() -> BoxFuture<'static, Result<Arc<Answer>, Error>>,
    {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = calls.get(&key)
            && let Some(answer) = entry.answer.upgrade()
        {
            return (answer, Role::Follower { leader_deadline: entry.deadline });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let leave = Leave { coalescer: Arc::downgrade(self), key: key.clone(), id };
        let call = lead();
        let answer = async move {
            let _leave = leave;
            call.await
        }
        .boxed()
        .shared();
        let weak = answer.downgrade().expect("a shared future that was never polled is pending");
        calls.insert(key, Entry { id, deadline, answer: weak });
        (answer, Role::Leader)
    }

    /// Calls being shared right now.
    pub fn in_flight(&self) -> usize {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Whether a follower that got `error` from a call led with an earlier deadline should try again
/// on its own: the error may be the leader's deadline, not an answer that holds for everyone.
pub fn is_leaders_deadline(error: &Error, role: Role, own_deadline: Option<Instant>) -> bool {
    let Role::Follower { leader_deadline: Some(leader) } = role else { return false };
    if own_deadline.is_some_and(|own| own <= leader) {
        return false;
    }
    match error {
        Error::Admission { source, .. } => {
            matches!(source, AdmissionError::DeadlineExpired { .. } | AdmissionError::DeadlineUnmeetable { .. })
        }
        Error::Upstream { status, .. } => status.code() == tonic::Code::DeadlineExceeded,
        _ => false,
    }
}

/// Takes the shared call out of the table when it ends or when its last caller leaves.
struct Leave {
    coalescer: Weak<Coalescer>,
    key: Key,
    id: u64,
}

impl Drop for Leave {
    fn drop(&mut self) {
        let Some(coalescer) = self.coalescer.upgrade() else { return };
        let mut calls = coalescer.calls.lock().unwrap_or_else(|p| p.into_inner());
        if calls.get(&self.key).is_some_and(|entry| entry.id == self.id) {
            calls.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::*;

    fn key(text: &'static str) -> Key {
        Key {
            path: "/tei.v1.Embed/Embed",
            priority: Priority::Standard,
            request: Framed::new(text.as_bytes()),
            caller: Caller::default(),
        }
    }

    /// A shared call that counts its starts and answers when `go` is notified.
    fn lead(
        starts: &Arc<AtomicUsize>,
        go: &Arc<Notify>,
    ) -> impl FnOnce() -> BoxFuture<'static, Result<Arc<Answer>, Error>> + use<> {
        let (starts, go) = (starts.clone(), go.clone());
        move || {
            async move {
                starts.fetch_add(1, Ordering::SeqCst);
                go.notified().await;
                Ok(Arc::new(Answer {
                    metadata: MetadataMap::new(),
                    message: Framed::new(b"answer"),
                    admitted: Instant::now(),
                }))
            }
            .boxed()
        }
    }

    #[tokio::test]
    async fn identical_calls_share_one_upstream_call() {
        let coalescer = Coalescer::new();
        let (starts, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
        let (first, role) = coalescer.join_or_lead(key("a"), None, lead(&starts, &go));
        assert_eq!(role, Role::Leader);
        let (second, role) = coalescer.join_or_lead(key("a"), None, lead(&starts, &go));
        assert_eq!(role, Role::Follower { leader_deadline: None });
        let (other, role) = coalescer.join_or_lead(key("b"), None, lead(&starts, &go));
        assert_eq!(role, Role::Leader, "different bytes, different call");
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, "Bearer another-key-0123456789".parse().unwrap());
        let (stranger, role) =
            coalescer.join_or_lead(Key { caller: Caller::of(&headers), ..key("a") }, None, lead(&starts, &go));
        assert_eq!(role, Role::Leader, "another caller's identical call is not joined");
        drop(stranger);
        let waiting = tokio::spawn(async move { (first.await.unwrap(), second.await.unwrap()) });
        tokio::time::sleep(Duration::from_millis(10)).await;
        go.notify_waiters();
        let (a, b) = waiting.await.unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        drop(other);
        assert_eq!(starts.load(Ordering::SeqCst), 1, "the unpolled call for b never started");
        assert_eq!(coalescer.in_flight(), 0, "finished and abandoned calls leave the table");
    }

    #[tokio::test]
    async fn one_caller_leaving_does_not_cancel_the_others() {
        let coalescer = Coalescer::new();
        let (starts, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
        let (leader, _) = coalescer.join_or_lead(key("a"), None, lead(&starts, &go));
        let (follower, _) = coalescer.join_or_lead(key("a"), None, lead(&starts, &go));
        let leader = tokio::spawn(leader);
        let follower = tokio::spawn(follower);
        tokio::time::sleep(Duration::from_millis(10)).await;
        leader.abort();
        tokio::time::sleep(Duration::from_millis(10)).await;
        go.notify_waiters();
        assert_eq!(&follower.await.unwrap().unwrap().message[..], b"answer");
        assert_eq!(starts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_call_everyone_left_is_dropped_and_the_next_caller_leads() {
        let coalescer = Coalescer::new();
        let (starts, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
        let (only, _) = coalescer.join_or_lead(key("a"), None, lead(&starts, &go));
        let only = tokio::spawn(only);
        tokio::time::sleep(Duration::from_millis(10)).await;
        only.abort();
        let _ = only.await;
        assert_eq!(coalescer.in_flight(), 0);
        let (_next, role) = coalescer.join_or_lead(key("a"), None, lead(&starts, &go));
        assert_eq!(role, Role::Leader);
    }

    #[test]
    fn only_a_later_deadline_retries_after_the_leaders_deadline() {
        let now = Instant::now();
        let expired = Error::Admission {
            pool: "p".into(),
            source: AdmissionError::DeadlineExpired { waited: Duration::from_millis(5) },
        };
        let follower = Role::Follower { leader_deadline: Some(now) };
        assert!(is_leaders_deadline(&expired, follower, Some(now + Duration::from_secs(1))));
        assert!(is_leaders_deadline(&expired, follower, None));
        assert!(!is_leaders_deadline(&expired, follower, Some(now)));
        assert!(!is_leaders_deadline(&expired, Role::Leader, None));
        let full = Error::Admission {
            pool: "p".into(),
            source: AdmissionError::QueueFull {
                queued: 1,
                retry_after: crate::admission::Retry::After(Duration::from_millis(5)),
            },
        };
        assert!(!is_leaders_deadline(&full, follower, None), "a full queue holds for everyone");
    }
}
