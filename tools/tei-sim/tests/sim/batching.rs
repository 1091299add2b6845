use std::time::Duration;

use teifleet_tei_sim::SimConfig;

use crate::common::{bounded, embed_client, embed_request, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_share_device_runs() {
    bounded(async {
        let sim = start(SimConfig { fixed_latency: Duration::from_millis(100), ..SimConfig::default() }).await;
        let client = embed_client(&sim).await;
        let calls = (0..40).map(|i| {
            let mut client = client.clone();
            async move { client.embed(embed_request(&format!("small request {i}"))).await }
        });
        let results = futures::future::join_all(calls).await;
        assert!(results.iter().all(Result::is_ok));
        let stats = sim.stats();
        assert_eq!(stats.completed, 40);
        // While one batch runs the rest queue up and share the next run.
        assert!(stats.batches_run <= 6, "{stats:?}");
        let in_a_batch = results
            .iter()
            .filter_map(|r| r.as_ref().ok()?.get_ref().metadata)
            .filter(|m| m.queue_time_ns > 0 && m.inference_time_ns >= 100_000_000)
            .count();
        assert_eq!(in_a_batch, 40);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_respect_the_request_cap_and_token_budget() {
    bounded(async {
        let config =
            SimConfig { fixed_latency: Duration::from_millis(50), max_batch_requests: Some(3), ..SimConfig::default() };
        let sim = start(config).await;
        let client = embed_client(&sim).await;
        let calls = (0..12).map(|i| {
            let mut client = client.clone();
            async move { client.embed(embed_request(&format!("capped {i}"))).await }
        });
        assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
        assert!(sim.stats().batches_run >= 4, "{:?}", sim.stats());
        sim.shutdown().await;

        // Inputs of 6 tokens with a 12-token budget: at most two per batch.
        let sim =
            start(SimConfig { max_batch_tokens: 12, fixed_latency: Duration::from_millis(50), ..SimConfig::default() })
                .await;
        let client = embed_client(&sim).await;
        let calls = (0..6).map(|i| {
            let mut client = client.clone();
            async move { client.embed(embed_request(&format!("four words here {i}"))).await }
        });
        assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
        assert!(sim.stats().batches_run >= 3, "{:?}", sim.stats());
        sim.shutdown().await;
    })
    .await;
}
