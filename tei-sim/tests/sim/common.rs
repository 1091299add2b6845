use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use teifleet_proto::v1::EmbedRequest;
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_tei_sim::{SimConfig, SimHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
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

/// A minimal HTTP/1.1 client, enough for the admin port.
pub async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("admin port answers");
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("request sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("response read");
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status line");
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Polls `check` until it holds or a couple of seconds pass.
pub async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}
