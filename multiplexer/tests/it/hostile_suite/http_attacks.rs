//! The attacks on every HTTP row (`table::HTTP`), as `grpc_attacks` does on the gRPC rows.

use bytes::Bytes;
use serde_json::json;

use super::bodies::{body, with_input};
use super::client::{HttpAnswer, h2_to, http_call, http_request, start_request};
use super::report::{Report, compressed_memory, memory};
use super::sidecar::{PEAK_BOUND_KIB, Sidecar};
use super::steady::{flood, http_embed};
use super::table::{Body, HTTP, HttpRow, Size};
use super::{quiet, sim};
use crate::support::sim as start_sim;

/// The HTTP port's largest body (`--payload-limit`'s default).
const PAYLOAD_LIMIT: usize = teifleet_multiplexer::front::http::DEFAULT_PAYLOAD_LIMIT;
const INFLATED: usize = 16 << 20;
const COMPRESSED_CALLS: usize = 8;
/// Connections that send a request and never read its answer.
const UNREAD_CONNECTIONS: usize = 32;

async fn setup() -> (teifleet_tei_sim::SimHandle, Sidecar) {
    let sim = start_sim(sim).await;
    let sidecar = Sidecar::start(sim.addr()).await;
    (sim, sidecar)
}

fn name(row: &HttpRow) -> String {
    format!("{} {}", row.method, row.path)
}

/// Served, or refused with a 4xx in TEI's error shape (`{"error", "error_type"}`, or for its
/// OpenAI route `{"message", "type"}`): never a 5xx, never nothing.
fn clear(answer: &Result<HttpAnswer, String>) -> bool {
    answer.as_ref().is_ok_and(|a| match a.status {
        200..=299 => true,
        400..=499 => {
            let json = a.json();
            json["error"].is_string() && json["error_type"].is_string()
                || json["message"].is_string() && json["type"].is_string()
        }
        _ => false,
    })
}

fn said(answer: &Result<HttpAnswer, String>) -> String {
    match answer {
        Ok(answer) => {
            let body: String = String::from_utf8_lossy(&answer.body).chars().take(120).collect();
            format!("{} {body:?}", answer.status)
        }
        Err(why) => why.clone(),
    }
}

