//! Shutdown drains: not ready at once, calls in flight finish, new calls are refused.

use std::sync::atomic::Ordering;
use std::time::Duration;

use teifleet_multiplexer::run::server::Settings;

use crate::support::*;

#[tokio::test]
async fn shutdown_finishes_in_flight_calls() {
    let sim = sim(|c| c.fixed_latency = Duration::from_millis(300)).await;
    let settings = Settings { drain_delay: Duration::from_millis(100), ..Settings::default() };
    let (mux, _) = mux_with(vec![spec("pool-a", sim.addr(), limits(2, 8))], settings).await;
    let addr = mux.grpc_addr;
    let client = embed_client(addr).await;
    until("ready", Duration::from_secs(5), || mux.readiness.ready().is_ok()).await;

    let in_flight = {
        let mut client = client.clone();
        tokio::spawn(async move { client.embed(embed_request("finishing")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let readiness = mux.readiness.clone();
    let forwarder = mux.forwarder.clone();
    let shutdown = tokio::spawn(mux.shutdown());
    until("not ready", Duration::from_secs(2), || !readiness.accepting.load(Ordering::Relaxed)).await;
    assert!(readiness.ready().is_err());

    until("draining", Duration::from_secs(2), || forwarder.is_draining()).await;
    in_flight.await.unwrap().expect("the call in flight completes");
    tokio::time::timeout(Duration::from_secs(5), shutdown).await.expect("drain ends").unwrap().unwrap();
    assert!(tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.is_err());
}
