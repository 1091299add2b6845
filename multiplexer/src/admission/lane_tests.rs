//! The two lanes: ingest takes what queries leave, keeps its floor under query overload, waits
//! rather than being refused, and is never evicted for queries.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::*;

/// Records what admission tells the lane observer.
#[derive(Clone, Default)]
struct Seen {
    decided: Arc<Mutex<BTreeMap<(Lane, &'static str), usize>>>,
    queued: Arc<Mutex<[usize; 2]>>,
    let_in: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl LaneObserver for Seen {
    fn queued(&self, lane: Lane, queued: [usize; 3]) {
        self.queued.lock().unwrap()[lane.index()] = queued.iter().sum();
    }

    fn decided(&self, lane: Lane, outcome: &'static str) {
        *self.decided.lock().unwrap().entry((lane, outcome)).or_default() += 1;
    }

    fn ingest_let_in(&self, why: IngestWhy) {
        *self.let_in.lock().unwrap().entry(why.as_str()).or_default() += 1;
    }
}

impl Seen {
    fn count(&self, lane: Lane, outcome: &str) -> usize {
        self.decided.lock().unwrap().iter().filter(|((l, o), _)| *l == lane && *o == outcome).map(|(_, n)| n).sum()
    }

    fn let_in(&self, why: IngestWhy) -> usize {
        self.let_in.lock().unwrap().get(why.as_str()).copied().unwrap_or(0)
    }
}

fn observed(limits: Limits) -> (Admission, Seen) {
    let seen = Seen::default();
    (Admission::with_observers(limits, |_| {}, seen.clone()), seen)
}

/// Lets spawned waiters run up to their next await point.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// A closed-loop caller of `lane` until `end`, each call of `cost`: each admitted call holds its
/// permit for `hold`; a refused one tries again a millisecond later. Records the order of
/// admissions.
#[allow(clippy::too_many_arguments)]
fn worker(
    admission: &Admission,
    lane: Lane,
    cost: Cost,
    deadline: Option<Duration>,
    hold: Duration,
    end: Instant,
    order: &Arc<Mutex<Vec<Lane>>>,
) -> tokio::task::JoinHandle<usize> {
    let (admission, order) = (admission.clone(), order.clone());
    tokio::spawn(async move {
        let mut refused = 0;
        while Instant::now() < end {
            let ask = Ask::new(Priority::Standard).lane(lane).cost(cost).deadline(deadline.map(|d| Instant::now() + d));
            match admission.acquire(ask).await {
                Ok(permit) => {
                    order.lock().unwrap().push(lane);
                    tokio::time::sleep(hold).await;
                    drop(permit);
                }
                Err(_) => {
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
        refused
    })
}

/// `ingest` closed-loop ingest callers of `cost` beside `queries` closed-loop one-input query
/// callers with a 1 s deadline, each call held 10 ms, until `end`: the queries overload the pool
/// and no ingest call is refused. The order of the admissions.
async fn overload_beside_ingest(
    admission: &Admission,
    ingest: usize,
    cost: Cost,
    queries: usize,
    end: Instant,
) -> Vec<Lane> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let hold = Duration::from_millis(10);
    let ingest: Vec<_> = (0..ingest).map(|_| worker(admission, Lane::Ingest, cost, None, hold, end, &order)).collect();
    let queries: Vec<_> = (0..queries)
        .map(|_| worker(admission, Lane::Query, Cost::ONE, Some(Duration::from_secs(1)), hold, end, &order))
        .collect();
    let mut refused_queries = 0;
    for task in queries {
        refused_queries += task.await.unwrap();
    }
    for task in ingest {
        assert_eq!(task.await.unwrap(), 0, "no ingest call refused");
    }
    assert!(refused_queries > 0, "the queries did overload the pool");
    order.lock().unwrap().clone()
}

fn longest_run(order: &[Lane], lane: Lane) -> usize {
    order.split(|l| *l != lane).map(<[Lane]>::len).max().unwrap_or(0)
}

/// The admissions once the queries' queue stands and the floor holds, the first quarter (about
/// 0.75 s; the queue stands after a tenth of a second) and the last 20 (once the queries
/// stopped) left out.
fn steady(order: &[Lane]) -> &[Lane] {
    &order[order.len() / 4..order.len() - 20]
}

/// Queries at many times capacity beside ingest pushing as fast as it can: once the queries'
/// queue stands, ingest gets its floor (a tenth of the admissions by default), no more than one
/// ingest call goes between two queries, and no ingest call is refused.
#[tokio::test(start_paused = true)]
async fn ingest_keeps_its_floor_under_query_overload() {
    let (admission, seen) = observed(Limits::new(2, 16, Duration::from_secs(1)));
    let end = Instant::now() + Duration::from_secs(3);
    let order = overload_beside_ingest(&admission, 8, Cost::ONE, 64, end).await;
    let steady = steady(&order);
    let share = steady.iter().filter(|l| **l == Lane::Ingest).count() as f64 / steady.len() as f64;
    assert!((0.095..=0.15).contains(&share), "ingest got {share:.3} of {} admissions", steady.len());
    assert!(seen.let_in(IngestWhy::FloorTurn) > 0, "ingest went in on its floor's turns");
    assert!(longest_run(steady, Lane::Query) <= 10, "ingest passed by at most nine queries: {steady:?}");
    assert!(longest_run(steady, Lane::Ingest) <= 2, "queries go first but for the floor: {steady:?}");
    assert_eq!(seen.count(Lane::Ingest, "evicted") + seen.count(Lane::Ingest, "queue_timeout"), 0);
    assert_eq!(seen.count(Lane::Ingest, ADMITTED), order.iter().filter(|l| **l == Lane::Ingest).count());
}

/// The floor is a share of the inputs, not of the calls: ingest calls of 8 inputs (a bulk
/// call's sub-batches) beside single-input queries overloading the pool get about a tenth of the
/// inputs admitted, not one call in ten (8 of every 17 inputs).
#[tokio::test(start_paused = true)]
async fn the_floor_counts_inputs_so_bulk_sub_batches_get_a_tenth_not_more() {
    const BULK: u32 = 8;
    let admission = Admission::new(Limits::new(16, 64, Duration::from_secs(1)));
    let end = Instant::now() + Duration::from_secs(3);
    let order = overload_beside_ingest(&admission, 4, Cost { inputs: BULK, tokens: 0 }, 128, end).await;
    let steady = steady(&order);
    let ingest_calls = steady.iter().filter(|l| **l == Lane::Ingest).count();
    let ingest_inputs = (ingest_calls * BULK as usize) as f64;
    let share = ingest_inputs / (ingest_inputs + (steady.len() - ingest_calls) as f64);
    assert!((0.09..=0.16).contains(&share), "ingest got {share:.3} of the inputs ({ingest_calls} calls of {BULK})");
}

/// A burst of queries that drains within the standing interval is served ahead of every waiting
/// ingest call, however many queries pass it: the floor is for queries that would take every
/// admission, not for a burst's wait (each turn it took inside a burst made every query behind it
/// wait that call's work). Between bursts ingest takes the pool.
#[tokio::test(start_paused = true)]
async fn a_query_burst_that_drains_passes_waiting_ingest_without_a_floor_turn() {
    const BURST: usize = 16;
    let (admission, seen) = observed(Limits::new(2, 64, Duration::from_secs(1)));
    let hold = Duration::from_millis(10);
    let end = Instant::now() + Duration::from_secs(2);
    let order = Arc::new(Mutex::new(Vec::new()));
    let ingest: Vec<_> = (0..4).map(|_| worker(&admission, Lane::Ingest, Cost::ONE, None, hold, end, &order)).collect();
    let mut bursts = 0;
    while Instant::now() + Duration::from_millis(300) < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Sixteen queries on two places of 10 ms: about 90 ms in the queue, under the standing
        // interval (100 ms at least), and more than the nine a floor of 10% lets pass.
        let deadline = Some(Instant::now() + Duration::from_secs(1));
        let burst: Vec<_> = (0..BURST)
            .map(|_| {
                let (admission, order) = (admission.clone(), order.clone());
                tokio::spawn(async move {
                    let permit = admission.acquire(Ask::new(Priority::Standard).deadline(deadline)).await?;
                    order.lock().unwrap().push(Lane::Query);
                    tokio::time::sleep(hold).await;
                    drop(permit);
                    Ok::<_, AdmissionError>(())
                })
            })
            .collect();
        for task in burst {
            task.await.unwrap().expect("every query of the burst served");
        }
        bursts += 1;
    }
    for task in ingest {
        assert_eq!(task.await.unwrap(), 0, "no ingest call refused");
    }
    let order = order.lock().unwrap().clone();
    assert!(bursts >= 5, "{bursts} bursts");
    assert_eq!(seen.let_in(IngestWhy::FloorTurn), 0, "no floor turn inside a burst: {order:?}");
    assert!(longest_run(&order, Lane::Query) >= BURST, "a burst went whole: {order:?}");
    let ingest_served = order.iter().filter(|l| **l == Lane::Ingest).count();
    assert!(ingest_served >= 200, "ingest took the pool between bursts: {ingest_served} calls");
}

/// Without queries, ingest takes the whole pool; a query that then arrives takes the next slot
/// that frees, ahead of every waiting ingest call: it waits behind the ingest in flight only.
#[tokio::test(start_paused = true)]
async fn a_query_waits_only_behind_the_ingest_in_flight() {
    let admission = Admission::new(Limits::new(2, 16, Duration::from_secs(1)));
    let end = Instant::now() + Duration::from_secs(2);
    let order = Arc::new(Mutex::new(Vec::new()));
    let ingest: Vec<_> = (0..10)
        .map(|_| worker(&admission, Lane::Ingest, Cost::ONE, None, Duration::from_millis(10), end, &order))
        .collect();
    tokio::time::sleep(Duration::from_millis(105)).await;
    let snapshot = admission.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.queued_total()), (2, 8), "ingest fills the pool and waits");
    let asked = Instant::now();
    let query = admission.acquire(Ask::new(Priority::Standard).deadline(Some(asked + Duration::from_secs(1)))).await;
    let waited = asked.elapsed();
    assert!(query.is_ok());
    assert!(waited <= Duration::from_millis(10), "one ingest call's hold at most, not eight: {waited:?}");
    drop(query);
    for task in ingest {
        assert_eq!(task.await.unwrap(), 0);
    }
    let served = order.lock().unwrap().len();
    assert!(served >= 390, "ingest used the pool: {served} calls of 10 ms on 2 slots in 2 s");
}

/// A spike of queries, critical ones included, fills the queries' own queue and is refused
/// beyond it; the ingest calls waiting (more than `maxQueued` of them: they have no deadline)
/// are neither evicted nor refused, and are all served once the spike has passed.
#[tokio::test(start_paused = true)]
async fn a_query_spike_neither_evicts_nor_refuses_ingest() {
    let (admission, seen) = observed(Limits::new(2, 4, Duration::from_secs(1)));
    let held = [(); 2].map(|_| admission.try_acquire(&Ask::new(Priority::Standard)).expect("room"));
    let ingest: Vec<_> = (0..6)
        .map(|_| {
            let admission = admission.clone();
            tokio::spawn(
                async move { admission.acquire(Ask::new(Priority::Sheddable).lane(Lane::Ingest)).await.map(drop) },
            )
        })
        .collect();
    settle().await;
    let deadline = Some(Instant::now() + Duration::from_secs(1));
    let spike: Vec<_> = (0..40)
        .map(|_| {
            let admission = admission.clone();
            let ask = Ask::new(Priority::Critical).deadline(deadline);
            tokio::spawn(async move { admission.acquire(ask).await.map(drop) })
        })
        .collect();
    settle().await;
    assert_eq!(*seen.queued.lock().unwrap(), [4, 6], "each lane's queue on its own");
    assert_eq!(seen.count(Lane::Query, "shed_queue_full"), 36);
    drop(held);
    for task in spike {
        let _ = task.await.unwrap();
    }
    for task in ingest {
        task.await.unwrap().expect("every ingest call served");
    }
    assert_eq!(seen.count(Lane::Ingest, ADMITTED), 6);
    assert_eq!(seen.count(Lane::Query, ADMITTED), 2 + 4);
    assert_eq!(admission.snapshot().queued_total(), 0);
}

/// Ingest without a deadline outwaits the queue timeout that a query is held to; ingest with a
/// deadline is held to its word like a query: refused at once when its turn cannot come in time.
#[tokio::test(start_paused = true)]
async fn ingest_waits_past_the_queue_timeout_unless_it_set_a_deadline() {
    let admission = Admission::new(Limits::new(1, 4, Duration::from_millis(100)));
    let taught = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(taught);
    let held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let ingest = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard).lane(Lane::Ingest)).await.map(drop) })
    };
    let query = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Priority::Standard)).await.map(drop) })
    };
    settle().await;
    let hurried =
        Ask::new(Priority::Standard).lane(Lane::Ingest).deadline(Some(Instant::now() + Duration::from_millis(20)));
    let refused = admission.acquire(hurried).await.unwrap_err();
    assert!(matches!(refused, AdmissionError::DeadlineUnmeetable { .. }), "{refused:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(matches!(query.await.unwrap(), Err(AdmissionError::QueueTimeout { .. })));
    drop(held);
    ingest.await.unwrap().expect("ingest waited for its turn");
}

