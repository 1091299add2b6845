use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn limits(in_flight: usize, queued: usize) -> Limits {
    Limits::new(in_flight, queued, Duration::from_secs(5))
}

/// Teaches a pool with one slot that a request takes 100 ms, then holds that slot.
async fn taught_and_full(admission: &Admission) -> Permit {
    let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(permit);
    admission.acquire(Ask::new(Priority::Standard)).await.unwrap()
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
    let a = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let _b = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let waiter = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await })
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
    let held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for priority in [Priority::Sheddable, Priority::Standard, Priority::Critical] {
        let (admission, order) = (admission.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let permit = admission.acquire(Ask::new(priority)).await.unwrap();
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
    let _held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let sheddable = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Sheddable)).await })
    };
    settle().await;

    // Same or lower priority than the queue holds: refused at once with a hint.
    let refused = admission.acquire(Ask::new(Priority::Sheddable)).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::QueueFull { queued: 1, .. }), "{refused:?}");
    assert!(refused.retry_after().unwrap() >= Duration::from_millis(10));

    // Higher priority takes the place of the sheddable waiter.
    let critical = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Critical)).await })
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
    let _held = admission.acquire(Ask::new(Priority::Critical)).await.unwrap();
    let refused = admission.acquire(Ask::new(Priority::Critical)).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::QueueFull { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_patient_call_waits_beyond_a_full_or_slow_queue_until_the_queue_timeout() {
    let admission = Admission::new(Limits { queue_timeout: Duration::from_secs(1), ..limits(1, 0) });
    let held = taught_and_full(&admission).await;
    let patient = || Ask::new(Priority::Standard).patient(true);
    // No queue at all: an impatient call is refused, a patient one waits and gets the slot.
    assert!(matches!(admission.acquire(Ask::new(Priority::Standard)).await, Err(AdmissionError::QueueFull { .. })));
    let waiting = tokio::spawn({
        let admission = admission.clone();
        async move { admission.acquire(patient()).await.map(drop) }
    });
    settle().await;
    assert_eq!(admission.snapshot().queued_total(), 1, "queued beyond maxQueued");
    drop(held);
    waiting.await.unwrap().expect("served once the slot frees");
    // Behind 20 waiting calls of 100 ms, more than the queue timeout: still not refused at once,
    // only when the queue timeout passes.
    let _held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let line: Vec<_> = (0..20)
        .map(|_| {
            let admission = admission.clone();
            tokio::spawn(async move { admission.acquire(patient()).await.map(drop) })
        })
        .collect();
    settle().await;
    let started = Instant::now();
    let late = admission.acquire(patient()).await.unwrap_err();
    assert!(matches!(late, AdmissionError::QueueTimeout { .. }), "{late:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    for waiter in line {
        let _ = waiter.await;
    }
}

#[tokio::test(start_paused = true)]
async fn queue_timeout_and_deadline_take_waiters_out() {
    let admission = Admission::new(Limits { queue_timeout: Duration::from_millis(300), ..limits(1, 10) });
    let _held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();

    let timed_out = admission.acquire(Ask::new(Priority::Standard)).await.unwrap_err();
    assert!(matches!(timed_out, AdmissionError::QueueTimeout { .. }), "{timed_out:?}");

    let deadline = Instant::now() + Duration::from_millis(50);
    let expired = admission.acquire(Ask::new(Priority::Standard).deadline(Some(deadline))).await.unwrap_err();
    assert!(matches!(expired, AdmissionError::DeadlineExpired { .. }), "{expired:?}");
    assert_eq!(admission.snapshot().queued_total(), 0);
    assert_eq!(admission.snapshot().in_flight, 1);
}

#[tokio::test(start_paused = true)]
async fn an_unmeetable_deadline_is_refused_at_once() {
    let admission = Admission::new(limits(1, 10));
    let _held = taught_and_full(&admission).await;

    let started = tokio::time::Instant::now();
    let deadline = Instant::now() + Duration::from_millis(20);
    let refused = admission.acquire(Ask::new(Priority::Standard).deadline(Some(deadline))).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::DeadlineUnmeetable { .. }), "{refused:?}");
    assert_eq!(started.elapsed(), Duration::ZERO, "refused without waiting");
}

