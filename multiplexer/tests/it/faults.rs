//! Faults: TEI going away mid-load, coming back, and thousands of requests with random
//! cancellations and deadlines. Every request gets an answer and no permit leaks.

use std::time::Duration;

use futures::future::join_all;
use tonic::Code;

use crate::support::*;

#[tokio::test]
async fn tei_killed_mid_load_gives_unavailable_then_recovers() {
    let first = sim(|c| c.fixed_latency = Duration::from_millis(20)).await;
    let addr = first.addr();
    let (mux, table) = mux(addr, limits(4, 64)).await;
    let client = embed_client(mux.grpc_addr).await;
    client.clone().embed(embed_request("before")).await.unwrap();

    let load: Vec<_> = (0..30)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.embed(embed_request(&format!("load {i}"))).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(15)).await;
    first.shutdown().await;
    let results = tokio::time::timeout(Duration::from_secs(10), join_all(load)).await.expect("no request hangs");
    let codes: Vec<Code> =
        results.into_iter().map(|r| r.unwrap().map(|_| Code::Ok).unwrap_or_else(|s| s.code())).collect();
    assert!(codes.contains(&Code::Unavailable), "{codes:?}");
    assert!(
        codes.iter().all(|c| matches!(c, Code::Ok | Code::Unavailable | Code::Cancelled | Code::Unknown)),
        "{codes:?}"
    );

    let status = client.clone().embed(embed_request("while down")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);

    let _second = sim(|c| c.listen = addr).await;
    until_ok(&client).await;
    let s = table.get("pool-a").unwrap().admission.snapshot();
    assert_eq!((s.in_flight, s.queued_total()), (0, 0));
}

