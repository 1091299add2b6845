//! Issue 32 through real gRPC: the queue keeps its word to callers that fit, and the `query` and
//! `ingest` lanes share a pool without starving or hurting each other. Capacity here: 4 in flight
//! on a simulator whose batches take 40 ms, about 100 calls a second (slow enough that the
//! debug build's own CPU per call matters little). The tests take turns: they measure rates.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use teifleet_multiplexer::admission::Limits;
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_wire::headers::LANE;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::support::*;

const BATCH: Duration = Duration::from_millis(40);

/// One test of this file at a time: each measures rates and latencies.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn pool(queue_timeout: Duration) -> (teifleet_multiplexer::run::server::Running, teifleet_tei_sim::SimHandle) {
    let sim = sim(|c| c.fixed_latency = BATCH).await;
    let (mux, _) = mux(sim.addr(), Limits { queue_timeout, ..limits(4, 64) }).await;
    (mux, sim)
}

fn call(
    lane: Option<&'static str>,
    deadline: Option<Duration>,
    i: usize,
) -> tonic::Request<teifleet_proto::v1::EmbedRequest> {
    let mut request = tonic::Request::new(embed_request(&format!("text {i}")));
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    if let Some(lane) = lane {
        request.metadata_mut().insert(LANE, lane.parse().unwrap());
    }
    request
}