/// A call that would wait past the queue timeout is refused at once, not when its wait runs out;
/// calls whose turn comes in time still queue.
#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_the_queue_timeout_is_refused_at_once() {
    let admission = Admission::new(Limits::new(1, 100, Duration::from_millis(350)));
    let _held = taught_and_full(&admission).await;
    // Turns after 100, 200 and 300 ms: within the 350 ms queue timeout.
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let admission = admission.clone();
            tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await.map(drop) })
        })
        .collect();
    settle().await;
    assert_eq!(admission.snapshot().queued_total(), 3);

    let started = tokio::time::Instant::now();
    let refused = admission.acquire(Ask::new(Priority::Standard)).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "refused without waiting");
    let AdmissionError::QueueTimeoutUnmeetable { expected_wait, queue_timeout, .. } = refused else {
        panic!("{refused:?}")
    };
    assert_eq!((expected_wait, queue_timeout), (Duration::from_millis(400), Duration::from_millis(350)));
    assert!(refused.retry_after().is_some(), "a later try can be served: {refused:?}");
    assert_eq!(admission.snapshot().queued_total(), 3, "the queue is as it was");
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_the_queue_and_leaks_nothing() {
    let admission = Admission::new(limits(1, 10));
    let held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let waiter = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await })
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
    let first = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let admission = admission.clone();
            tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await })
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
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await })
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
    let _held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let waiters: Vec<_> = [Priority::Critical, Priority::Sheddable, Priority::Standard]
        .into_iter()
        .map(|priority| {
            let admission = admission.clone();
            tokio::spawn(async move { (priority, admission.acquire(Ask::new(priority)).await.map(drop)) })
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

    let peak = Arc::new(AtomicUsize::new(0));
    let observed = peak.clone();
    let queue = |in_flight| Limits::new(in_flight, 16, Duration::from_millis(20));
    let admission = Admission::with_observer(queue(4), move |snapshot| {
        observed.fetch_max(snapshot.in_flight, Ordering::Relaxed);
    });
    let outcomes = Arc::new(std::sync::Mutex::new(BTreeMap::<&'static str, usize>::new()));
    let mut tasks = Vec::new();
    for i in 0..3_000u64 {
        let (pool, outcomes) = (admission.clone(), outcomes.clone());
        let lane = if i % 5 == 0 { Lane::Ingest } else { Lane::Query };
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
                let outcome = match pool.acquire(Ask::new(priority).lane(lane).deadline(deadline)).await {
                    Ok(permit) => {
                        tokio::time::sleep(hold).await;
                        drop(permit);
                        "served"
                    }
                    Err(AdmissionError::QueueFull { .. }) => "queue_full",
                    Err(AdmissionError::DeadlineUnmeetable { .. }) => "deadline_unmeetable",
                    Err(AdmissionError::QueueTimeoutUnmeetable { .. }) => "queue_timeout_unmeetable",
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

fn cost(inputs: u32, tokens: u32) -> Cost {
    Cost { inputs, tokens }
}

/// A call costs all its inputs at once: it waits as a whole and never holds part of them.
#[tokio::test]
async fn a_call_takes_all_its_inputs_or_waits_for_them() {
    let admission = Admission::new(limits(4, 100));
    let three = admission.acquire(Ask::new(Priority::Standard).cost(cost(3, 0))).await.unwrap();
    let two = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard).cost(cost(2, 0))).await })
    };
    settle().await;
    assert_eq!((admission.snapshot().in_flight, admission.snapshot().queued_total()), (3, 2), "nothing partial");
    drop(three);
    let two = two.await.unwrap().unwrap();
    assert_eq!(admission.snapshot().in_flight, 2);
    drop(two);
    // Larger than the whole limit: admitted alone, never starved.
    let huge = admission.acquire(Ask::new(Priority::Standard).cost(cost(100, 0))).await.unwrap();
    assert_eq!(admission.snapshot().in_flight, 100);
    drop(huge);
    assert_eq!(admission.snapshot().in_flight, 0);
}

/// With a token budget, long inputs take more of it than short ones.
#[tokio::test]
async fn a_token_budget_charges_long_inputs_more() {
    let admission = Admission::new(Limits { max_in_flight_tokens: Some(600), ..limits(100, 100) });
    assert_eq!(admission.estimate_tokens(2000, 1), 502);
    let long = admission.acquire(Ask::new(Priority::Standard).cost(cost(1, 502))).await.unwrap();
    let short: Vec<_> =
        futures::future::join_all((0..20).map(|_| admission.acquire(Ask::new(Priority::Standard).cost(cost(1, 4)))))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    let another_long = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard).cost(cost(1, 502))).await })
    };
    settle().await;
    assert_eq!(admission.snapshot().in_flight_tokens, 502 + 80);
    assert_eq!(admission.snapshot().queued_total(), 1, "a second long input waits; twenty short ones did not");
    drop(long);
    drop(another_long.await.unwrap().unwrap());
    drop(short);
}