/// Within the ingest lane, priorities and tenants order the queue as they do for queries.
#[tokio::test(start_paused = true)]
async fn priorities_and_tenants_work_inside_the_ingest_lane() {
    let admission = Admission::new(Limits::new(1, 16, Duration::from_secs(1)));
    let held = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let asks =
        [(Priority::Sheddable, "a"), (Priority::Standard, "a"), (Priority::Standard, "a"), (Priority::Standard, "b")];
    for (priority, tenant) in asks {
        let (admission, order) = (admission.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let ask = Ask::new(priority).lane(Lane::Ingest).tenant(Some(tenant));
            let permit = admission.acquire(ask).await.unwrap();
            order.lock().unwrap().push((priority, tenant));
            drop(permit);
        }));
        settle().await;
    }
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        [(Priority::Standard, "a"), (Priority::Standard, "b"), (Priority::Standard, "a"), (Priority::Sheddable, "a")],
        "priority first, then tenants take turns"
    );
}

/// While queries come, ingest waits for the last quarter of TEI's running batch (read from the
/// permits coming back and TEI's reported batch time) before it takes the permits left free, so a
/// query arriving earlier takes one at once; the gate opens on its own timer, with no permit
/// back, and stays open once the queries stop. (A reserve of 0, said explicitly, leaves the places
/// out of play.)
#[tokio::test(start_paused = true)]
async fn ingest_waits_for_the_end_of_teis_batch_while_queries_come() {
    const BATCH: Duration = Duration::from_millis(24);
    let admission = Admission::new(Limits { query_reserve: Some(0), ..Limits::new(16, 64, Duration::from_secs(1)) });
    let ingest = Ask::new(Priority::Standard).lane(Lane::Ingest);
    // Eight queries in flight for a few seconds, TEI reporting 24 ms batches.
    let mut queries: Vec<Permit> =
        (0..8).map(|_| admission.try_acquire(&Ask::new(Priority::Standard)).unwrap()).collect();
    queries[0].observe(Observation { tei_inference: BATCH, ..Default::default() });
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Four come back: their batch ended and the next one started.
    queries.truncate(4);
    let batch_start = Instant::now();

    assert!(admission.try_acquire(&ingest).is_none(), "twelve permits free, but the batch just started");
    let waiting = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(ingest).await.map(|permit| (permit, Instant::now())) })
    };
    settle().await;
    let query = admission.try_acquire(&Ask::new(Priority::Standard));
    assert!(query.is_some(), "a query walks in while ingest waits");
    let (permit, admitted) = waiting.await.unwrap().unwrap();
    assert_eq!(admitted - batch_start, BATCH.mul_f64(ingest_gate::OPENS_AFTER), "let in by the gate's timer");
    let mut held = vec![permit];
    while let Some(permit) = admission.try_acquire(&ingest) {
        held.push(permit);
    }
    assert_eq!(held.len(), 16 - 5, "in the batch's last quarter ingest takes every place left");

    // The queries stop; seconds later a permit coming back no longer closes the gate.
    drop((queries, query));
    tokio::time::sleep(Duration::from_secs(10)).await;
    held.pop();
    assert!(admission.try_acquire(&ingest).is_some(), "no queries: ingest goes at once");
}

