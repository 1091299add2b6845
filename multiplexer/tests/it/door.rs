//! A pool's door (`teifleet_multiplexer::door`): gRPC calls beyond what the pool can serve or
//! queue wait in order instead of being refused, connections take turns, and a call refused at
//! the door (queue timeout, deadline) never reaches TEI.

use std::time::Duration;

use futures::future::join_all;
use teifleet_multiplexer::admission::Limits;
use teifleet_tei_sim::Fault;
use teifleet_wire::headers::RETRY_PUSHBACK_MS;
use tonic::Code;

use crate::support::*;

fn answered(mux: &teifleet_multiplexer::server::Running, code: &str) -> f64 {
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
async fn a_call_held_past_the_queue_timeout_or_its_deadline_is_refused_without_reaching_tei() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let (mux, table) = mux(sim.addr(), Limits::new(1, 1, Duration::from_millis(300))).await;
    let admission = table.get("pool-a").unwrap().admission.clone();
    let client = embed_client(mux.grpc_addr).await;
    let _in_flight = spawn_embed(&client, embed_request("in flight"));
    let _queued = spawn_embed(&client, embed_request("queued"));
    until("one in flight, one queued", Duration::from_secs(5), || {
        let s = admission.snapshot();
        (s.in_flight, s.queued_total()) == (1, 1)
    })
    .await;

    let status = client.clone().embed(embed_request("held")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("queue timeout"), "{}", status.message());
    assert!(status.metadata().get(RETRY_PUSHBACK_MS).is_some(), "a retry hint");

    let mut hurried = tonic::Request::new(embed_request("hurried"));
    hurried.set_timeout(Duration::from_millis(150));
    let status = client.clone().embed(hurried).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");

    assert_eq!(sim.stats().requests_received, 1, "only the call in flight reached TEI");
    assert_eq!(metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]), 0.0, "nobody left at the door");
    sim.set_fault(Fault::None);
}
