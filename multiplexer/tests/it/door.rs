//! A pool's door (`teifleet_multiplexer::gate::door`): gRPC calls without a deadline beyond what the
//! pool can serve or queue wait their turn instead of being refused, connections take turns, and
//! calls with a deadline are told at once by the queue, as before.

use std::time::Duration;

use futures::future::join_all;
use teifleet_multiplexer::admission::Limits;
use teifleet_tei_sim::Fault;
use teifleet_wire::headers::RETRY_PUSHBACK_MS;
use tonic::Code;

use crate::support::*;

fn answered(mux: &teifleet_multiplexer::run::server::Running, code: &str) -> f64 {
    metric_sum(&metrics_text(mux), "teifleet_requests_total", &[("code", code)])
}

#[tokio::test]
async fn a_connection_over_its_budget_waits_in_order_and_none_is_refused() {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(20)).await;
    let (mux, _) = mux(sim.addr(), limits(2, 2)).await;
    let client = embed_client(mux.grpc_addr).await;
    // Six times the budget on one connection, all at once: without the door, 20 of them would
    // be refused at once and come back.
    let calls = (0..24).map(|i| spawn_embed(&client, embed_request(&format!("burst {i}"))));
    for call in join_all(calls).await {
        call.unwrap().expect("every call served");
    }
    assert_eq!(answered(&mux, "Ok"), 24.0);
    assert_eq!(answered(&mux, "ResourceExhausted"), 0.0, "{}", metrics_text(&mux));
    assert!(sim.stats().max_in_flight_observed <= 2, "TEI never saw more than the limit");
    assert_eq!(metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]), 0.0);
}

#[tokio::test]
async fn busy_connections_share_the_budget_and_nothing_is_refused() {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(20)).await;
    let (mux, _) = mux(sim.addr(), limits(2, 2)).await;
    let mut calls = Vec::new();
    for connection in 0..4 {
        let client = embed_client(mux.grpc_addr).await;
        calls.extend((0..8).map(|i| spawn_embed(&client, embed_request(&format!("{connection}/{i}")))));
    }
    for call in join_all(calls).await {
        call.unwrap().expect("every call served");
    }
    assert_eq!(answered(&mux, "Ok"), 32.0);
    assert_eq!(answered(&mux, "ResourceExhausted"), 0.0, "{}", metrics_text(&mux));
}

#[tokio::test]
async fn a_call_without_a_deadline_waits_its_turn_and_one_with_a_deadline_is_told_at_once() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let queue_timeout = Duration::from_millis(300);
    let (mux, table) = mux(sim.addr(), Limits::new(1, 0, queue_timeout)).await;
    let admission = table.get("pool-a").unwrap().admission.clone();
    let client = embed_client(mux.grpc_addr).await;
    let in_flight = spawn_embed(&client, embed_request("in flight"));
    until("one in flight", Duration::from_secs(5), || admission.snapshot().in_flight == 1).await;

    // Without a deadline, a call waits its turn, past the queue timeout, as it would in its
    // client's own HTTP/2 queue.
    let patient = spawn_embed(&client, embed_request("patient"));
    tokio::time::sleep(queue_timeout * 2).await;
    assert!(!patient.is_finished(), "still waiting at the door");
    assert_eq!(metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]), 1.0);

    // With a deadline, the queue says at once that there is no room, with a retry hint.
    let mut hurried = tonic::Request::new(embed_request("hurried"));
    hurried.set_timeout(Duration::from_secs(10));
    let status = client.clone().embed(hurried).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("queue is full"), "{}", status.message());
    assert!(status.metadata().get(RETRY_PUSHBACK_MS).is_some(), "a retry hint");

    assert_eq!(sim.stats().requests_received, 1, "only the call in flight reached TEI");
    sim.set_fault(Fault::None);
    for call in [in_flight, patient] {
        call.await.unwrap().expect("served once TEI moves");
    }
    assert_eq!(metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]), 0.0);
}
