//! A pool's share of a time-sliced GPU through the admission queue (see `contention` and
//! `device_time`), in tokio's paused time: the cap holds while TEI's batch times say a neighbour
//! is busy, and lifts when they say it is quiet.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::*;

/// A batch of this pool alone on the device.
const BATCH: Duration = Duration::from_millis(4);
/// A neighbour's batch, which every other batch of this pool waits for while the neighbour is busy.
const NEIGHBOUR: Duration = Duration::from_millis(6);

fn shared(in_flight: usize, share: Option<u8>, cap: Option<u8>) -> Limits {
    Limits { gpu_share: share, device_time_cap: cap, ..Limits::new(in_flight, 64, Duration::from_secs(5)) }
}

/// `callers` closed-loop callers for `run`, each call taking TEI `BATCH`, or `BATCH + NEIGHBOUR`
/// every other call when `neighbour_busy`, and reported as such: the share of the time any call
/// was in flight, and how many calls went through.
async fn flood(admission: &Admission, callers: usize, neighbour_busy: bool, run: Duration) -> (f64, usize) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let (admission, spans) = (admission.clone(), spans.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = caller;
            while start.elapsed() < run {
                let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
                let taken = Instant::now();
                let took = if neighbour_busy && n % 2 == 0 { BATCH + NEIGHBOUR } else { BATCH };
                n += 1;
                tokio::time::sleep(took).await;
                // Each call a batch of its own: TEI's time for it, to the nanosecond, is its own.
                let reported = took + Duration::from_nanos((caller * 1_000 + n % 1_000) as u64);
                permit.observe(Observation { tei_inference: reported, ..Observation::default() });
                drop(permit);
                spans.lock().unwrap().push((taken, Instant::now()));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut spans = std::mem::take(&mut *spans.lock().unwrap());
    let calls = spans.len();
    spans.sort();
    let (mut covered, mut open) = (Duration::ZERO, None::<(Instant, Instant)>);
    for (s, e) in spans {
        open = match open {
            Some((os, oe)) if s <= oe => Some((os, oe.max(e))),
            Some((os, oe)) => {
                covered += oe - os;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    covered += open.map_or(Duration::ZERO, |(s, e)| e - s);
    (covered.as_secs_f64() / start.elapsed().as_secs_f64(), calls)
}

#[tokio::test(start_paused = true)]
async fn a_pool_alone_on_a_shared_gpu_keeps_the_whole_device() {
    let admission = Admission::new(shared(2, Some(25), None));
    let (busy, calls) = flood(&admission, 8, false, Duration::from_secs(4)).await;
    let (_, uncapped) = flood(&Admission::new(shared(2, None, None)), 8, false, Duration::from_secs(4)).await;
    assert!(busy > 0.99, "busy {busy:.3} of the time");
    assert!(calls * 100 >= uncapped * 99, "{calls} calls against {uncapped} without a share");
}

#[tokio::test(start_paused = true)]
async fn the_share_caps_a_pool_while_a_neighbour_is_busy_and_lifts_when_it_is_quiet() {
    let admission = Admission::new(shared(2, Some(25), None));
    let (alone, _) = flood(&admission, 8, false, Duration::from_secs(2)).await;
    assert!(alone > 0.99, "alone: busy {alone:.3} of the time");
    // The neighbour floods: within a few dozen answers the pool is held to its share of the
    // device. Its own work is 2 × BATCH of every 2 × BATCH + NEIGHBOUR in flight; its waits
    // for the neighbour's turn are not charged to it.
    let (beside, _) = flood(&admission, 8, true, Duration::from_secs(4)).await;
    let own = beside * (2 * BATCH).as_secs_f64() / (2 * BATCH + NEIGHBOUR).as_secs_f64();
    assert!(own < 0.30, "beside a busy neighbour: own work {own:.3} of the time (in flight {beside:.3})");
    assert!(own > 0.22, "the share is a ceiling, not a brake: own work {own:.3} of the time");
    // The neighbour goes quiet: the pool's batches stop waiting and the cap lifts once a few
    // dozen answers, at the share's pace, have said so (half a second here).
    let (lifting, _) = flood(&admission, 8, false, Duration::from_secs(1)).await;
    assert!(lifting > 0.5, "lifting: busy {lifting:.3} of the time");
    let (after, _) = flood(&admission, 8, false, Duration::from_secs(2)).await;
    assert!(after > 0.99, "after: busy {after:.3} of the time");
    let snapshot = admission.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.queued_total()), (0, 0), "nothing leaks");
}

#[tokio::test(start_paused = true)]
async fn an_explicit_cap_holds_whether_or_not_a_neighbour_is_busy() {
    let admission = Admission::new(shared(2, Some(50), Some(25)));
    let (busy, _) = flood(&admission, 8, false, Duration::from_secs(4)).await;
    assert!(busy < 0.28, "busy {busy:.3} of the time under a cap of 25 beside nobody");
}

/// One call every `every` for `run`, each taking TEI `BATCH`, or `BATCH + NEIGHBOUR` (a wait
/// for the neighbour's batch every time) when `neighbour_busy`: the longest any call waited to
/// be let in.
async fn paced(admission: &Admission, every: Duration, neighbour_busy: bool, run: Duration) -> Duration {
    let start = Instant::now();
    let mut tasks = Vec::new();
    let mut n = 0u64;
    while start.elapsed() < run {
        let admission = admission.clone();
        n += 1;
        tasks.push(tokio::spawn(async move {
            let asked = Instant::now();
            let permit = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
            let waited = asked.elapsed();
            let took = if neighbour_busy { BATCH + NEIGHBOUR } else { BATCH };
            tokio::time::sleep(took).await;
            permit.observe(Observation {
                tei_inference: took + Duration::from_nanos(n % 1_000 + 1),
                ..Observation::default()
            });
            waited
        }));
        tokio::time::sleep(every).await;
    }
    let mut longest = Duration::ZERO;
    for task in tasks {
        longest = longest.max(task.await.unwrap());
    }
    longest
}

#[tokio::test(start_paused = true)]
async fn a_light_pool_beside_a_busy_neighbour_is_not_held_for_its_waits() {
    // 40 calls a second, each 4 ms of its own work behind a 6 ms neighbour's batch: 40 % of the
    // time in flight, 16 % of it on the device, under a share of 25.
    let every = Duration::from_millis(25);
    let admission = Admission::new(shared(2, Some(25), None));
    paced(&admission, every, false, Duration::from_secs(2)).await;
    let longest = paced(&admission, every, true, Duration::from_secs(6)).await;
    assert!(admission.shared.lock().contention.neighbour_busy(), "the share is in force");
    assert!(longest < Duration::from_millis(1), "a call waited {longest:?}");
    // An explicit cap of 25 still counts the time in flight, waits included: the same load is held.
    let capped = Admission::new(shared(2, Some(25), Some(25)));
    paced(&capped, every, false, Duration::from_secs(2)).await;
    let longest = paced(&capped, every, true, Duration::from_secs(6)).await;
    assert!(longest > Duration::from_millis(5), "under the explicit cap the longest wait was {longest:?}");
}
