use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::time::Instant;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(1);

fn doors() -> Arc<Doors> {
    Doors::new(Metrics::new())
}

async fn through(door: &Arc<Door>, budget: usize) -> Pass {
    door.enter(budget, TIMEOUT, None).now_or_never().expect("through at once").expect("not held")
}

fn busy(doors: &Doors) -> usize {
    doors.busy.load(Ordering::Relaxed)
}

#[tokio::test(start_paused = true)]
async fn a_lone_connection_gets_the_whole_budget_and_its_next_calls_wait_in_order() {
    let doors = doors();
    let door = doors.door();
    let passes: Vec<Pass> = futures::future::join_all((0..3).map(|_| through(&door, 3))).await;
    let first = tokio::spawn({
        let door = door.clone();
        async move { door.enter(3, TIMEOUT, None).await.map(|_| Instant::now()) }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = tokio::spawn({
        let door = door.clone();
        async move { door.enter(3, TIMEOUT, None).await.map(|_| Instant::now()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!first.is_finished() && !second.is_finished(), "the fourth and fifth calls wait");
    assert_eq!(door.lock().waiting.len(), 2);
    let text = prometheus::TextEncoder::new().encode_to_string(&doors.metrics.registry.gather()).unwrap();
    assert!(text.contains("\nteifleet_held_at_door 2\n"), "{text}");
    drop(passes);
    let (first, second) = (first.await.unwrap().expect("through"), second.await.unwrap().expect("through"));
    assert!(first <= second, "in arrival order");
}

#[tokio::test(start_paused = true)]
async fn busy_connections_share_the_budget_and_idle_ones_count_for_nothing() {
    let doors = doors();
    let (a, b, idle) = (doors.door(), doors.door(), doors.door());
    let _a = (through(&a, 4).await, through(&a, 4).await);
    let _b = through(&b, 4).await;
    assert_eq!(busy(&doors), 2, "the idle connection is not counted");
    assert!(a.enter(4, TIMEOUT, None).now_or_never().is_none(), "a third call on `a` is over its half");
    let _b2 = through(&b, 4).await;
    assert!(b.enter(4, TIMEOUT, None).now_or_never().is_none(), "and so is a third on `b`");
    drop(idle);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waits_past_the_queue_timeout_or_its_deadline_is_refused_and_leaves_the_line() {
    let doors = doors();
    let door = doors.door();
    let pass = through(&door, 1).await;
    let held = door.enter(1, TIMEOUT, None).await.err().expect("held");
    assert!(matches!(held, Held::QueueTimeout { waited } if waited >= TIMEOUT), "{held:?}");
    let deadline = Instant::now() + Duration::from_millis(200);
    let held = door.enter(1, TIMEOUT, Some(deadline)).await.err().expect("held");
    assert!(matches!(held, Held::Deadline { waited } if waited >= Duration::from_millis(200)), "{held:?}");
    assert!(door.lock().waiting.is_empty());
    drop(pass);
    assert_eq!(busy(&doors), 0, "the connection is idle again");
    let _next = through(&door, 1).await;
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_leaves_the_line_takes_no_pass() {
    let doors = doors();
    let door = doors.door();
    let pass = through(&door, 1).await;
    let left = tokio::spawn({
        let door = door.clone();
        async move { door.enter(1, TIMEOUT, None).await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    left.abort();
    let _ = left.await;
    let staying = tokio::spawn({
        let door = door.clone();
        async move { door.enter(1, TIMEOUT, None).await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(pass);
    assert!(staying.await.unwrap(), "the pass went to the caller still waiting");
    assert_eq!(door.lock().through, 0);
    assert_eq!(busy(&doors), 0);
}

#[tokio::test(start_paused = true)]
async fn a_pass_whose_caller_left_goes_to_the_next_in_line() {
    let doors = doors();
    let door = doors.door();
    let pass = through(&door, 1).await;
    // Two in line; the first's caller is gone by the time the door lets it through.
    let mut gone = Box::pin(door.enter(1, TIMEOUT, None));
    assert!((&mut gone).now_or_never().is_none());
    let next = tokio::spawn({
        let door = door.clone();
        async move { door.enter(1, TIMEOUT, None).await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(pass);
    drop(gone);
    assert!(next.await.unwrap());
    assert_eq!(door.lock().through, 0);
    assert_eq!(busy(&doors), 0);
}
