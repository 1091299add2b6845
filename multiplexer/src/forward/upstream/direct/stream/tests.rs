//! Streaming calls on the direct connection against the TEI simulator over loopback, each beside
//! what a tonic client gets from the simulator directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use prost::Message as _;
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_proto::v1::{EmbedRequest, EmbedResponse};
use teifleet_tei_sim::SimConfig;
use tonic::{Code, Request};

use crate::error::Error;
use crate::forward::upstream::Dialer;
use crate::forward::upstream::direct::Direct;

const EMBED_STREAM: &str = "/tei.v1.Embed/EmbedStream";
const LIMIT: usize = 4 * 1024 * 1024;

fn client(addr: std::net::SocketAddr) -> Direct {
    let uri = format!("http://{addr}").parse().unwrap();
    Direct::new(&uri, &Dialer::default(), Duration::from_secs(1)).unwrap()
}

fn requests(inputs: &[&str]) -> Vec<EmbedRequest> {
    inputs.iter().map(|inputs| EmbedRequest { inputs: (*inputs).into(), ..Default::default() }).collect()
}

fn encoded(requests: &[EmbedRequest]) -> Request<futures::stream::Iter<std::vec::IntoIter<Bytes>>> {
    let messages: Vec<Bytes> = requests.iter().map(|r| Bytes::from(r.encode_to_vec())).collect();
    Request::new(futures::stream::iter(messages))
}

fn direct_tonic(addr: std::net::SocketAddr) -> EmbedClient<tonic::transport::Channel> {
    EmbedClient::new(tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy())
}

#[tokio::test]
async fn answers_come_back_in_order_as_tei_sent_them() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let sent = requests(&["one", "two words", "three words here", "four"]);
    let answers: Vec<Bytes> = client(sim.addr())
        .stream("pool", EMBED_STREAM, encoded(&sent), LIMIT)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let expected: Vec<EmbedResponse> = direct_tonic(sim.addr())
        .embed_stream(futures::stream::iter(sent.clone()))
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap();
    let answers: Vec<Vec<f32>> = answers.iter().map(|a| EmbedResponse::decode(a.clone()).unwrap().embeddings).collect();
    let expected: Vec<Vec<f32>> = expected.into_iter().map(|a| a.embeddings).collect();
    assert_eq!(answers, expected);
}

#[tokio::test]
async fn messages_go_up_while_no_answer_is_read() {
    // A client that sends everything before it reads: its messages reach TEI all the same.
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let inputs: Vec<String> = (0..300).map(|i| format!("text number {i}")).collect();
    let sent = requests(&inputs.iter().map(String::as_str).collect::<Vec<_>>());
    let exchange = client(sim.addr()).stream("pool", EMBED_STREAM, encoded(&sent), LIMIT).await.unwrap();
    for _ in 0..200 {
        if sim.stats().requests_received == 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sim.stats().requests_received, 300, "every message reached TEI before an answer was read");
    let answers = tokio::time::timeout(Duration::from_secs(10), exchange.try_collect::<Vec<_>>()).await;
    assert_eq!(answers.expect("no stall").unwrap().len(), 300);
}

#[tokio::test]
async fn teis_status_mid_stream_ends_it_as_tei_sent_it() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let sent = requests(&["fine", ""]);
    let expected = direct_tonic(sim.addr())
        .embed_stream(futures::stream::iter(sent.clone()))
        .await
        .unwrap()
        .into_inner()
        .try_collect::<Vec<_>>()
        .await
        .unwrap_err();
    let mut exchange = client(sim.addr()).stream("pool", EMBED_STREAM, encoded(&sent), LIMIT).await.unwrap();
    assert!(exchange.next().await.unwrap().is_ok(), "the first message's answer");
    let Some(Err(Error::Upstream { status, .. })) = exchange.next().await else { panic!("TEI's status") };
    assert_eq!((status.code(), status.message()), (expected.code(), expected.message()));
    assert!(exchange.next().await.is_none(), "nothing after the status");
}

#[tokio::test]
async fn an_answer_over_the_limit_is_out_of_range() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let mut exchange =
        client(sim.addr()).stream("pool", EMBED_STREAM, encoded(&requests(&["a b c"])), 16).await.unwrap();
    let Some(Err(Error::Upstream { status, .. })) = exchange.next().await else { panic!("refused") };
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("the limit is: 16 bytes"), "{status:?}");
}

#[tokio::test]
async fn a_dropped_exchange_stops_sending_and_drops_the_callers_stream() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Flag(dropped.clone());
    let first = Bytes::from(requests(&["one"])[0].encode_to_vec());
    // One message, then a stream that never ends, holding the flag.
    let messages = futures::stream::iter(Some(first)).chain(futures::stream::pending().map(move |()| {
        let _held = &flag;
        Bytes::new()
    }));
    let mut exchange = client(sim.addr()).stream("pool", EMBED_STREAM, Request::new(messages), LIMIT).await.unwrap();
    assert!(exchange.next().await.unwrap().is_ok());
    assert!(!dropped.load(Ordering::SeqCst));
    drop(exchange);
    for _ in 0..100 {
        if dropped.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the caller's stream outlived its exchange");
}
