//! The floor proxies, on each stack, against an in-process TEI simulator: any unary path is
//! forwarded and answered as the backend answered, errors included; the h2 floor relays a stream
//! both ways at once.

use std::time::Duration;

use teifleet_bench::floor;
use teifleet_load::{Call, LoadConfig};
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_proto::v1::tokenize_client::TokenizeClient;
use teifleet_proto::v1::{EmbedRequest, EncodeRequest};
use teifleet_tei_sim::SimConfig;
use tokio::time::timeout;
use tokio_stream::wrappers::ReceiverStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_unary_calls_of_any_path_unchanged() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.expect("simulator starts");
    for stack in floor::Stack::PROXIES {
        let addr =
            floor::spawn(stack, "127.0.0.1:0".parse().unwrap(), &format!("http://{}", sim.addr())).await.unwrap();
        forwards_through(&format!("http://{addr}")).await;
    }
}

async fn forwards_through(target: &str) {
    let target = target.to_owned();

    for call in [Call::Info, Call::Embed] {
        let report =
            teifleet_load::run(&LoadConfig { call, ..LoadConfig::closed(target.clone(), 2, 20) }).await.unwrap();
        assert_eq!(report.ok, 20, "{target} {call}: {:?}", report.codes);
    }

    let channel = tonic::transport::Endpoint::from_shared(target).unwrap().connect().await.unwrap();
    let tokens = TokenizeClient::new(channel.clone())
        .tokenize(EncodeRequest { inputs: "the quick fox".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tokens.tokens.len(), 3, "one token per word, no special tokens asked for");
    // The backend's refusal comes back as the backend's status.
    let status = EmbedClient::new(channel)
        .embed(EmbedRequest { inputs: String::new(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}

/// A stream's client that sends its next message only once the last is answered gets every answer:
/// the h2 floor relays a stream's answers while its requests still come, as the multiplexer does,
/// so scenario 8 compares two full-duplex relays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_h2_floor_relays_answers_while_the_requests_still_come() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.expect("simulator starts");
    let upstream = format!("http://{}", sim.addr());
    let addr = floor::spawn(floor::Stack::H2, "127.0.0.1:0".parse().unwrap(), &upstream).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let within = Duration::from_secs(5);
    let (send, requests) = tokio::sync::mpsc::channel(1);
    let ask = |inputs: String| EmbedRequest { inputs, ..Default::default() };
    send.send(ask("message 0".into())).await.unwrap();
    let mut answers = timeout(within, EmbedClient::new(channel).embed_stream(ReceiverStream::new(requests)))
        .await
        .expect("the answer's headers come while the request stream is open")
        .unwrap()
        .into_inner();
    for i in 1..=5 {
        let answer = timeout(within, answers.message()).await.expect("each message answered before the next is sent");
        assert!(answer.unwrap().is_some(), "answer {i}");
        send.send(ask(format!("message {i}"))).await.unwrap();
    }
    drop(send);
    let last = timeout(within, answers.message()).await.unwrap().unwrap();
    assert!(last.is_some(), "the last message's answer");
    assert!(timeout(within, answers.message()).await.unwrap().unwrap().is_none(), "then the end, with an OK status");
}

/// The memo floor forwards what it has not seen (errors included, and never kept) and answers a
/// call it has seen from memory, byte for byte, without asking the backend again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memo_floor_answers_a_call_it_has_seen_from_memory() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.expect("simulator starts");
    let addr = floor::spawn(floor::Stack::Memo, "127.0.0.1:0".parse().unwrap(), &format!("http://{}", sim.addr()))
        .await
        .unwrap();
    let target = format!("http://{addr}");
    forwards_through(&target).await;

    let channel = tonic::transport::Endpoint::from_shared(target).unwrap().connect().await.unwrap();
    let mut client = EmbedClient::new(channel);
    let ask = || EmbedRequest { inputs: "a text asked twice".into(), ..Default::default() };
    let first = client.embed(ask()).await.unwrap().into_inner();
    let asked = sim.stats().requests_received;
    let again = client.embed(ask()).await.unwrap().into_inner();
    assert_eq!(again.embeddings, first.embeddings, "the same answer");
    assert_eq!(sim.stats().requests_received, asked, "the backend was not asked again");
    // A refusal is forwarded each time: never kept.
    let refused = || EmbedRequest { inputs: String::new(), ..Default::default() };
    for _ in 0..2 {
        assert_eq!(client.embed(refused()).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    }
    assert_eq!(sim.stats().requests_received, asked + 2, "each refusal came from the backend");
}
