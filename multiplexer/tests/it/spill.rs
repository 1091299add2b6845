//! A pool's replicas as one budget: a client pinned to one replica (one connection) gets the
//! whole pool, calls spilling to a sibling with room; the budget holds on every replica; a
//! sibling's own callers keep their turn; a sibling that goes away loses no call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use teifleet_multiplexer::forward::pools::PoolTable;
use teifleet_multiplexer::gate::auth::{Gate, KeyRing, Policy};
use teifleet_multiplexer::run::server::{Running, Settings};
use teifleet_tei_sim::SimHandle;

use crate::http_front::request;
use crate::support::*;

/// Each replica's share of the pool's budget.
const SHARE: usize = 4;

struct Replica {
    sim: SimHandle,
    mux: Running,
    table: Arc<PoolTable>,
}

/// `n` replicas of one pool, each a simulator behind its own multiplexer, each knowing the others.
async fn replicas(n: usize) -> Vec<Replica> {
    replicas_with(n, Settings::default).await
}

async fn replicas_with(n: usize, settings: impl Fn() -> Settings) -> Vec<Replica> {
    let mut replicas = Vec::new();
    for _ in 0..n {
        let sim = sim(|config| config.fixed_latency = Duration::from_millis(20)).await;
        let (mux, table) = mux_with(vec![spec("pool-a", sim.addr(), limits(SHARE, 256))], settings()).await;
        replicas.push(Replica { sim, mux, table });
    }
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.mux.grpc_addr).collect();
    for replica in &replicas {
        let others: Vec<String> =
            addrs.iter().filter(|addr| **addr != replica.mux.grpc_addr).map(|addr| format!("http://{addr}")).collect();
        replica.table.siblings().sync(&others).unwrap();
        replica.table.siblings().peer_key().set(Some(PEER_KEY.as_bytes())).unwrap();
    }
    replicas
}

/// The pool's peer key, the same on every replica (the operator's per-pool Secret).
pub const PEER_KEY: &str = "pool-a-peer-key-0123456789-0123456789";

/// How a load's calls ended.
#[derive(Debug, Default, PartialEq, Eq)]
struct Ended {
    ok: usize,
    /// Shed with a retry hint: the pool was full.
    exhausted: usize,
    /// Anything else: a lost call.
    other: usize,
}

/// `calls` Embed calls, `concurrency` at a time, on one connection to `addr`.
async fn pinned_load(addr: SocketAddr, calls: usize, concurrency: usize) -> Ended {
    let client = embed_client(addr).await;
    let mut ended = Ended::default();
    let mut count = |result: Result<(), tonic::Status>| match result {
        Ok(()) => ended.ok += 1,
        Err(status) if status.code() == tonic::Code::ResourceExhausted => ended.exhausted += 1,
        Err(status) => {
            eprintln!("lost: {status:?}");
            ended.other += 1;
        }
    };
    let mut running: tokio::task::JoinSet<Result<(), tonic::Status>> = tokio::task::JoinSet::new();
    for i in 0..calls {
        if running.len() >= concurrency {
            count(running.join_next().await.unwrap().unwrap());
        }
        running.spawn({
            let mut client = client.clone();
            async move { client.embed(embed_request(&format!("call {i}"))).await.map(drop) }
        });
    }
    while let Some(done) = running.join_next().await {
        count(done.unwrap());
    }
    ended
}

