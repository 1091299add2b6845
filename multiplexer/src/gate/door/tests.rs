use std::time::Duration;

use futures::FutureExt as _;
use tokio::time::Instant;

use super::*;
use crate::admission::Limits;
use crate::report::metrics::Metrics;

const A: ConnectionId = ConnectionId(1);
const B: ConnectionId = ConnectionId(2);
const QUEUE_TIMEOUT: Duration = Duration::from_secs(1);

/// A door and a pool that can serve or queue `budget` calls.
fn door(budget: usize) -> (Arc<Door>, Admission) {
    (Door::new(Metrics::new().held_at_door()), Admission::new(Limits::new(budget, 0, QUEUE_TIMEOUT)))
}

fn pass_now(door: &Arc<Door>, admission: &Admission, connection: ConnectionId) -> Pass {
    door.enter(admission, connection, None, &HoldBounds::default())
        .now_or_never()
        .expect("in at once")
        .expect("no deadline")
}

/// A call entering in the background, holding its pass 10 ms: the instant it went in.
fn entering(door: &Arc<Door>, admission: &Admission, connection: ConnectionId) -> tokio::task::JoinHandle<Instant> {
    let (door, admission) = (door.clone(), admission.clone());
    tokio::spawn(async move {
        let pass = door.enter(&admission, connection, None, &HoldBounds::default()).await;
        let now = Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(pass);
        now
    })
}

fn waiting(door: &Door) -> usize {
    door.lock().lines.values().map(VecDeque::len).sum()
}

#[tokio::test(start_paused = true)]
async fn calls_beyond_the_budget_wait_their_turn_and_go_in_as_calls_finish() {
    let metrics = Metrics::new();
    let (door, admission) = (Door::new(metrics.held_at_door()), Admission::new(Limits::new(3, 0, QUEUE_TIMEOUT)));
    let inside: Vec<Pass> = (0..3).map(|_| pass_now(&door, &admission, A)).collect();
    let first = entering(&door, &admission, A);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = entering(&door, &admission, A);
    // A call waits its turn, past the queue timeout: the queue's clock starts once it is in.
    tokio::time::sleep(QUEUE_TIMEOUT * 3).await;
    assert!(!first.is_finished() && !second.is_finished(), "the fourth and fifth calls wait");
    assert_eq!(waiting(&door), 2);
    let text = prometheus::TextEncoder::new().encode_to_string(&metrics.registry.gather()).unwrap();
    assert!(text.contains("\nteifleet_held_at_door 2\n"), "{text}");
    drop(inside);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert!(first <= second, "in arrival order");
    assert_eq!(door.lock().inside, 0);
}

#[tokio::test(start_paused = true)]
async fn connections_take_turns() {
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    // A queues three, then B one: B's call goes in second, not fourth.
    let a: Vec<_> = (0..3).map(|_| entering(&door, &admission, A)).collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let b = entering(&door, &admission, B);
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(inside);
    let mut a_times = Vec::new();
    for call in a {
        a_times.push(call.await.unwrap());
    }
    let b_time = b.await.unwrap();
    assert!(a_times[0] < b_time && b_time < a_times[1], "A, B, A, A: {a_times:?} {b_time:?}");
}

