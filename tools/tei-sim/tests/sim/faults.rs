use std::time::Duration;

use teifleet_proto::v1::InfoRequest;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_tei_sim::{Fault, SimConfig};
use teifleet_testkit::poll::until;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common::{bounded, channel, embed_client, embed_request, start};

async fn health(client: &mut HealthClient<tonic::transport::Channel>, service: &str) -> ServingStatus {
    let request = HealthCheckRequest { service: service.to_owned() };
    client.check(request).await.unwrap().into_inner().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fault_refuses_everything_and_reports_not_serving() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let channel = channel(&sim).await;
        let mut embed = embed_client(&sim).await;
        let mut health_client = HealthClient::new(channel.clone());
        let mut info = InfoClient::new(channel);
        assert_eq!(health(&mut health_client, "").await, ServingStatus::Serving);
        assert_eq!(health(&mut health_client, "tei.v1.Embed").await, ServingStatus::Serving);
        let unknown = health_client.check(HealthCheckRequest { service: "nope".into() }).await.unwrap_err();
        assert_eq!(unknown.code(), Code::NotFound);

        sim.set_fault(Fault::Fail);
        assert_eq!(health(&mut health_client, "").await, ServingStatus::NotServing);
        assert_eq!(health(&mut health_client, "tei.v1.Embed").await, ServingStatus::NotServing);
        assert_eq!(embed.embed(embed_request("x")).await.unwrap_err().code(), Code::Unavailable);
        assert_eq!(info.info(InfoRequest {}).await.unwrap_err().code(), Code::Unavailable);
        let stats = sim.stats();
        assert_eq!((stats.requests_received, stats.requests_admitted, stats.completed), (2, 0, 0));

        sim.set_fault(Fault::None);
        assert_eq!(health(&mut health_client, "").await, ServingStatus::Serving);
        embed.embed(embed_request("x")).await.unwrap();
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_fault_holds_calls_until_cleared() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let mut health_client = HealthClient::new(channel(&sim).await);
        sim.set_fault(Fault::Stall);
        assert_eq!(health(&mut health_client, "").await, ServingStatus::Serving);

        let mut client = embed_client(&sim).await;
        let call = tokio::spawn(async move { client.embed(embed_request("stalled")).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!call.is_finished(), "a stalled call must not answer");
        let stats = sim.stats();
        assert_eq!((stats.in_flight, stats.requests_admitted, stats.completed), (1, 1, 0));

        sim.set_fault(Fault::None);
        let answer = tokio::time::timeout(Duration::from_secs(5), call).await.expect("answers once cleared");
        assert!(answer.unwrap().is_ok());
        assert_eq!(sim.stats().in_flight, 0);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_stalled_call_releases_its_slot() {
    bounded(async {
        let sim = start(SimConfig { max_concurrent_requests: 1, ..SimConfig::default() }).await;
        sim.set_fault(Fault::Stall);
        let mut client = embed_client(&sim).await;
        let stalled = tokio::time::timeout(Duration::from_millis(200), client.embed(embed_request("given up"))).await;
        assert!(stalled.is_err(), "the stalled call times out on the client side");
        until("the stalled call's slot to be released", Duration::from_secs(2), || sim.stats().in_flight == 0).await;

        // The slot is free again: with the fault cleared, the single slot admits a new call.
        sim.set_fault(Fault::None);
        client.embed(embed_request("after")).await.unwrap();
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_stalled_calls_and_frees_the_port() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let addr = sim.addr();
        sim.set_fault(Fault::Stall);
        let mut client = embed_client(&sim).await;
        let call = tokio::spawn(async move { client.embed(embed_request("stalled")).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        sim.shutdown().await;
        let answer = tokio::time::timeout(Duration::from_secs(5), call).await.expect("call ends").unwrap();
        assert!(answer.is_err());
        let rebound = teifleet_tei_sim::start(SimConfig { listen: addr, ..SimConfig::default() }).await;
        rebound.expect("port released").shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_prompt_with_open_streams() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let mut client = embed_client(&sim).await;
        let (outbound, rx) = tokio::sync::mpsc::channel(4);
        let mut answers =
            client.embed_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
        outbound.send(embed_request("open stream")).await.unwrap();
        assert!(answers.message().await.unwrap().is_some());
        let mut health_client = HealthClient::new(channel(&sim).await);
        let mut watch = health_client.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
        assert_eq!(watch.message().await.unwrap().unwrap().status(), ServingStatus::Serving);

        let started = std::time::Instant::now();
        sim.shutdown().await;
        // Well under the grace period: open streams are ended, not waited out.
        assert!(started.elapsed() < Duration::from_secs(2), "shutdown took {:?}", started.elapsed());
        drop(outbound);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_follows_the_fault() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let mut health_client = HealthClient::new(channel(&sim).await);
        let mut watch =
            health_client.watch(HealthCheckRequest { service: "tei.v1.Embed".into() }).await.unwrap().into_inner();
        assert_eq!(watch.message().await.unwrap().unwrap().status(), ServingStatus::Serving);
        sim.set_fault(Fault::Stall);
        sim.set_fault(Fault::Fail);
        assert_eq!(watch.message().await.unwrap().unwrap().status(), ServingStatus::NotServing);
        sim.set_fault(Fault::None);
        assert_eq!(watch.message().await.unwrap().unwrap().status(), ServingStatus::Serving);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fault_ends_streams_with_unavailable() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        sim.set_fault(Fault::Fail);
        let mut client = embed_client(&sim).await;
        let outbound = futures::stream::iter([embed_request("a"), embed_request("b")]);
        let mut answers = client.embed_stream(outbound).await.unwrap().into_inner();
        assert_eq!(answers.message().await.unwrap_err().code(), Code::Unavailable);
        assert_eq!(sim.stats().requests_admitted, 0);
        sim.shutdown().await;
    })
    .await;
}
