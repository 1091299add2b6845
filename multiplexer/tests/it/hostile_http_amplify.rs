//! Issue 43's attacks on the HTTP front, each against the multiplexer binary in front of the TEI
//! simulator on loopback (as `attacks.rs`): one field copied into every upstream message, answers
//! a client never reads, and an answer estimate steered by what callers sent before. The sidecar
//! stays alive under a peak resident memory (VmHWM) far below its 256Mi, a steady gRPC caller
//! beside the attacker keeps its p99 under a second and at least 90% of its calls, and the
//! attacker is refused clearly (413, or 429 with `retry-after`). Each prints its figures for the
//! issue's note.

use std::net::SocketAddr;
use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};
use teifleet_tei_sim::SimHandle;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::http_front::{Answer, post};
use crate::support::attacker::{Sidecar, Steady, beside_a_steady_caller};
use crate::support::sim;

/// What one request may add to the sidecar's peak beyond a small multiple of its body: the
/// messages of two chunks of at most 1 MiB in flight (`front::http::upstream`), and the
/// allocator's slack.
const GROWTH_FLOOR_KIB: u64 = 8 * 1024;
/// The multiple of a request's body its messages may hold at once beyond that floor.
const GROWTH_PER_BODY: u64 = 4;

/// The binary in front of `sim`, with the sidecar's memory limit (a 128 MiB budget), and its HTTP
/// port.
fn start(sim: &SimHandle) -> (Sidecar, SocketAddr) {
    let sidecar = Sidecar::start(sim, &["--max-in-flight", "32"]);
    let http = sidecar.http();
    (sidecar, http)
}

/// [`start`], then one `/embed` served: the pool's vector size is learned from its first answer.
async fn warmed(sim: &SimHandle) -> (Sidecar, SocketAddr) {
    let (sidecar, http) = start(sim);
    let warm = post(http, "/embed", json!({"inputs": "warm up"})).await;
    assert_eq!(warm.status, 200, "{}", warm.body);
    (sidecar, http)
}

fn check(sidecar: &mut Sidecar, attack: &str, steady: &Steady) {
    let peak = sidecar.peak_kib();
    let calls = steady.calls();
    eprintln!(
        "{attack}: peak RSS {} MB; steady caller p99 {:?}, {} of {calls} calls served",
        peak / 1000,
        steady.p99(),
        steady.took.len()
    );
    sidecar.held(attack, steady, steady.mostly_served(), steady.p99());
}

/// Served, or refused as too large (413) or for memory (429 with a retry hint); never a failure
/// of the sidecar's own.
fn served_or_refused(what: &str, answer: &Answer) {
    match answer.status {
        200 | 413 => {}
        429 => assert!(answer.header("retry-after").is_some(), "{what}: 429 with a retry hint"),
        status => panic!("{what}: {status} {}", answer.body),
    }
}

/// A request that copies `field` (`bytes` of it) into each of `inputs` upstream messages.
fn amplifying(path: &str, bytes: usize, inputs: usize) -> Value {
    let texts = vec!["a"; inputs];
    let field = "p".repeat(bytes);
    match path {
        "/rerank" => json!({"query": field, "texts": texts}),
        _ => json!({"inputs": texts, "prompt_name": field}),
    }
}

/// Requests that copy a field into every upstream message: too many copies (refused with 413
/// before anything is built), and as many as a body may make (served).
const COPIES: [(&str, usize, usize, u16); 8] = [
    ("/embed", 56_000, 512, 413),
    ("/embed", 1_500, 2048, 200),
    ("/embed_sparse", 56_000, 512, 413),
    ("/embed_all", 56_000, 512, 413),
    ("/tokenize", 1_500, 2048, 200),
    ("/rerank", 270_000, 2048, 413),
    ("/rerank", 1_900_000, 2048, 413),
    ("/rerank", 8_000, 512, 200),
];

