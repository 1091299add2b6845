//! Every answer carries this replica's load as ORCA reports it, for clients that balance call by
//! call: gRPC answers (and refusals) in the `endpoint-load-metrics-bin` trailer, HTTP answers in
//! `endpoint-load-metrics: TEXT ...`.

use std::time::Duration;

use prost::Message as _;
use serde_json::json;
use teifleet_multiplexer::report::orca::OrcaLoadReport;
use teifleet_multiplexer::run::server::Settings;
use teifleet_tei_sim::Fault;
use teifleet_wire::headers::{ENDPOINT_LOAD_METRICS, ENDPOINT_LOAD_METRICS_BIN, PRIORITY};
use tonic::Code;

use crate::http_front::request;
use crate::support::*;

fn report(metadata: &tonic::metadata::MetadataMap) -> OrcaLoadReport {
    let value = metadata.get_bin(ENDPOINT_LOAD_METRICS_BIN).expect("a load report");
    OrcaLoadReport::decode(value.to_bytes().expect("base64").as_ref()).expect("an OrcaLoadReport")
}

#[tokio::test]
async fn answers_and_refusals_carry_the_replicas_load() {
    let sim = sim(|_| {}).await;
    let settings = Settings { http_listen: Some("127.0.0.1:0".parse().unwrap()), ..Settings::default() };
    let (mux, _) = mux_with(vec![spec("pool-a", sim.addr(), limits(2, 0))], settings).await;
    let client = embed_client(mux.grpc_addr).await;

    let answer = client.clone().embed(embed_request("warm")).await.expect("served");
    let load = report(answer.metadata());
    assert_eq!(load.named_metrics.get("limit"), Some(&2.0), "{load:?}");

    // Two in flight, no queue, TEI stalled: a third is refused (a critical one: it does not wait
    // at the pool's door), and its refusal says the replica is full.
    sim.set_fault(Fault::Stall);
    let held: Vec<_> = (0..2).map(|i| spawn_embed(&client, embed_request(&format!("held {i}")))).collect();
    until("both permits held", Duration::from_secs(5), || {
        metric_sum(&metrics_text(&mux), "teifleet_in_flight", &[]) == 2.0
    })
    .await;
    let third = with_meta(embed_request("third"), &[(PRIORITY, "critical")]);
    let refused = client.clone().embed(third).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.metadata().get("grpc-retry-pushback-ms").is_some(), "the hint stays");
    let full = report(refused.metadata());
    assert!(full.application_utilization >= 1.0, "{full:?}");
    assert_eq!(full.named_metrics.get("in_flight"), Some(&2.0), "{full:?}");
    sim.set_fault(Fault::None);
    for call in held {
        call.await.unwrap().expect("served");
    }

    let http = mux.http_addr.unwrap();
    let answer = request(http, "POST", "/embed", &[], json!({ "inputs": "over HTTP" }).to_string().as_bytes()).await;
    assert_eq!(answer.status, 200);
    let text = answer.header(ENDPOINT_LOAD_METRICS).expect("a load report on HTTP");
    assert!(text.starts_with("TEXT ") && text.contains("named_metrics.limit=2"), "{text}");
}
