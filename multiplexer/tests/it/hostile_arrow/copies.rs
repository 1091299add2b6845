//! What one request makes many of: a per-request field copied into every row's upstream message
//! (a 40 MB `prompt_name` on 100,000 rows held 1.6 GB), rows inflated from LZ4 and copied again
//! into their messages (8 calls of 0.5 MB inflating to 16 MiB each held 168 MB beyond what was
//! charged), and a row larger than TEI's message limit (copied, sent, and refused by TEI).

use futures::future::join_all;
use teifleet_proto::tei_multiplexer::v1 as mux;
use tonic::Code;

use super::{DIM, beside_a_steady_caller, check, client, ipc, read, refused_clearly, request, sim_at, start};

/// The hostile suite's "many" Arrow body: 100,000 one-letter rows and a 40 MB prompt name.
const ROWS: usize = 100_000;
const PROMPT_NAME: usize = 40_000_000;
/// The sidecar's bound on a prompt's name, as its refusal names it.
const PROMPT_NAME_BOUND: &str = "256";

/// (7) A 40 MB `prompt_name` on EmbedArrow, EmbedSparseArrow and EmbedArrowStream is refused
/// INVALID_ARGUMENT naming the bound, before any row is copied: the peak stays in bounds.
#[tokio::test]
async fn a_long_prompt_name_is_refused_before_any_row_is_made() {
    let _attack = crate::support::attack_lock();
    let sim = sim_at(DIM).await;
    let mut sidecar = start(&sim);
    let grpc = sidecar.grpc;
    let rows = vec![Some("a"); ROWS];
    let batch = ipc::stream(&rows, false, false);
    let name = Some("p".repeat(PROMPT_NAME));
    let dense = mux::EmbedArrowRequest { prompt_name: name.clone(), ..request(batch.clone(), false) };
    let sparse = mux::EmbedSparseArrowRequest {
        target: dense.target.clone(),
        arrow_ipc: dense.arrow_ipc.clone(),
        prompt_name: name,
        ..Default::default()
    };
    let attack = async {
        let mut refusals = vec![
            client(grpc).await.embed_arrow(dense.clone()).await.map(|_| ()),
            client(grpc).await.embed_sparse_arrow(sparse).await.map(|_| ()),
        ];
        let stream = client(grpc).await.embed_arrow_stream(futures::stream::iter([dense])).await;
        let refused = match stream {
            Ok(answers) => answers.into_inner().message().await.map(|_| ()),
            Err(status) => Err(status),
        };
        refusals.push(refused);
        refusals
    };
    let (refusals, steady) = beside_a_steady_caller(grpc, attack).await;
    for refusal in refusals {
        let status = refusal.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("prompt_name") && status.message().contains(PROMPT_NAME_BOUND), "{status:?}");
    }
    check(&mut sidecar, "100,000 rows with a 40 MB prompt_name", &steady);
    sim.shutdown().await;
}

