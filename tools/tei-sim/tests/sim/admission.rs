use std::time::{Duration, Instant};

use futures::StreamExt;
use teifleet_tei_sim::SimConfig;
use tonic::Code;

use crate::common::{bounded, embed_client, embed_request, start};

fn slow_pair() -> SimConfig {
    SimConfig { max_concurrent_requests: 2, fixed_latency: Duration::from_millis(300), ..SimConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unary_calls_beyond_the_slots_fail_at_once() {
    bounded(async {
        let sim = start(slow_pair()).await;
        let client = embed_client(&sim).await;
        let calls = (0..5).map(|i| {
            let mut client = client.clone();
            async move {
                let started = Instant::now();
                let result = client.embed(embed_request(&format!("request {i}"))).await;
                (result.map(|_| ()).map_err(|s| s.code()), started.elapsed())
            }
        });
        let results = futures::future::join_all(calls).await;
        let ok = results.iter().filter(|(r, _)| r.is_ok()).count();
        let refused: Vec<Duration> =
            results.iter().filter(|(r, _)| *r == Err(Code::ResourceExhausted)).map(|(_, d)| *d).collect();
        assert_eq!(ok, 2, "{results:?}");
        assert_eq!(refused.len(), 3, "{results:?}");
        // Refused calls do not wait for the device.
        assert!(refused.iter().all(|d| *d < Duration::from_millis(250)), "{results:?}");

        let stats = sim.stats();
        assert_eq!(stats.requests_received, 5);
        assert_eq!(stats.requests_admitted, 2);
        assert_eq!(stats.requests_refused_overloaded, 3);
        assert_eq!(stats.max_in_flight_observed, 2);
        assert_eq!(stats.completed, 2);
        assert_eq!(stats.in_flight, 0);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stream_messages_wait_for_a_slot() {
    bounded(async {
        let sim = start(SimConfig { fixed_latency: Duration::from_millis(100), ..slow_pair() }).await;
        let mut client = embed_client(&sim).await;
        let texts: Vec<String> = (0..6).map(|i| format!("streamed text {i}")).collect();
        let outbound = futures::stream::iter(texts.clone().into_iter().map(|t| embed_request(&t)));
        let answers: Vec<_> = client.embed_stream(outbound).await.unwrap().into_inner().collect().await;
        assert_eq!(answers.len(), 6);
        for (answer, text) in answers.into_iter().zip(&texts) {
            let answer = answer.expect("streamed messages are never refused");
            // Answers come back in message order.
            assert_eq!(answer.embeddings, teifleet_tei_sim::embedding_for(text, 384));
        }
        let stats = sim.stats();
        assert_eq!(stats.requests_received, 6);
        assert_eq!(stats.requests_admitted, 6);
        assert_eq!(stats.requests_refused_overloaded, 0);
        assert_eq!(stats.max_in_flight_observed, 2);
        assert_eq!(stats.completed, 6);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reset_stats_restarts_the_high_water_mark() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let mut client = embed_client(&sim).await;
        client.embed(embed_request("warm up")).await.unwrap();
        assert_eq!(sim.stats().completed, 1);
        sim.reset_stats();
        assert_eq!(sim.stats(), teifleet_tei_sim::Stats::default());
        sim.shutdown().await;
    })
    .await;
}
