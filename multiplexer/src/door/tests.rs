use std::time::Duration;

use futures::FutureExt as _;
use tokio::time::Instant;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(1);
const A: ConnectionId = ConnectionId(1);
const B: ConnectionId = ConnectionId(2);

fn door() -> Arc<Door> {
    Door::new(Metrics::new())
}

fn pass_now(door: &Arc<Door>, connection: ConnectionId, budget: usize) -> Pass {
    door.enter(connection, budget, TIMEOUT, None).now_or_never().expect("in at once").expect("not held")
}

/// A call entering in the background: the instant it went in, or why not.
fn entering(
    door: &Arc<Door>,
    connection: ConnectionId,
    budget: usize,
) -> tokio::task::JoinHandle<Result<Instant, Held>> {
    let door = door.clone();
    tokio::spawn(async move {
        let pass = door.enter(connection, budget, TIMEOUT, None).await?;
        let now = Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(pass);
        Ok(now)
    })
}

fn waiting(door: &Door) -> usize {
    door.lock().lines.values().map(VecDeque::len).sum()
}

#[tokio::test(start_paused = true)]
async fn calls_beyond_the_budget_wait_and_go_in_as_calls_finish() {
    let door = door();
    let inside: Vec<Pass> = (0..3).map(|_| pass_now(&door, A, 3)).collect();
    let first = entering(&door, A, 3);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = entering(&door, A, 3);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!first.is_finished() && !second.is_finished(), "the fourth and fifth calls wait");
    assert_eq!(waiting(&door), 2);
    let text = prometheus::TextEncoder::new().encode_to_string(&door.metrics.registry.gather()).unwrap();
    assert!(text.contains("\nteifleet_held_at_door 2\n"), "{text}");
    drop(inside);
    let (first, second) = (first.await.unwrap().expect("in"), second.await.unwrap().expect("in"));
    assert!(first <= second, "in arrival order");
    assert_eq!(door.lock().inside, 0);
}

#[tokio::test(start_paused = true)]
async fn connections_take_turns() {
    let door = door();
    let inside = pass_now(&door, A, 1);
    // A queues three, then B one: B's call goes in second, not fourth.
    let a: Vec<_> = (0..3).map(|_| entering(&door, A, 1)).collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let b = entering(&door, B, 1);
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(inside);
    let mut a_times = Vec::new();
    for call in a {
        a_times.push(call.await.unwrap().expect("in"));
    }
    let b_time = b.await.unwrap().expect("in");
    assert!(a_times[0] < b_time && b_time < a_times[1], "A, B, A, A: {a_times:?} {b_time:?}");
}

#[tokio::test(start_paused = true)]
async fn a_budget_that_grows_lets_waiting_calls_in() {
    let door = door();
    let _inside = pass_now(&door, A, 1);
    let held = entering(&door, A, 1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!held.is_finished());
    // The next call reads a budget of 3: it and the one waiting both go in.
    let _also = door.enter(B, 3, TIMEOUT, None).await.expect("in");
    held.await.unwrap().expect("in once the budget grew");
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waits_past_the_queue_timeout_or_its_deadline_is_refused_and_leaves_the_line() {
    let door = door();
    let inside = pass_now(&door, A, 1);
    let held = door.enter(A, 1, TIMEOUT, None).await.err().expect("held");
    assert!(matches!(held, Held::QueueTimeout { waited } if waited >= TIMEOUT), "{held:?}");
    let deadline = Instant::now() + Duration::from_millis(200);
    let held = door.enter(B, 1, TIMEOUT, Some(deadline)).await.err().expect("held");
    assert!(matches!(held, Held::Deadline { waited } if waited >= Duration::from_millis(200)), "{held:?}");
    assert_eq!(waiting(&door), 0);
    assert!(door.lock().turns.is_empty());
    drop(inside);
    let _next = pass_now(&door, A, 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_leaves_takes_no_pass() {
    let door = door();
    let inside = pass_now(&door, A, 1);
    let mut gone = Box::pin(door.enter(A, 1, TIMEOUT, None));
    assert!((&mut gone).now_or_never().is_none());
    let staying = entering(&door, B, 1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(gone);
    assert_eq!(waiting(&door), 1, "the caller that left is out of line");
    drop(inside);
    staying.await.unwrap().expect("the pass went to the caller still waiting");
    assert_eq!(door.lock().inside, 0);
    assert!(door.lock().lines.is_empty() && door.lock().turns.is_empty());
}
