use std::time::Duration;

use futures::FutureExt as _;
use tokio::time::Instant;

use super::*;
use crate::admission::{Cost, Limits, Priority};

const TIMEOUT: Duration = Duration::from_secs(1);
const A: ConnectionId = ConnectionId(1);
const B: ConnectionId = ConnectionId(2);

/// A door and a pool that can serve or queue `budget` calls.
fn door(budget: usize) -> (Arc<Door>, Admission) {
    (Door::new(Metrics::new()), Admission::new(Limits::new(budget, 0, TIMEOUT)))
}

fn ask(deadline: Option<Instant>) -> Ask<'static> {
    Ask::new(Priority::Standard).deadline(deadline)
}

fn pass_now(door: &Arc<Door>, admission: &Admission, connection: ConnectionId) -> Pass {
    door.enter(admission, ask(None), connection).now_or_never().expect("in at once").expect("not refused")
}

/// A call entering in the background, holding its pass 10 ms: the instant it went in, or why not.
fn entering(
    door: &Arc<Door>,
    admission: &Admission,
    connection: ConnectionId,
    deadline: Option<Instant>,
) -> tokio::task::JoinHandle<Result<Instant, AdmissionError>> {
    let (door, admission) = (door.clone(), admission.clone());
    tokio::spawn(async move {
        let pass = door.enter(&admission, ask(deadline), connection).await?;
        let now = Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(pass);
        Ok(now)
    })
}

fn waiting(door: &Door) -> usize {
    let lobby = door.lock();
    let waiting = lobby.lines.values().map(VecDeque::len).sum();
    assert_eq!(lobby.waiting, waiting, "the count follows the lines");
    waiting
}

#[tokio::test(start_paused = true)]
async fn calls_beyond_the_budget_wait_and_go_in_as_calls_finish() {
    let (door, admission) = door(3);
    let inside: Vec<Pass> = (0..3).map(|_| pass_now(&door, &admission, A)).collect();
    let first = entering(&door, &admission, A, None);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = entering(&door, &admission, A, None);
    // Without a deadline a call waits its turn, past the queue timeout.
    tokio::time::sleep(TIMEOUT * 3).await;
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
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    // A queues three, then B one: B's call goes in second, not fourth.
    let a: Vec<_> = (0..3).map(|_| entering(&door, &admission, A, None)).collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let b = entering(&door, &admission, B, None);
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
    let (door, admission) = door(1);
    let _inside = pass_now(&door, &admission, A);
    let held = entering(&door, &admission, A, None);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!held.is_finished());
    // The next call reads a budget of 3: it and the one waiting both go in.
    admission.set_limits(Limits::new(3, 0, TIMEOUT));
    let _also = door.enter(&admission, ask(None), B).await.expect("in");
    held.await.unwrap().expect("in once the budget grew");
}

#[tokio::test(start_paused = true)]
async fn a_call_with_a_deadline_waits_no_longer_than_it_or_the_queue_timeout() {
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    let soon = Instant::now() + Duration::from_millis(200);
    let refused = door.enter(&admission, ask(Some(soon)), A).await.err().expect("refused");
    assert!(matches!(refused, AdmissionError::DeadlineExpired { waited } if waited >= Duration::from_millis(200)));
    let later = Instant::now() + TIMEOUT * 5;
    let refused = door.enter(&admission, ask(Some(later)), B).await.err().expect("refused");
    assert!(matches!(refused, AdmissionError::QueueTimeout { waited, .. } if waited >= TIMEOUT), "{refused:?}");
    assert_eq!(waiting(&door), 0);
    assert!(door.lock().turns.is_empty());
    drop(inside);
    let _next = pass_now(&door, &admission, A);
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_the_line_would_outlast_is_refused_at_once() {
    let (door, admission) = door(1);
    // Teach the pool that a call takes 100 ms.
    let permit = admission.try_acquire(Cost::ONE).expect("room");
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(permit);
    let inside = pass_now(&door, &admission, A);
    let _waiting: Vec<_> = (0..5).map(|_| entering(&door, &admission, A, None)).collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Five ahead on its connection at 100 ms each: a 300 ms deadline cannot be met, and it is
    // said at once. (On another connection it would be one turn behind, and wait.)
    let started = Instant::now();
    let deadline = started + Duration::from_millis(300);
    let refused = door.enter(&admission, ask(Some(deadline)), A).await.err().expect("refused");
    assert_eq!(started.elapsed(), Duration::ZERO, "at once");
    assert!(matches!(refused, AdmissionError::DeadlineUnmeetable { .. }), "{refused:?}");
    assert!(refused.retry().is_some(), "with a retry hint");
    assert_eq!(waiting(&door), 5, "and it never stood in line");
    drop(inside);
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_leaves_takes_no_pass() {
    let (door, admission) = door(1);
    let inside = pass_now(&door, &admission, A);
    let mut gone = Box::pin(door.enter(&admission, ask(None), A));
    assert!((&mut gone).now_or_never().is_none());
    let staying = entering(&door, &admission, B, None);
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(gone);
    assert_eq!(waiting(&door), 1, "the caller that left is out of line");
    drop(inside);
    staying.await.unwrap().expect("the pass went to the caller still waiting");
    assert_eq!(door.lock().inside, 0);
    assert!(door.lock().lines.is_empty() && door.lock().turns.is_empty());
}

#[test]
fn a_newcomer_is_behind_its_own_line_and_one_turn_of_each_other_line_per_call_of_its_own() {
    let door = Door::new(Metrics::new());
    let mut lobby = door.lock();
    let line = |n: usize| (0..n).map(|id| Waiter { id: id as u64, grant: oneshot::channel().0 }).collect();
    lobby.lines.insert(A, line(10));
    lobby.lines.insert(ConnectionId(3), line(1));
    assert_eq!(lobby.ahead_of(B), 2, "one turn of A's, C's one");
    lobby.lines.insert(B, line(2));
    assert_eq!(lobby.ahead_of(B), 2 + 3 + 1, "its own two, three turns of A's, C's one");
}
