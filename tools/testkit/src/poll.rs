//! Waiting for a condition with a deadline, instead of sleeping for a guessed time.
//!
//! Uses Tokio's clock, so tests with paused time advance through the pauses.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, Result};

/// How often [`until`] looks: in-process state is cheap to read, and tests react to it quickly.
pub const LOCAL_INTERVAL: Duration = Duration::from_millis(10);
/// How often [`eventually`] looks: its checks usually ask a server (an API server, an admin port),
/// which should not be flooded.
pub const REMOTE_INTERVAL: Duration = Duration::from_millis(100);

/// Polls `check` until it holds, panicking with `what` after `timeout`.
pub async fn until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let polled = poll(what, timeout, LOCAL_INTERVAL, || std::future::ready(check().then_some(()))).await;
    polled.unwrap_or_else(|error| panic!("{error}"));
}

/// Polls the async `check` until it yields a value, panicking with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    try_eventually(what, timeout, check).await.unwrap_or_else(|error| panic!("{error}"))
}

/// [`eventually`] that reports the timeout as [`Error::TimedOut`] instead of panicking.
pub async fn try_eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(what, timeout, REMOTE_INTERVAL, check).await
}

async fn poll<T, F, Fut>(what: &str, timeout: Duration, interval: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::TimedOut { what: what.to_owned(), timeout });
        }
        // One last look right at the deadline rather than a sleep past it.
        tokio::time::sleep(interval.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_first_value_once_the_check_holds() {
        let calls = AtomicU32::new(0);
        let value = eventually("the third look", Duration::from_secs(5), || {
            let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
            async move { (n == 3).then_some(n * 10) }
        })
        .await;
        assert_eq!(value, 30);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_names_what_was_awaited() {
        let error =
            try_eventually("a pool to be ready", Duration::from_secs(2), || async { None::<()> }).await.unwrap_err();
        assert_eq!(error.to_string(), "timed out after 2s waiting for a pool to be ready");
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 1s waiting for nothing")]
    async fn until_panics_at_the_deadline() {
        until("nothing", Duration::from_secs(1), || false).await;
    }

    #[tokio::test(start_paused = true)]
    async fn until_returns_when_the_state_changes() {
        let started = Instant::now();
        until("a second to pass", Duration::from_secs(5), || started.elapsed() >= Duration::from_secs(1)).await;
        assert!(started.elapsed() < Duration::from_millis(1100));
    }
}
