//! Admission control through real gRPC: the simulator counts what actually reaches it.

use std::time::Duration;

use futures::future::join_all;
use teifleet_multiplexer::run::server::Settings;
use teifleet_tei_sim::Fault;
use teifleet_wire::headers::{PRIORITY as PRIORITY_HEADER, RETRY_PUSHBACK_MS as RETRY_PUSHBACK_HEADER};
use tonic::Code;

use crate::support::*;

/// 40 Embed calls at once through the multiplexer at `addr`, every one served.
async fn forty_calls_all_served(addr: std::net::SocketAddr) {
    let client = embed_client(addr).await;
    let calls = (0..40).map(|i| {
        let mut client = client.clone();
        async move { client.embed(embed_request(&format!("request {i}"))).await }
    });
    let results = join_all(calls).await;
    assert!(results.iter().all(Result::is_ok), "all served: {:?}", results.iter().find(|r| r.is_err()));
}

#[tokio::test]
async fn never_more_than_the_limit_reaches_tei() {
    let sim = sim(|c| c.fixed_latency = Duration::from_millis(30)).await;
    let (mux, _) = mux(sim.addr(), limits(3, 100)).await;
    forty_calls_all_served(mux.grpc_addr).await;
    let stats = sim.stats();
    assert_eq!(stats.requests_received, 40);
    assert!(stats.max_in_flight_observed <= 3, "TEI saw {} at once", stats.max_in_flight_observed);
    assert_eq!(stats.requests_refused_overloaded, 0, "TEI never had to shed");
}

#[tokio::test]
async fn a_full_queue_sheds_at_once_with_a_retry_hint() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let settings = Settings { http_listen: Some("127.0.0.1:0".parse().unwrap()), ..Settings::default() };
    let (mux, table) = mux_with(vec![spec("pool-a", sim.addr(), limits(1, 2))], settings).await;
    let client = embed_client(mux.grpc_addr).await;
    let held: Vec<_> = (0..3).map(|i| spawn_embed(&client, embed_request(&format!("held {i}")))).collect();
    let admission = table.get("pool-a").unwrap().admission.clone();
    until("one in flight and two queued", Duration::from_secs(5), || {
        let s = admission.snapshot();
        (s.in_flight, s.queued_total()) == (1, 2)
    })
    .await;

    // A gRPC call beyond the budget waits at the pool's door (`gate/door.rs`), on any connection.
    let other = embed_client(mux.grpc_addr).await;
    let waiting = spawn_embed(&other, embed_request("at the door"));
    until("a call held at the door", Duration::from_secs(5), || {
        metric_sum(&metrics_text(&mux), "teifleet_held_at_door", &[]) == 1.0
    })
    .await;

    // An HTTP request with a short deadline finding the queue full gets 429 at once, with a hint
    // (one without a deadline would wait at the door like the gRPC call above).
    let started = tokio::time::Instant::now();
    let body = br#"{"inputs":"one too many"}"#;
    let hurried = [("x-teifleet-timeout-ms", "100")];
    let answer = crate::http_front::request(mux.http_addr.unwrap(), "POST", "/embed", &hurried, body).await;
    assert!(started.elapsed() < Duration::from_secs(1), "refused at once");
    assert_eq!(answer.status, 429);
    assert!(answer.body.to_string().contains("queue is full"), "{}", answer.body);
    assert!(answer.header("retry-after").is_some(), "a retry hint");
    assert_eq!(sim.stats().requests_received, 1, "only the admitted request reached TEI");

    sim.set_fault(Fault::None);
    for call in held {
        call.await.unwrap().expect("queued requests are served once TEI moves");
    }
    waiting.await.unwrap().expect("the call at the door is served after them");
    until("all answered", Duration::from_secs(5), || {
        let s = admission.snapshot();
        (s.in_flight, s.queued_total()) == (0, 0)
    })
    .await;
}

#[tokio::test]
async fn a_deadline_that_cannot_be_met_is_refused_without_reaching_tei() {
    let sim = sim(|c| c.fixed_latency = Duration::from_millis(150)).await;
    let (mux, _) = mux(sim.addr(), limits(1, 10)).await;
    let client = embed_client(mux.grpc_addr).await;
    // Teach the multiplexer how long a request takes.
    client.clone().embed(embed_request("warm up")).await.unwrap();
    let busy = spawn_embed(&client, embed_request("busy"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = sim.stats().requests_received;

    let mut hurried = embed_request("in a hurry");
    let mut request = tonic::Request::new(hurried.clone());
    request.set_timeout(Duration::from_millis(40));
    let status = client.clone().embed(request).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("deadline cannot be met"), "{}", status.message());
    assert!(status.metadata().get(RETRY_PUSHBACK_HEADER).is_some());
    assert_eq!(sim.stats().requests_received, before, "never reached TEI");
    busy.await.unwrap().unwrap();

    // With time to spare, the same request is served and TEI sees the remaining deadline.
    hurried.inputs = "with time to spare".into();
    let mut request = tonic::Request::new(hurried);
    request.set_timeout(Duration::from_secs(5));
    client.clone().embed(request).await.unwrap();
}

#[tokio::test]
async fn priority_orders_the_queue_and_unknown_priority_is_invalid() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let (mux, table) = mux(sim.addr(), limits(1, 10)).await;
    let client = embed_client(mux.grpc_addr).await;
    let blocker = spawn_embed(&client, embed_request("blocker"));
    let admission = table.get("pool-a").unwrap().admission.clone();
    until("blocker in flight", Duration::from_secs(5), || admission.snapshot().in_flight == 1).await;

    let done = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut calls = Vec::new();
    for (i, priority) in ["sheddable", "standard", "critical"].into_iter().enumerate() {
        let (mut client, done) = (client.clone(), done.clone());
        calls.push(tokio::spawn(async move {
            client.embed(with_meta(embed_request(priority), &[(PRIORITY_HEADER, priority)])).await.unwrap();
            done.lock().unwrap().push(priority);
        }));
        until("queued", Duration::from_secs(5), || admission.snapshot().queued_total() == i + 1).await;
    }
    sim.set_fault(Fault::None);
    blocker.await.unwrap().unwrap();
    for call in calls {
        call.await.unwrap();
    }
    assert_eq!(*done.lock().unwrap(), ["critical", "standard", "sheddable"]);

    let status = client.clone().embed(with_meta(embed_request("x"), &[(PRIORITY_HEADER, "urgent")])).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("critical, standard, sheddable"), "{}", status.message());
}

