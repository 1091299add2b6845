//! Bad input gets a clear status and the server stays up.

use teifleet_multiplexer::server::Settings;
use teifleet_wire::headers::{MODEL as MODEL_HEADER, POOL as POOL_HEADER, PRIORITY as PRIORITY_HEADER};
use tonic::Code;

use crate::support::*;

#[tokio::test]
async fn oversized_messages_invalid_metadata_and_the_server_stays_up() {
    let sim = sim(|_| {}).await;
    let settings = Settings { max_message_bytes: 64 * 1024, ..Settings::default() };
    let (mux, _) = mux_with(vec![spec("pool-a", sim.addr(), limits(2, 8))], settings).await;
    let client = embed_client(mux.grpc_addr).await;

    let huge = "x ".repeat(100 * 1024);
    let status = client.clone().embed(embed_request(&huge)).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("the limit is: 65536 bytes"), "{}", status.message());
    assert_eq!(sim.stats().requests_received, 0);

    type Metadata = &'static [(&'static str, &'static str)];
    let cases: [(Metadata, Code, &str); 4] = [
        (&[(PRIORITY_HEADER, "asap")], Code::InvalidArgument, "critical, standard, sheddable"),
        (&[(POOL_HEADER, "pool-a"), (MODEL_HEADER, "m")], Code::InvalidArgument, "not both"),
        (&[(POOL_HEADER, "")], Code::InvalidArgument, "empty"),
        (&[("grpc-timeout", "soon")], Code::InvalidArgument, "grpc-timeout"),
    ];
    for (metadata, code, text) in cases {
        let status = client.clone().embed(with_meta(embed_request("hi"), metadata)).await.unwrap_err();
        assert_eq!(status.code(), code, "{metadata:?}: {status:?}");
        assert!(status.message().contains(text), "{metadata:?}: {}", status.message());
    }

    client.clone().embed(embed_request("still serving")).await.expect("the server stays up");
}
