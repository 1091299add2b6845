//! Hostile clients on every port the multiplexer opens: idle connections past the cap, request
//! heads and bodies sent too slowly or too large, HTTP/2 header lists over the limit and reset
//! floods. Each bound holds, the client is answered in its protocol's own shape where one is
//! possible, other callers keep being served meanwhile, and refusals the multiplexer makes itself
//! are counted in `teifleet_refused_input_total`. (What hyper refuses inside a connection, a 431,
//! a head cut off at the header timeout, a reset flood's GOAWAY, is not counted.)

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use teifleet_multiplexer::run::server::{InputBounds, Running, Settings};
use teifleet_runtime::http_server::ServerBounds;
use teifleet_tei_sim::SimHandle;
use teifleet_testkit::poll::eventually;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tonic::transport::Channel;

use crate::http_front::{post, request};
use crate::support::*;

const MAX_CONNECTIONS: usize = 8;
const HEADER_TIMEOUT: Duration = Duration::from_millis(300);
const BODY_TIMEOUT: Duration = Duration::from_millis(500);
/// hyper's floor for its HTTP/1.1 read buffer, so the HTTP/2 and HTTP/1.1 limits are the same.
const MAX_HEADER_BYTES: usize = 8192;
/// Well over the HTTP front's 100 headers (`InputBounds::http_server`).
const TOO_MANY_HEADERS: usize = 200;
/// Streams per HTTP/2 connection; also the number of resets pending accept hyper tolerates.
const MAX_STREAMS: u32 = 16;
/// How long a bound may take to act before the test calls it not enforced: generous, for a loaded
/// machine. No test asserts anything quicker.
const SLACK: Duration = Duration::from_secs(5);
/// What every HTTP/2 connection starts with; half of it is a client that never shows its protocol.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn bounds() -> InputBounds {
    InputBounds {
        max_connections: MAX_CONNECTIONS,
        header_read_timeout: HEADER_TIMEOUT,
        body_timeout: BODY_TIMEOUT,
        max_header_bytes: MAX_HEADER_BYTES,
    }
}

/// Idle connections are cut off at the header timeout (tested below): these bounds keep them
/// open while a test fills the cap with them.
fn holding_idle_connections() -> InputBounds {
    InputBounds { header_read_timeout: Duration::from_secs(60), ..bounds() }
}

/// A multiplexer with gRPC, the HTTP front and the admin port on loopback, within `bounds`.
async fn hostile_front(sim: &SimHandle, bounds: InputBounds) -> Running {
    let loopback = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    let settings = Settings {
        http_listen: loopback,
        admin_listen: loopback,
        max_concurrent_streams: MAX_STREAMS,
        bounds,
        ..Settings::default()
    };
    mux_with(vec![spec("pool-a", sim.addr(), limits(16, 64))], settings).await.0
}

async fn within<T>(what: &str, limit: Duration, work: impl Future<Output = T>) -> T {
    timeout(limit, work).await.unwrap_or_else(|_| panic!("{what}: not within {limit:?}"))
}

/// A well-behaved caller of the HTTP front, on a connection of its own, is answered.
async fn http_served(http: SocketAddr) {
    let answer = within("a bystander's POST /embed", SLACK, post(http, "/embed", json!({"inputs": "bystander"}))).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}

/// A well-behaved gRPC caller, on a connection of its own, is answered.
async fn grpc_served(grpc: SocketAddr) {
    let call = async { embed_client(grpc).await.embed(embed_request("bystander")).await };
    within("a bystander's gRPC Embed", SLACK, call).await.expect("served");
}

async fn connect(addr: SocketAddr) -> TcpStream {
    within("a TCP connect", SLACK, TcpStream::connect(addr)).await.expect("connects")
}

/// Reads what the server sends until it closes the connection (end of stream or reset).
async fn until_closed(what: &str, stream: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut received = Vec::new();
    let read = async {
        let mut buffer = [0; 4096];
        while let Ok(n @ 1..) = stream.read(&mut buffer).await {
            received.extend_from_slice(&buffer[..n]);
        }
    };
    let closed = timeout(limit, read).await;
    assert!(closed.is_ok(), "{what}: still open after {limit:?}, having sent {:?}", String::from_utf8_lossy(&received));
    received
}

