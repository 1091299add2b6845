//! The attacks of issue 31 ("The trust boundary"), each against the multiplexer binary in front
//! of the TEI simulator on loopback: the process stays alive under a peak resident memory (VmHWM)
//! far below the sidecar's 256Mi, a steady caller beside the attacker keeps its p99 under a
//! second, and the attacker is refused clearly (413, or RESOURCE_EXHAUSTED / 429 with a retry
//! hint). Each prints its peak for the note.

use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use prost::Message as _;
use teifleet_proto::v1::{self, embed_client::EmbedClient, tokenize_client::TokenizeClient};
use teifleet_wire::headers::RETRY_PUSHBACK_MS;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::Code;

use crate::support::attacker::{Sidecar, Steady, beside_a_steady_caller, open_call};
use crate::support::{channel, embed_request, sim};

/// How long this test's client takes to send a flood of thousands of calls (see `check`).
const FLOOD_ARRIVAL: Duration = Duration::from_secs(2);

/// The checks every attack ends with; prints the peak for the note. The steady caller's p99
/// counts its calls from `settled` after the attack began: a flood of thousands of calls is
/// sent by this test's own debug-built client on the same two cores, and while it is being
/// sent the machine, not the sidecar, is what the steady caller waits for.
fn check(sidecar: &mut Sidecar, attack: &str, steady: &Steady, settled: Duration) {
    let peak = sidecar.peak_kib();
    let from = (!settled.is_zero()).then(|| steady.began + settled);
    let (all, p99) = (steady.p99(), steady.p99_since(from));
    let calls = steady.took.len();
    eprintln!(
        "{attack}: peak RSS {} MB, steady caller p99 {p99:?} ({all:?} counting the flood's arrival) over {calls} calls",
        peak / 1000
    );
    sidecar.held(attack, steady, calls >= 5 && steady.failed == 0, p99);
}

fn long_texts(inputs: usize) -> Vec<String> {
    // About 900 bytes each, as the request (2,048 of them fit the payload limit).
    (0..inputs).map(|i| format!("{i} {}", "lorem ipsum dolor sit amet ".repeat(33))).collect()
}

/// (a) `/embed_all` of 256 and of 2,048 long inputs: each answer would be hundreds of megabytes.
#[tokio::test]
async fn embed_all_of_many_long_inputs_is_refused_before_it_is_built() {
    let _attack = crate::support::attack_lock();
    let sim = sim(|_| {}).await;
    let mut sidecar = Sidecar::start(&sim, &["--max-in-flight", "32"]);
    let http = sidecar.http();
    let attack = async {
        let requests = [256, 2048, 256, 2048].map(|inputs| {
            crate::http_front::post(http, "/embed_all", serde_json::json!({ "inputs": long_texts(inputs) }))
        });
        join_all(requests).await
    };
    let (answers, steady) = beside_a_steady_caller(sidecar.grpc, attack).await;
    for answer in answers {
        assert_eq!(answer.status, 413, "{}", answer.body);
        assert_eq!(answer.body["error_type"], "Validation");
        assert!(answer.body["error"].as_str().unwrap().contains("answer would be"), "{}", answer.body);
    }
    let small = crate::http_front::post(http, "/embed_all", serde_json::json!({ "inputs": ["a short text"] })).await;
    assert_eq!(small.status, 200, "a small answer is served: {}", small.body);
    check(&mut sidecar, "embed_all of 256 and 2048 long inputs", &steady, Duration::ZERO);
    sim.shutdown().await;
}

/// A gRPC Embed of about `bytes` of text, framed, all but its last `short` bytes.
fn unfinished_message(bytes: usize, short: usize) -> Bytes {
    let message = v1::EmbedRequest { inputs: "a".repeat(bytes), ..Default::default() }.encode_to_vec();
    let framed = teifleet_multiplexer::vocab::framing::framed(&message);
    framed.slice(..framed.len() - short)
}

