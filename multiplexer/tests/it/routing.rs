//! Routing by metadata across pools, and forwarding loops prevented.

use teifleet_multiplexer::forward::pools::PoolSpec;
use teifleet_multiplexer::run::server::Settings;
use teifleet_wire::headers::{FORWARDED_BY as FORWARDED_BY_HEADER, MODEL as MODEL_HEADER, POOL as POOL_HEADER};
use tonic::Code;

use crate::support::*;

#[tokio::test]
async fn pool_and_model_headers_pick_the_pool() {
    let small = sim(|c| c.dimensions = 8).await;
    let large = sim(|c| {
        c.dimensions = 16;
        c.model_id = "org/large".into();
    })
    .await;
    let specs = vec![
        spec("small", small.addr(), limits(2, 8)),
        PoolSpec { model: Some("org/large".into()), ..spec("large", large.addr(), limits(2, 8)) },
    ];
    let (mux, _) = mux_with(specs, Settings::default()).await;
    let client = embed_client(mux.grpc_addr).await;
    let dims = |r: tonic::Response<teifleet_proto::v1::EmbedResponse>| r.into_inner().embeddings.len();

    assert_eq!(dims(client.clone().embed(embed_request("default")).await.unwrap()), 8);
    let by_pool = client.clone().embed(with_meta(embed_request("p"), &[(POOL_HEADER, "large")])).await.unwrap();
    assert_eq!(dims(by_pool), 16);
    let by_model = client.clone().embed(with_meta(embed_request("m"), &[(MODEL_HEADER, "org/large")])).await.unwrap();
    assert_eq!(dims(by_model), 16);

    let unknown = client.clone().embed(with_meta(embed_request("u"), &[(POOL_HEADER, "nope")])).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("known pools: large, small"), "{}", unknown.message());
    let unknown = client.clone().embed(with_meta(embed_request("u"), &[(MODEL_HEADER, "org/none")])).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    // Each pool has its own admission state.
    assert_eq!(small.stats().requests_received, 1);
    assert_eq!(large.stats().requests_received, 2);
}

#[tokio::test]
async fn forwarding_to_another_pools_multiplexer_happens_once_at_most() {
    let tei_b = sim(|c| c.dimensions = 12).await;
    let tei_a = sim(|c| c.dimensions = 4).await;
    // Multiplexer B fronts pool b's TEI.
    let (mux_b, _) = mux_with(vec![spec("b", tei_b.addr(), limits(2, 8))], Settings::default()).await;
    // Multiplexer A fronts pool a and reaches pool b through B, as in a cluster.
    let remote_b = PoolSpec { remote: true, ..spec("b", mux_b.grpc_addr, limits(2, 8)) };
    let settings = Settings { identity: "mux-a-0".into(), ..Settings::default() };
    let (mux_a, _) = mux_with(vec![spec("a", tei_a.addr(), limits(2, 8)), remote_b], settings).await;
    let client = embed_client(mux_a.grpc_addr).await;

    let answer = client.clone().embed(with_meta(embed_request("to b"), &[(POOL_HEADER, "b")])).await.unwrap();
    assert_eq!(answer.into_inner().embeddings.len(), 12, "served by pool b's TEI through its multiplexer");
    assert_eq!(tei_b.stats().requests_received, 1);

    // A request that was already forwarded is never forwarded again.
    let looped = client
        .clone()
        .embed(with_meta(embed_request("loop"), &[(POOL_HEADER, "b"), (FORWARDED_BY_HEADER, "mux-z-0")]))
        .await
        .unwrap_err();
    assert_eq!(looped.code(), Code::FailedPrecondition);
    assert!(looped.message().contains("already forwarded by a teifleet sidecar"), "{}", looped.message());
    assert!(!looped.message().contains("mux-z-0"), "names no pod: {}", looped.message());
    assert_eq!(tei_b.stats().requests_received, 1);
}