/// Reads one HTTP/1.1 answer (a head and a `content-length` body) off a connection left open.
async fn read_answer(stream: &mut TcpStream) -> (u16, Value) {
    let mut raw = Vec::new();
    let mut buffer = [0; 4096];
    let mut fill = async |raw: &mut Vec<u8>| {
        let n = stream.read(&mut buffer).await.expect("reads");
        assert!(n > 0, "closed before a whole answer: {:?}", String::from_utf8_lossy(raw));
        raw.extend_from_slice(&buffer[..n]);
    };
    let body_at = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        fill(&mut raw).await;
    };
    let head = String::from_utf8_lossy(&raw[..body_at]).to_lowercase();
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status line");
    let length: usize =
        head.lines().find_map(|line| line.strip_prefix("content-length:")).map_or(0, |n| n.trim().parse().unwrap());
    while raw.len() < body_at + length {
        fill(&mut raw).await;
    }
    (status, serde_json::from_slice(&raw[body_at..body_at + length]).unwrap_or(Value::Null))
}

/// `POST /embed` on a connection kept alive, answered 200.
async fn embed_keeping_alive(stream: &mut TcpStream) {
    let body = json!({"inputs": "kept alive"}).to_string();
    let head = format!(
        "POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    let (status, body) = within("an answer on a kept-alive connection", SLACK, read_answer(stream)).await;
    assert_eq!(status, 200, "{body}");
}

/// Opens `n` connections that send nothing.
async fn idle(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        idle.push(connect(addr).await);
    }
    idle
}

/// One connection past the cap: accepted by the kernel, then closed by the server at once, with
/// nothing said (no protocol has spoken yet).
async fn turned_away(addr: SocketAddr) {
    let mut extra = connect(addr).await;
    let received = until_closed("a connection past the cap", &mut extra, SLACK).await;
    assert!(received.is_empty(), "{:?}", String::from_utf8_lossy(&received));
}

#[tokio::test]
async fn idle_connections_past_the_cap_on_the_http_port_are_closed_at_once() {
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, holding_idle_connections()).await;
    let http = mux.http_addr.unwrap();

    let mut kept = connect(http).await;
    embed_keeping_alive(&mut kept).await;
    let flood = idle(http, MAX_CONNECTIONS - 1).await;
    turned_away(http).await;
    assert_eq!(refused(&mux, "http", "connection_limit"), 1.0);

    // A caller already connected, and the gRPC port, keep serving.
    embed_keeping_alive(&mut kept).await;
    grpc_served(mux.grpc_addr).await;

    drop(flood);
    let body = json!({"inputs": "after the flood"}).to_string();
    let served = || async {
        let answer = teifleet_testkit::http::send(http, "POST", "/embed", &[], &body).await;
        answer.filter(|answer| answer.status == 200)
    };
    eventually("a new connection served once the idle ones closed", SLACK, served).await;
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn idle_connections_past_the_cap_on_the_grpc_port_are_closed_at_once() {
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, holding_idle_connections()).await;
    let grpc = mux.grpc_addr;

    let mut connected = embed_client(grpc).await;
    connected.embed(embed_request("before")).await.expect("served");
    let flood = idle(grpc, MAX_CONNECTIONS - 1).await;
    turned_away(grpc).await;
    assert_eq!(refused(&mux, "grpc", "connection_limit"), 1.0);

    // A caller already connected, and the HTTP front, keep serving.
    let call = connected.embed(embed_request("during"));
    within("a connected caller's Embed", SLACK, call).await.expect("served");
    http_served(mux.http_addr.unwrap()).await;

    drop(flood);
    let served = || async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).ok()?.connect().await.ok()?;
        let mut client = teifleet_proto::v1::embed_client::EmbedClient::new(channel);
        client.embed(embed_request("after")).await.ok()
    };
    eventually("a new connection served once the idle ones closed", SLACK, served).await;
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

