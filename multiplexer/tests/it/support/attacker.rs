//! The harness the attack tests share: the multiplexer binary in front of the TEI simulator on
//! loopback with the sidecar's memory limit, its peak resident memory (VmHWM), a steady caller
//! beside the attacker and its p99, and raw gRPC calls on an h2 connection.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_tei_sim::SimHandle;
use teifleet_testkit::process::ChildGuard;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::{channel, embed_request, metric_sum};

/// The bound on the sidecar's peak resident memory under each attack.
pub const PEAK_BOUND_KIB: u64 = 200 * 1000;
/// The bound on the steady caller's p99.
pub const STEADY_P99: Duration = Duration::from_secs(1);

/// How a test starts the binary: the sidecar's memory limit unless it says otherwise, an HTTP
/// port or not, and flags of its own.
pub struct Launch<'a> {
    pub memory_limit: &'a str,
    pub http: bool,
    pub extra: &'a [&'a str],
}

impl<'a> Launch<'a> {
    /// The sidecar's 256Mi, an HTTP port, and `extra`.
    pub fn with(extra: &'a [&'a str]) -> Self {
        Self { memory_limit: "256Mi", http: true, extra }
    }
}

/// The binary in front of a simulator.
pub struct Sidecar {
    pub guard: ChildGuard,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    http: Option<SocketAddr>,
    panicked: Arc<AtomicBool>,
}

impl Sidecar {
    /// The binary in front of `sim`, with the sidecar's memory limit, an HTTP port and `extra`.
    pub fn start(sim: &SimHandle, extra: &[&str]) -> Self {
        Self::launch(sim, Launch::with(extra))
    }

    pub fn launch(sim: &SimHandle, launch: Launch<'_>) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_teifleet-multiplexer"));
        command.args(["static", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"]);
        if launch.http {
            command.args(["--http-listen", "127.0.0.1:0"]);
        }
        command
            .args(["--memory-limit", launch.memory_limit, "--upstream", &format!("http://{}", sim.addr())])
            .args(launch.extra)
            .env("RUST_BACKTRACE", "1")
            .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn("teifleet-multiplexer", command).expect("the binary starts");
        let mut logs = BufReader::new(guard.child_mut().stderr.take().unwrap()).lines();
        let serving = logs.by_ref().map_while(Result::ok).find(|l| l.contains("multiplexer serving")).expect("serving");
        // Drained in the background, so the process never blocks on a full pipe; a panic (or the
        // backtrace a panic prints) is printed and remembered.
        let panicked = Arc::new(AtomicBool::new(false));
        let seen = panicked.clone();
        std::thread::spawn(move || {
            for line in logs.map_while(Result::ok) {
                if line.contains("panicked") || line.contains("stack backtrace") {
                    eprintln!("a panic in the sidecar: {line}");
                    seen.store(true, Ordering::Relaxed);
                }
            }
        });
        let line: serde_json::Value = serde_json::from_str(&serving).expect("JSON logs");
        let addr = |key: &str| line[key].as_str().and_then(|a| a.parse().ok()).expect("an address");
        let http = launch.http.then(|| addr("http_addr"));
        Self { grpc: addr("grpc_addr"), admin: addr("admin_addr"), http, guard, panicked }
    }

    /// The HTTP port's address.
    pub fn http(&self) -> SocketAddr {
        self.http.expect("started with an HTTP port")
    }

    /// VmHWM: the most the process has held resident.
    pub fn peak_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.guard.id())).expect("alive");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmHWM in kB")
    }

    pub fn alive(&mut self) -> bool {
        self.guard.child_mut().try_wait().unwrap().is_none()
    }

    /// Whether the sidecar's log showed a panic.
    pub fn panicked(&self) -> bool {
        self.panicked.load(Ordering::Relaxed)
    }

    /// The sum of a metric's series with `labels` on the admin port.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = teifleet_testkit::http::get(self.admin, "/metrics").await.unwrap_or_default();
        metric_sum(&text, name, labels)
    }

    /// The checks every attack ends with, after the test's own figures are printed: the sidecar
    /// is alive, its peak is under the bound, the steady caller was `served` as the test
    /// asks and its `p99` is under the bound.
    pub fn held(&mut self, attack: &str, steady: &Steady, served: bool, p99: Duration) {
        let peak = self.peak_kib();
        assert!(self.alive(), "{attack}: the sidecar died");
        assert!(peak < PEAK_BOUND_KIB, "{attack}: peak RSS {peak} KiB");
        assert!(served, "{attack}: the steady caller was not served: {steady:?}");
        assert!(p99 < STEADY_P99, "{attack}: the steady caller's p99 {p99:?}");
    }
}

