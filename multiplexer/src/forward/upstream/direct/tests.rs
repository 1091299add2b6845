//! The direct client against the TEI simulator over loopback: answers, TEI's own statuses, the
//! size limit, a connection that breaks and is made again.

use prost::Message as _;
use teifleet_proto::v1::{EmbedRequest, EmbedResponse};
use teifleet_tei_sim::SimConfig;
use tonic::{Code, Request};

use super::Direct;
use crate::error::Error;
use crate::forward::upstream::Dialer;
use crate::vocab::framing::Framed;

const EMBED: &str = "/tei.v1.Embed/Embed";
const LIMIT: usize = 4 * 1024 * 1024;

fn client(addr: std::net::SocketAddr) -> Direct {
    let uri = format!("http://{addr}").parse().unwrap();
    Direct::new(&uri, &Dialer::default(), std::time::Duration::from_secs(1)).unwrap()
}

fn embed(inputs: &str) -> Request<Framed> {
    let mut request = Request::new(Framed::encode(&EmbedRequest { inputs: inputs.into(), ..Default::default() }));
    request.metadata_mut().insert("x-caller", "kept".parse().unwrap());
    request
}

#[tokio::test]
async fn answers_and_tei_statuses_come_back_as_tei_sent_them() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let direct = client(sim.addr());

    let answer = direct.unary("pool", EMBED, embed("the quick fox"), LIMIT).await.unwrap();
    let decoded = EmbedResponse::decode(&answer.get_ref()[..]).unwrap();
    assert!(!decoded.embeddings.is_empty());
    assert!(answer.metadata().get("content-type").is_some(), "the answer's headers are its metadata");

    // TEI's refusal, compared with what TEI answers a tonic client directly.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", sim.addr())).unwrap().connect_lazy();
    let expected =
        teifleet_proto::v1::embed_client::EmbedClient::new(channel).embed(EmbedRequest::default()).await.unwrap_err();
    let Err(Error::Upstream { status, .. }) = direct.unary("pool", EMBED, embed(""), LIMIT).await else {
        panic!("TEI's own status")
    };
    assert_eq!((status.code(), status.message()), (expected.code(), expected.message()));
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn an_answer_over_the_limit_is_out_of_range() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let Err(Error::Upstream { status, .. }) = client(sim.addr()).unary("pool", EMBED, embed("a b c"), 16).await else {
        panic!("refused")
    };
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("the limit is: 16 bytes"), "{status:?}");
}

#[tokio::test]
async fn a_connection_that_breaks_is_unreachable_then_made_again() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let addr = sim.addr();
    let direct = client(addr);
    direct.unary("pool", EMBED, embed("one"), LIMIT).await.unwrap();

    sim.shutdown().await;
    let error = direct.unary("pool", EMBED, embed("two"), LIMIT).await.unwrap_err();
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    let error = direct.unary("pool", EMBED, embed("three"), LIMIT).await.unwrap_err();
    assert!(matches!(error, Error::Unreachable { .. }), "nothing listens: {error:?}");

    let _back = teifleet_tei_sim::start(SimConfig { listen: addr, ..SimConfig::default() }).await.unwrap();
    direct.unary("pool", EMBED, embed("four"), LIMIT).await.expect("a new connection to the same address");
}

#[tokio::test]
async fn an_answer_holds_its_upstream_stream_until_it_is_let_go() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let direct = client(sim.addr());
    let mut answer = direct.unary("pool", EMBED, embed("the quick fox"), LIMIT).await.unwrap();
    let held = answer.extensions_mut().remove::<super::HeldUpstream>();
    assert!(held.is_some(), "held in the answer until the gRPC port has queued the answer");
    drop(held);
    // The stream let go, the connection serves the next call as before.
    let again = direct.unary("pool", EMBED, embed("the lazy dog"), LIMIT).await.unwrap();
    assert!(!EmbedResponse::decode(&again.get_ref()[..]).unwrap().embeddings.is_empty());
}
