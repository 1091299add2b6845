use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use teifleet_proto::v1::EmbedRequest;
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_tei_sim::{SimConfig, SimHandle};
use tonic::transport::{Channel, Endpoint};

/// Upper bound on every test, so a hang fails instead of blocking the suite.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, f).await.expect("test exceeded its time bound")
}

pub async fn start(config: SimConfig) -> SimHandle {
    teifleet_tei_sim::start(config).await.expect("simulator starts")
}

pub async fn channel(sim: &SimHandle) -> Channel {
    Endpoint::from_shared(format!("http://{}", sim.addr()))
        .expect("valid uri")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connects")
}

pub async fn embed_client(sim: &SimHandle) -> EmbedClient<Channel> {
    EmbedClient::new(channel(sim).await)
}

pub fn embed_request(inputs: &str) -> EmbedRequest {
    EmbedRequest { inputs: inputs.to_owned(), ..Default::default() }
}

/// Status and body of an admin-port request; panics when the port does not answer.
pub async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let response = teifleet_testkit::http::request(addr, method, path).await.expect("admin port answers");
    (response.status, response.body)
}