/// TEI's answers teach the characters-per-token ratio.
#[tokio::test]
async fn answers_teach_the_token_estimate() {
    let admission = Admission::new(limits(4, 4));
    let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    for _ in 0..300 {
        permit.observe(Observation { chars: 600, tokens: 100, ..Default::default() });
    }
    assert!((admission.snapshot().chars_per_token - 6.0).abs() < 0.05, "{}", admission.snapshot().chars_per_token);
    assert!((102..=103).contains(&admission.estimate_tokens(600, 1)), "{}", admission.estimate_tokens(600, 1));
}

/// Tenant A floods the queue; tenant B, arriving later at the same priority, is served next and
/// takes A's newest place when the queue is full.
#[tokio::test]
async fn a_flooding_tenant_evicts_its_own_work_not_others() {
    let admission = Admission::new(limits(1, 4));
    let held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let mut flood = Vec::new();
    for _ in 0..4 {
        let admission = admission.clone();
        flood
            .push(tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard).tenant(Some("a"))).await }));
        settle().await;
    }
    let refused = admission.acquire(Ask::new(Priority::Standard).tenant(Some("a"))).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::QueueFull { .. }), "the flood sheds itself: {refused:?}");
    let light = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard).tenant(Some("b"))).await })
    };
    settle().await;
    let evicted = flood.pop().unwrap().await.unwrap().unwrap_err();
    assert!(matches!(evicted, AdmissionError::Evicted { .. }), "A's newest made room: {evicted:?}");
    drop(held);
    let first_a = flood.remove(0).await.unwrap().unwrap();
    drop(first_a);
    drop(light.await.unwrap().expect("B served second, before A's older waiters"));
    for waiter in flood {
        waiter.abort();
    }
}

/// A queue that has stood for an interval is reported as standing, and still queues every call
/// that fits: only a full queue, or a wait past the deadline or the queue timeout, is refused.
#[tokio::test(start_paused = true)]
async fn a_standing_queue_refuses_nothing_that_fits() {
    let admission = Admission::new(Limits::new(1, 1000, Duration::from_secs(60)));
    // Teach a 10 ms service time: target 20 ms, interval 100 ms.
    let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(permit);

    let held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let serve = |admission: &Admission, ask: Ask<'static>| {
        let admission = admission.clone();
        tokio::spawn(async move {
            let permit = admission.acquire(ask).await?;
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(permit);
            Ok::<_, AdmissionError>(())
        })
    };
    let mut burst: Vec<_> = (0..30).map(|_| serve(&admission, Ask::new(Priority::Standard))).collect();
    settle().await;
    assert_eq!(admission.snapshot().queued_total(), 30, "a burst is queued");
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(held);
    // Let the queue stand for longer than the interval.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(admission.snapshot().standing_queue);
    let deadline = Some(Instant::now() + Duration::from_secs(1));
    burst.push(serve(&admission, Ask::new(Priority::Standard).deadline(deadline)));
    settle().await;
    assert!(admission.snapshot().queued_total() > 10, "still standing, the newcomer queued behind it");
    let hopeless = Ask::new(Priority::Standard).deadline(Some(Instant::now() + Duration::from_millis(50)));
    let refused = admission.acquire(hopeless).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::DeadlineUnmeetable { .. }), "{refused:?}");
    for waiter in burst {
        waiter.await.unwrap().expect("the burst and the newcomer are served in full");
    }
    assert!(!admission.snapshot().standing_queue, "empty: no longer standing");
}