/// A caller sending one small Embed at a time on a connection of its own while an attack runs.
#[derive(Debug)]
pub struct Steady {
    /// A moment after the caller connected: when the attack began.
    pub began: Instant,
    /// When each call started, and how long it took.
    pub took: Vec<(Instant, Duration)>,
    pub failed: usize,
}

impl Steady {
    /// Its calls, served or not.
    pub fn calls(&self) -> usize {
        self.took.len() + self.failed
    }

    /// At least five calls, nine in ten of them served.
    pub fn mostly_served(&self) -> bool {
        self.calls() >= 5 && self.failed * 10 <= self.calls()
    }

    /// How long each call started from `from` (all of them: `None`) took.
    pub fn took_since(&self, from: Option<Instant>) -> Vec<Duration> {
        let after = |started: &Instant| from.is_none_or(|from| *started >= from);
        self.took.iter().filter(|(at, _)| after(at)).map(|(_, took)| *took).collect()
    }

    /// The p99 of the calls started from `from` (all of them: `None`).
    pub fn p99_since(&self, from: Option<Instant>) -> Duration {
        let mut took = self.took_since(from);
        took.sort();
        took.get((took.len() * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or_default()
    }

    /// The p99 of all its calls.
    pub fn p99(&self) -> Duration {
        self.p99_since(None)
    }
}

/// Runs `attack` with a steady caller on `grpc` beside it, started a moment before.
pub async fn beside_a_steady_caller<T>(grpc: SocketAddr, attack: impl Future<Output = T>) -> (T, Steady) {
    beside_a_steady_caller_on(channel(grpc), Duration::from_millis(200), attack).await
}

/// Runs `attack` with a steady caller on the channel `connect` makes beside it, started a moment
/// before; the caller stops `after` the attack ended.
pub async fn beside_a_steady_caller_on<T>(
    connect: impl Future<Output = Channel> + Send + 'static,
    after: Duration,
    attack: impl Future<Output = T>,
) -> (T, Steady) {
    let (stop, stopped) = watch::channel(false);
    let steady = tokio::spawn(async move {
        let mut client = EmbedClient::new(connect.await);
        let mut steady = Steady { began: Instant::now() + Duration::from_millis(200), took: Vec::new(), failed: 0 };
        while !*stopped.borrow() {
            let started = Instant::now();
            match client.embed(embed_request("a steady caller's query")).await {
                Ok(_) => steady.took.push((started, started.elapsed())),
                Err(status) => {
                    eprintln!("steady caller: {status}");
                    steady.failed += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        steady
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let outcome = attack.await;
    tokio::time::sleep(after).await;
    stop.send(true).unwrap();
    (outcome, steady.await.unwrap())
}

/// A gRPC call to `path` on an h2 connection, sending `body` and ending the stream there if
/// `finished`: the connection (ready for the next call), the answer to come, and the stream's
/// sending half.
pub async fn open_call(
    client: h2::client::SendRequest<Bytes>,
    grpc: SocketAddr,
    path: &str,
    body: Bytes,
    finished: bool,
) -> (h2::client::SendRequest<Bytes>, h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!("http://{grpc}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut send) = client.send_request(request, false).unwrap();
    send.send_data(body, finished).unwrap();
    (client, answer, send)
}