/// The admin port's caps are `ServerBounds::ADMIN`'s, not flags: one address's share of it is
/// cheap to fill on loopback, and its 10 s header timeout leaves the connections open for the
/// whole test. (The whole port, filled from eight addresses, is `hostile_connections`'.)
#[tokio::test]
async fn idle_connections_past_one_clients_share_of_the_admin_port_are_closed_at_once() {
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, bounds()).await;
    let admin = mux.admin_addr.unwrap();

    let flood = idle(admin, ServerBounds::ADMIN.max_connections_per_peer).await;
    turned_away(admin).await;
    assert_eq!(refused(&mux, "admin", "peer_connection_limit"), 1.0);
    http_served(mux.http_addr.unwrap()).await;
    grpc_served(mux.grpc_addr).await;

    drop(flood);
    let scraped = || teifleet_testkit::http::get(admin, "/metrics");
    let text = eventually("/metrics served once the idle connections closed", SLACK, scraped).await;
    assert!(metric_sum(&text, "teifleet_refused_input_total", &[("port", "admin")]) >= 1.0, "{text}");
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_request_head_sent_too_slowly_is_cut_off_at_the_header_timeout() {
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, bounds()).await;
    let http = mux.http_addr.unwrap();

    let started = Instant::now();
    let mut slowloris = connect(http).await;
    slowloris.write_all(b"POST /embed HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    // Nothing at all, and the start of HTTP/2's preface: still undecided between the protocols.
    let mut silent = connect(http).await;
    let mut half_preface = connect(http).await;
    half_preface.write_all(&HTTP2_PREFACE[..16]).await.unwrap();
    // The gRPC port speaks HTTP/2 only: its connections must send the preface in the same time.
    let mut grpc_silent = connect(mux.grpc_addr).await;
    let mut grpc_half_preface = connect(mux.grpc_addr).await;
    grpc_half_preface.write_all(&HTTP2_PREFACE[..16]).await.unwrap();
    http_served(http).await;
    grpc_served(mux.grpc_addr).await;

    for (what, stream) in
        [("half a head", &mut slowloris), ("nothing", &mut silent), ("half a preface", &mut half_preface)]
    {
        // Closed without an answer (hyper sends no 408): the client has not finished asking.
        let received = until_closed(what, stream, HEADER_TIMEOUT + SLACK).await;
        assert!(received.is_empty(), "{what}: {:?}", String::from_utf8_lossy(&received));
        assert!(started.elapsed() >= HEADER_TIMEOUT, "{what}: closed by the timeout, not before it");
    }
    for (what, stream) in [("nothing on gRPC", &mut grpc_silent), ("half a preface on gRPC", &mut grpc_half_preface)] {
        // What arrives first is the server's own SETTINGS, sent before it reads the preface.
        until_closed(what, stream, HEADER_TIMEOUT + SLACK).await;
        assert!(started.elapsed() >= HEADER_TIMEOUT, "{what}: closed by the timeout, not before it");
    }
    // Those that never showed a protocol are counted; half an HTTP/1.1 head is hyper's to close.
    assert_eq!(refused(&mux, "http", "no_protocol"), 2.0);
    assert_eq!(refused(&mux, "grpc", "no_protocol"), 2.0);
    http_served(http).await;
    grpc_served(mux.grpc_addr).await;
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_at_the_header_timeout() {
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, bounds()).await;
    let http = mux.http_addr.unwrap();

    let mut kept = connect(http).await;
    embed_keeping_alive(&mut kept).await;
    embed_keeping_alive(&mut kept).await;
    http_served(http).await;
    let received = until_closed("an idle kept-alive connection", &mut kept, HEADER_TIMEOUT + SLACK).await;
    assert!(received.is_empty(), "{:?}", String::from_utf8_lossy(&received));
    http_served(http).await;
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_body_that_stalls_or_trickles_is_answered_408_at_the_body_deadline() {
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, bounds()).await;
    let http = mux.http_addr.unwrap();
    let head = "POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n";

    let started = Instant::now();
    let mut stalled = connect(http).await;
    stalled.write_all(format!("{head}{{\"inputs\": \"").as_bytes()).await.unwrap();
    // A byte every 100 ms: each arrives well within any per-read timeout, the whole never does.
    let mut trickled = connect(http).await;
    trickled.write_all(head.as_bytes()).await.unwrap();
    let (mut reader, mut writer) = trickled.into_split();
    let trickle = tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(100));
        while writer.write_all(b" ").await.is_ok() {
            interval.tick().await;
        }
    });
    http_served(http).await;
    grpc_served(mux.grpc_addr).await;

    let (status, body) = within("the stalled body's answer", BODY_TIMEOUT + SLACK, read_answer(&mut stalled)).await;
    assert_eq!(status, 408, "{body}");
    assert_eq!(body, json!({"error": "the request body did not arrive in time", "error_type": "Validation"}));
    let trickled = async {
        let mut raw = Vec::new();
        let mut buffer = [0; 4096];
        while !raw.ends_with(b"}") {
            let n = reader.read(&mut buffer).await.expect("reads");
            assert!(n > 0, "closed before an answer: {:?}", String::from_utf8_lossy(&raw));
            raw.extend_from_slice(&buffer[..n]);
        }
        String::from_utf8(raw).unwrap()
    };
    let answer = within("the trickled body's answer", BODY_TIMEOUT + SLACK, trickled).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(started.elapsed() >= BODY_TIMEOUT);
    trickle.abort();

    assert_eq!(refused(&mux, "http", "body_timeout"), 2.0);
    assert_eq!(sim.stats().requests_received, 2, "only the bystanders reached TEI");
    http_served(http).await;
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_head_too_large_or_with_too_many_headers_is_431() {
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, bounds()).await;
    let http = mux.http_addr.unwrap();
    let body = json!({"inputs": "a"}).to_string();

    let big = "x".repeat(MAX_HEADER_BYTES + 1);
    let answer =
        within("a huge header's answer", SLACK, request(http, "POST", "/embed", &[("x-big", &big)], body.as_bytes()))
            .await;
    assert_eq!(answer.status, 431, "{}", answer.body);
    let names: Vec<String> = (0..TOO_MANY_HEADERS).map(|i| format!("x-header-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|name| (name.as_str(), "1")).collect();
    let answer = within("many headers' answer", SLACK, request(http, "POST", "/embed", &many, body.as_bytes())).await;
    assert_eq!(answer.status, 431, "{}", answer.body);
    http_served(http).await;

    // The admin port's own bounds (testkit's HTTP/1.0 request adds two headers of its own).
    let admin = mux.admin_addr.unwrap();
    let names: Vec<String> = (0..ServerBounds::ADMIN.max_headers).map(|i| format!("x-header-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|name| (name.as_str(), "1")).collect();
    let answer = teifleet_testkit::http::send(admin, "GET", "/metrics", &many, "").await.expect("an answer");
    assert_eq!(answer.status, 431);
    let big = "x".repeat(ServerBounds::ADMIN.max_header_bytes + 1);
    let answer =
        teifleet_testkit::http::send(admin, "GET", "/metrics", &[("x-big", &big)], "").await.expect("an answer");
    assert_eq!(answer.status, 431);
    assert!(teifleet_testkit::http::get(admin, "/metrics").await.is_some(), "the admin port stays up");
    assert_eq!(sim.stats().requests_received, 1, "only the bystander reached TEI");
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

/// An HTTP/2 request on `channel` (h2c, prior knowledge: tonic's transport is the HTTP/2 client
/// the workspace has); the status and the body.
async fn h2_request(channel: &Channel, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    let mut request = http::Request::post(format!("http://x{path}")).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(tonic::body::Body::new(http_body_util::Full::new(Bytes::from(body.to_owned()))));
    let mut channel = channel.clone();
    let exchange = async move {
        std::future::poll_fn(|cx| tower::Service::poll_ready(&mut channel, cx)).await.expect("ready");
        let response = tower::Service::call(&mut channel, request.unwrap()).await.expect("an answer");
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map(|body| body.to_bytes()).unwrap_or_default();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    };
    within("an HTTP/2 exchange", SLACK, exchange).await
}

#[tokio::test]
async fn an_http2_header_list_over_the_limit_is_431() {
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, bounds()).await;
    let h2 = channel(mux.http_addr.unwrap()).await;
    let body = json!({"inputs": "over HTTP/2"}).to_string();

    let (status, answer) = h2_request(&h2, "/embed", &[], &body).await;
    assert_eq!(status, 200, "{answer}");
    let big = "x".repeat(MAX_HEADER_BYTES);
    let (status, _) = h2_request(&h2, "/embed", &[("x-big", &big)], &body).await;
    assert_eq!(status, 431);
    // The refusal is the stream's, not the connection's: the same connection keeps serving.
    let (status, answer) = h2_request(&h2, "/embed", &[], &body).await;
    assert_eq!(status, 200, "{answer}");
    http_served(mux.http_addr.unwrap()).await;
    assert_eq!(sim.stats().requests_received, 3);
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

/// CVE-2023-44487: streams opened and reset at once, faster than the server can accept them, on
/// the gRPC and the HTTP port. The flooding connection gets GOAWAY; other callers are served;
/// no reset stream reaches TEI and nothing is left in flight or queued.
#[tokio::test]
async fn an_http2_rapid_reset_flood_gets_goaway_and_costs_other_callers_nothing() {
    use frames::*;
    let sim = sim(|_| {}).await;
    let mux = hostile_front(&sim, bounds()).await;
    let (grpc, http) = (mux.grpc_addr, mux.http_addr.unwrap());
    let grpc_request = [("content-type", "application/grpc"), ("te", "trailers")];
    let http_request = [("content-type", "application/json")];
    for (port, path, headers) in [(grpc, "/tei.v1.Embed/Embed", &grpc_request[..]), (http, "/embed", &http_request[..])]
    {
        let mut flood = connect(port).await;
        let mut fields = vec![(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x")];
        fields.extend_from_slice(headers);
        let request = header_block(&fields);
        let mut burst = [HTTP2_PREFACE, &frame(SETTINGS, 0, 0, &[])].concat();
        for stream in (1..).step_by(2).take(100 * MAX_STREAMS as usize) {
            burst.extend(frame(HEADERS, END_HEADERS, stream, &request));
            burst.extend(frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes()));
        }
        flood.write_all(&burst).await.unwrap();
        grpc_served(grpc).await;
        http_served(http).await;

        // hyper tolerates as many resets pending accept as streams, then sends GOAWAY and closes.
        let received = until_closed(path, &mut flood, SLACK).await;
        let goaway = parse(&received).into_iter().find(|(kind, ..)| *kind == GOAWAY).expect("a GOAWAY");
        let reason = u32::from_be_bytes(goaway.2[4..8].try_into().unwrap());
        assert_eq!(reason, ENHANCE_YOUR_CALM, "{path}: {goaway:?}");
    }
    grpc_served(grpc).await;
    assert_eq!(sim.stats().requests_received, 5, "only the bystanders reached TEI");
    until("no permit held and nothing queued", SLACK, || {
        let text = metrics_text(&mux);
        metric_sum(&text, "teifleet_in_flight", &[]) == 0.0 && metric_sum(&text, "teifleet_queued", &[]) == 0.0
    })
    .await;
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

/// HTTP/2 frames written by hand, for what no client library sends on purpose: a client library
/// paces its streams to what the server accepts, which is exactly what an attacker does not.
mod frames {
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const GOAWAY: u8 = 0x7;
    pub const END_HEADERS: u8 = 0x4;
    pub const CANCEL: u32 = 0x8;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;

    /// One frame: 24-bit length, type, flags, stream id, payload.
    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut frame = vec![length[1], length[2], length[3], kind, flags];
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    /// HPACK literal fields without indexing, new names, no Huffman coding (short strings only).
    pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in fields {
            block.push(0);
            for text in [name, value] {
                block.push(u8::try_from(text.len()).expect("under 127 bytes"));
                block.extend_from_slice(text.as_bytes());
            }
        }
        block
    }

    /// The frames in what the server sent: (type, stream, payload).
    pub fn parse(mut raw: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
        let mut frames = Vec::new();
        while raw.len() >= 9 {
            let length = u32::from_be_bytes([0, raw[0], raw[1], raw[2]]) as usize;
            if raw.len() < 9 + length {
                break;
            }
            let stream = u32::from_be_bytes([raw[5], raw[6], raw[7], raw[8]]) & 0x7fff_ffff;
            frames.push((raw[3], stream, raw[9..9 + length].to_vec()));
            raw = &raw[9 + length..];
        }
        frames
    }
}