#[tokio::test]
async fn a_pinned_client_gets_every_replica_and_the_budget_holds_on_each() {
    let replicas = replicas(3).await;
    // As many calls at once as the pool has permits: none need wait, if the pool is one budget.
    let ended = pinned_load(replicas[0].mux.grpc_addr, 300, 3 * SHARE).await;
    // A busy machine can make a queue stand for a moment; nothing may be lost.
    assert!(ended.ok >= 270 && ended.other == 0, "{ended:?}");
    for (i, replica) in replicas.iter().enumerate() {
        let stats = replica.sim.stats();
        assert!(stats.max_in_flight_observed <= SHARE as u64, "replica {i}: {stats:?}");
        // Spread: a replica reached only through spills still did a fair part of the work.
        assert!(stats.completed >= 300 / 3 / 2, "replica {i} served {} of 300", stats.completed);
    }
    let text = metrics_text(&replicas[0].mux);
    let spilled = metric_sum(&text, "teifleet_spills_total", &[("result", "served")]);
    assert!(spilled >= 100.0, "{text}");
    let counted: f64 = replicas.iter().map(|r| metric_sum(&metrics_text(&r.mux), "teifleet_requests_total", &[])).sum();
    assert_eq!(counted, 300.0, "each call counted once in the pool, by the replica its client called");
    let spilled_in: f64 = replicas[1..]
        .iter()
        .map(|r| metric_sum(&metrics_text(&r.mux), "teifleet_spilled_in_total", &[("outcome", "ok")]))
        .sum();
    assert_eq!(spilled_in, spilled);
}

#[tokio::test]
async fn clients_of_every_replica_get_their_share_when_the_pool_is_full() {
    let replicas = replicas(2).await;
    // Both replicas' clients push more than their share: each keeps its own budget, and calls
    // from the first that find the second full are served where they came in.
    let (first, second) = (replicas[0].mux.grpc_addr, replicas[1].mux.grpc_addr);
    let (a, b) = tokio::join!(pinned_load(first, 160, SHARE * 3), pinned_load(second, 160, SHARE * 3));
    assert_eq!((a.other, b.other), (0, 0), "only refusals with a retry hint: {a:?} {b:?}");
    for replica in &replicas {
        assert!(replica.sim.stats().max_in_flight_observed <= SHARE as u64);
    }
    // Spilled calls wait in line with a sibling's own callers, never ahead of them: with both
    // replicas' clients pushing past the pool's budget, each client gets its fair half.
    let (low, high) = (a.ok.min(b.ok), a.ok.max(b.ok));
    assert!(low * 10 >= high * 8, "{a:?} {b:?}");
    let own = metric_sum(&metrics_text(&replicas[1].mux), "teifleet_requests_total", &[("outcome", "ok")]);
    assert_eq!(own as usize, b.ok, "a replica counts its own clients' calls, spilled or not");
}

#[tokio::test]
async fn a_sibling_that_goes_away_loses_no_call() {
    let mut replicas = replicas(2).await;
    let first = replicas[0].mux.grpc_addr;
    let load = tokio::spawn(pinned_load(first, 200, SHARE * 2));
    let gone = replicas.pop().unwrap();
    until("calls spill to the second replica", Duration::from_secs(10), || gone.sim.stats().completed > 5).await;
    // Its TEI vanishes with calls spilled there in flight, and its sidecar drains.
    let draining = tokio::spawn(gone.mux.shutdown());
    gone.sim.shutdown().await;
    draining.await.unwrap().unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), load).await.expect("the load ends").unwrap();
    // Alone, the replica has half the budget the load needs: it sheds some with a retry hint,
    // but no call spilled to the sibling is lost.
    assert_eq!(ended.other, 0, "calls the sibling could not answer were served here: {ended:?}");
    assert!(replicas[0].sim.stats().max_in_flight_observed <= SHARE as u64);
}