/// (b) 96 HTTP/2 streams on one connection, each sending a 1.9 MB message it never finishes (the
/// pool counts tokens, so each body is read before its call is admitted).
#[tokio::test]
async fn unfinished_grpc_bodies_on_one_connection_are_bounded_by_the_budget() {
    let _attack = crate::support::attack_lock();
    let sim = sim(|_| {}).await;
    let mut sidecar =
        Sidecar::start(&sim, &["--max-in-flight", "64", "--max-queued", "128", "--max-in-flight-tokens", "10000000"]);
    let grpc = sidecar.grpc;
    let attack = async {
        let tcp = tokio::net::TcpStream::connect(grpc).await.unwrap();
        let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let body = unfinished_message(1_900_000, 1000);
        let mut answers = Vec::new();
        let mut bodies = Vec::new();
        for _ in 0..96 {
            let (ready, answer, send) = open_call(client, grpc, "/tei.v1.Embed/Embed", body.clone(), false).await;
            client = ready;
            answers.push(answer);
            bodies.push(send);
        }
        // The bodies arrive as fast as the sidecar reads them; those past the budget are refused.
        let refused = refusals(answers).await;
        (refused, bodies)
    };
    let ((refused, bodies), steady) = beside_a_steady_caller(grpc, attack).await;
    assert!(refused > 0, "the bodies past the budget are refused");
    let charged = sidecar.metric("teifleet_memory_charged_bytes", &[("use", "request_bodies")]).await;
    eprintln!("unfinished gRPC bodies: {refused} of 96 refused, {} MB charged", charged as u64 / 1_000_000);
    check(&mut sidecar, "96 unfinished 1.9 MB gRPC bodies on one h2c connection", &steady, Duration::ZERO);
    drop(bodies);
    sim.shutdown().await;
}

/// The refusals among `answers` (each RESOURCE_EXHAUSTED with a retry hint), waiting 8 s for
/// them: the answers not in by then are bodies still being held.
async fn refusals(answers: Vec<h2::client::ResponseFuture>) -> usize {
    let mut refused = 0;
    let waiting = join_all(answers.into_iter().map(|answer| tokio::time::timeout(Duration::from_secs(8), answer)));
    for answer in waiting.await {
        let Ok(answer) = answer else { continue };
        let answer = answer.expect("an answer, not a broken stream");
        let headers = answer.headers();
        assert_eq!(headers["grpc-status"], "8", "RESOURCE_EXHAUSTED: {headers:?}");
        assert!(headers.contains_key(RETRY_PUSHBACK_MS), "with a retry hint: {headers:?}");
        refused += 1;
    }
    refused
}

/// (c) 96 HTTP/1.1 connections, each sending a 1.9 MB body it never finishes.
#[tokio::test]
async fn unfinished_http_bodies_on_many_connections_are_bounded_by_the_budget() {
    let _attack = crate::support::attack_lock();
    let sim = sim(|_| {}).await;
    let mut sidecar = Sidecar::start(&sim, &["--max-in-flight", "32"]);
    let http = sidecar.http();
    let attack = async {
        let body = Bytes::from(vec![b' '; 1_899_000]);
        let connections = (0..96).map(|_| {
            let body = body.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(http).await.unwrap();
                let (mut read, mut write) = tcp.into_split();
                let head = "POST /embed HTTP/1.1\r\nhost: pool\r\ncontent-type: application/json\r\ncontent-length: 1900000\r\n\r\n";
                write.write_all(head.as_bytes()).await.unwrap();
                let writing = tokio::spawn(async move {
                    let _ = write.write_all(&body).await;
                    write
                });
                let mut answer = vec![0; 4096];
                let read = tokio::time::timeout(Duration::from_secs(8), read.read(&mut answer)).await;
                let answer = match read {
                    Ok(Ok(n)) => String::from_utf8_lossy(&answer[..n]).into_owned(),
                    _ => String::new(),
                };
                (answer, writing)
            }
        });
        join_all(connections).await
    };
    let (answers, steady) = beside_a_steady_caller(sidecar.grpc, attack).await;
    let refused: Vec<&String> = answers.iter().map(|(answer, _)| answer).filter(|a| !a.is_empty()).collect();
    assert!(!refused.is_empty(), "the bodies past the budget are refused");
    for answer in &refused {
        assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
        assert!(answer.contains("retry-after: 1") && answer.contains("\"error_type\":\"Overloaded\""), "{answer}");
    }
    eprintln!("unfinished HTTP bodies: {} of 96 refused", refused.len());
    check(&mut sidecar, "96 unfinished 1.9 MB HTTP/1.1 bodies", &steady, Duration::ZERO);
    drop(answers);
    sim.shutdown().await;
}

