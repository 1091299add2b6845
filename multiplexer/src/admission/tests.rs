use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn limits(in_flight: usize, queued: usize) -> Limits {
    Limits { max_in_flight: in_flight, max_queued: queued, queue_timeout: Duration::from_secs(5) }
}

/// Lets spawned waiters run up to their next await point.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn admits_up_to_the_limit_then_queues() {
    let admission = Admission::new(limits(2, 10));
    let a = admission.acquire(Priority::Standard, None).await.unwrap();
    let _b = admission.acquire(Priority::Standard, None).await.unwrap();
    let waiter = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Priority::Standard, None).await })
    };
    settle().await;
    assert_eq!(admission.snapshot().in_flight, 2);
    assert_eq!(admission.snapshot().queued_total(), 1);
    drop(a);
    let third = waiter.await.unwrap().unwrap();
    assert_eq!(admission.snapshot().queued_total(), 0);
    assert_eq!(admission.snapshot().in_flight, 2);
    drop(third);
    assert_eq!(admission.snapshot().in_flight, 1);
}

#[tokio::test]
async fn higher_priority_is_served_first() {
    let admission = Admission::new(limits(1, 10));
    let held = admission.acquire(Priority::Standard, None).await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for priority in [Priority::Sheddable, Priority::Standard, Priority::Critical] {
        let (admission, order) = (admission.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let permit = admission.acquire(priority, None).await.unwrap();
            order.lock().unwrap().push(priority);
            drop(permit);
        }));
        settle().await;
    }
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [Priority::Critical, Priority::Standard, Priority::Sheddable]);
}

#[tokio::test]
async fn full_queue_refuses_or_evicts_the_lowest_priority() {
    let admission = Admission::new(limits(1, 1));
    let _held = admission.acquire(Priority::Standard, None).await.unwrap();
    let sheddable = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Priority::Sheddable, None).await })
    };
    settle().await;

    // Same or lower priority than the queue holds: refused at once with a hint.
    let refused = admission.acquire(Priority::Sheddable, None).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::QueueFull { queued: 1, .. }), "{refused:?}");
    assert!(refused.retry_after().unwrap() >= Duration::from_millis(10));

    // Higher priority takes the place of the sheddable waiter.
    let critical = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Priority::Critical, None).await })
    };
    settle().await;
    let evicted = sheddable.await.unwrap().unwrap_err();
    assert!(matches!(evicted, AdmissionError::Evicted { .. }), "{evicted:?}");
    assert_eq!(admission.snapshot().queued, [1, 0, 0]);
    critical.abort();
}

#[tokio::test]
async fn zero_queue_means_serve_now_or_refuse() {
    let admission = Admission::new(limits(1, 0));
    let _held = admission.acquire(Priority::Critical, None).await.unwrap();
    let refused = admission.acquire(Priority::Critical, None).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::QueueFull { .. }));
}

#[tokio::test(start_paused = true)]
async fn queue_timeout_and_deadline_take_waiters_out() {
    let admission = Admission::new(Limits { queue_timeout: Duration::from_millis(300), ..limits(1, 10) });
    let _held = admission.acquire(Priority::Standard, None).await.unwrap();

    let timed_out = admission.acquire(Priority::Standard, None).await.unwrap_err();
    assert!(matches!(timed_out, AdmissionError::QueueTimeout { .. }), "{timed_out:?}");

    let deadline = Instant::now() + Duration::from_millis(50);
    let expired = admission.acquire(Priority::Standard, Some(deadline)).await.unwrap_err();
    assert!(matches!(expired, AdmissionError::DeadlineExpired { .. }), "{expired:?}");
    assert_eq!(admission.snapshot().queued_total(), 0);
    assert_eq!(admission.snapshot().in_flight, 1);
}

#[tokio::test(start_paused = true)]
async fn an_unmeetable_deadline_is_refused_at_once() {
    let admission = Admission::new(limits(1, 10));
    // Teach the pool that a request takes 100 ms.
    let permit = admission.acquire(Priority::Standard, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(permit);
    let _held = admission.acquire(Priority::Standard, None).await.unwrap();

    let started = tokio::time::Instant::now();
    let deadline = Instant::now() + Duration::from_millis(20);
    let refused = admission.acquire(Priority::Standard, Some(deadline)).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::DeadlineUnmeetable { .. }), "{refused:?}");
    assert_eq!(started.elapsed(), Duration::ZERO, "refused without waiting");
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_the_queue_and_leaks_nothing() {
    let admission = Admission::new(limits(1, 10));
    let held = admission.acquire(Priority::Standard, None).await.unwrap();
    let waiter = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Priority::Standard, None).await })
    };
    settle().await;
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(admission.snapshot().queued_total(), 0);
    drop(held);
    assert_eq!(admission.snapshot().in_flight, 0);
}