#[tokio::test]
async fn http_calls_spill_with_their_key_to_a_sibling_that_checks_it() {
    const KEY: &str = "search-key-0123456789abcdef";
    let keyed = || {
        let (ring, problems) = KeyRing::parse([("search", KEY.as_bytes())]);
        assert!(problems.is_empty(), "{problems:?}");
        let gate = Arc::new(Gate::new("pool-a", &prometheus::Registry::new(), Policy::Keys(ring)).unwrap());
        Settings { http_listen: Some("127.0.0.1:0".parse().unwrap()), auth: gate, ..Settings::default() }
    };
    let replicas = replicas_with(2, keyed).await;
    let http = replicas[0].mux.http_addr.unwrap();
    let authorization = format!("Bearer {KEY}");
    let calls =
        (0..24).map(|i| {
            let (authorization, body) = (authorization.clone(), json!({ "inputs": format!("text {i}") }).to_string());
            async move {
                request(http, "POST", "/embed", &[("authorization", &authorization)], body.as_bytes()).await.status
            }
        });
    let statuses = futures::future::join_all(calls).await;
    assert!(statuses.iter().all(|status| *status == 200), "{statuses:?}");
    assert!(replicas[1].sim.stats().completed > 0, "some calls were served by the sibling, which took the key");
    let spilled = metric_sum(&metrics_text(&replicas[0].mux), "teifleet_spills_total", &[("result", "served")]);
    assert_eq!(spilled, replicas[1].sim.stats().completed as f64);
}

#[tokio::test]
async fn a_burst_without_deadlines_on_one_connection_waits_at_the_door_and_spills_instead_of_being_refused() {
    // The real-pods shape: two replicas, one in flight each, no queue. The door lets in what the
    // replica and its sibling can take; a call that finds neither free after all (the sibling's
    // window is larger than its room) waits in the queue rather than being refused, so each
    // refusal does not let the next waiting call in to be refused in turn.
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let sim = sim(|config| config.fixed_latency = Duration::from_millis(20)).await;
        let (mux, table) = mux_with(vec![spec("pool-a", sim.addr(), limits(1, 0))], Settings::default()).await;
        replicas.push(Replica { sim, mux, table });
    }
    let addrs: Vec<String> = replicas.iter().map(|r| format!("http://{}", r.mux.grpc_addr)).collect();
    replicas[0].table.siblings().sync(&addrs[1..]).unwrap();
    replicas[1].table.siblings().sync(&addrs[..1]).unwrap();
    let ended = pinned_load(replicas[0].mux.grpc_addr, 24, 24).await;
    assert_eq!(ended, Ended { ok: 24, exhausted: 0, other: 0 });
    for replica in &replicas {
        assert!(replica.sim.stats().max_in_flight_observed <= 1, "{:?}", replica.sim.stats());
    }
}

#[tokio::test]
async fn a_stream_opened_on_one_replica_is_spread_over_the_pool_and_answered_in_order() {
    let replicas = replicas(3).await;
    let mut client = embed_client(replicas[0].mux.grpc_addr).await;
    let texts: Vec<String> = (0..300).map(|i| format!("streamed {i}")).collect();
    let messages = tokio_stream::iter(texts.clone().into_iter().map(|text| embed_request(&text)));
    let mut answers = client.embed_stream(messages).await.expect("the stream opens").into_inner();
    let mut vectors = Vec::new();
    while let Some(answer) = answers.message().await.expect("every message answered") {
        vectors.push(answer.embeddings);
    }
    assert_eq!(vectors.len(), texts.len());
    // In order: each answer is its own message's vector, as one replica's TEI gives it.
    let mut direct = embed_client(replicas[0].mux.grpc_addr).await;
    for i in [0, 149, 299] {
        let alone = direct.embed(embed_request(&texts[i])).await.unwrap().into_inner().embeddings;
        assert_eq!(vectors[i], alone, "answer {i}");
    }
    for (i, replica) in replicas.iter().enumerate() {
        let served = replica.sim.stats().completed;
        assert!(served >= 20, "replica {i} served {served} of the stream's 300 messages");
        assert!(replica.sim.stats().max_in_flight_observed <= SHARE as u64, "replica {i}: the budget holds");
    }
    let text = metrics_text(&replicas[0].mux);
    assert_eq!(
        metric_sum(&text, "teifleet_requests_total", &[("rpc", "EmbedStream"), ("outcome", "ok")]),
        1.0,
        "{text}"
    );
}
