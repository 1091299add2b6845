//! Bad input gets a clear status and the server stays up: metadata, request messages framed
//! wrongly, compressed or trickled, and routing that reaches outside the namespace.

use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use http_body_util::BodyExt as _;
use teifleet_multiplexer::run::server::{InputBounds, Settings};
use teifleet_wire::headers::{MODEL as MODEL_HEADER, POOL as POOL_HEADER, PRIORITY as PRIORITY_HEADER};
use tonic::Code;
use tonic::transport::Channel;

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
    let cases: [(Metadata, Code, &str); 8] = [
        (&[(PRIORITY_HEADER, "asap")], Code::InvalidArgument, "critical, standard, sheddable"),
        (&[(POOL_HEADER, "pool-a"), (MODEL_HEADER, "m")], Code::InvalidArgument, "not both"),
        (&[(POOL_HEADER, "")], Code::InvalidArgument, "empty"),
        (&[("grpc-timeout", "soon")], Code::InvalidArgument, "grpc-timeout"),
        (&[("grpc-timeout", "999999999S")], Code::InvalidArgument, "grpc-timeout"),
        // Routing names a pool of this namespace, never a host: another namespace's pool, or a
        // Service name, is simply not a pool here.
        (&[(POOL_HEADER, "pool-a.other-namespace")], Code::NotFound, "known pools: pool-a"),
        (&[(POOL_HEADER, "other-namespace/pool-a")], Code::NotFound, "known pools: pool-a"),
        (&[(POOL_HEADER, "evil.example.com:50051")], Code::NotFound, "known pools: pool-a"),
    ];
    for (metadata, code, text) in cases {
        let status = client.clone().embed(with_meta(embed_request("hi"), metadata)).await.unwrap_err();
        assert_eq!(status.code(), code, "{metadata:?}: {status:?}");
        assert!(status.message().contains(text), "{metadata:?}: {}", status.message());
    }
    assert_eq!(sim.stats().requests_received, 0, "none of them reached TEI");
    let rejected = metric_sum(&metrics_text(&mux), "teifleet_requests_total", &[("outcome", "rejected")]);
    assert_eq!(rejected, 9.0, "each refusal counted once as the caller's");
    assert_eq!(refused(&mux, "grpc", "message_too_large"), 1.0);

    // The longest timeout gRPC can say (eight digits of hours) is a deadline like any other.
    let absurd = with_meta(embed_request("patient"), &[("grpc-timeout", "99999999H")]);
    client.clone().embed(absurd).await.expect("an absurd timeout is served");
    client.clone().embed(embed_request("still serving")).await.expect("the server stays up");
}

#[tokio::test]
async fn a_stream_message_over_the_limit_fails_the_stream_in_tonics_words() {
    let sim = sim(|_| {}).await;
    let settings = Settings { max_message_bytes: 64 * 1024, ..Settings::default() };
    let (mux, _) = mux_with(vec![spec("pool-a", sim.addr(), limits(2, 8))], settings).await;
    let client = embed_client(mux.grpc_addr).await;

    // TEI must not answer the messages before it as if they were the whole stream.
    let messages = vec![embed_request("fine"), embed_request(&"x ".repeat(100 * 1024))];
    let answers = client.clone().embed_stream(futures::stream::iter(messages)).await;
    let status = match answers {
        Err(status) => status,
        Ok(answers) => {
            let mut answers = answers.into_inner();
            loop {
                match answers.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("the stream ended as if whole"),
                    Err(status) => break status,
                }
            }
        }
    };
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("the limit is: 65536 bytes"), "{}", status.message());
    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("outcome", "rejected")]), 1.0, "{text}");
    assert_eq!(refused(&mux, "grpc", "message_too_large"), 1.0, "counted as a unary message's is");
    let more = client.clone().embed_stream(futures::stream::iter(vec![embed_request("again")])).await;
    assert_eq!(more.unwrap().into_inner().message().await.unwrap().map(|_| ()), Some(()), "the pool serves on");
}

