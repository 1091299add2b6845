use teifleet_proto::v1::EmbedRequest;
use teifleet_tei_sim::{SimConfig, embedding_for};
use tonic::Code;

use crate::common::{bounded, embed_client, embed_request, start};

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_is_deterministic_normalized_and_timed() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let mut client = embed_client(&sim).await;
        let first = client.embed(embed_request("hello simulated world")).await.unwrap().into_inner();
        let second = client.embed(embed_request("hello simulated world")).await.unwrap().into_inner();
        assert_eq!(first.embeddings.len(), 384);
        assert_eq!(first.embeddings, second.embeddings);
        assert_eq!(first.embeddings, embedding_for("hello simulated world", 384));
        assert!((norm(&first.embeddings) - 1.0).abs() < 1e-4);

        let other = client.embed(embed_request("something else")).await.unwrap().into_inner();
        assert_ne!(other.embeddings, first.embeddings);

        let meta = first.metadata.expect("metadata");
        assert!(meta.tokenization_time_ns > 0);
        assert!(meta.queue_time_ns > 0);
        // The default device takes at least its 2ms fixed latency.
        assert!(meta.inference_time_ns >= 2_000_000, "{meta:?}");
        assert!(meta.total_time_ns >= meta.inference_time_ns + meta.queue_time_ns);
        assert_eq!(meta.compute_tokens, 5);
        assert_eq!(meta.compute_chars, 21);

        let stats = sim.stats();
        assert_eq!((stats.requests_received, stats.requests_admitted, stats.completed), (3, 3, 3));
        assert_eq!(stats.in_flight, 0);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smaller_dimensions_truncate_and_renormalize() {
    bounded(async {
        let sim = start(SimConfig { dimensions: 128, ..SimConfig::default() }).await;
        let mut client = embed_client(&sim).await;
        let request = EmbedRequest { dimensions: Some(32), normalize: Some(false), ..embed_request("matryoshka doll") };
        let small = client.embed(request).await.unwrap().into_inner().embeddings;
        assert_eq!(small.len(), 32);
        assert!((norm(&small) - 1.0).abs() < 1e-4);
        for (a, b) in small.iter().zip(embedding_for("matryoshka doll", 32)) {
            assert!((a - b).abs() < 1e-5);
        }
        let too_big = EmbedRequest { dimensions: Some(129), ..embed_request("x") };
        assert_eq!(client.embed(too_big).await.unwrap_err().code(), Code::InvalidArgument);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_inputs_are_refused_unless_truncated() {
    bounded(async {
        let sim = start(SimConfig { max_batch_tokens: 8, ..SimConfig::default() }).await;
        let mut client = embed_client(&sim).await;
        let long = "one two three four five six seven eight nine ten";
        let err = client.embed(embed_request(long)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(client.embed(embed_request("")).await.unwrap_err().code(), Code::InvalidArgument);

        let truncated = EmbedRequest { truncate: true, ..embed_request(long) };
        let answer = client.embed(truncated).await.unwrap().into_inner();
        assert_eq!(answer.metadata.unwrap().compute_tokens, 8);
        assert_eq!(answer.embeddings, embedding_for("one two three four five six", 384));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_and_per_token_embeddings() {
    bounded(async {
        let sim = start(SimConfig { dimensions: 16, ..SimConfig::default() }).await;
        let mut client = embed_client(&sim).await;
        let sparse_request =
            teifleet_proto::v1::EmbedSparseRequest { inputs: "alpha beta alpha".into(), ..Default::default() };
        let sparse = client.embed_sparse(sparse_request.clone()).await.unwrap().into_inner();
        assert_eq!(sparse.sparse_embeddings.len(), 2);
        assert!(sparse.sparse_embeddings.iter().all(|v| v.value > 0.0));
        assert!(sparse.sparse_embeddings.windows(2).all(|w| w[0].index < w[1].index));
        let again = client.embed_sparse(sparse_request).await.unwrap().into_inner();
        assert_eq!(again.sparse_embeddings, sparse.sparse_embeddings);

        let all_request = teifleet_proto::v1::EmbedAllRequest { inputs: "alpha beta".into(), ..Default::default() };
        let all = client.embed_all(all_request).await.unwrap().into_inner();
        assert_eq!(all.token_embeddings.len(), 4);
        assert!(all.token_embeddings.iter().all(|t| t.embeddings.len() == 16));
        sim.shutdown().await;
    })
    .await;
}