/// The queue keeps its word (issue 32): 32 closed-loop callers with a 10 s deadline against 4 in
/// flight and 64 queued, each call taking 20 ms, are all queued and served, never refused, and
/// so are 64 callers with a 30 s deadline.
#[tokio::test(start_paused = true)]
async fn closed_loop_callers_that_fit_are_never_refused() {
    for (workers, deadline) in [(32, Duration::from_secs(10)), (64, Duration::from_secs(30))] {
        let admission = Admission::new(Limits::new(4, 64, Duration::from_secs(3)));
        let end = Instant::now() + Duration::from_secs(8);
        let tasks: Vec<_> = (0..workers)
            .map(|_| {
                let admission = admission.clone();
                tokio::spawn(async move {
                    let (mut served, mut refused) = (0, 0);
                    while Instant::now() < end {
                        let ask = Ask::new(Priority::Standard).deadline(Some(Instant::now() + deadline));
                        match admission.acquire(ask).await {
                            Ok(permit) => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                drop(permit);
                                served += 1;
                            }
                            Err(_) => refused += 1,
                        }
                    }
                    (served, refused)
                })
            })
            .collect();
        let (mut served, mut refused) = (0, 0);
        for task in tasks {
            let (s, r) = task.await.unwrap();
            (served, refused) = (served + s, refused + r);
        }
        assert_eq!(refused, 0, "{workers} workers: {served} served");
        // 4 slots of 20 ms for 8 s: 1,600 calls.
        assert!(served >= 1_550, "{workers} workers: {served} served");
    }
}

/// A refused caller whose turn would come after its deadline is told not to retry and is not
/// counted in line; the others are told later and later turns, spread, never identical.
#[tokio::test(start_paused = true)]
async fn retry_hints_follow_the_line_and_the_deadline() {
    let admission = Admission::new(Limits::new(2, 4, Duration::from_secs(2)));
    // Teach a 20 ms service time: 100 calls a second.
    let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(permit);
    let mut held = Vec::new();
    for _ in 0..6 {
        let admission = admission.clone();
        held.push(tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await }));
    }
    settle().await;
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut hints = Vec::new();
    let mut futile = 0;
    for _ in 0..150 {
        match admission.acquire(Ask::new(Priority::Standard).deadline(Some(deadline))).await.unwrap_err().retry() {
            Some(Retry::After(after)) => hints.push(after),
            Some(Retry::Futile) => futile += 1,
            None => panic!("a shed call gets a hint"),
        }
    }
    // 100 a second within 1 s: about 100 turns, minus the queue's, fit before the deadline.
    assert!((80..=100).contains(&hints.len()), "{} hinted, {futile} futile", hints.len());
    assert!(hints.windows(10).all(|w| w[9] > w[0]), "later callers get later turns: {hints:?}");
    assert!(hints.iter().all(|h| *h <= Duration::from_secs(1)), "within the deadline: {hints:?}");
    let without_deadline = admission.acquire(Ask::new(Priority::Standard)).await.unwrap_err();
    assert!(without_deadline.retry_after().unwrap() <= Duration::from_secs(2), "capped at the queue timeout");
    for waiter in held {
        waiter.abort();
    }
}