#[tokio::test]
async fn request_messages_framed_wrongly_or_compressed_are_refused_in_tonics_words() {
    let sim = sim(|_| {}).await;
    let (mux, _) = mux(sim.addr(), limits(2, 8)).await;
    let channel = channel(mux.grpc_addr).await;
    let message = prost::Message::encode_to_vec(&embed_request("hi"));

    // A compressed message: nothing is ever decompressed here, so no ratio can be abused.
    let gzip = call(&channel, &[("grpc-encoding", "gzip")], frame(1, u32_len(&message), &message)).await;
    assert_eq!(gzip.code(), Code::Unimplemented, "{gzip:?}");
    assert!(gzip.message().contains("gzip"), "{}", gzip.message());
    let flagged = call(&channel, &[], frame(1, u32_len(&message), &message)).await;
    assert_eq!(flagged.code(), Code::Internal, "{flagged:?}");
    assert!(flagged.message().contains("compressed-flag"), "{}", flagged.message());

    // Length prefixes that lie: past the message limit (refused before anything is buffered),
    // and longer than what arrives.
    let huge = call(&channel, &[], frame(0, u32::MAX, &message)).await;
    assert_eq!(huge.code(), Code::OutOfRange, "{huge:?}");
    let short = call(&channel, &[], frame(0, u32_len(&message) + 100, &message)).await;
    assert_eq!(short.code(), Code::Internal, "{short:?}");
    assert!(short.message().contains("EOF"), "{}", short.message());

    assert_eq!(sim.stats().requests_received, 0);
    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("outcome", "rejected")]), 4.0, "{text}");
    assert_eq!(refused(&mux, "grpc", "compressed_message"), 1.0);
    assert_eq!(refused(&mux, "grpc", "malformed_message"), 2.0);
    assert_eq!(refused(&mux, "grpc", "message_too_large"), 1.0);
    embed_client(mux.grpc_addr).await.embed(embed_request("still serving")).await.expect("the server stays up");
}

#[tokio::test]
async fn a_trickled_message_gives_its_permit_back_at_the_message_deadline() {
    let sim = sim(|_| {}).await;
    let bounds = InputBounds { body_timeout: Duration::from_millis(300), ..InputBounds::default() };
    // One permit: the trickling call holds it (an Embed's cost is known from its headers).
    let (mux, _) =
        mux_with(vec![spec("pool-a", sim.addr(), limits(1, 8))], Settings { bounds, ..Settings::default() }).await;
    let channel = channel(mux.grpc_addr).await;
    let message = prost::Message::encode_to_vec(&embed_request("slow"));
    let whole = frame(0, u32_len(&message), &message);

    let (sender, body) = futures::channel::mpsc::channel::<Result<http_body::Frame<Bytes>, tonic::Status>>(1);
    let mut sender = sender;
    sender.try_send(Ok(http_body::Frame::data(whole.slice(..3)))).unwrap();
    let slow = tokio::spawn({
        let channel = channel.clone();
        async move { exchange(&channel, &[], tonic::body::Body::new(http_body_util::StreamBody::new(body))).await }
    });
    until("the trickling call holds the permit", Duration::from_secs(10), || {
        metric_sum(&metrics_text(&mux), "teifleet_in_flight", &[("pool", "pool-a")]) == 1.0
    })
    .await;
    let mut next = embed_client(mux.grpc_addr).await;
    let waiting = tokio::time::timeout(Duration::from_secs(10), next.embed(embed_request("next")));
    waiting.await.expect("served once the slow call's deadline freed the permit").expect("the next call is served");
    let status = tokio::time::timeout(Duration::from_secs(10), slow).await.expect("answered").unwrap();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("did not arrive within 300ms"), "{}", status.message());
    drop(sender);
    assert_eq!(refused(&mux, "grpc", "message_timeout"), 1.0);
    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("outcome", "rejected")]), 1.0, "{text}");
    assert_eq!(sim.stats().requests_received, 1, "only the whole call reached TEI");
}

fn u32_len(message: &[u8]) -> u32 {
    u32::try_from(message.len()).unwrap()
}

/// One gRPC length-prefixed message whose prefix says what the test wants.
fn frame(compressed: u8, declared_len: u32, message: &[u8]) -> Bytes {
    let mut frame = BytesMut::new();
    frame.put_u8(compressed);
    frame.put_u32(declared_len);
    frame.put_slice(message);
    frame.freeze()
}

/// An Embed call whose request body is exactly `body`.
async fn call(channel: &Channel, headers: &[(&'static str, &str)], body: Bytes) -> tonic::Status {
    exchange(channel, headers, tonic::body::Body::new(http_body_util::Full::new(body))).await
}

/// Sends one raw Embed request on the HTTP/2 channel and returns the status it ends with.
async fn exchange(channel: &Channel, headers: &[(&'static str, &str)], body: tonic::body::Body) -> tonic::Status {
    use tower::Service as _;
    let mut request = http::Request::builder()
        .method("POST")
        .uri("http://mux/tei.v1.Embed/Embed")
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut channel = channel.clone();
    futures::future::poll_fn(|cx| channel.poll_ready(cx)).await.expect("the channel is ready");
    let response = channel.call(request.body(body).unwrap()).await.expect("an HTTP/2 answer");
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return status;
    }
    let collected = response.into_body().collect().await.expect("the answer's body");
    tonic::Status::from_header_map(collected.trailers().expect("trailers")).expect("a grpc-status")
}