/// (d) 10,000 calls without a deadline parked at the door of a slow pool.
#[tokio::test]
async fn ten_thousand_calls_at_the_door_are_capped_and_the_steady_caller_takes_its_turns() {
    let _attack = crate::support::attack_lock();
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(5)).await;
    let mut sidecar = Sidecar::start(&sim, &["--max-in-flight", "32", "--max-queued", "32"]);
    let grpc = sidecar.grpc;
    let attack = async {
        let mut calls = Vec::new();
        for _ in 0..40 {
            let client = EmbedClient::new(channel(grpc).await);
            calls.extend((0..250).map(|i| {
                let mut client = client.clone();
                tokio::spawn(async move { client.embed(embed_request(&format!("parked {i}"))).await })
            }));
        }
        join_all(calls).await
    };
    let (outcomes, steady) = beside_a_steady_caller(grpc, attack).await;
    let (mut served, mut refused) = (0, 0);
    for outcome in outcomes {
        match outcome.unwrap() {
            Ok(_) => served += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
                assert!(status.metadata().contains_key(RETRY_PUSHBACK_MS), "{status:?}");
                refused += 1;
            }
        }
    }
    eprintln!("10,000 calls at the door: {served} served, {refused} refused");
    assert!(refused > 0, "past the door's cap, refused at once");
    check(&mut sidecar, "10,000 calls parked at the door", &steady, FLOOD_ARRIVAL);
    sim.shutdown().await;
}

/// (e) A flood of Tokenize and Decode calls: admitted like the rest, they wait at the door and in
/// the queue, and another caller is not stalled behind them.
#[tokio::test]
async fn a_tokenize_and_decode_flood_waits_its_turn() {
    let _attack = crate::support::attack_lock();
    let sim = sim(|_| {}).await;
    let mut sidecar =
        Sidecar::start(&sim, &["--max-in-flight", "8", "--max-queued", "16", "--max-held-at-door", "1000"]);
    let grpc = sidecar.grpc;
    let attack = async {
        // Small enough that a connection's unread bodies stay within its HTTP/2 window.
        let text = "tokenize me please ".repeat(100);
        let mut calls = Vec::new();
        for connection in 0..20 {
            let client = TokenizeClient::new(channel(grpc).await);
            calls.extend((0..250).map(|i| {
                let (mut client, text) = (client.clone(), text.clone());
                tokio::spawn(async move {
                    if (connection + i) % 2 == 0 {
                        let request = v1::EncodeRequest { inputs: text, ..Default::default() };
                        client.tokenize(request).await.map(drop)
                    } else {
                        let request = v1::DecodeRequest { ids: (0..400).collect(), skip_special_tokens: false };
                        client.decode(request).await.map(drop)
                    }
                })
            }));
        }
        join_all(calls).await
    };
    let (outcomes, steady) = beside_a_steady_caller(grpc, attack).await;
    let (mut served, mut refused) = (0, 0);
    for outcome in outcomes {
        match outcome.unwrap() {
            Ok(()) => served += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
                refused += 1;
            }
        }
    }
    eprintln!("tokenize/decode flood: {served} served, {refused} refused");
    assert!(refused > 0, "past the door's cap, refused at once");
    assert!(sidecar.metric("teifleet_requests_total", &[("rpc", "Tokenize"), ("code", "Ok")]).await > 0.0);
    check(&mut sidecar, "a flood of 5,000 Tokenize and Decode calls", &steady, FLOOD_ARRIVAL);
    sim.shutdown().await;
}