#[tokio::test(start_paused = true)]
async fn a_budget_that_grows_lets_waiting_calls_in() {
    let (door, admission) = door(1);
    let _inside = pass_now(&door, &admission, A);
    let held = entering(&door, &admission, A);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!held.is_finished());
    // The next call reads a budget of 3: it and the one waiting both go in.
    admission.set_limits(Limits::new(3, 0, QUEUE_TIMEOUT));
    let _also = door.enter(&admission, B, None, &HoldBounds::default()).await;
    held.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_leaves_takes_no_pass() {
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    let bounds = HoldBounds::default();
    let mut gone = Box::pin(door.enter(&admission, A, None, &bounds));
    assert!((&mut gone).now_or_never().is_none());
    let staying = entering(&door, &admission, B);
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(gone);
    assert_eq!(waiting(&door), 1, "the caller that left is out of line");
    drop(inside);
    staying.await.unwrap();
    assert_eq!(door.lock().inside, 0);
    assert!(door.lock().lines.is_empty() && door.lock().turns.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pass_whose_caller_left_goes_to_the_next_in_line() {
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    let left = entering(&door, &admission, A);
    let next = entering(&door, &admission, B);
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The first in line is let in just as its caller goes: its pass comes back for the next.
    left.abort();
    drop(inside);
    let _ = left.await;
    next.await.unwrap();
    assert_eq!(door.lock().inside, 0);
}

/// A door of one that is full, and a call on another connection entering with a 30 s deadline.
fn full_door_and_a_call_with_30s() -> (Arc<Door>, Admission, Pass, tokio::task::JoinHandle<Result<(), DoorRefusal>>) {
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    let deadline = Instant::now() + Duration::from_secs(30);
    let waiter = {
        let (door, admission) = (door.clone(), admission.clone());
        tokio::spawn(async move { door.enter(&admission, B, Some(deadline), &HoldBounds::default()).await.map(drop) })
    };
    (door, admission, inside, waiter)
}

#[tokio::test(start_paused = true)]
async fn a_call_waits_at_the_door_until_its_deadline_then_leaves_its_line() {
    let (door, _admission, inside, waiter) = full_door_and_a_call_with_30s();
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(!waiter.is_finished(), "it waits its turn while its deadline allows");
    assert_eq!(waiting(&door), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(waiter.await.unwrap().is_err(), "its deadline passed at the door");
    assert_eq!(waiting(&door), 0, "and it left its line");
    drop(inside);
    assert_eq!(door.lock().inside, 0, "no pass was left behind");
}

#[tokio::test(start_paused = true)]
async fn a_call_with_a_deadline_goes_in_when_its_turn_comes_first() {
    let (_door, _admission, inside, waiter) = full_door_and_a_call_with_30s();
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(inside);
    assert!(waiter.await.unwrap().is_ok(), "in once a call finished");
}

#[test]
fn a_deadline_of_several_queue_timeouts_is_patient_and_a_short_one_is_not() {
    let now = Instant::now();
    let queue_timeout = Duration::from_secs(2);
    assert!(is_patient(None, queue_timeout, now), "no deadline: it waits as long as it takes");
    assert!(is_patient(Some(now + Duration::from_secs(30)), queue_timeout, now), "30 s: a patient caller");
    assert!(is_patient(Some(now + queue_timeout * PATIENT_DEADLINE_FACTOR), queue_timeout, now));
    assert!(!is_patient(Some(now + Duration::from_secs(1)), queue_timeout, now), "within the queue timeout");
    assert!(!is_patient(Some(now + Duration::from_millis(100)), queue_timeout, now), "a 100 ms query");
    assert!(!is_patient(Some(now + Duration::from_millis(7_999)), queue_timeout, now), "just short of four");
}

#[tokio::test(start_paused = true)]
async fn the_doors_hold_a_bounded_number_of_calls_each_for_a_bounded_time_and_charged() {
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    let memory = crate::admission::memory::MemoryBudget::new(3 * HELD_CALL_BYTES, None);
    let bounds = HoldBounds { max_held: 2, max_hold: Duration::from_secs(5), memory: memory.clone() };
    let wait = |connection| {
        let (door, admission, bounds) = (door.clone(), admission.clone(), bounds.clone());
        tokio::spawn(async move { door.enter(&admission, connection, None, &bounds).await.map(drop) })
    };
    let (first, second) = (wait(A), wait(B));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!((waiting(&door), memory.charged()), (2, 2 * HELD_CALL_BYTES), "each place in line is charged");
    let third = door.enter(&admission, B, None, &bounds).await.map(drop);
    assert_eq!(third, Err(DoorRefusal::Full { held: 2 }), "one past the cap is told at once");
    assert!(third.unwrap_err().retry_after().is_some());
    tokio::time::sleep(Duration::from_secs(5)).await;
    for waiter in [first, second] {
        let refused = waiter.await.unwrap();
        assert!(matches!(refused, Err(DoorRefusal::HeldTooLong { .. })), "no deadline, still bounded: {refused:?}");
    }
    assert_eq!((waiting(&door), memory.charged()), (0, 0), "the lines and the charges are given back");
    let tight = HoldBounds { memory: crate::admission::memory::MemoryBudget::new(100, None), ..bounds };
    let refused = door.enter(&admission, A, None, &tight).await.map(drop);
    assert!(matches!(refused, Err(DoorRefusal::Memory(_))), "{refused:?}");
    drop(inside);
}

#[tokio::test(start_paused = true)]
async fn a_full_door_gives_another_connections_call_the_place_of_the_floods_newest() {
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    let bounds = HoldBounds { max_held: 3, ..HoldBounds::default() };
    let wait = |connection| {
        let (door, admission, bounds) = (door.clone(), admission.clone(), bounds.clone());
        tokio::spawn(async move { door.enter(&admission, connection, None, &bounds).await.map(drop) })
    };
    let flood: Vec<_> = (0..3).map(|_| wait(A)).collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(waiting(&door), 3, "the flood fills the door");
    let steady = wait(B);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(waiting(&door), 3, "still at the cap");
    let mut flood = flood.into_iter();
    let newest = flood.next_back().unwrap().await.unwrap();
    assert_eq!(newest, Err(DoorRefusal::Full { held: 3 }), "the flood's newest call made room");
    drop(inside);
    assert_eq!(steady.await.unwrap(), Ok(()), "the other connection's call takes its turn");
    for older in flood {
        assert_eq!(older.await.unwrap(), Ok(()));
    }
    assert_eq!(waiting(&door), 0);
}
