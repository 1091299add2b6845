//! The crowd's gate through the pool's admission: a tenant holding most of the queue leaves the
//! room that frees for other tenants until the last part of TEI's running batch, then takes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::*;

const BATCH: Duration = Duration::from_millis(20);

fn of(tenant: &'static str) -> Ask<'static> {
    Ask::new(Priority::Standard).tenant(Some(tenant))
}

/// Lets spawned waiters run up to their next await point.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// `n` waiters of `tenant` that hold their permits until the test ends; counts the admitted.
fn waiters(admission: &Admission, tenant: &'static str, n: usize, admitted: &Arc<AtomicUsize>) {
    for _ in 0..n {
        let (admission, admitted) = (admission.clone(), admitted.clone());
        tokio::spawn(async move {
            let permit = admission.acquire(of(tenant)).await;
            if permit.is_ok() {
                admitted.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(permit);
        });
    }
}

/// A pool at eight in flight held by tenant `a`, TEI reporting 20 ms batches, `a` waiting for
/// more, and (when `b_came`) tenant `b` having called a moment ago.
async fn crowded(b_came: bool) -> (Admission, Vec<Permit>, Arc<AtomicUsize>) {
    let admission = Admission::new(Limits::new(8, 64, Duration::from_secs(10)));
    let held: Vec<Permit> = (0..8).map(|_| admission.try_acquire(&of("a")).unwrap()).collect();
    held[0].observe(Observation { tei_inference: BATCH, ..Default::default() });
    let admitted = Arc::new(AtomicUsize::new(0));
    waiters(&admission, "a", 10, &admitted);
    settle().await;
    if b_came {
        assert!(admission.try_acquire(&of("b")).is_none(), "b calls while the pool is full");
    }
    (admission, held, admitted)
}

#[tokio::test(start_paused = true)]
async fn the_crowd_leaves_the_room_until_the_last_part_of_teis_batch_while_another_tenant_comes() {
    let (admission, mut held, admitted) = crowded(true).await;
    // Four come back: their batch ended, the next one (the other four) started.
    held.truncate(4);
    let batch_start = Instant::now();
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 0, "four places free, kept while the batch runs");

    tokio::time::sleep(Duration::from_millis(5)).await;
    let b = admission.acquire(of("b")).await.expect("b walks in");
    assert_eq!(Instant::now() - batch_start, Duration::from_millis(5), "at once, into TEI's next batch");

    let opens = batch_start + BATCH.mul_f64(ingest_gate::OPENS_AFTER);
    tokio::time::sleep_until(opens - Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 0, "still the running batch's first part");
    tokio::time::sleep_until(opens).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 3, "its last part: the crowd takes every place left");
    drop((b, held));
}

#[tokio::test(start_paused = true)]
async fn alone_the_crowd_takes_the_room_at_once() {
    let (_admission, mut held, admitted) = crowded(false).await;
    held.truncate(4);
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 4, "nobody else came");
}

#[tokio::test(start_paused = true)]
async fn a_tenant_gone_for_a_second_no_longer_holds_the_crowd_back() {
    let (_admission, mut held, admitted) = crowded(true).await;
    tokio::time::sleep(tenant_gate::OTHERS_COME_WITHIN).await;
    held.truncate(4);
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn tenants_sharing_the_queue_evenly_are_not_held() {
    let (admission, mut held, admitted) = crowded(true).await;
    let others = Arc::new(AtomicUsize::new(0));
    waiters(&admission, "b", 10, &others);
    settle().await;
    held.truncate(4);
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst) + others.load(Ordering::SeqCst), 4, "half each: no crowd");
}

/// As [`crowded`] with `b` having called, but `b` weighing `b_weight` and the pool's queries in
/// flight for seconds first, so the next batch's places are counted as they come (see
/// `ingest_gate`).
async fn crowded_beside(b_weight: u32) -> (Admission, Vec<Permit>, Arc<AtomicUsize>) {
    let admission = Admission::new(Limits::new(8, 64, Duration::from_secs(10)));
    admission.set_tenant_weights(BTreeMap::from([("b".to_owned(), b_weight)]));
    let held: Vec<Permit> = (0..8).map(|_| admission.try_acquire(&of("a")).unwrap()).collect();
    held[0].observe(Observation { tei_inference: BATCH, ..Default::default() });
    tokio::time::sleep(Duration::from_secs(5)).await;
    let admitted = Arc::new(AtomicUsize::new(0));
    waiters(&admission, "a", 10, &admitted);
    settle().await;
    assert!(admission.try_acquire(&of("b")).is_none(), "b calls while the pool is full");
    (admission, held, admitted)
}

