//! A pool's `deviceTimeCap` through the admission queue (see `device_time`), in tokio's paused
//! time: what is measured is the time permits are held, not how fast this machine is.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::device_time::BURST;
use super::*;

fn capped(in_flight: usize, cap: Option<u8>) -> Limits {
    Limits { device_time_cap: cap, ..Limits::new(in_flight, 64, Duration::from_secs(5)) }
}

/// Holds one permit of `admission` for `busy`: TEI busy that long with one call.
async fn busy_for(admission: &Admission, busy: Duration) {
    let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    tokio::time::sleep(busy).await;
    drop(permit);
}

/// How long at least one of `spans` was open.
fn covered(mut spans: Vec<(Instant, Instant)>) -> Duration {
    spans.sort();
    let mut total = Duration::ZERO;
    let mut open: Option<(Instant, Instant)> = None;
    for (start, end) in spans {
        open = match open {
            Some((s, e)) if start <= e => Some((s, e.max(end))),
            Some((s, e)) => {
                total += e - s;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    total + open.map_or(Duration::ZERO, |(s, e)| e - s)
}

/// `callers` closed-loop callers, each holding its permit `hold`, for `run`: the share of the
/// time any permit was held, and how many calls went through.
async fn flood(admission: &Admission, callers: usize, hold: Duration, run: Duration) -> (f64, usize) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (admission, spans) = (admission.clone(), spans.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < run {
                let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
                let taken = Instant::now();
                tokio::time::sleep(hold).await;
                drop(permit);
                spans.lock().unwrap().push((taken, Instant::now()));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let spans = std::mem::take(&mut *spans.lock().unwrap());
    let calls = spans.len();
    (covered(spans).as_secs_f64() / start.elapsed().as_secs_f64(), calls)
}

#[tokio::test(start_paused = true)]
async fn a_capped_pool_keeps_tei_busy_at_most_its_cap_however_many_call() {
    let run = Duration::from_secs(4);
    let admission = Admission::new(capped(2, Some(25)));
    let (busy, calls) = flood(&admission, 8, Duration::from_millis(4), run).await;
    // The cap, plus the burst it may start with, plus the one call let in at the last moment.
    let most = 0.25 + (BURST + Duration::from_millis(4)).as_secs_f64() / run.as_secs_f64();
    assert!(busy <= most, "busy {busy:.3} of the time, cap 0.25");
    assert!(busy >= 0.24, "the cap is a ceiling, not a brake: busy {busy:.3} of the time");
    let uncapped = Admission::new(capped(2, None));
    let (busy, uncapped_calls) = flood(&uncapped, 8, Duration::from_millis(4), run).await;
    assert!(busy > 0.99, "without a cap TEI is never left idle: {busy:.3}");
    assert!(calls * 3 < uncapped_calls, "{calls} calls capped, {uncapped_calls} without");
    let snapshot = admission.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.queued_total()), (0, 0), "nothing leaks");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_held_by_the_cap_is_let_in_when_the_credit_is_back_without_any_call_returning() {
    let admission = Admission::new(capped(4, Some(25)));
    let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    // Busy 150 ms: a burst of 50 ms and 37.5 ms earned meanwhile, 62.5 ms overdrawn.
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(permit);
    let asked = Instant::now();
    assert!(admission.try_acquire(&Ask::new(Priority::Standard)).is_none(), "room, but no TEI time left");
    let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    // 62.5 ms earned back at 25 % a second.
    let waited = asked.elapsed();
    assert!(waited.abs_diff(Duration::from_millis(250)) <= Duration::from_millis(2), "{waited:?}");
    drop(permit);
}

#[tokio::test(start_paused = true)]
async fn lifting_the_cap_lets_waiters_in_at_once() {
    let admission = Admission::new(capped(4, Some(10)));
    busy_for(&admission, Duration::from_millis(200)).await;
    let waiter = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(admission.snapshot().queued_total(), 1, "held by the cap");
    admission.set_limits(capped(4, None));
    let asked = Instant::now();
    let permit = waiter.await.unwrap().unwrap();
    assert_eq!(asked.elapsed(), Duration::ZERO);
    drop(permit);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_ends_before_the_credit_is_back_is_refused_at_once() {
    let admission = Admission::new(capped(4, Some(25)));
    busy_for(&admission, Duration::from_millis(150)).await;
    // The credit is back in 250 ms: a caller with 100 ms left is told now, not at its deadline.
    let ask = Ask::new(Priority::Standard).deadline(Some(Instant::now() + Duration::from_millis(100)));
    let asked = Instant::now();
    let refused = admission.acquire(ask).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::DeadlineUnmeetable { .. }), "{refused:?}");
    assert_eq!(asked.elapsed(), Duration::ZERO);
    // One with time enough for the credit and its own call (150 ms, as the last one) waits.
    let ask = Ask::new(Priority::Standard).deadline(Some(Instant::now() + Duration::from_millis(500)));
    drop(admission.acquire(ask).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_queue_held_by_the_cap_is_expected_to_drain_at_the_caps_pace() {
    let admission = Admission::new(capped(1, Some(25)));
    // Teach a service time of 10 ms and spend the credit down to the gate.
    for _ in 0..3 {
        busy_for(&admission, Duration::from_millis(10)).await;
    }
    busy_for(&admission, Duration::from_millis(60)).await;
    let mut queued = Vec::new();
    for _ in 0..20 {
        let admission = admission.clone();
        queued.push(tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await }));
    }
    tokio::task::yield_now().await;
    // 20 calls ahead at 10 ms each: 200 ms at the in-flight limit's pace, four times that at 25 %.
    let ask = Ask::new(Priority::Standard).deadline(Some(Instant::now() + Duration::from_millis(400)));
    let refused = admission.acquire(ask).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::DeadlineUnmeetable { .. }), "{refused:?}");
    for call in queued {
        drop(call.await.unwrap().unwrap());
    }
}