async fn until_ok(client: &teifleet_proto::v1::embed_client::EmbedClient<tonic::transport::Channel>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if client.clone().embed(embed_request("after")).await.is_ok() {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the multiplexer did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_requests_with_random_cancellations_and_deadlines_all_answered_nothing_leaked() {
    use rand::RngExt;
    let sim = sim(|c| {
        c.fixed_latency = Duration::from_millis(1);
        c.per_token_latency = Duration::from_micros(5);
    })
    .await;
    let (mux, table) = mux(sim.addr(), limits(8, 64)).await;
    let client = embed_client(mux.grpc_addr).await;
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut calls = Vec::with_capacity(10_000);
    for i in 0..10_000 {
        let (mut client, semaphore) = (client.clone(), semaphore.clone());
        let (timeout, cancel_after) = {
            let mut rng = rand::rng();
            (
                rng.random_bool(0.3).then(|| Duration::from_millis(rng.random_range(1..40))),
                rng.random_bool(0.1).then(|| Duration::from_millis(rng.random_range(0..20))),
            )
        };
        calls.push(tokio::spawn(async move {
            let _slot = semaphore.acquire_owned().await.unwrap();
            let mut request = tonic::Request::new(embed_request(&format!("request number {i}")));
            if let Some(timeout) = timeout {
                request.set_timeout(timeout);
            }
            let call = client.embed(request);
            match cancel_after {
                Some(after) => match tokio::time::timeout(after, call).await {
                    Ok(result) => result.map(|_| ()).map_err(|s| s.code()),
                    Err(_) => Err(Code::Cancelled),
                },
                None => call.await.map(|_| ()).map_err(|s| s.code()),
            }
        }));
    }
    let mut by_code = std::collections::BTreeMap::<String, usize>::new();
    let results =
        tokio::time::timeout(Duration::from_secs(120), join_all(calls)).await.expect("every request answered");
    for result in results {
        let code = match result.unwrap() {
            Ok(()) => "Ok".to_owned(),
            Err(code) => format!("{code:?}"),
        };
        *by_code.entry(code).or_default() += 1;
    }
    println!("outcomes: {by_code:?}");
    assert_eq!(by_code.values().sum::<usize>(), 10_000);
    assert!(by_code.get("Ok").copied().unwrap_or(0) > 1_000, "{by_code:?}");
    for code in by_code.keys() {
        assert!(
            ["Ok", "Cancelled", "DeadlineExceeded", "ResourceExhausted"].contains(&code.as_str()),
            "unexpected {code}: {by_code:?}"
        );
    }
    let admission = table.get("pool-a").unwrap().admission.clone();
    until("permits to return", Duration::from_secs(10), || {
        let s = admission.snapshot();
        (s.in_flight, s.queued_total()) == (0, 0)
    })
    .await;
    // No bound on TEI's peak here: a client cancelling a call already at TEI frees its permit as
    // the cancellation (RST_STREAM) goes out, and TEI frees its slot when that arrives, so the
    // two can overlap for a moment. The strict bound without cancellations is tested in
    // admission.rs.
}

/// What a client is told must not say where the upstream lives.
fn names_nothing_inside(told: &str, upstream: std::net::SocketAddr) {
    let port = upstream.port().to_string();
    for inside in ["127.0.0.1", port.as_str(), "http://", "https://"] {
        assert!(!told.contains(inside), "{inside:?} in what the client was told: {told}");
    }
}

/// An upstream that refuses connections (its own TEI, or another pool's sidecar) is UNAVAILABLE
/// to a gRPC call, unary or stream, and 503 to an HTTP request, naming the pool but not its URL,
/// address or port: those stay in the sidecar's log.
#[tokio::test]
async fn an_upstream_that_refuses_connections_is_unavailable_and_named_by_its_pool_only() {
    // Held for the whole test: a port let go could be taken and answer.
    let closed = [(); 2].map(|()| teifleet_testkit::net::ClosedPort::new().unwrap());
    let (own, other) = (closed[0].addr(), closed[1].addr());
    let remote = teifleet_multiplexer::forward::pools::PoolSpec { remote: true, ..spec("other", other, limits(2, 8)) };
    let settings = teifleet_multiplexer::run::server::Settings {
        http_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    let (mux, _) = mux_with(vec![spec("pool-a", own, limits(2, 8)), remote], settings).await;
    let client = embed_client(mux.grpc_addr).await;

    let unary = client.clone().embed(embed_request("nobody home")).await.unwrap_err();
    assert_eq!(unary.code(), Code::Unavailable, "{unary:?}");
    assert!(unary.message().contains("pool-a"), "{unary:?}");
    names_nothing_inside(unary.message(), own);

    let messages = tokio_stream::iter([embed_request("one"), embed_request("two")]);
    let stream = match client.clone().embed_stream(messages).await {
        Err(status) => status,
        Ok(answers) => match answers.into_inner().message().await {
            Err(status) => status,
            Ok(answer) => panic!("no upstream, yet {answer:?}"),
        },
    };
    assert_eq!(stream.code(), Code::Unavailable, "{stream:?}");
    names_nothing_inside(stream.message(), own);

    let routed = client
        .clone()
        .embed(with_meta(embed_request("to the other pool"), &[(teifleet_wire::headers::POOL, "other")]))
        .await
        .unwrap_err();
    assert_eq!(routed.code(), Code::Unavailable, "{routed:?}");
    assert!(routed.message().contains("other"), "{routed:?}");
    names_nothing_inside(routed.message(), other);

    let http = crate::http_front::request(mux.http_addr.unwrap(), "POST", "/embed", &[], br#"{"inputs":"x"}"#).await;
    assert_eq!(http.status, 503, "{}", http.body);
    assert_eq!(http.body["error_type"], "Unhealthy", "TEI's shape: {}", http.body);
    names_nothing_inside(&http.body.to_string(), own);
    let openai = crate::http_front::request(
        mux.http_addr.unwrap(),
        "POST",
        "/v1/embeddings",
        &[],
        br#"{"input":"x","model":"m"}"#,
    )
    .await;
    assert_eq!(openai.status, 503, "{}", openai.body);
    names_nothing_inside(&openai.body.to_string(), own);
}