/// (1) `prompt_name` in every message of `/embed`, `/embed_sparse`, `/embed_all` and
/// `/tokenize`, `/rerank`'s query in every slice: each request first sent with a short field
/// (what the route costs anyway: its answer, its inputs), then with a long one; the peak may grow
/// by no more than a small multiple of the body. Then a dozen at once beside a steady caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_copied_into_every_input_costs_at_most_a_small_multiple_of_the_body() {
    let _attack = crate::support::attack_lock();
    let sim = sim(|_| {}).await;
    let (mut sidecar, http) = warmed(&sim).await;
    for (path, bytes, inputs, status) in COPIES {
        let reference = post(http, path, amplifying(path, 8, inputs)).await;
        served_or_refused(path, &reference);
        let before = sidecar.peak_kib();
        let attack = amplifying(path, bytes, inputs);
        let body = attack.to_string().len() as u64;
        let answer = post(http, path, attack).await;
        let grown = sidecar.peak_kib().saturating_sub(before);
        eprintln!(
            "{path}: {bytes} bytes copied into {inputs} inputs, {} KB body: {}, peak +{grown} KiB",
            body / 1000,
            answer.status
        );
        assert_eq!(answer.status, status, "{path}: {}", answer.body);
        if status == 413 {
            let message = answer.body["error"].as_str().unwrap_or_default();
            assert!(message.contains("copied into every input") || message.contains("answer would be"), "{message}");
        }
        assert!(grown <= GROWTH_PER_BODY * body / 1024 + GROWTH_FLOOR_KIB, "{path}: +{grown} KiB for {body} bytes");
    }
    let attack = async {
        let requests = (0..12).map(|i| {
            let (path, bytes, inputs, _) = COPIES[[0, 6, 1, 7][i % 4]];
            post(http, path, amplifying(path, bytes, inputs))
        });
        join_all(requests).await
    };
    let (answers, steady) = beside_a_steady_caller(sidecar.grpc, attack).await;
    let statuses: Vec<u16> = answers.iter().map(|answer| answer.status).collect();
    answers.iter().for_each(|answer| served_or_refused("12 at once", answer));
    eprintln!("12 amplifying requests at once: {statuses:?}");
    check(&mut sidecar, "fields copied into every input", &steady);
    sim.shutdown().await;
}

/// `count` `/embed_all` requests, one after another, each on a connection that never reads its
/// answer (a receive buffer of 4 KiB) and each about 13 MB of JSON: the status of each whose head
/// came back, and the connections, kept open.
async fn unread_answers(http: SocketAddr, count: usize) -> (Vec<u16>, Vec<tokio::net::TcpStream>) {
    // 30 texts of 100 one-letter words: about 3,000 tokens of 384 numbers, within 32 MiB as
    // estimated (at most a token per byte).
    let text = vec!["w"; 100].join(" ");
    let body = json!({ "inputs": vec![text; 30] }).to_string();
    let request = format!(
        "POST /embed_all HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (mut statuses, mut held) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(http).await.expect("connects");
        stream.write_all(request.as_bytes()).await.unwrap();
        // The head only: the rest of a 200 is left in the sidecar.
        let mut head = [0; 512];
        let status = match tokio::time::timeout(Duration::from_secs(15), stream.read(&mut head)).await {
            Ok(Ok(n)) => String::from_utf8_lossy(&head[..n]).split(' ').nth(1).and_then(|s| s.parse().ok()),
            _ => None,
        };
        statuses.push(status.unwrap_or(0));
        held.push(stream);
    }
    (statuses, held)
}

/// (2) 32 HTTP/1.1 clients, one after another, send `/embed_all` and never read the answer: each
/// answer stays charged until the socket has taken its last slice, so those past the budget are
/// refused with 429 instead of being built beside the ones nobody reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_reads_stay_charged_until_the_socket_takes_them() {
    let _attack = crate::support::attack_lock();
    let sim = sim(|_| {}).await;
    let (mut sidecar, http) = warmed(&sim).await;
    let ((statuses, held), steady) = beside_a_steady_caller(sidecar.grpc, unread_answers(http, 32)).await;
    let served = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    eprintln!("32 unread /embed_all answers: {served} sent and held, {refused} refused: {statuses:?}");
    assert!(statuses.iter().all(|s| matches!(s, 200 | 429 | 0)), "{statuses:?}");
    assert!(refused > 0, "answers past the budget are refused");
    check(&mut sidecar, "32 /embed_all answers never read", &steady);
    drop(held);
    sim.shutdown().await;
}

/// (3) 150 calls of one long word teach the pool's estimate that a token is many characters;
/// then an `/embed_all` of 512 texts of 160 short words (164 KB, hundreds of megabytes as an
/// answer, 33 MB as the steered estimate had it) is refused before any of it is sent upstream:
/// the answer's bound counts a token per byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_bound_no_caller_can_steer() {
    let _attack = crate::support::attack_lock();
    let sim = sim(|_| {}).await;
    let (mut sidecar, http) = start(&sim);
    let word = "x".repeat(4000);
    for _ in 0..150 {
        let answer = post(http, "/embed", json!({ "inputs": word })).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let before = sidecar.peak_kib();
    let texts = vec![vec!["w"; 160].join(" "); 512];
    let attack = async { post(http, "/embed_all", json!({ "inputs": texts })).await };
    let (answer, steady) = beside_a_steady_caller(sidecar.grpc, attack).await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("answer would be")), "{}", answer.body);
    let grown = sidecar.peak_kib().saturating_sub(before);
    eprintln!("steered estimate: 164 KB /embed_all refused with 413, peak +{grown} KiB");
    assert!(grown < GROWTH_FLOOR_KIB, "refused before any work: +{grown} KiB");
    let small = post(http, "/embed_all", json!({ "inputs": ["a short text", "another"] })).await;
    assert_eq!(small.status, 200, "a small answer is still served: {}", small.body);
    check(&mut sidecar, "a steered answer estimate", &steady);
    sim.shutdown().await;
}