/// (a) The largest body each route takes: the longest texts, the most inputs a request may carry
/// with every field copied per input (`prompt_name`, a query) filled, and as many inputs as the
/// body holds (past the input cap).
#[tokio::test]
async fn the_largest_body_of_every_route_is_bounded() {
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("HTTP largest body");
    for row in HTTP {
        let variants = [
            ("long", body(row, Size::Long(PAYLOAD_LIMIT))),
            ("many", body(row, Size::Many(PAYLOAD_LIMIT))),
            ("past the input cap", super::bodies::most_inputs(row, PAYLOAD_LIMIT)),
        ];
        for (label, body) in variants {
            let request = http_request(row.method, row.path, &[], &body);
            let baseline = sidecar.reset_peak();
            let answer = http_call(sidecar.http, &request).await;
            quiet(&sim).await;
            let (bounded, figure) = memory(baseline, sidecar.peak_kib(), request.len());
            report.check(
                &format!("{} {label}", name(row)),
                bounded && clear(&answer),
                format!("{}; {figure}", said(&answer)),
            );
        }
        report.after_row(&name(row), &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}

/// The row's JSON with a run of `a`s where its main input goes: (before, after) the run.
fn around_run(row: &HttpRow) -> (Vec<u8>, Vec<u8>) {
    let text = serde_json::to_string(&with_input(row, json!("@@"))).expect("JSON encodes");
    let (before, after) = text.split_once("@@").expect("the marker");
    (before.as_bytes().to_vec(), after.as_bytes().to_vec())
}

/// (b) `Content-Encoding: gzip` and `deflate` bodies inflating to 16 MiB, 8 at once: refused
/// or bounded.
#[tokio::test]
async fn compressed_bodies_to_every_route_are_refused_or_bounded() {
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("HTTP compressed body");
    for row in HTTP {
        let (before, after) = around_run(row);
        let variants = [
            ("gzip", super::compressed::gzip(&before, b'a', INFLATED, &after)),
            ("deflate", super::compressed::zlib(&before, b'a', INFLATED, &after)),
        ];
        for (encoding, compressed) in variants {
            let request = http_request(row.method, row.path, &[("content-encoding", encoding)], &compressed);
            let baseline = sidecar.reset_peak();
            let calls = (0..COMPRESSED_CALLS).map(|_| http_call(sidecar.http, &request));
            let answers = futures::future::join_all(calls).await;
            quiet(&sim).await;
            let (bounded, figure) = compressed_memory(baseline, sidecar.peak_kib(), COMPRESSED_CALLS * request.len());
            // A GET reads no body; a POST's inflated body is past the payload limit.
            let refused = |a: &Result<HttpAnswer, String>| {
                clear(a) && (row.body == Body::None || a.as_ref().is_ok_and(|a| a.status >= 400))
            };
            let holds = bounded && answers.iter().all(refused);
            report.check(
                &format!("{} {encoding}", name(row)),
                holds,
                format!("first: {}; {figure}", said(&answers[0])),
            );
        }
        report.after_row(&name(row), &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}

/// Broken bodies: (what, body, extra headers).
fn malformed(row: &HttpRow) -> Vec<(&'static str, Vec<u8>)> {
    let valid = body(row, Size::Cheapest);
    let mut utf8 = serde_json::to_vec(&with_input(row, json!("@@"))).expect("JSON encodes");
    let at = utf8.windows(2).position(|w| w == b"@@").expect("the marker");
    utf8.splice(at..at + 2, [0xff, 0xfe, 0xc0]);
    let huge = |value: &str| {
        let mut json = serde_json::to_string(&with_input(row, json!("a"))).expect("JSON encodes");
        // Fields of every route's body that take a number or a flag: each route reads one of them
        // (/similarity its `parameters`). TEI ignores a field its route does not have, as the
        // front does: a huge number only there is a valid body (answered 200), not a malformed one.
        let fields = ["dimensions", "truncate", "add_special_tokens", "skip_special_tokens", "raw_scores"];
        let mut fields: String = fields.iter().map(|field| format!("\"{field}\": {value}, ")).collect();
        if row.body == Body::Similarity {
            fields.push_str(&format!("\"parameters\": {{\"truncate\": {value}}}, "));
        }
        json.insert_str(1, &fields);
        json.into_bytes()
    };
    vec![
        ("bad JSON", br#"{"inputs": ["a", "#.to_vec()),
        ("cut short", valid[..valid.len() / 2].to_vec()),
        ("invalid UTF-8", utf8),
        ("wrong types", serde_json::to_vec(&with_input(row, json!({"a": [1, null, {}]}))).expect("JSON")),
        ("huge numbers", huge("1e400")),
        ("huge integers", huge("340282366920938463463374607431768211456")),
        ("deep nesting", "[".repeat(100_000).into_bytes()),
        ("empty", Vec::new()),
        ("binary", (0..=255u8).collect()),
    ]
}

/// (c) Bad JSON, invalid UTF-8, wrong types, huge numbers, deep nesting: a 4xx in the route's
/// error shape, no panic, the sidecar alive (a GET, which reads no body, may answer 200).
#[tokio::test]
async fn malformed_bodies_to_every_route_are_refused_clearly() {
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("HTTP malformed body");
    for row in HTTP {
        for (label, broken) in malformed(row) {
            let answer = http_call(sidecar.http, &http_request(row.method, row.path, &[], &broken)).await;
            let refused = answer.as_ref().is_ok_and(|a| (400..500).contains(&a.status)) || row.body == Body::None;
            report.check(&format!("{} {label}", name(row)), clear(&answer) && refused, said(&answer));
        }
        report.after_row(&name(row), &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}

/// (d) HTTP/1.1 clients that send a request with a large answer and never read it (a small
/// receive buffer, so the answer stays in the sidecar): the peak within the issue's bound.
#[tokio::test]
async fn unread_answers_of_every_route_are_bounded() {
    use tokio::io::AsyncWriteExt as _;
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("HTTP unread answers");
    for row in HTTP {
        let request = http_request(row.method, row.path, &[], &body(row, Size::BigAnswer));
        let baseline = sidecar.reset_peak();
        let mut held = Vec::new();
        for _ in 0..UNREAD_CONNECTIONS {
            let connect = async {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.set_recv_buffer_size(4096)?;
                let mut stream = socket.connect(sidecar.http).await?;
                stream.write_all(&request).await?;
                Ok::<_, std::io::Error>(stream)
            };
            if let Ok(stream) = connect.await {
                held.push(stream);
            }
        }
        quiet(&sim).await;
        let peak = sidecar.peak_kib();
        let (_, figure) = memory(baseline, peak, held.len() * request.len());
        let holds = peak < PEAK_BOUND_KIB;
        report.check(&name(row), holds, format!("{} unread connections: {figure}", held.len()));
        drop(held);
        report.after_row(&name(row), &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}

/// (e) A flood of each route's cheapest request (64 callers on 4 HTTP/2 connections, the port's
/// 16 streams each) beside a steady HTTP/1.1 caller.
#[tokio::test]
async fn a_flood_of_every_route_leaves_a_steady_caller_served() {
    let _attack = crate::support::attack_lock();
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("HTTP flood");
    let http = sidecar.http;
    for row in HTTP {
        let body = Bytes::from(body(row, Size::Cheapest));
        let connections = futures::future::join_all((0..4).map(|_| h2_to(http))).await;
        let Ok(connections) = connections.into_iter().collect::<Result<Vec<_>, _>>() else {
            report.check(&name(row), false, "could not connect".into());
            report.after_row(&name(row), &mut sidecar).await;
            continue;
        };
        let (method, path) = (row.method, row.path);
        let (calls, unserved, steady) = flood(
            64,
            move |i| {
                let (mut client, body) = (connections[i % connections.len()].clone(), body.clone());
                async move {
                    let Ok(ready) = client.ready().await else { return false };
                    client = ready;
                    let headers = [("content-type", "application/json")];
                    let Ok(answer) = start_request(&mut client, method, path, &headers, body) else { return false };
                    let served = super::client::finish_call(answer, false).await;
                    served.is_ok_and(|a| a.status == 200)
                }
            },
            move || http_embed(http),
        )
        .await;
        let (holds, figure) = steady.verdict();
        report.check(&name(row), holds, format!("{calls} flood requests ({unserved} not served); {figure}"));
        report.after_row(&name(row), &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}
