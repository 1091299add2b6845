//! A steady caller beside a flood: one small call at a time on a connection of its own, its
//! latencies and failures kept; and the flood itself, many callers each sending the cheapest call
//! of a surface again as soon as it is answered, for a bounded time.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The issue's bound on the steady caller's p99.
pub const STEADY_P99: Duration = Duration::from_secs(1);
/// The share of its calls the steady caller must have served.
pub const STEADY_SERVED: f64 = 0.9;
/// How long each flood lasts.
pub const FLOOD: Duration = Duration::from_millis(1000);

#[derive(Debug, Default)]
pub struct Steady {
    pub took: Vec<Duration>,
    pub failed: Vec<String>,
}

impl Steady {
    pub fn p99(&self) -> Duration {
        let mut took = self.took.clone();
        took.sort();
        took.get((took.len() * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or_default()
    }

    pub fn served(&self) -> f64 {
        self.took.len() as f64 / (self.took.len() + self.failed.len()).max(1) as f64
    }

    /// Whether it was served as the issue asks, and its figure.
    pub fn verdict(&self) -> (bool, String) {
        let calls = self.took.len() + self.failed.len();
        let holds = calls >= 5 && self.served() >= STEADY_SERVED && self.p99() < STEADY_P99;
        let first_failure = self.failed.first().map(|f| format!(", first failure: {f}")).unwrap_or_default();
        (holds, format!("steady caller {} of {calls} served, p99 {:?}{first_failure}", self.took.len(), self.p99()))
    }
}

/// Calls `call` every 20 ms until stopped (each call bounded by the client's own limit).
pub fn steady_caller<F, Fut>(call: F, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<Steady>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    tokio::spawn(async move {
        let mut steady = Steady::default();
        while !*stop.borrow() {
            let started = Instant::now();
            match call().await {
                Ok(()) => steady.took.push(started.elapsed()),
                Err(why) => steady.failed.push(why),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        steady
    })
}

/// `callers` tasks each calling `call` back to back for [`FLOOD`], with the steady caller beside
/// them from a moment before to a moment after. Returns the flood's calls, how many of them were
/// not served (refused or failed), and the steady caller.
pub async fn flood<F, Fut, S, SFut>(callers: usize, call: F, steady: S) -> (usize, usize, Steady)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
    S: Fn() -> SFut + Send + 'static,
    SFut: Future<Output = Result<(), String>> + Send,
{
    let (stop, stopped) = watch::channel(false);
    let steady = steady_caller(steady, stopped);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (calls, unserved) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let call = Arc::new(call);
    let until = Instant::now() + FLOOD;
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (call, calls, unserved) = (call.clone(), calls.clone(), unserved.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let served = tokio::time::timeout(Duration::from_secs(2), call(i)).await.unwrap_or(false);
                    calls.fetch_add(1, Ordering::Relaxed);
                    if !served {
                        unserved.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    futures::future::join_all(tasks).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop.send(true);
    let steady = steady.await.unwrap_or_default();
    (calls.load(Ordering::Relaxed), unserved.load(Ordering::Relaxed), steady)
}

/// A steady caller's one call: a small Embed over gRPC on its connection.
pub async fn grpc_embed(client: &h2::client::SendRequest<bytes::Bytes>) -> Result<(), String> {
    use prost::Message as _;
    let message = teifleet_proto::v1::EmbedRequest { inputs: "a steady caller's query".into(), ..Default::default() };
    let body = super::client::frame(&message.encode_to_vec());
    let row = super::table::GRPC.iter().find(|r| r.path == "/tei.v1.Embed/Embed").expect("a row");
    let answer = super::client::grpc_call(client, row, &[], body, Duration::from_secs(5)).await?;
    match answer.code() {
        tonic::Code::Ok => Ok(()),
        code => Err(format!("{code:?}: {}", answer.message)),
    }
}

/// A steady caller's one call: a small `/embed` over HTTP/1.1, on a connection of its own.
pub async fn http_embed(http: SocketAddr) -> Result<(), String> {
    let request = super::client::http_request("POST", "/embed", &[], br#"{"inputs": "a steady caller's query"}"#);
    let answer = super::client::http_call(http, &request).await?;
    match answer.status {
        200 => Ok(()),
        status => Err(format!("{status}: {}", String::from_utf8_lossy(&answer.body))),
    }
}
