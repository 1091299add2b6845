//! Liveness tied to the health of the controller's watches.
//!
//! A watch that keeps failing (API server unreachable, credentials revoked) leaves the operator
//! alive but blind. When failures have gone on without a single successful reconciliation for
//! longer than the allowed streak, and are still arriving, `/healthz` fails so the kubelet restarts
//! the operator with fresh connections. Watches that recover on their own stop reporting errors and
//! the operator stays healthy, even when there are no pools to reconcile.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long errors must persist, uninterrupted by a success, before the operator is unhealthy.
const ALLOWED_STREAK: Duration = Duration::from_secs(120);
/// An error older than this no longer counts as "still failing".
const RECENT: Duration = Duration::from_secs(45);

#[derive(Default)]
pub struct WatchHealth(Mutex<Streak>);

#[derive(Default, Clone, Copy)]
struct Streak {
    first_error: Option<Instant>,
    last_error: Option<Instant>,
}

impl WatchHealth {
    pub fn success(&self) {
        *self.lock() = Streak::default();
    }

    pub fn error(&self, at: Instant) {
        let mut streak = self.lock();
        streak.first_error.get_or_insert(at);
        streak.last_error = Some(at);
    }

    pub fn healthy(&self, now: Instant) -> bool {
        let streak = *self.lock();
        match (streak.first_error, streak.last_error) {
            (Some(first), Some(last)) => {
                now.saturating_duration_since(first) < ALLOWED_STREAK || now.saturating_duration_since(last) > RECENT
            }
            _ => true,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Streak> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_without_errors() {
        assert!(WatchHealth::default().healthy(Instant::now()));
    }

    #[test]
    fn a_short_error_streak_is_tolerated() {
        let health = WatchHealth::default();
        let start = Instant::now();
        health.error(start);
        health.error(start + Duration::from_secs(60));
        assert!(health.healthy(start + Duration::from_secs(61)));
    }

    #[test]
    fn a_long_ongoing_error_streak_is_unhealthy() {
        let health = WatchHealth::default();
        let start = Instant::now();
        health.error(start);
        health.error(start + Duration::from_secs(130));
        assert!(!health.healthy(start + Duration::from_secs(131)));
    }

    #[test]
    fn errors_that_stopped_arriving_mean_the_watch_recovered() {
        let health = WatchHealth::default();
        let start = Instant::now();
        health.error(start);
        assert!(health.healthy(start + Duration::from_secs(200)));
    }

    #[test]
    fn a_success_ends_the_streak() {
        let health = WatchHealth::default();
        let start = Instant::now();
        health.error(start);
        health.success();
        health.error(start + Duration::from_secs(130));
        assert!(health.healthy(start + Duration::from_secs(131)));
    }
}