#[tokio::test(start_paused = true)]
async fn the_crowd_leaves_a_heavier_tenant_its_share_of_teis_next_batch() {
    let (admission, mut held, admitted) = crowded_beside(3).await;
    held.truncate(4);
    let batch_start = Instant::now();
    tokio::time::sleep_until(batch_start + BATCH.mul_f64(ingest_gate::OPENS_AFTER)).await;
    settle().await;
    // B weighs 3 against A's 1: of the next batch's four places (half the limit of 8) A fills one.
    assert_eq!(admitted.load(Ordering::SeqCst), 1, "the crowd's quarter of the next batch");
    let mut b = Vec::new();
    for _ in 0..3 {
        b.push(admission.acquire(of("b")).await.expect("b walks in"));
    }
    assert_eq!(Instant::now(), batch_start + BATCH.mul_f64(ingest_gate::OPENS_AFTER), "at once");
    tokio::time::sleep(BATCH / 8).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 1, "B took the rest: nothing is left to fill");

    // The batch ends: TEI's next batch (A's one and B's three) runs; the crowd waits for its
    // last part again, and fills its share then.
    held.truncate(0);
    let next_start = Instant::now();
    tokio::time::sleep_until(next_start + BATCH.mul_f64(ingest_gate::OPENS_AFTER)).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 2, "one more: its share of the batch after");
    drop(b);
}

#[tokio::test(start_paused = true)]
async fn a_tenant_weighing_the_same_keeps_no_share() {
    let (_admission, mut held, admitted) = crowded_beside(1).await;
    held.truncate(4);
    let batch_start = Instant::now();
    tokio::time::sleep_until(batch_start + BATCH.mul_f64(ingest_gate::OPENS_AFTER)).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 4, "every place the batch's end freed");
}

#[tokio::test(start_paused = true)]
async fn a_heavier_tenant_gone_for_a_second_keeps_nothing() {
    let (_admission, mut held, admitted) = crowded_beside(3).await;
    tokio::time::sleep(tenant_gate::OTHERS_COME_WITHIN).await;
    held.truncate(4);
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 4);
}

/// When the places kept for `b` go to the crowd in the batch that started at `batch_start`.
fn kept_until(batch_start: Instant) -> Instant {
    batch_start + BATCH.mul_f64(tenant_gate::KEPT_UNTIL)
}

/// [`crowded_beside`] a tenant of weight 3 after a batch ended (half the permits back), at the
/// last part of the batch that started then: the crowd has taken its share of the next batch.
async fn crowd_in_the_last_part() -> (Admission, Vec<Permit>, Arc<AtomicUsize>, Instant) {
    let (admission, mut held, admitted) = crowded_beside(3).await;
    held.truncate(4);
    let batch_start = Instant::now();
    tokio::time::sleep_until(batch_start + BATCH.mul_f64(ingest_gate::OPENS_AFTER)).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 1, "the crowd's share first");
    (admission, held, admitted, batch_start)
}

#[tokio::test(start_paused = true)]
async fn the_places_kept_for_a_heavier_tenant_that_sends_nothing_do_not_run_empty() {
    let (_admission, _held, admitted, batch_start) = crowd_in_the_last_part().await;
    tokio::time::sleep_until(kept_until(batch_start) - Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 1, "B's places stay B's while it may still come");
    tokio::time::sleep_until(kept_until(batch_start)).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 4, "B sent nothing: TEI's next batch starts full");
}

#[tokio::test(start_paused = true)]
async fn the_crowd_takes_no_more_than_its_share_while_the_heavier_tenant_waits() {
    let (admission, mut held, admitted, batch_start) = crowd_in_the_last_part().await;
    // B's call of four inputs does not fit the three places left: it waits for the batch's end.
    let b_admitted = Arc::new(AtomicUsize::new(0));
    let (waiter, counted) = (admission.clone(), b_admitted.clone());
    tokio::spawn(async move {
        let ask = of("b").cost(Cost { inputs: 4, tokens: 0 });
        let permit = waiter.acquire(ask).await;
        counted.fetch_add(usize::from(permit.is_ok()), Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(permit);
    });
    tokio::time::sleep_until(kept_until(batch_start)).await;
    settle().await;
    assert_eq!(admitted.load(Ordering::SeqCst), 1, "B waits: its places are not the crowd's");
    held.truncate(0);
    settle().await;
    assert_eq!(b_admitted.load(Ordering::SeqCst), 1, "the batch's end makes room for B's call");
}

#[tokio::test(start_paused = true)]
async fn past_the_batchs_end_unseen_the_crowd_keeps_to_its_share() {
    let (_admission, mut held, admitted) = crowded_beside(3).await;
    held.truncate(4);
    let batch_start = Instant::now();
    // The dispatch that would hand the places over comes only after the batch's expected end (a
    // jump of the clock fires the gates' timers at once, at its end).
    tokio::time::advance(BATCH + Duration::from_millis(1)).await;
    settle().await;
    assert!(Instant::now() > batch_start + BATCH);
    assert!(admitted.load(Ordering::SeqCst) <= 1, "where TEI's batches are is unknown: the share only");
}
