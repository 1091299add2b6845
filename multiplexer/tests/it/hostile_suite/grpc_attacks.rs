//! The attacks on every gRPC row (`table::GRPC`), each against one sidecar, row after row, the
//! peak reset before each: the largest bodies, compressed bodies, malformed messages, answers
//! never read, and a flood of the cheapest call beside a steady caller.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use tonic::Code;

use super::client::{GrpcAnswer, frame, frame_as, grpc_call, h2, h2_to, start_call};
use super::report::{Report, compressed_memory, memory};
use super::requests::{self, bulk_field, bulk_header, tag, varint, with_inner};
use super::sidecar::Sidecar;
use super::steady::{flood, grpc_embed};
use super::table::{GRPC, GrpcRow, Message, Size};
use super::{quiet, sim};
use crate::support::sim as start_sim;

/// The gRPC port's largest message (`--max-message-bytes`' default).
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// The largest message `row` takes: the port's, or tei-manager's for an Arrow batch.
fn largest(row: &GrpcRow) -> usize {
    match row.message {
        Message::Arrow | Message::SparseArrow => teifleet_multiplexer::front::tei_manager::ARROW_MAX_MESSAGE,
        _ => MAX_MESSAGE,
    }
}
/// Room in the largest message for what is not its largest field (target, options, framing).
const ROOM: usize = 16 * 1024;
/// What a compressed message inflates to: far past the largest message.
const INFLATED: usize = 16 << 20;
/// Compressed calls sent at once on one connection.
const COMPRESSED_CALLS: usize = 8;
/// Calls whose answers are never read: unary calls on one connection, and streams of
/// `requests::messages`' 32 messages each.
const UNREAD_CALLS: usize = 64;
const UNREAD_STREAMS: usize = 16;
const CALL_LIMIT: Duration = super::client::CALL_LIMIT;
/// How long a call that should be refused at once (malformed, gzip'd) may take: a hang costs the
/// suite this, not [`CALL_LIMIT`], and is reported as no answer all the same.
const REFUSAL_LIMIT: Duration = Duration::from_secs(5);

/// A status that tells the caller what happened: served, or refused for what the request was.
/// Not UNKNOWN, INTERNAL, UNAVAILABLE (a sidecar in trouble), nor a broken stream.
fn clear(code: Code) -> bool {
    use Code::*;
    matches!(
        code,
        Ok | InvalidArgument | ResourceExhausted | OutOfRange | FailedPrecondition | NotFound | Unimplemented
    )
}

fn said(answer: &Result<GrpcAnswer, String>) -> String {
    match answer {
        Ok(answer) => {
            let message: String = answer.message.chars().take(100).collect();
            format!("{:?} {message:?}", answer.code())
        }
        Err(why) => why.clone(),
    }
}

async fn call(sidecar: &Sidecar, row: &GrpcRow, headers: &[(&str, &str)], body: Bytes) -> Result<GrpcAnswer, String> {
    call_within(sidecar, row, headers, body, CALL_LIMIT).await
}

async fn call_within(
    sidecar: &Sidecar,
    row: &GrpcRow,
    headers: &[(&str, &str)],
    body: Bytes,
    limit: Duration,
) -> Result<GrpcAnswer, String> {
    grpc_call(&h2_to(sidecar.grpc).await?, row, headers, body, limit).await
}

async fn setup() -> (teifleet_tei_sim::SimHandle, Sidecar) {
    let sim = start_sim(sim).await;
    let sidecar = Sidecar::start(sim.addr()).await;
    (sim, sidecar)
}

/// (a) The largest request each row takes: the longest texts, and the most inputs with every
/// field copied per input filled. Answered or refused clearly, the peak within the bound
/// and within `AMPLIFICATION` times the request's bytes.
/// In two tests, each with its own sidecar, which cargo runs side by side: the rows'
/// calls wait mostly on the simulator, not on the cores.
#[tokio::test]
async fn the_largest_body_of_every_tei_rpc_is_bounded() {
    largest_bodies(false).await;
}

/// [`the_largest_body_of_every_tei_rpc_is_bounded`]'s other half: tei-manager's rows.
#[tokio::test]
async fn the_largest_body_of_every_tei_manager_rpc_is_bounded() {
    largest_bodies(true).await;
}

/// The rows of tei-manager's service (`manager`), or all the others.
fn half(manager: bool) -> impl Iterator<Item = &'static GrpcRow> {
    GRPC.iter().filter(move |row| row.path.starts_with("/tei_multiplexer.") == manager)
}