#[tokio::test]
async fn raising_the_limit_admits_waiters_at_once_and_lowering_drains() {
    let admission = Admission::new(limits(1, 10));
    let first = admission.acquire(Priority::Standard, None).await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let admission = admission.clone();
            tokio::spawn(async move { admission.acquire(Priority::Standard, None).await })
        })
        .collect();
    settle().await;
    admission.set_limits(limits(4, 10));
    let mut permits = vec![first];
    for waiter in waiters {
        permits.push(waiter.await.unwrap().unwrap());
    }
    assert_eq!(admission.snapshot().in_flight, 4);

    // Lowering to 2 keeps all 4 running; nobody new gets in until only 1 remains.
    admission.set_limits(limits(2, 10));
    let newcomer = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Priority::Standard, None).await })
    };
    settle().await;
    permits.pop();
    permits.pop();
    settle().await;
    assert_eq!(admission.snapshot().queued_total(), 1, "2 in flight is still at the limit");
    permits.pop();
    let admitted = newcomer.await.unwrap().unwrap();
    assert_eq!(admission.snapshot().in_flight, 2);
    drop(admitted);
    drop(permits);
    assert_eq!(admission.snapshot().in_flight, 0);
}

#[tokio::test]
async fn shrinking_the_queue_evicts_the_overflow() {
    let admission = Admission::new(limits(1, 10));
    let _held = admission.acquire(Priority::Standard, None).await.unwrap();
    let waiters: Vec<_> = [Priority::Critical, Priority::Sheddable, Priority::Standard]
        .into_iter()
        .map(|priority| {
            let admission = admission.clone();
            tokio::spawn(async move { (priority, admission.acquire(priority, None).await.map(drop)) })
        })
        .collect();
    settle().await;
    admission.set_limits(limits(1, 2));
    settle().await;
    assert_eq!(admission.snapshot().queued, [1, 1, 0]);
    let mut waiters = waiters.into_iter();
    let (critical, sheddable, standard) = (waiters.next().unwrap(), waiters.next().unwrap(), waiters.next().unwrap());
    let (priority, outcome) = sheddable.await.unwrap();
    assert_eq!(priority, Priority::Sheddable);
    assert!(matches!(outcome, Err(AdmissionError::Evicted { .. })), "{outcome:?}");
    critical.abort();
    standard.abort();
}

/// Thousands of acquisitions with random holds, cancellations and deadlines: the limit is never
/// exceeded, every kind of outcome happens, and everything returns to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_never_exceeds_the_limit_and_leaks_nothing() {
    use rand::RngExt;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    let peak = Arc::new(AtomicUsize::new(0));
    let observed = peak.clone();
    let queue =
        |in_flight| Limits { max_in_flight: in_flight, max_queued: 16, queue_timeout: Duration::from_millis(20) };
    let admission = Admission::with_observer(queue(4), move |snapshot| {
        observed.fetch_max(snapshot.in_flight, Ordering::Relaxed);
    });
    let outcomes = Arc::new(std::sync::Mutex::new(BTreeMap::<&'static str, usize>::new()));
    let mut tasks = Vec::new();
    for i in 0..3_000u64 {
        let (pool, outcomes) = (admission.clone(), outcomes.clone());
        let (hold, cancel_after, deadline, priority) = {
            let mut rng = rand::rng();
            (
                Duration::from_micros(rng.random_range(100..1_500)),
                rng.random_bool(0.15).then(|| Duration::from_micros(rng.random_range(0..3_000))),
                rng.random_bool(0.3).then(|| Instant::now() + Duration::from_micros(rng.random_range(0..8_000))),
                Priority::ALL[(i % 3) as usize],
            )
        };
        let cancelled = outcomes.clone();
        tasks.push(tokio::spawn(async move {
            let work = async move {
                let outcome = match pool.acquire(priority, deadline).await {
                    Ok(permit) => {
                        tokio::time::sleep(hold).await;
                        drop(permit);
                        "served"
                    }
                    Err(AdmissionError::QueueFull { .. }) => "queue_full",
                    Err(AdmissionError::DeadlineUnmeetable { .. }) => "deadline_unmeetable",
                    Err(AdmissionError::QueueTimeout { .. }) => "queue_timeout",
                    Err(AdmissionError::DeadlineExpired { .. }) => "deadline_expired",
                    Err(AdmissionError::Evicted { .. }) => "evicted",
                };
                *outcomes.lock().unwrap().entry(outcome).or_default() += 1;
            };
            match cancel_after {
                Some(after) => {
                    if tokio::time::timeout(after, work).await.is_err() {
                        *cancelled.lock().unwrap().entry("cancelled").or_default() += 1;
                    }
                }
                None => work.await,
            }
        }));
        if i % 20 == 0 {
            // Arrivals in bursts, and limits that keep changing under load.
            tokio::time::sleep(Duration::from_micros(500)).await;
            admission.set_limits(queue(if i % 40 == 0 { 4 } else { 2 }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task).await.expect("no task hangs").unwrap();
    }
    let end = admission.snapshot();
    assert_eq!((end.in_flight, end.queued_total()), (0, 0), "nothing leaked");
    assert!(peak.load(Ordering::Relaxed) <= 4, "peak {}", peak.load(Ordering::Relaxed));
    let outcomes = outcomes.lock().unwrap().clone();
    assert_eq!(outcomes.values().sum::<usize>(), 3_000, "every request got an outcome: {outcomes:?}");
    for kind in ["served", "queue_full", "cancelled", "evicted"] {
        assert!(outcomes.get(kind).copied().unwrap_or(0) > 0, "{kind} never happened: {outcomes:?}");
    }
    assert!(outcomes.contains_key("deadline_expired") || outcomes.contains_key("deadline_unmeetable"), "{outcomes:?}");
    println!("{outcomes:?}");
}