/// With `queryReserve`, ingest fills TEI's next batch (half the in-flight limit) only up to the
/// places the reserve leaves while queries come: the rest is there for a query that arrives late
/// in the running batch. The next batch starts empty when a call comes back, and once the queries
/// stop, ingest takes every place.
#[tokio::test(start_paused = true)]
async fn ingest_leaves_the_query_reserve_of_the_next_batch_while_queries_come() {
    let limits = Limits { query_reserve: Some(25), ..Limits::new(16, 64, Duration::from_secs(1)) };
    let admission = Admission::new(limits);
    let ingest = Ask::new(Priority::Standard).lane(Lane::Ingest);
    let take_all = |held: &mut Vec<Permit>| {
        while let Some(permit) = admission.try_acquire(&ingest) {
            held.push(permit);
        }
    };
    // Two queries in flight for a few seconds: they come. TEI reports no batch times, so the
    // gate's timing is out of play and only the reserve holds ingest back.
    let mut queries: Vec<Permit> =
        (0..2).map(|_| admission.try_acquire(&Ask::new(Priority::Standard)).unwrap()).collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut held = Vec::new();
    take_all(&mut held);
    assert_eq!(held.len(), 6 - 2, "a batch of 8, a quarter kept for queries, two places theirs already");
    queries.push(admission.try_acquire(&Ask::new(Priority::Standard)).expect("a late query takes a kept place"));

    // A query comes back: its batch ended, the next one runs, and a new next batch opens.
    queries.pop();
    take_all(&mut held);
    assert_eq!(held.len(), 4 + 6, "six more for the new next batch");

    // The queries stop; seconds later ingest fills every place of the limit.
    drop(queries);
    tokio::time::sleep(Duration::from_secs(10)).await;
    take_all(&mut held);
    assert_eq!(held.len(), 16, "no queries: ingest takes every place");
}