async fn largest_bodies(manager: bool) {
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("gRPC largest body");
    for row in half(manager) {
        let bytes = largest(row) - ROOM;
        for (label, size) in [("long", Size::Long(bytes)), ("many", Size::Many(bytes))] {
            let body = requests::body(row, size);
            let baseline = sidecar.reset_peak();
            let started = std::time::Instant::now();
            let answer = call(&sidecar, row, &[], body.clone()).await;
            let took = started.elapsed();
            quiet(&sim).await;
            let (bounded, figure) = memory(baseline, sidecar.peak_kib(), body.len());
            let clear = answer.as_ref().is_ok_and(|a| clear(a.code()));
            let figure = format!("{} in {took:.1?}; {figure}", said(&answer));
            report.check(&format!("{} {label}", row.path), bounded && clear, figure);
        }
        report.after_row(row.path, &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}

/// The LZ4-compressed Arrow batch of 16 rows of a megabyte each (made once).
fn lz4_batch() -> &'static [u8] {
    static BATCH: OnceLock<Vec<u8>> = OnceLock::new();
    BATCH.get_or_init(|| {
        let row = "a".repeat(1 << 20);
        requests::ipc(&vec![row.as_str(); 16], true)
    })
}

/// (b) A small message inflating hugely: `grpc-encoding: gzip` on every row, and for the Arrow
/// rows an LZ4-compressed IPC batch in a plain message. Refused, or answered with the
/// inflated bytes charged: a clear answer and a peak within the bound (not the ratio to
/// the wire bytes, which an inflated body charged to the budget rightly exceeds).
#[tokio::test]
async fn compressed_messages_to_every_rpc_are_refused_or_bounded() {
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("gRPC compressed body");
    for row in GRPC {
        let gzip = super::compressed::gzip(&bulk_header(row, INFLATED), b'a', INFLATED, b"");
        let body = frame_as(1, gzip.len() as u32, &gzip);
        let mut variants = vec![("gzip", body, &[("grpc-encoding", "gzip")][..])];
        if matches!(row.message, Message::Arrow | Message::SparseArrow) {
            let plain = requests::arrow_with(row, lz4_batch().to_vec());
            variants.push(("lz4 arrow", frame(&plain), &[][..]));
        }
        for (label, body, headers) in variants {
            let baseline = sidecar.reset_peak();
            let outcome = async {
                let client = h2_to(sidecar.grpc).await?;
                // gzip is refused before it is read; an LZ4 batch is decoded and answered.
                let limit = if label == "gzip" { REFUSAL_LIMIT } else { CALL_LIMIT };
                let calls = (0..COMPRESSED_CALLS).map(|_| grpc_call(&client, row, headers, body.clone(), limit));
                Ok::<_, String>(futures::future::join_all(calls).await)
            };
            let answers = outcome.await.unwrap_or_else(|why| vec![Err(why)]);
            quiet(&sim).await;
            let (bounded, figure) = compressed_memory(baseline, sidecar.peak_kib(), COMPRESSED_CALLS * body.len());
            // A gzip'd message is refused: it inflates past the largest message.
            // (tei-manager's wrapped methods answer as tonic does, in tonic's words.)
            let said_so =
                |a: &GrpcAnswer| a.code() == Code::Internal && TONIC_WORDS.iter().any(|w| a.message.contains(w));
            let refused = |a: &GrpcAnswer| (clear(a.code()) || said_so(a)) && (label != "gzip" || a.code() != Code::Ok);
            let clear = answers.iter().all(|a| a.as_ref().is_ok_and(refused));
            let figure = format!("{} calls, first: {}; {figure}", answers.len(), said(&answers[0]));
            report.check(&format!("{} {label}", row.path), bounded && clear, figure);
        }
        report.after_row(row.path, &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}

/// What tonic says of a message it cannot frame or decode.
const TONIC_WORDS: [&str; 4] = ["decod", "protocol error", "compressed", "Missing request message"];

/// Broken messages of `row`: (what, framed body, whether protobuf would take it anyway).
fn malformed(row: &GrpcRow) -> Vec<(&'static str, Bytes, bool)> {
    let field = bulk_field(row);
    // Info's message has no fields: what is written into a field it does not have is skipped
    // unread, and so is all of it inside tei-manager's wrapper (field 2 of its `InfoRequest`).
    let (unknown, wrapped_unknown) = (row.message == Message::Info, row.message == Message::Info && row.wrapped);
    let cheapest = requests::messages(row, Size::Cheapest).remove(0);
    let mut garbage = vec![0xffu8];
    garbage.extend((0..63u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let invalid_utf8 = [tag(field, 2), varint(3), vec![0xff, 0xfe, 0xc0]].concat();
    vec![
        (
            "truncated field",
            frame(&with_inner(row, &[tag(field, 2), varint(100), vec![b'a'; 10]].concat())),
            wrapped_unknown,
        ),
        ("wire type 7", frame(&with_inner(row, &[tag(field, 7), vec![0]].concat())), wrapped_unknown),
        ("string as fixed64", frame(&with_inner(row, &[tag(field, 1), vec![0; 8]].concat())), unknown),
        ("invalid UTF-8", frame(&with_inner(row, &invalid_utf8)), unknown),
        ("garbage", frame(&garbage), false),
        ("frame cut short", frame_as(0, 1000, &cheapest[..cheapest.len().min(10)]), false),
        ("compressed flag, no encoding", frame_as(1, cheapest.len() as u32, &cheapest), false),
    ]
}

/// (c) Truncated protobuf, wrong wire types, invalid UTF-8, garbage, broken framing: a clear
/// refusal (INVALID_ARGUMENT, or tonic's own words where the product answers as tonic does), no
/// panic, the sidecar alive.
#[tokio::test]
async fn malformed_messages_to_every_rpc_are_refused_clearly() {
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("gRPC malformed message");
    for row in GRPC {
        for (label, body, valid) in malformed(row) {
            let answer = call_within(&sidecar, row, &[], body, REFUSAL_LIMIT).await;
            let refused = |a: &GrpcAnswer| match a.code() {
                // A stream that ends with nothing served is how tonic's services, and TEI's,
                // refuse a stream message they cannot decode (the product forwards stream
                // messages to TEI unread).
                Code::Ok => valid || (row.client_stream && a.bytes == 0),
                Code::InvalidArgument | Code::OutOfRange | Code::Unimplemented => true,
                // tonic's words for a message it cannot decode or frame (the product answers so
                // where tonic would).
                Code::Internal => TONIC_WORDS.iter().any(|w| a.message.contains(w)),
                _ => false,
            };
            report.check(&format!("{} {label}", row.path), answer.as_ref().is_ok_and(refused), said(&answer));
        }
        report.after_row(row.path, &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}

/// (d) Calls whose answers are never read (a window of zero): each row's largest answers for
/// their size, many at once. The peak stays within the bound.
#[tokio::test]
async fn unread_answers_of_every_tei_rpc_are_bounded() {
    unread_answers(false).await;
}

/// [`unread_answers_of_every_tei_rpc_are_bounded`]'s other half: tei-manager's rows.
#[tokio::test]
async fn unread_answers_of_every_tei_manager_rpc_are_bounded() {
    unread_answers(true).await;
}

async fn unread_answers(manager: bool) {
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("gRPC unread answers");
    for row in half(manager) {
        let calls = if row.client_stream { UNREAD_STREAMS } else { UNREAD_CALLS };
        let body = requests::body(row, Size::BigAnswer);
        let baseline = sidecar.reset_peak();
        let held = async {
            let tcp = tokio::net::TcpStream::connect(sidecar.grpc).await.map_err(|e| e.to_string())?;
            let mut client = h2(tcp, Some(0)).await?;
            let mut answers = Vec::new();
            for _ in 0..calls {
                client = client.ready().await.map_err(|e| e.to_string())?;
                answers.push(start_call(&mut client, row.path, &[], body.clone())?);
            }
            Ok::<_, String>((client, answers))
        };
        let held = held.await;
        quiet(&sim).await;
        let peak = sidecar.peak_kib();
        let (_, figure) = memory(baseline, peak, calls * body.len());
        let holds = held.is_ok() && peak < super::sidecar::PEAK_BOUND_KIB;
        let opened = held.as_ref().map(|_| format!("{calls} calls")).unwrap_or_else(|why| why.clone());
        report.check(row.path, holds, format!("{opened}: {figure}"));
        drop(held);
        report.after_row(row.path, &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}

/// (e) A flood of each row's cheapest call (64 callers on 4 connections) beside a steady caller
/// on a connection of its own: p99 under a second, 90% of its calls served.
#[tokio::test]
async fn a_flood_of_every_rpc_leaves_a_steady_caller_served() {
    let _attack = crate::support::attack_lock();
    let (sim, mut sidecar) = setup().await;
    let mut report = Report::new("gRPC flood");
    for row in GRPC {
        let body = requests::body(row, Size::Cheapest);
        let connections = futures::future::join_all((0..4).map(|_| h2_to(sidecar.grpc))).await;
        let (Ok(steady), Ok(connections)) =
            (h2_to(sidecar.grpc).await, connections.into_iter().collect::<Result<Vec<_>, _>>())
        else {
            report.check(row.path, false, "could not connect".into());
            report.after_row(row.path, &mut sidecar).await;
            continue;
        };
        let path = row.path;
        let (calls, unserved, steady) = flood(
            64,
            move |i| {
                let (client, body) = (connections[i % connections.len()].clone(), body.clone());
                async move {
                    let row = GRPC.iter().find(|r| r.path == path).expect("a row");
                    let answer = grpc_call(&client, row, &[], body, Duration::from_secs(2)).await;
                    answer.is_ok_and(|a| a.code() == Code::Ok)
                }
            },
            move || {
                let steady = steady.clone();
                async move { grpc_embed(&steady).await }
            },
        )
        .await;
        let (holds, figure) = steady.verdict();
        report.check(row.path, holds, format!("{calls} flood calls ({unserved} not served); {figure}"));
        report.after_row(row.path, &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}
