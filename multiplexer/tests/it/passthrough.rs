//! What the byte-forwarding path must keep: TEI's own answers reach clients exactly as TEI sent
//! them, identical calls in flight can share one TEI call, and start-up failures name their cause.

use std::time::Duration;

use futures::future::join_all;
use teifleet_multiplexer::SetupError;
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::run::server::{self, Settings};
use teifleet_proto::v1::{self, rerank_client::RerankClient};
use tonic::Code;

use crate::support::*;

/// A TEI validation error comes back with TEI's code, message and metadata, not wrapped in the
/// multiplexer's words; it is counted as an upstream error.
#[tokio::test]
async fn upstream_errors_pass_through_unaltered() {
    let sim = sim(|_| {}).await;
    let (mux, _) = mux(sim.addr(), limits(4, 4)).await;
    let empty = v1::RerankRequest { query: "q".into(), texts: vec![], ..Default::default() };

    let direct = RerankClient::new(channel(sim.addr()).await).rerank(empty.clone()).await.unwrap_err();
    let through = RerankClient::new(channel(mux.grpc_addr).await).rerank(empty).await.unwrap_err();
    assert_eq!(through.code(), Code::InvalidArgument);
    assert_eq!(through.message(), direct.message(), "TEI's own message, unwrapped");
    assert_eq!(through.details(), direct.details());

    let text = metrics_text(&mux);
    let series = "teifleet_requests_total{code=\"InvalidArgument\",outcome=\"upstream_error\",pool=\"pool-a\",priority=\"standard\",protocol=\"grpc\",rpc=\"Rerank\"}";
    assert_eq!(metric(&text, series), Some(1.0), "{text}");
}

/// With coalescing on, identical Embed calls in flight together reach TEI once and every caller
/// gets the same embedding; a different text is its own call.
#[tokio::test]
async fn identical_calls_in_flight_share_one_tei_call() {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(200)).await;
    let mut spec = spec("pool-a", sim.addr(), limits(1, 64));
    spec.coalesce = true;
    let (mux, _) = mux_with(vec![spec], Settings::default()).await;
    let client = embed_client(mux.grpc_addr).await;

    let calls: Vec<_> = (0..20).map(|_| spawn_embed(&client, embed_request("hot query"))).collect();
    let other = spawn_embed(&client, embed_request("another query"));
    let answers = join_all(calls).await;
    let first = answers[0].as_ref().unwrap().as_ref().unwrap().get_ref().embeddings.clone();
    for answer in &answers {
        assert_eq!(answer.as_ref().unwrap().as_ref().unwrap().get_ref().embeddings, first);
    }
    other.await.unwrap().unwrap();

    let reached_tei = sim.stats().requests_received;
    assert!(reached_tei <= 3, "21 calls, 2 texts: TEI saw {reached_tei}");
    let text = metrics_text(&mux);
    let coalesced = metric(&text, "teifleet_coalesced_total{pool=\"pool-a\",rpc=\"Embed\"}").unwrap_or(0.0);
    assert_eq!(coalesced as u64 + reached_tei, 21, "every call either reached TEI or joined one: {text}");
    assert_eq!(mux.forwarder.pools.get("pool-a").unwrap().admission.snapshot().in_flight, 0, "no permit leaked");
}

/// Without coalescing (the default), identical calls are separate TEI calls.
#[tokio::test]
async fn coalescing_is_off_by_default() {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(50)).await;
    let (mux, _) = mux(sim.addr(), limits(8, 64)).await;
    let client = embed_client(mux.grpc_addr).await;
    let calls: Vec<_> = (0..5).map(|_| spawn_embed(&client, embed_request("hot query"))).collect();
    for answer in join_all(calls).await {
        answer.unwrap().unwrap();
    }
    assert_eq!(sim.stats().requests_received, 5);
}

/// A caller with a short deadline leaving a shared call does not cancel it for the others.
#[tokio::test]
async fn a_caller_leaving_a_shared_call_does_not_cancel_it() {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(300)).await;
    let mut spec = spec("pool-a", sim.addr(), limits(1, 64));
    spec.coalesce = true;
    let (mux, _) = mux_with(vec![spec], Settings::default()).await;
    let client = embed_client(mux.grpc_addr).await;

    let mut impatient = tonic::Request::new(embed_request("shared"));
    impatient.set_timeout(Duration::from_millis(100));
    let patient = spawn_embed(&client, embed_request("shared"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let impatient = spawn_embed(&client, impatient);
    // The multiplexer answers just before the deadline; on a loaded machine tonic's own
    // deadline timer can answer first, with CANCELLED. Either way the caller left at its deadline.
    let left = impatient.await.unwrap().unwrap_err().code();
    assert!(matches!(left, Code::DeadlineExceeded | Code::Cancelled), "{left:?}");
    patient.await.unwrap().expect("the other caller still gets its answer");
    assert_eq!(sim.stats().completed, 1);
}

/// A busy port is reported with the address that could not be bound.
#[tokio::test]
async fn a_busy_port_names_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let metrics = Metrics::new();
    let table = std::sync::Arc::new(teifleet_multiplexer::forward::pools::PoolTable::new("pool-a", metrics.clone()));
    let settings = Settings { listen: addr, ..Settings::default() };
    let error = server::start(settings, table, metrics).await.err().expect("the port is taken");
    assert!(matches!(error, SetupError::Bind { .. }), "{error}");
    assert!(error.to_string().contains(&addr.to_string()), "{error}");
}
