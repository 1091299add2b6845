//! Where the pool's HTTP API must answer as TEI's own HTTP server does, and what one small
//! request may cost: long inputs follow `--auto-truncate` when the request says nothing, a
//! request over the input cap is refused whole before anything reaches TEI, the model's Info is
//! fetched once per pool, and a client that leaves takes its split calls with it.

use std::time::Duration;

use serde_json::json;
use teifleet_multiplexer::front::http::HttpSettings;

use crate::http_front::{front, post, request};
use crate::support::*;

/// Words the simulator counts as one token each, more than it takes in one sequence.
fn long_text(words: usize) -> String {
    (0..words).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn long_inputs_follow_auto_truncate_as_teis_http_routes_do() {
    let sim = sim(|c| c.max_batch_tokens = 512).await;
    let mux = front(limits(16, 64), &sim, HttpSettings::default()).await;
    let http = mux.http_addr.unwrap();
    let text = long_text(700);

    // No `truncate`: the server's --auto-truncate (true by default), as TEI's HTTP server.
    let answer = post(http, "/embed", json!({"inputs": text})).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer = post(http, "/v1/embeddings", json!({"input": [text.clone(), "short"]})).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["data"].as_array().unwrap().len(), 2);
    for route in ["/embed_sparse", "/embed_all"] {
        assert_eq!(post(http, route, json!({"inputs": text})).await.status, 200, "{route}");
    }
    // Asked not to truncate: TEI's 422 with TEI's words.
    let answer = post(http, "/embed", json!({"inputs": text, "truncate": false})).await;
    assert_eq!(answer.status, 422, "{}", answer.body);
    assert_eq!(answer.body["error_type"], "Validation");
    assert!(answer.body["error"].as_str().unwrap().contains("must have less than 512 tokens"), "{}", answer.body);

    // A pool whose TEI runs with --auto-truncate=false refuses the long text, as that TEI would.
    let strict = front(limits(16, 64), &sim, HttpSettings { auto_truncate: false, ..HttpSettings::default() }).await;
    let answer = post(strict.http_addr.unwrap(), "/embed", json!({"inputs": text})).await;
    assert_eq!(answer.status, 422, "{}", answer.body);
    strict.shutdown().await.unwrap();
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_request_over_the_input_cap_is_refused_whole_before_anything_is_sent() {
    let sim = sim(|_| {}).await;
    let http_settings = HttpSettings { max_request_inputs: 100, ..HttpSettings::default() };
    let mux = front(limits(16, 64), &sim, http_settings).await;
    let http = mux.http_addr.unwrap();

    // 60,000 one-character inputs: 300 KB on the wire, 1,875 upstream calls if split.
    let inputs: Vec<&str> = vec!["a"; 60_000];
    let answer = post(http, "/embed", json!({"inputs": inputs})).await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert_eq!(answer.body["error_type"], "Validation");
    assert!(
        answer.body["error"].as_str().unwrap().contains("60000 > maximum allowed batch size 100"),
        "{}",
        answer.body
    );
    let texts: Vec<&str> = vec!["t"; 101];
    let answer = post(http, "/rerank", json!({"query": "q", "texts": texts})).await;
    assert_eq!(answer.status, 413, "a rerank's texts count: {}", answer.body);
    let answer = post(http, "/v1/embeddings", json!({"input": vec!["a"; 101]})).await;
    assert_eq!((answer.status, answer.body["type"].as_str()), (413, Some("Validation")), "{}", answer.body);
    assert_eq!(sim.stats().requests_received, 0, "nothing reached TEI");

    // At the cap: served, split into TEI-sized calls.
    let answer = post(http, "/embed", json!({"inputs": vec!["a"; 100]})).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body.as_array().unwrap().len(), 100);

    let metrics = metrics_text(&mux);
    let rejected = metric_sum(&metrics, "teifleet_requests_total", &[("protocol", "http"), ("outcome", "rejected")]);
    assert_eq!(rejected, 3.0, "each refused request counted once, as the caller's doing");
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn the_models_info_is_fetched_once_and_each_request_counted_once() {
    let sim = sim(|_| {}).await;
    let mux = front(limits(16, 64), &sim, HttpSettings::default()).await;
    let http = mux.http_addr.unwrap();
    for _ in 0..5 {
        assert_eq!(post(http, "/", json!({"inputs": "a"})).await.status, 200);
        assert_eq!(post(http, "/v1/embeddings", json!({"input": "a"})).await.status, 200);
    }
    // One Info call for the pool, then ten Embed calls.
    assert_eq!(sim.stats().requests_received, 11);
    let metrics = metrics_text(&mux);
    let http_requests = metric_sum(&metrics, "teifleet_requests_total", &[("protocol", "http")]);
    assert_eq!(http_requests, 10.0, "every request counted once, none for the Info behind it");
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_client_that_leaves_takes_its_split_calls_with_it() {
    let sim = sim(|c| c.fixed_latency = Duration::from_millis(300)).await;
    // One chunk in flight at a time: 64 chunks of 32 would take about 20 s.
    let mux = front(limits(32, 64), &sim, HttpSettings::default()).await;
    let http = mux.http_addr.unwrap();
    let body = json!({"inputs": vec!["a"; 2048]}).to_string();
    let leaving = tokio::spawn(async move { request(http, "POST", "/embed", &[], body.as_bytes()).await });
    until("the first chunk reaches TEI", Duration::from_secs(10), || sim.stats().requests_received > 0).await;
    leaving.abort();
    let _ = leaving.await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let received = sim.stats().requests_received;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sim.stats().requests_received, received, "no chunk is sent after the client left");
    assert!(received < 2048 / 2, "{received} of 2048 inputs went upstream");
    until("nothing left in flight", Duration::from_secs(10), || sim.stats().in_flight == 0).await;
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}