#[tokio::test]
async fn a_full_queue_evicts_lower_priority_for_higher() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let (mux, table) = mux(sim.addr(), limits(1, 1)).await;
    let client = embed_client(mux.grpc_addr).await;
    let admission = table.get("pool-a").unwrap().admission.clone();
    let blocker = spawn_embed(&client, embed_request("blocker"));
    until("blocker in flight", Duration::from_secs(5), || admission.snapshot().in_flight == 1).await;
    let sheddable = spawn_embed(&client, with_meta(embed_request("s"), &[(PRIORITY_HEADER, "sheddable")]));
    until("sheddable queued", Duration::from_secs(5), || admission.snapshot().queued_total() == 1).await;
    let critical = spawn_embed(&client, with_meta(embed_request("c"), &[(PRIORITY_HEADER, "critical")]));
    let evicted = sheddable.await.unwrap().unwrap_err();
    assert_eq!(evicted.code(), Code::ResourceExhausted);
    assert!(evicted.message().contains("evicted"), "{}", evicted.message());
    sim.set_fault(Fault::None);
    blocker.await.unwrap().unwrap();
    critical.await.unwrap().unwrap();
}

#[tokio::test]
async fn expired_and_cancelled_waiters_never_reach_tei() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let (mux, table) = mux(sim.addr(), limits(1, 20)).await;
    let client = embed_client(mux.grpc_addr).await;
    let admission = table.get("pool-a").unwrap().admission.clone();
    let blocker = spawn_embed(&client, embed_request("blocker"));
    until("blocker in flight", Duration::from_secs(5), || admission.snapshot().in_flight == 1).await;

    // Five that time out in the queue, five whose callers give up.
    let expiring: Vec<_> = (0..5)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut request = tonic::Request::new(embed_request(&format!("expiring {i}")));
                request.set_timeout(Duration::from_millis(100));
                client.embed(request).await
            })
        })
        .collect();
    let cancelled: Vec<_> = (0..5).map(|i| spawn_embed(&client, embed_request(&format!("cancelled {i}")))).collect();
    until("all ten queued", Duration::from_secs(5), || admission.snapshot().queued_total() == 10).await;
    for call in &cancelled {
        call.abort();
    }
    for call in expiring {
        let status = call.await.unwrap().unwrap_err();
        assert!(matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled), "{status:?}");
    }
    until("the queue to empty", Duration::from_secs(5), || admission.snapshot().queued_total() == 0).await;
    sim.set_fault(Fault::None);
    blocker.await.unwrap().unwrap();
    until("nothing in flight", Duration::from_secs(5), || admission.snapshot().in_flight == 0).await;
    assert_eq!(sim.stats().requests_received, 1, "only the blocker ever reached TEI");

    let text = metrics_text(&mux);
    assert!(text.contains("outcome=\"expired_in_queue\"") || text.contains("outcome=\"cancelled\""), "{text}");
}

/// A limit of one of TEI's batches (its Info's `max_batch_requests`): TEI's queue holds its next
/// batch too, learned from TEI, and never more.
#[tokio::test]
async fn a_limit_of_one_batch_keeps_teis_next_batch_ready() {
    let sim = sim(|c| {
        c.fixed_latency = Duration::from_millis(30);
        c.max_batch_requests = Some(4);
    })
    .await;
    let specs = vec![spec("pool-a", sim.addr(), limits(4, 100))];
    let (mux, table) = mux_keeping_next_batch(specs, Settings::default(), true).await;
    let pool = table.get("pool-a").expect("the pool");
    let learned = tokio::time::timeout(Duration::from_secs(20), async {
        while pool.admission.snapshot().effective_limit != 8 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    learned.await.expect("TEI's batch learned from its Info");
    forty_calls_all_served(mux.grpc_addr).await;
    let seen = sim.stats().max_in_flight_observed;
    assert_eq!(seen, 8, "TEI held its batch and the next one, no more");
}
