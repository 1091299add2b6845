//! Whether a connection is idle: calls open on it (an HTTP request until its answer's last byte
//! is sent, a gRPC stream until its call's task ends), and since when none has been. A connection
//! idle past its port's idle timeout is closed, so connections nobody uses do not keep places
//! under the port's cap: HTTP/2 sends no keep-alive timer of its own, and hyper's header timeout
//! closes only idle HTTP/1.1 connections.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

/// One connection's calls open, and when the last one ended.
pub struct Busy {
    open: AtomicUsize,
    /// Milliseconds from `born` to the end of the last call (0: none yet).
    idle_since: AtomicU64,
    born: Instant,
}

impl Default for Busy {
    fn default() -> Self {
        Self::new()
    }
}

impl Busy {
    /// A connection just accepted: idle from now.
    pub fn new() -> Self {
        Self { open: AtomicUsize::new(0), idle_since: AtomicU64::new(0), born: Instant::now() }
    }

    /// A call opened; it is open until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Ordering::AcqRel);
        Open(self.clone())
    }

    /// Resolves once the connection has had no call open for `timeout`. Wakes once a `timeout`
    /// at most, whatever the connection does meanwhile.
    pub async fn idle_for(&self, timeout: Duration) {
        loop {
            let now = Instant::now();
            let until = match self.open.load(Ordering::Acquire) {
                0 => self.born + Duration::from_millis(self.idle_since.load(Ordering::Acquire)) + timeout,
                _ => now + timeout,
            };
            if until <= now {
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }
}

/// A call open on a connection.
pub struct Open(Arc<Busy>);

impl Drop for Open {
    fn drop(&mut self) {
        let busy = &self.0;
        // Written before the count goes down: whoever reads the count at 0 reads this end too.
        let since = u64::try_from(busy.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        busy.idle_since.store(since, Ordering::Release);
        busy.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body, its call open until the body is sent or dropped.
pub struct Answer {
    body: axum::body::Body,
    _open: Open,
}

impl Answer {
    pub fn new(body: axum::body::Body, open: Open) -> Self {
        Self { body, _open: open }
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_only_once_no_call_has_been_open_for_the_timeout() {
        let timeout = Duration::from_millis(100);
        let busy = Arc::new(Busy::new());
        let call = busy.enter();
        let idle = tokio::time::timeout(timeout * 3, busy.idle_for(timeout)).await;
        assert!(idle.is_err(), "a call open keeps the connection busy");
        drop(call);
        let ended = Instant::now();
        busy.idle_for(timeout).await;
        assert!(ended.elapsed() >= timeout, "idle a timeout after the last call ended, not before");
    }
}