/// Closed-loop callers until `end`: (answered OK, anything else).
async fn closed_loop(
    client: &EmbedClient<Channel>,
    workers: usize,
    lane: Option<&'static str>,
    deadline: Option<Duration>,
    end: Instant,
) -> (usize, usize) {
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (mut client, ok, failed) = (client.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                let mut i = w * 1_000_000;
                while Instant::now() < end {
                    i += 1;
                    match client.embed(call(lane, deadline, i)).await {
                        Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(status) => {
                            eprintln!("{status:?}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}

/// Queries sent open loop at `rate` a second for `duration`, each with a 1 s deadline: latencies
/// of the OK ones (from when each was due), and how many were not OK.
async fn open_loop(client: &EmbedClient<Channel>, rate: f64, duration: Duration) -> (Vec<Duration>, usize) {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let end = Instant::now() + duration;
    let mut calls = Vec::new();
    for i in 0.. {
        let due = ticks.tick().await;
        if due >= end {
            break;
        }
        let mut client = client.clone();
        calls.push(tokio::spawn(async move {
            client.embed(call(None, Some(Duration::from_secs(1)), i)).await.map(|_| due.elapsed())
        }));
    }
    let (mut latencies, mut failed) = (Vec::new(), 0);
    for answer in calls {
        match answer.await.unwrap() {
            Ok(latency) => latencies.push(latency),
            Err(_) => failed += 1,
        }
    }
    latencies.sort_unstable();
    (latencies, failed)
}

fn p99(latencies: &[Duration]) -> Duration {
    latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]
}

/// `ghz -c 64` and 32 closed-loop workers, as issue 32 found them: every caller fits the queue
/// (`maxInFlight 4`, `maxQueued 64`, `queueTimeout 3s`) and its deadline, so none is refused.
#[tokio::test]
async fn the_queue_keeps_its_word_to_callers_that_fit() {
    let _turn = TURN.lock().await;
    let (mux, _sim) = pool(Duration::from_secs(3)).await;
    let client = embed_client(mux.grpc_addr).await;
    let (ok, refused) =
        closed_loop(&client, 32, None, Some(Duration::from_secs(10)), Instant::now() + Duration::from_secs(3)).await;
    assert_eq!(refused, 0, "32 workers, 10 s deadline: {ok} OK");
    assert!(ok > 100, "{ok} OK");
    let (ok, refused) =
        closed_loop(&client, 64, None, Some(Duration::from_secs(30)), Instant::now() + Duration::from_secs(2)).await;
    assert_eq!(refused, 0, "64 workers, 30 s deadline: {ok} OK, every call served");
    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_lane_admissions_total", &[("outcome", "shed_queue_full")]), 0.0);
}

/// Queries at about 0.6 of capacity beside ingest pushing as fast as it can: the queries' p99
/// stays near their p99 alone, and ingest gets most of the rest.
#[tokio::test]
async fn ingest_takes_what_queries_leave_without_hurting_them() {
    let _turn = TURN.lock().await;
    let (mux, _sim) = pool(Duration::from_secs(2)).await;
    let queries = embed_client(mux.grpc_addr).await;
    let ingest = embed_client(mux.grpc_addr).await;
    let window = Duration::from_secs(3);

    let (ingest_alone, failed) = closed_loop(&ingest, 16, Some("ingest"), None, Instant::now() + window).await;
    assert_eq!(failed, 0);
    let capacity = ingest_alone as f64 / window.as_secs_f64();
    let rate = 0.6 * capacity;
    let (alone, failed) = open_loop(&queries, rate, window).await;
    assert_eq!(failed, 0, "queries alone at {rate:.0}/s");

    let pushing = {
        let ingest = ingest.clone();
        tokio::spawn(async move { closed_loop(&ingest, 16, Some("ingest"), None, Instant::now() + window).await })
    };
    let (beside, failed) = open_loop(&queries, rate, window).await;
    let (ingest_ok, ingest_failed) = pushing.await.unwrap();
    let (p99_alone, p99_beside) = (p99(&alone), p99(&beside));
    println!(
        "capacity {capacity:.0}/s, queries at {rate:.0}/s: p99 alone {p99_alone:?}, beside ingest {p99_beside:?}; \
         ingest {:.0}/s",
        ingest_ok as f64 / window.as_secs_f64()
    );
    assert_eq!((failed, ingest_failed), (0, 0), "nothing refused");
    assert!(p99_beside <= p99_alone * 2 + BATCH / 2, "p99 alone {p99_alone:?}, beside ingest {p99_beside:?}");
    let left = capacity - rate;
    let ingest_rate = ingest_ok as f64 / window.as_secs_f64();
    // Most of it: a loaded machine's noise, not the lanes, is the rest (the bench measures it).
    assert!(ingest_rate >= 0.6 * left, "ingest {ingest_rate:.0}/s of the {left:.0}/s queries left");
}

/// Queries at 1.5 times capacity (150 a second) beside ingest: the queries are refused beyond what fits, ingest
/// keeps at least about its floor (a tenth of the admissions), and no ingest call is refused or
/// lost.
#[tokio::test]
async fn ingest_keeps_its_floor_when_queries_overload_the_pool() {
    let _turn = TURN.lock().await;
    let (mux, _sim) = pool(Duration::from_secs(2)).await;
    let queries = embed_client(mux.grpc_addr).await;
    let ingest = embed_client(mux.grpc_addr).await;
    let window = Duration::from_secs(3);
    let pushing = {
        let ingest = ingest.clone();
        tokio::spawn(async move { closed_loop(&ingest, 8, Some("ingest"), None, Instant::now() + window).await })
    };
    let (_, refused) = open_loop(&queries, 150.0, window).await;
    let (ingest_ok, ingest_failed) = pushing.await.unwrap();
    assert_eq!(ingest_failed, 0, "no ingest call refused or lost");
    assert!(refused > 0, "the queries overloaded the pool");
    let text = metrics_text(&mux);
    let admitted =
        |lane| metric_sum(&text, "teifleet_lane_admissions_total", &[("lane", lane), ("outcome", "admitted")]);
    let share = admitted("ingest") / (admitted("ingest") + admitted("query"));
    println!("ingest: {ingest_ok} OK, {share:.3} of admissions; {refused} queries refused");
    assert!(share >= 0.08, "ingest got {share:.3} of the admissions");
    // Every ingest call let in is counted once under the rule that let it, the floor's turns
    // among them.
    let let_in = |reason| metric_sum(&text, "teifleet_ingest_let_in_total", &[("reason", reason)]);
    assert!(let_in("floor_turn") > 0.0, "{text}");
    assert_eq!(metric_sum(&text, "teifleet_ingest_let_in_total", &[]), admitted("ingest"));
    let ingest_not_admitted: f64 =
        ["shed_queue_full", "shed_deadline", "shed_queue_timeout", "queue_timeout", "evicted"]
            .iter()
            .map(|outcome| {
                metric_sum(&text, "teifleet_lane_admissions_total", &[("lane", "ingest"), ("outcome", outcome)])
            })
            .sum();
    assert_eq!(ingest_not_admitted, 0.0);
}
