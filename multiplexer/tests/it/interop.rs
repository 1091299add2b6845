//! Every tei.v1 RPC through the multiplexer gets the answer the simulator gives directly.

use teifleet_proto::v1::{
    self, embed_client::EmbedClient, info_client::InfoClient, predict_client::PredictClient,
    rerank_client::RerankClient, tokenize_client::TokenizeClient,
};
use tonic::transport::Channel;

use crate::support::*;

/// Answers minus TEI's timing Metadata, which differs between any two calls.
fn embed_vec(r: v1::EmbedResponse) -> Vec<f32> {
    r.embeddings
}

async fn both(sim_addr: std::net::SocketAddr, mux_addr: std::net::SocketAddr) -> (Channel, Channel) {
    (channel(sim_addr).await, channel(mux_addr).await)
}

#[tokio::test]
async fn every_rpc_matches_the_direct_answer() {
    let sim = sim(|_| {}).await;
    let (mux, _) = mux(sim.addr(), limits(4, 16)).await;
    let (direct, via) = both(sim.addr(), mux.grpc_addr).await;

    let info = |ch: Channel| async move { InfoClient::new(ch).info(v1::InfoRequest {}).await.unwrap().into_inner() };
    assert_eq!(info(direct.clone()).await, info(via.clone()).await);

    let embed = |ch: Channel| async move {
        embed_vec(EmbedClient::new(ch).embed(embed_request("the quick brown fox")).await.unwrap().into_inner())
    };
    let expected = embed(direct.clone()).await;
    assert!(!expected.is_empty());
    assert_eq!(expected, embed(via.clone()).await);

    let sparse = |ch: Channel| async move {
        let request = v1::EmbedSparseRequest { inputs: "sparse words here".into(), ..Default::default() };
        EmbedClient::new(ch).embed_sparse(request).await.unwrap().into_inner().sparse_embeddings
    };
    assert_eq!(sparse(direct.clone()).await, sparse(via.clone()).await);

    let all = |ch: Channel| async move {
        let request = v1::EmbedAllRequest { inputs: "all of the tokens".into(), ..Default::default() };
        EmbedClient::new(ch).embed_all(request).await.unwrap().into_inner().token_embeddings
    };
    assert_eq!(all(direct.clone()).await, all(via.clone()).await);

    let predict = |ch: Channel| async move {
        let mut client = PredictClient::new(ch);
        let single = client.predict(v1::PredictRequest { inputs: "great".into(), ..Default::default() }).await;
        let pair = client
            .predict_pair(v1::PredictPairRequest { inputs: vec!["a".into(), "b".into()], ..Default::default() })
            .await;
        (single.unwrap().into_inner().predictions, pair.unwrap().into_inner().predictions)
    };
    assert_eq!(predict(direct.clone()).await, predict(via.clone()).await);

    let rerank = |ch: Channel| async move {
        let request = v1::RerankRequest {
            query: "fox".into(),
            texts: vec!["a fox".into(), "a dog".into(), "foxes run".into()],
            return_text: true,
            ..Default::default()
        };
        RerankClient::new(ch).rerank(request).await.unwrap().into_inner().ranks
    };
    assert_eq!(rerank(direct.clone()).await, rerank(via.clone()).await);

    let rerank_stream = |ch: Channel| async move {
        let texts = ["a fox", "a dog"].map(|text| v1::RerankStreamRequest {
            query: "fox".into(),
            text: text.into(),
            ..Default::default()
        });
        RerankClient::new(ch).rerank_stream(tokio_stream::iter(texts)).await.unwrap().into_inner().ranks
    };
    assert_eq!(rerank_stream(direct.clone()).await, rerank_stream(via.clone()).await);

    let tokenize = |ch: Channel| async move {
        let mut client = TokenizeClient::new(ch);
        let encoded = client
            .tokenize(v1::EncodeRequest {
                inputs: "hello world".into(),
                add_special_tokens: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let ids = encoded.tokens.iter().map(|t| t.id).collect();
        let decoded = client.decode(v1::DecodeRequest { ids, skip_special_tokens: true }).await.unwrap().into_inner();
        (encoded, decoded)
    };
    assert_eq!(tokenize(direct.clone()).await, tokenize(via.clone()).await);
}

#[tokio::test]
async fn streams_match_message_by_message() {
    let sim = sim(|_| {}).await;
    let (mux, _) = mux(sim.addr(), limits(2, 16)).await;
    let (direct, via) = both(sim.addr(), mux.grpc_addr).await;
    let texts: Vec<String> = (0..25).map(|i| format!("stream message number {i}")).collect();

    let run = |ch: Channel, texts: Vec<String>| async move {
        let requests = texts.into_iter().map(|t| embed_request(&t));
        let mut answers = EmbedClient::new(ch).embed_stream(tokio_stream::iter(requests)).await.unwrap().into_inner();
        let mut out = Vec::new();
        while let Some(answer) = answers.message().await.unwrap() {
            out.push(answer.embeddings);
        }
        out
    };
    let expected = run(direct.clone(), texts.clone()).await;
    assert_eq!(expected.len(), 25);
    assert_eq!(expected, run(via.clone(), texts.clone()).await);

    let tokens = |ch: Channel| async move {
        let requests = ["one two", "three"].map(|t| v1::EncodeRequest { inputs: t.into(), ..Default::default() });
        let mut answers =
            TokenizeClient::new(ch).tokenize_stream(tokio_stream::iter(requests)).await.unwrap().into_inner();
        let mut out = Vec::new();
        while let Some(answer) = answers.message().await.unwrap() {
            out.push(answer);
        }
        out
    };
    assert_eq!(tokens(direct).await, tokens(via).await);
    let snapshot = mux.forwarder.pools.get("pool-a").unwrap().admission.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.queued_total()), (0, 0), "stream permits all returned");
}