/// (8) 8 concurrent calls of 16 LZ4-compressed rows of 1 MiB (0.5 MB each, inflating to
/// 16 MiB), on EmbedArrow and on EmbedArrowStream: each served or refused for memory at once
/// (the inflation, the decoder's buffers and the rows' upstream messages are charged), the
/// process within its bound.
// The simulator reads the served calls' 32 MiB of text on the test's runtime: on threads of
// their own, so the steady caller's client is not run behind that work.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lz4_rows_and_their_upstream_copies_are_charged() {
    let _attack = crate::support::attack_lock();
    // The simulator's time per token would make the two served calls' 32 MiB of text (8 million
    // tokens) hold its one "GPU" for seconds, and the steady caller's query wait behind them
    // there, as it would behind any TEI batch: what is measured is the sidecar.
    let sim = crate::support::sim(|config| {
        config.dimensions = DIM;
        config.fixed_latency = std::time::Duration::ZERO;
        config.per_token_latency = std::time::Duration::ZERO;
    })
    .await;
    let mut sidecar = start(&sim);
    let grpc = sidecar.grpc;
    let row = "a".repeat(1 << 20);
    let batch = ipc::stream(&vec![Some(row.as_str()); 16], false, true);
    eprintln!("16 MiB of rows LZ4-compressed: {} bytes", batch.len());
    let attack = async {
        let unary = (0..8).map(|_| {
            let call = request(batch.clone(), true);
            async move { client(grpc).await.embed_arrow(call).await.map(|answer| answer.into_inner().arrow_ipc) }
        });
        let streams = (0..8).map(|_| {
            let call = request(batch.clone(), true);
            async move {
                let mut answers =
                    client(grpc).await.embed_arrow_stream(futures::stream::iter([call])).await?.into_inner();
                let answer = answers.message().await?.map(|answer| answer.arrow_ipc).unwrap_or_default();
                answers.message().await?;
                Ok(answer)
            }
        });
        let limit = std::time::Duration::from_secs(15);
        let unary = tokio::time::timeout(limit, join_all(unary)).await.expect("answered within 15 s");
        let streams = tokio::time::timeout(limit, join_all(streams)).await.expect("answered within 15 s");
        unary.into_iter().chain(streams).collect::<Vec<Result<bytes::Bytes, tonic::Status>>>()
    };
    let (outcomes, steady) = beside_a_steady_caller(grpc, attack).await;
    let (mut served, mut refused) = (0, 0);
    for outcome in outcomes {
        match outcome {
            Ok(answer) => {
                assert_eq!(read(&answer).num_rows(), 16);
                served += 1;
            }
            Err(status) => {
                refused_clearly(&status);
                refused += 1;
            }
        }
    }
    eprintln!("LZ4 rows of 1 MiB: {served} served, {refused} refused");
    assert!(served > 0, "a call that fits the budget is served");
    check(&mut sidecar, "16 calls of 16 LZ4-compressed rows of 1 MiB", &steady);
    sim.shutdown().await;
}

/// (9) One row past the message TEI takes (a 40 MB text, within the 40 MiB Arrow message):
/// refused OUT_OF_RANGE naming the limit, before it is copied into a message and sent.
#[tokio::test]
async fn a_row_larger_than_tei_takes_is_refused_before_it_is_copied() {
    let _attack = crate::support::attack_lock();
    let sim = sim_at(DIM).await;
    let mut sidecar = start(&sim);
    let grpc = sidecar.grpc;
    let text = "a".repeat(40_000_000);
    let call = request(ipc::stream(&[Some(text.as_str())], false, false), false);
    let (refused, steady) = beside_a_steady_caller(grpc, client(grpc).await.embed_arrow(call)).await;
    let status = refused.expect_err("refused");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("largest message TEI takes (4194304 bytes)"), "{status:?}");
    check(&mut sidecar, "a 40 MB row", &steady);
    sim.shutdown().await;
}

/// (10) A message past the Arrow RPCs' 40 MiB (EmbedArrow, and one EmbedArrowStream message): refused
/// OUT_OF_RANGE naming that limit, from its declared length, before its body is buffered.
#[tokio::test]
async fn an_arrow_message_past_forty_mebibytes_is_refused_from_its_prefix() {
    let _attack = crate::support::attack_lock();
    let sim = sim_at(DIM).await;
    let mut sidecar = start(&sim);
    let grpc = sidecar.grpc;
    let limit = teifleet_multiplexer::front::tei_manager::ARROW_MAX_MESSAGE;
    let call = request(vec![0; limit + 1024], false);
    let attack = async {
        let unary = client(grpc).await.embed_arrow(call.clone()).await.map(|_| ());
        let stream = match client(grpc).await.embed_arrow_stream(futures::stream::iter([call])).await {
            Ok(answers) => answers.into_inner().message().await.map(|_| ()),
            Err(status) => Err(status),
        };
        [unary, stream]
    };
    let (refusals, steady) = beside_a_steady_caller(grpc, attack).await;
    for refusal in refusals {
        let status = refusal.expect_err("refused");
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        assert!(status.message().contains(&format!("the limit is: {limit} bytes")), "{status:?}");
    }
    check(&mut sidecar, "Arrow messages of 40 MiB and 1 KiB", &steady);
    sim.shutdown().await;
}
