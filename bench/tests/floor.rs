//! The floor proxies, on each stack, against an in-process TEI simulator: any unary path is
//! forwarded and answered as the backend answered, errors included.

use teifleet_bench::floor;
use teifleet_load::{Call, LoadConfig};
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_proto::v1::tokenize_client::TokenizeClient;
use teifleet_proto::v1::{EmbedRequest, EncodeRequest};
use teifleet_tei_sim::SimConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_unary_calls_of_any_path_unchanged() {
    let sim = teifleet_tei_sim::start(SimConfig::default()).await.expect("simulator starts");
    for stack in floor::Stack::ALL {
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