/// The adaptive limit moves with what TEI reports and stays under the ceiling.
#[tokio::test]
async fn the_adaptive_limit_follows_teis_queue() {
    let changes = Arc::new(AtomicUsize::new(0));
    let counted = changes.clone();
    let admission = Admission::with_observer(Limits { adaptive: true, ..limits(64, 1000) }, move |snapshot| {
        if snapshot.change.is_some() {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    assert_eq!(admission.snapshot().effective_limit, 16, "starts at a quarter of the ceiling");
    let observer = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    // Demand: more callers than any limit, each holding its permit.
    let callers: Vec<_> = (0..100)
        .map(|_| {
            let admission = admission.clone();
            tokio::spawn(async move {
                let _permit = admission.acquire(Ask::new(Priority::Standard)).await;
                std::future::pending::<()>().await;
            })
        })
        .collect();
    settle().await;
    let held = [observer];
    for _ in 0..400 {
        held[0].observe(Observation {
            tei_queue: Duration::ZERO,
            tei_inference: Duration::from_millis(10),
            ..Default::default()
        });
    }
    assert_eq!(admission.snapshot().effective_limit, 64, "an empty TEI queue under demand: up to the ceiling");
    for _ in 0..800 {
        held[0].observe(Observation {
            tei_queue: Duration::from_millis(80),
            tei_inference: Duration::from_millis(10),
            ..Default::default()
        });
    }
    assert_eq!(admission.snapshot().effective_limit, ADAPTIVE_FLOOR, "a long TEI queue: down to the floor");
    assert!(changes.load(Ordering::Relaxed) >= 2);
    drop(held);
    for caller in callers {
        caller.abort();
    }
    admission.set_limits(limits(8, 10));
    assert_eq!(admission.snapshot().effective_limit, 8, "adaptive off: the share is the limit");
}

/// Weighted calls, tenants and an adaptive limit moving underneath, with cancellations and
/// deadlines: inputs in flight never exceed the ceiling, and everything returns to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_with_weights_tenants_and_an_adaptive_limit_leaks_nothing() {
    use rand::RngExt;

    let peak = Arc::new(AtomicUsize::new(0));
    let observed = peak.clone();
    let pool = |adaptive| Limits {
        adaptive,
        max_in_flight_tokens: Some(4_000),
        ..Limits::new(8, 32, Duration::from_millis(30))
    };
    let admission = Admission::with_observer(pool(true), move |snapshot| {
        observed.fetch_max(snapshot.in_flight, Ordering::Relaxed);
    });
    let mut tasks = Vec::new();
    for i in 0..2_000u64 {
        let pool_state = admission.clone();
        let (inputs, tokens, hold, cancel_after, deadline, tenant) = {
            let mut rng = rand::rng();
            (
                rng.random_range(1..4),
                rng.random_range(2..600),
                Duration::from_micros(rng.random_range(100..1_500)),
                rng.random_bool(0.15).then(|| Duration::from_micros(rng.random_range(0..3_000))),
                rng.random_bool(0.3).then(|| Instant::now() + Duration::from_micros(rng.random_range(0..8_000))),
                ["a", "b", "c"][rng.random_range(0..3)],
            )
        };
        tasks.push(tokio::spawn(async move {
            let work = async move {
                let ask = Ask::new(Priority::ALL[(i % 3) as usize])
                    .tenant(Some(tenant))
                    .cost(cost(inputs, tokens))
                    .deadline(deadline);
                if let Ok(permit) = pool_state.acquire(ask).await {
                    tokio::time::sleep(hold).await;
                    let queue = Duration::from_micros(hold.as_micros() as u64 % 2_000);
                    permit.observe(Observation { tei_queue: queue, tei_inference: hold, chars: 400, tokens: 100 });
                }
            };
            match cancel_after {
                Some(after) => drop(tokio::time::timeout(after, work).await),
                None => work.await,
            }
        }));
        if i % 25 == 0 {
            tokio::time::sleep(Duration::from_micros(500)).await;
            admission.set_limits(pool(i % 50 == 0));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task).await.expect("no task hangs").unwrap();
    }
    let end = admission.snapshot();
    assert_eq!((end.in_flight, end.in_flight_tokens, end.queued_total()), (0, 0, 0), "nothing leaked");
    // A call larger than the room left goes alone, so the peak is the ceiling or one call.
    assert!(peak.load(Ordering::Relaxed) <= 8 + 3, "peak {}", peak.load(Ordering::Relaxed));
}

/// A queue that siblings drain too (calls spill to them) expects shorter waits: a call it would
/// refuse alone, for a wait past the queue timeout, waits instead, and hints are shorter.
#[tokio::test(start_paused = true)]
async fn spill_slots_shorten_the_expected_wait() {
    let admission = Admission::new(Limits::new(1, 16, Duration::from_millis(300)));
    let _held = taught_and_full(&admission).await;
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let admission = admission.clone();
        waiting.push(tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await }));
    }
    settle().await;
    // Alone: three ahead at 100 ms each is past the 300 ms timeout.
    let alone = admission.acquire(Ask::new(Priority::Standard)).await.unwrap_err();
    assert!(matches!(alone, AdmissionError::QueueTimeoutUnmeetable { .. }), "{alone:?}");
    // With three siblings taking calls too, the same queue drains four times as fast.
    admission.set_spill_slots(3);
    let helped = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await })
    };
    settle().await;
    assert_eq!(admission.snapshot().queued_total(), 4, "queued, not refused");
    for waiter in waiting.into_iter().chain([helped]) {
        waiter.abort();
    }
}

