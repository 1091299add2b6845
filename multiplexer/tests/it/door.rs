//! A pool's door (`teifleet_multiplexer::gate::door`): patient gRPC calls (no deadline, or one of
//! several queue timeouts) beyond what the pool can serve or queue wait their turn instead of being
//! refused, connections take turns, and calls with a short deadline are told at once by the queue.

use std::time::Duration;

use futures::future::join_all;
use teifleet_multiplexer::admission::Limits;
use teifleet_multiplexer::run::server::Running;
use teifleet_proto::v1::{self, embed_client::EmbedClient};
use teifleet_tei_sim::{Fault, SimHandle};
use teifleet_wire::headers::RETRY_PUSHBACK_MS;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::support::*;

fn answered(mux: &Running, code: &str) -> f64 {
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

/// A pool of one call and no queue whose TEI stalls, with that one call in flight.
async fn one_call_in_flight_at_a_stalled_tei(
    queue_timeout: Duration,
) -> (SimHandle, Running, EmbedClient<Channel>, JoinHandle<Result<Response<v1::EmbedResponse>, Status>>) {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let (mux, table) = mux(sim.addr(), Limits::new(1, 0, queue_timeout)).await;
    let admission = table.get("pool-a").unwrap().admission.clone();
    let client = embed_client(mux.grpc_addr).await;
    let in_flight = spawn_embed(&client, embed_request("in flight"));
    until("one in flight", Duration::from_secs(5), || admission.snapshot().in_flight == 1).await;
    (sim, mux, client, in_flight)
}

#[tokio::test]
async fn patient_calls_wait_their_turn_and_one_with_a_short_deadline_is_told_at_once() {
    let queue_timeout = Duration::from_millis(300);
    let (sim, mux, client, in_flight) = one_call_in_flight_at_a_stalled_tei(queue_timeout).await;

    // Without a deadline, a call waits its turn, past the queue timeout, as it would in its
    // client's own HTTP/2 queue.
    let patient = spawn_embed(&client, embed_request("patient"));
    until("held at the door", Duration::from_secs(5), || {
        metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]) == 1.0
    })
    .await;
    tokio::time::sleep(queue_timeout * 2).await;
    assert!(!patient.is_finished(), "still waiting at the door, past the queue timeout");

    // A deadline of many queue timeouts (30 s, a load tool's or a batch client's) is patient too:
    // it waits at the door instead of being refused into a resend loop.
    let mut deadline_30s = tonic::Request::new(embed_request("patient with a deadline"));
    deadline_30s.set_timeout(Duration::from_secs(30));
    let patient_with_deadline = tokio::spawn({
        let mut client = client.clone();
        async move { client.embed(deadline_30s).await }
    });
    until("two held at the door", Duration::from_secs(5), || {
        metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]) == 2.0
    })
    .await;

    // A short deadline (100 ms, within a few queue timeouts): the queue says at once that there
    // is no room, with a retry hint, instead of holding a query that has somewhere better to be.
    let mut hurried = tonic::Request::new(embed_request("hurried"));
    hurried.set_timeout(Duration::from_millis(100));
    let status = client.clone().embed(hurried).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("queue is full"), "{}", status.message());
    assert!(status.metadata().get(RETRY_PUSHBACK_MS).is_some(), "a retry hint");

    assert_eq!(sim.stats().requests_received, 1, "only the call in flight reached TEI");
    sim.set_fault(Fault::None);
    for call in [in_flight, patient] {
        call.await.unwrap().expect("served once TEI moves");
    }
    patient_with_deadline.await.unwrap().expect("the patient call with a deadline is served");
    assert_eq!(metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]), 0.0);
    assert_eq!(answered(&mux, "ResourceExhausted"), 1.0, "only the hurried call was refused");
}

#[tokio::test]
async fn a_patient_call_whose_deadline_passes_at_the_door_leaves_it_as_expired() {
    let (sim, mux, client, _in_flight) = one_call_in_flight_at_a_stalled_tei(Duration::from_millis(100)).await;

    // 1 s is ten queue timeouts: the call waits at the door, and TEI never moves.
    let mut waiting = tonic::Request::new(embed_request("waits in vain"));
    waiting.set_timeout(Duration::from_secs(1));
    let status = client.clone().embed(waiting).await.unwrap_err();
    // The sidecar answers DEADLINE_EXCEEDED a little before the caller's own clock runs out; a
    // client whose timer fires first reports its own timeout (tonic: CANCELLED).
    assert!(matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled), "{status:?}");
    until("counted as expired in the queue", Duration::from_secs(5), || {
        metric_sum(&metrics_text(&mux), "teifleet_requests_total", &[("outcome", "expired_in_queue")]) == 1.0
    })
    .await;
    assert_eq!(metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]), 0.0, "out of line");
    assert_eq!(answered(&mux, "ResourceExhausted"), 0.0, "waited, not refused");
    assert_eq!(sim.stats().requests_received, 1, "only the call in flight reached TEI");
}

/// HTTP requests meet the same door: one without a deadline waits its turn past the queue
/// timeout instead of hearing 429 and coming back at once; one with a short deadline
/// (`x-teifleet-timeout-ms: 100`) is told at once.
#[tokio::test]
async fn an_http_request_without_a_deadline_waits_at_the_door_and_a_hurried_one_is_told_at_once() {
    let queue_timeout = Duration::from_millis(300);
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let settings = teifleet_multiplexer::run::server::Settings {
        http_listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
        ..Default::default()
    };
    let (mux, table) = mux_with(vec![spec("pool-a", sim.addr(), Limits::new(1, 0, queue_timeout))], settings).await;
    let http = mux.http_addr.expect("the HTTP front listens");
    let admission = table.get("pool-a").unwrap().admission.clone();
    let in_flight = tokio::spawn(crate::http_front::post(http, "/embed", serde_json::json!({"inputs": "in flight"})));
    until("one in flight", Duration::from_secs(5), || admission.snapshot().in_flight == 1).await;

    let patient = tokio::spawn(crate::http_front::post(http, "/embed", serde_json::json!({"inputs": "patient"})));
    until("held at the door", Duration::from_secs(5), || {
        metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]) == 1.0
    })
    .await;
    tokio::time::sleep(queue_timeout * 2).await;
    assert!(!patient.is_finished(), "still waiting at the door, past the queue timeout");

    let hurried = crate::http_front::request(
        http,
        "POST",
        "/embed",
        &[("x-teifleet-timeout-ms", "100")],
        br#"{"inputs": "hurried"}"#,
    )
    .await;
    assert_eq!(hurried.status, 429, "{:?}", hurried.body);
    assert!(hurried.header("retry-after").is_some(), "a retry hint");

    sim.set_fault(Fault::None);
    for request in [in_flight, patient] {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 200, "served once TEI moves: {:?}", answer.body);
    }
    assert_eq!(metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]), 0.0);
    assert_eq!(sim.stats().requests_received, 2, "the hurried request never reached TEI");
}