/// By default (no `queryReserve`) the places ingest may fill come from TEI's batch-time curve;
/// before the pool has seen batches of two sizes, ingest takes half of TEI's next batch while
/// queries come (which also shows the curve a second size), and every place once they stop.
#[tokio::test(start_paused = true)]
async fn by_default_ingest_takes_half_the_next_batch_until_the_curve_is_known() {
    let admission = Admission::new(Limits::new(16, 64, Duration::from_secs(1)));
    let ingest = Ask::new(Priority::Standard).lane(Lane::Ingest);
    let take_all = |held: &mut Vec<Permit>| {
        while let Some(permit) = admission.try_acquire(&ingest) {
            held.push(permit);
        }
    };
    let queries: Vec<Permit> = (0..2).map(|_| admission.try_acquire(&Ask::new(Priority::Standard)).unwrap()).collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut held = Vec::new();
    take_all(&mut held);
    assert_eq!(held.len(), 4 - 2, "half of a batch of 8, two places the queries' already");

    drop(queries);
    tokio::time::sleep(Duration::from_secs(10)).await;
    take_all(&mut held);
    assert_eq!(held.len(), 16, "no queries: ingest takes every place");
}

/// TEI on a CPU (a batch of 4 ingest inputs 98 ms, a query alone 35 ms: no places beside
/// queries), queries one every 50 ms and now and then 150 ms apart: an ingest call that waits on
/// its ration of TEI's idle time when the queries stop goes in once they have stopped (twice
/// their longest recent gap after the last, some 260 ms), not when the ration's timer, set while
/// they came, fires over half a second on (the stale count's wake, two batch times after the
/// last answer, comes before they have stopped and finds the ration still holding).
#[tokio::test(start_paused = true)]
async fn ingest_rationed_while_queries_came_goes_once_they_have_stopped() {
    let admission = Admission::new(Limits::new(8, 64, Duration::from_secs(1)));
    let ingest = Ask::new(Priority::Standard).lane(Lane::Ingest);
    let query = Ask::new(Priority::Standard);
    let tei = |millis: u64, i: u32| Observation {
        tei_inference: Duration::from_millis(millis) + Duration::from_nanos(u64::from(i % 2)),
        ..Default::default()
    };
    for i in 0..20 {
        let batch: Vec<Permit> = (0..4).map(|_| admission.try_acquire(&ingest).unwrap()).collect();
        tokio::time::sleep(Duration::from_millis(98)).await;
        batch.iter().for_each(|permit| permit.observe(tei(98, i)));
    }
    let mut last_query = Instant::now();
    for i in 0..100 {
        let permit = admission.try_acquire(&query).unwrap();
        last_query = Instant::now();
        tokio::time::sleep(Duration::from_millis(35)).await;
        permit.observe(tei(35, i));
        drop(permit);
        tokio::time::sleep(Duration::from_millis(if i % 10 == 5 { 115 } else { 15 })).await;
    }
    // TEI idle, the ration full: one input goes, and spends it.
    drop(admission.try_acquire(&ingest).expect("an idle TEI takes the ration's input"));
    let waiting = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(ingest).await.map(|_| Instant::now()) })
    };
    let admitted = waiting.await.unwrap().unwrap();
    let after = admitted - last_query;
    assert!(after < Duration::from_millis(350), "let in {after:?} after the last query");
}