#[tokio::test]
async fn a_limit_of_one_teis_batch_keeps_the_next_batch_ready() {
    let admission = Admission::new(limits(4, 10));
    admission.set_backend_batch(Some(4));
    assert_eq!(admission.snapshot().effective_limit, 8);
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(admission.acquire(Ask::new(Priority::Standard)).await.unwrap());
    }
    let ninth = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await })
    };
    settle().await;
    assert_eq!(
        (admission.snapshot().in_flight, admission.snapshot().queued_total()),
        (8, 1),
        "two batches, then the queue"
    );
    // A TEI that batches by tokens alone: exactly the limit again, the ninth waiting its turn.
    admission.set_backend_batch(None);
    assert_eq!(admission.snapshot().effective_limit, 4);
    held.truncate(4);
    settle().await;
    assert_eq!(admission.snapshot().queued_total(), 1, "still over the plain limit");
    held.pop();
    drop(ninth.await.unwrap().unwrap());
}

#[tokio::test]
async fn the_adaptive_limit_and_wide_limits_keep_no_extra_batch() {
    let wide = Admission::new(limits(16, 10));
    wide.set_backend_batch(Some(8));
    assert_eq!(wide.snapshot().effective_limit, 16);
    let adaptive = Admission::new(Limits { adaptive: true, ..limits(16, 10) });
    assert_eq!(adaptive.snapshot().effective_limit, 4, "starts at a quarter of its ceiling");
    adaptive.set_backend_batch(Some(4));
    assert_eq!(adaptive.snapshot().effective_limit, 4, "nothing added to the adaptive limit");
}

#[tokio::test]
async fn the_adaptive_limit_never_goes_below_one_teis_batch() {
    let admission = Admission::new(Limits { adaptive: true, ..limits(16, 10) });
    admission.set_backend_batch(Some(8));
    assert_eq!(admission.snapshot().effective_limit, 8, "raised to the batch");
    // TEI's queue long beside its batch time: the limit backs off, down to one batch, not below.
    let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    for _ in 0..50 {
        permit.observe(Observation {
            tei_queue: Duration::from_millis(400),
            tei_inference: Duration::from_millis(20),
            ..Observation::default()
        });
    }
    assert_eq!(admission.snapshot().effective_limit, 8);
    drop(permit);
    let small = Admission::new(Limits { adaptive: true, ..limits(4, 10) });
    small.set_backend_batch(Some(8));
    assert_eq!(small.snapshot().effective_limit, 4, "never above the ceiling");
}
