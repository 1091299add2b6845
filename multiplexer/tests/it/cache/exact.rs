//! What a hit is: exactly TEI's answer to that exact request, per input whichever front the
//! input came in by, never for a request that differs in any option, never an error.

use std::time::Duration;

use arrow_array::{Array, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_ipc::reader::StreamReader;
use prost::Message as _;
use serde_json::json;
use teifleet_proto::tei_multiplexer::v1 as mux;
use teifleet_proto::tei_multiplexer::v1::tei_multiplexer_client::TeiMultiplexerClient;
use teifleet_proto::v1;
use teifleet_tei_sim::embedding_for;
use tonic::Code;

use super::fleet::*;
use crate::streamed_arrow::ipc;
use crate::support::sim;

const DIMENSIONS: usize = 384;

fn request(text: &str) -> v1::EmbedRequest {
    v1::EmbedRequest { inputs: text.into(), normalize: Some(true), ..Default::default() }
}

/// Tei.v1 Embed, N texts at 384 dimensions, twice: the second answers are TEI's first answers
/// byte for byte (its timings included, which a recomputed answer would not repeat), TEI did no
/// work for them, the header says `hit` and the metrics count local hits.
#[tokio::test]
async fn a_hit_is_teis_answer_byte_for_byte_and_costs_tei_nothing() {
    const N: usize = 24;
    let sim = sim(|_| {}).await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, "64Mi")], &[]).await;
    let texts = texts("exact", N, 12);

    let (work_before, misses_before) = (work(&sim), replica.inputs("miss").await);
    let mut first = Vec::new();
    for text in &texts {
        let (answer, cache) = replica.embed(request(text)).await.unwrap();
        assert_eq!(cache.as_deref(), Some("miss"), "{text}");
        assert_eq!(answer.embeddings, embedding_for(text, DIMENSIONS), "TEI's vector for {text}");
        first.push(answer.encode_to_vec());
    }
    assert_eq!(work(&sim) - work_before, N as u64, "TEI embedded each text once");
    assert_eq!(replica.inputs("miss").await - misses_before, N as f64);

    let (work_before, hits_before) = (work(&sim), replica.inputs("hit_local").await);
    for (text, first) in texts.iter().zip(&first) {
        let (answer, cache) = replica.embed(request(text)).await.unwrap();
        assert_eq!(cache.as_deref(), Some("hit"), "{text}");
        assert_eq!(&answer.encode_to_vec(), first, "the protobuf bytes TEI answered for {text}");
    }
    assert_eq!(work(&sim), work_before, "TEI did no work for hits");
    assert_eq!(replica.inputs("hit_local").await - hits_before, N as f64, "counted as local hits");
    let stored = replica.metric("teifleet_cache_stored_total", &[("pool", POOL_NAME), ("tier", "local")]).await;
    assert!(stored >= N as f64, "each answer stored locally: {stored}");
}

/// HTTP `/embed` with [cached, new, cached, new]: `partial`, answers in order, each TEI's own
/// vector for its text, and TEI asked for the 2 new ones only; then the same list is a `hit`.
#[tokio::test]
async fn http_embed_lists_are_cached_per_input() {
    let sim = sim(|_| {}).await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, "64Mi")], &[]).await;
    let [a, b, new1, new2] = ["http a", "http b", "http new one", "http new two"];

    let (status, cache, warm) = http(replica.http, "/embed", &[], json!({ "inputs": [a, b] })).await;
    assert_eq!((status, cache.as_deref()), (200, Some("miss")), "{warm}");
    let before = work(&sim);
    let (status, cache, mixed) = http(replica.http, "/embed", &[], json!({ "inputs": [a, new1, b, new2] })).await;
    assert_eq!((status, cache.as_deref()), (200, Some("partial")), "{mixed}");
    assert_eq!(work(&sim) - before, 2, "TEI embedded the two new inputs only");
    assert_eq!(mixed.as_array().map(Vec::len), Some(4));
    assert_eq!(vector(&mixed[0]), vector(&warm[0]), "a, from the cache, in its place");
    assert_eq!(vector(&mixed[2]), vector(&warm[1]), "b, from the cache, in its place");
    for (i, text) in [(0, a), (1, new1), (2, b), (3, new2)] {
        assert_eq!(vector(&mixed[i]), embedding_for(text, DIMENSIONS), "input {i} is {text}'s vector");
    }
    let before = work(&sim);
    let (_, cache, again) = http(replica.http, "/embed", &[], json!({ "inputs": [a, new1, b, new2] })).await;
    assert_eq!(cache.as_deref(), Some("hit"));
    assert_eq!(again, mixed);
    assert_eq!(work(&sim), before);
}

/// OpenAI's `/v1/embeddings` with an `input` list: the same, per input.
#[tokio::test]
async fn openai_input_lists_are_cached_per_input() {
    let sim = sim(|_| {}).await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, "64Mi")], &[]).await;
    let [a, b, new1, new2] = ["openai a", "openai b", "openai new one", "openai new two"];
    let body = |input: &[&str]| json!({ "input": input, "model": "m" });

    let (status, cache, warm) = http(replica.http, "/v1/embeddings", &[], body(&[a, b])).await;
    assert_eq!((status, cache.as_deref()), (200, Some("miss")), "{warm}");
    let before = work(&sim);
    let (status, cache, mixed) = http(replica.http, "/v1/embeddings", &[], body(&[a, new1, b, new2])).await;
    assert_eq!((status, cache.as_deref()), (200, Some("partial")), "{mixed}");
    assert_eq!(work(&sim) - before, 2, "TEI embedded the two new inputs only");
    for (i, text) in [a, new1, b, new2].into_iter().enumerate() {
        assert_eq!(mixed["data"][i]["index"], json!(i), "{mixed}");
        assert_eq!(vector(&mixed["data"][i]["embedding"]), embedding_for(text, DIMENSIONS), "input {i}");
    }
    assert_eq!(vector(&mixed["data"][0]["embedding"]), vector(&warm["data"][0]["embedding"]));
}

fn arrow_rows(ipc: &[u8]) -> RecordBatch {
    StreamReader::try_new(std::io::Cursor::new(ipc), None).unwrap().next().unwrap().unwrap()
}

fn arrow_vector(batch: &RecordBatch, i: usize) -> Vec<f32> {
    let list = batch.column_by_name("embeddings").unwrap().as_any().downcast_ref::<FixedSizeListArray>().unwrap();
    list.value(i).as_any().downcast_ref::<Float32Array>().unwrap().values().to_vec()
}

fn arrow_error(batch: &RecordBatch, i: usize) -> Option<String> {
    let errors = batch.column_by_name("error").unwrap().as_any().downcast_ref::<StringArray>().unwrap();
    errors.is_valid(i).then(|| errors.value(i).to_owned())
}

fn arrow_request(rows: &[Option<&str>]) -> mux::EmbedArrowRequest {
    let target = mux::Target { routing: Some(mux::target::Routing::InstanceName(POOL_NAME.into())) };
    mux::EmbedArrowRequest { target: Some(target), arrow_ipc: ipc(rows).into(), normalize: true, ..Default::default() }
}

/// A held EmbedArrow answer's `x-teifleet-cache` is `want`.
fn arrow_header<T>(answer: &tonic::Response<T>, want: &str) {
    assert_eq!(header(answer.metadata()).as_deref(), Some(want), "EmbedArrow's x-teifleet-cache");
}

/// A streamed answer's trailers, once its messages are read: their `x-teifleet-cache`.
async fn trailer<T: prost::Message + Default>(answers: &mut tonic::Streaming<T>) -> Option<String> {
    while answers.message().await.unwrap().is_some() {}
    header(&answers.trailers().await.unwrap().expect("trailers"))
}

/// tei-manager's EmbedArrow: rows are inputs; TEI embeds a call's new rows only, and each row is
/// TEI's vector for its text; the answer's `x-teifleet-cache` tallies the rows looked up (a null
/// row, refused before any lookup, is none). EmbedArrowStream's tally over its batches is in its
/// trailers. tei.v1 EmbedStream: messages are inputs, the tally in the trailers too.
#[tokio::test]
async fn arrow_rows_and_stream_messages_are_cached_per_input() {
    let sim = sim(|_| {}).await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, "64Mi")], &[]).await;
    let mut manager = TeiMultiplexerClient::new(replica.channel());
    let [a, b, new1, new2] = ["arrow a", "arrow b", "arrow new one", "arrow new two"];

    let warm = manager.embed_arrow(arrow_request(&[Some(a), Some(b)])).await.unwrap();
    arrow_header(&warm, "miss");
    let before = work(&sim);
    let mixed = manager.embed_arrow(arrow_request(&[Some(a), Some(new1), Some(b), Some(new2)])).await.unwrap();
    arrow_header(&mixed, "partial");
    assert_eq!(work(&sim) - before, 2, "TEI embedded the two new rows only");
    let rows = arrow_rows(&mixed.into_inner().arrow_ipc);
    assert_eq!(rows.num_rows(), 4);
    for (i, text) in [a, new1, b, new2].into_iter().enumerate() {
        assert_eq!(arrow_error(&rows, i), None);
        assert_eq!(arrow_vector(&rows, i), embedding_for(text, DIMENSIONS), "row {i} is {text}'s vector");
    }
    let before = work(&sim);
    let again = manager.embed_arrow(arrow_request(&[Some(new2), None, Some(a)])).await.unwrap();
    arrow_header(&again, "hit");
    assert_eq!(work(&sim), before);

    // EmbedArrowStream: its headers go before its batches, the tally over them in the trailers.
    let new3 = "arrow new three";
    let batches = vec![arrow_request(&[Some(a), Some(b)]), arrow_request(&[Some(new3)])];
    let answer = manager.embed_arrow_stream(futures::stream::iter(batches)).await.unwrap();
    assert_eq!(header(answer.metadata()), None, "not in the headers, sent before any lookup");
    assert_eq!(trailer(&mut answer.into_inner()).await.as_deref(), Some("partial"));
    let batches = vec![arrow_request(&[Some(new3)]), arrow_request(&[Some(a)])];
    let mut answers = manager.embed_arrow_stream(futures::stream::iter(batches)).await.unwrap().into_inner();
    assert_eq!(trailer(&mut answers).await.as_deref(), Some("hit"));

    // EmbedStream: a (cached by Arrow? only if the keys agree, so warm it here), new, b, new.
    let [sa, sb, snew1, snew2] = ["stream a", "stream b", "stream new one", "stream new two"];
    let mut client = v1::embed_client::EmbedClient::new(replica.channel());
    let stream = |texts: Vec<&str>| {
        let messages: Vec<v1::EmbedRequest> = texts.into_iter().map(request).collect();
        let mut call = tonic::Request::new(futures::stream::iter(messages));
        call.metadata_mut().insert(teifleet_wire::headers::POOL, POOL_NAME.parse().unwrap());
        call
    };
    let mut answers = client.embed_stream(stream(vec![sa, sb])).await.unwrap().into_inner();
    assert_eq!(trailer(&mut answers).await.as_deref(), Some("miss"), "EmbedStream's trailers");
    let before = work(&sim);
    let answer = client.embed_stream(stream(vec![sa, snew1, sb, snew2])).await.unwrap();
    assert_eq!(header(answer.metadata()), None, "not in the headers, sent before any lookup");
    let mut answers = answer.into_inner();
    for text in [sa, snew1, sb, snew2] {
        let answer = answers.message().await.unwrap().expect("one answer per message");
        assert_eq!(answer.embeddings, embedding_for(text, DIMENSIONS), "{text}, in order");
    }
    assert_eq!(trailer(&mut answers).await.as_deref(), Some("partial"), "EmbedStream's trailers");
    assert_eq!(work(&sim) - before, 2, "TEI embedded the two new messages only");
    let mut answers = client.embed_stream(stream(vec![snew2, sa])).await.unwrap().into_inner();
    assert_eq!(trailer(&mut answers).await.as_deref(), Some("hit"), "EmbedStream's trailers");
}

/// An EmbedArrow answer too large to hold within the memory budget is streamed: its headers go
/// before its rows are looked up, so its `x-teifleet-cache` is in its trailers (tonic merges them
/// into a unary answer's metadata), the tally over every row.
#[tokio::test]
async fn a_streamed_arrow_answer_has_its_tally_in_its_trailers() {
    // 16Mi: a budget of 8Mi, of which large holders take at most 6Mi; the answer's vectors held
    // would be 3,000 rows of 384 numbers in f32, kept and written (9 MB): only a streamed answer
    // can succeed.
    const ROWS: usize = 3_000;
    const WARM: usize = 10;
    let sim = sim(|_| {}).await;
    let replica =
        Replica::start_with(&[PoolConfig::cached(POOL_NAME, &sim, "2Mi")], &[], &["--memory-limit", "16Mi"]).await;
    let mut manager = TeiMultiplexerClient::new(replica.channel()).max_decoding_message_size(usize::MAX);
    let known = texts("streamed", ROWS, 4);
    let rows: Vec<Option<&str>> = known.iter().map(|text| Some(text.as_str())).collect();

    let warm = manager.embed_arrow(arrow_request(&rows[..WARM])).await.unwrap();
    arrow_header(&warm, "miss");
    let before = work(&sim);
    let answer = manager.embed_arrow(arrow_request(&rows)).await.unwrap();
    assert_eq!(work(&sim) - before, (ROWS - WARM) as u64, "TEI embedded the new rows only");
    arrow_header(&answer, "partial");
    let batch = arrow_rows(&answer.into_inner().arrow_ipc);
    assert_eq!(batch.num_rows(), ROWS);
    for i in [0, WARM - 1, WARM, ROWS / 2, ROWS - 1] {
        assert_eq!(arrow_vector(&batch, i), embedding_for(&known[i], DIMENSIONS), "row {i}");
    }

    let fresh = texts("fresh streamed", ROWS, 4);
    let rows: Vec<Option<&str>> = fresh.iter().map(|text| Some(text.as_str())).collect();
    let answer = manager.embed_arrow(arrow_request(&rows)).await.unwrap();
    arrow_header(&answer, "miss");
}

/// A pool without a cache: no `x-teifleet-cache` on any answer, held or streamed.
#[tokio::test]
async fn a_pool_without_a_cache_answers_without_the_header() {
    let sim = sim(|_| {}).await;
    let mut pool = PoolConfig::cached(POOL_NAME, &sim, "64Mi");
    pool.cache = None;
    let replica = Replica::start(&[pool], &[]).await;
    let (_, cache) = replica.embed(request("uncached")).await.unwrap();
    assert_eq!(cache, None, "Embed");
    let mut manager = TeiMultiplexerClient::new(replica.channel());
    for _ in 0..2 {
        let answer = manager.embed_arrow(arrow_request(&[Some("uncached a"), Some("uncached b")])).await.unwrap();
        assert_eq!(header(answer.metadata()), None, "EmbedArrow");
    }
    let batches = vec![arrow_request(&[Some("uncached a")])];
    let mut answers = manager.embed_arrow_stream(futures::stream::iter(batches)).await.unwrap().into_inner();
    assert_eq!(trailer(&mut answers).await, None, "EmbedArrowStream");
    let mut client = v1::embed_client::EmbedClient::new(replica.channel());
    let messages = vec![request("uncached a"), request("uncached c")];
    let mut answers = client.embed_stream(futures::stream::iter(messages)).await.unwrap().into_inner();
    assert_eq!(trailer(&mut answers).await, None, "EmbedStream");
}

/// Every option is part of the key: the same text with normalize, truncate, the truncation's
/// side, dimensions or a prompt name changed is TEI's work again, never another option's hit;
/// asked again, each is a hit equal to its own first answer.
#[tokio::test]
async fn options_are_part_of_the_key() {
    let sim = sim(|config| config.max_batch_tokens = 64).await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, "64Mi")], &[]).await;
    let long = texts("long enough to truncate", 1, 100).remove(0);
    let short = "a short text";
    let with = |text: &str, f: fn(&mut v1::EmbedRequest)| {
        let mut request = request(text);
        f(&mut request);
        request
    };
    const RIGHT: i32 = v1::TruncationDirection::Right as i32;
    const LEFT: i32 = v1::TruncationDirection::Left as i32;
    let variants = [
        with(short, |_| {}),
        with(short, |r| r.normalize = Some(false)),
        with(short, |r| r.normalize = None),
        with(short, |r| r.truncate = true),
        with(short, |r| r.dimensions = Some(8)),
        with(short, |r| r.dimensions = Some(16)),
        with(short, |r| r.dimensions = Some(384)),
        with(short, |r| r.prompt_name = Some("query".into())),
        with(&long, |r| (r.truncate, r.truncation_direction) = (true, RIGHT)),
        with(&long, |r| (r.truncate, r.truncation_direction) = (true, LEFT)),
        with(&long, |r| (r.truncate, r.truncation_direction, r.dimensions) = (true, LEFT, Some(8))),
    ];
    let before = work(&sim);
    let mut first = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        let (answer, cache) = replica.embed(variant.clone()).await.unwrap();
        assert_eq!(cache.as_deref(), Some("miss"), "variant {i} is no other variant's hit: {variant:?}");
        first.push(answer);
    }
    assert_eq!(work(&sim) - before, variants.len() as u64, "TEI did each variant");
    assert_eq!(first[4].embeddings.len(), 8);
    assert_eq!(first[5].embeddings.len(), 16);
    assert_eq!(first[6].embeddings.len(), 384);
    assert_ne!(first[8].embeddings, first[9].embeddings, "the two sides of a truncation differ");
    assert_eq!(first[10].embeddings.len(), 8);

    let before = work(&sim);
    for (i, variant) in variants.iter().enumerate() {
        let (answer, cache) = replica.embed(variant.clone()).await.unwrap();
        assert_eq!(cache.as_deref(), Some("hit"), "variant {i}");
        assert_eq!(answer.encode_to_vec(), first[i].encode_to_vec(), "variant {i}'s own answer");
    }
    assert_eq!(work(&sim), before);
}

/// TEI's refusals are never cached: an empty input and a text too long without truncation are
/// refused each time they are asked, by TEI each time; an Arrow call's refused row likewise.
#[tokio::test]
async fn errors_are_never_cached() {
    let sim = sim(|config| config.max_batch_tokens = 64).await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, "64Mi")], &[]).await;
    let long = texts("too long", 1, 100).remove(0);
    let stored = || replica.metric("teifleet_cache_stored_total", &[("pool", POOL_NAME), ("tier", "local")]);
    let stored_before = stored().await;

    for text in ["", long.as_str()] {
        let before = work(&sim);
        for round in 0..3 {
            let refused = replica.embed(request(text)).await.unwrap_err();
            assert_eq!(refused.code(), Code::InvalidArgument, "round {round}: {refused:?}");
        }
        assert_eq!(work(&sim) - before, 3, "TEI refused {:.20}… each time", text);
    }
    // A row TEI refuses, beside one it answers, twice: the refusal is TEI's both times.
    let mut manager = TeiMultiplexerClient::new(replica.channel());
    let before = work(&sim);
    for round in 0..2 {
        let answer = manager.embed_arrow(arrow_request(&[Some("fine row"), Some(&long)])).await.unwrap();
        let rows = arrow_rows(&answer.into_inner().arrow_ipc);
        assert_eq!(arrow_error(&rows, 0), None);
        assert!(
            arrow_error(&rows, 1).is_some_and(|e| e.contains("tokens")),
            "round {round}: {:?}",
            arrow_error(&rows, 1)
        );
    }
    assert_eq!(work(&sim) - before, 3, "the fine row once, the refused row both times");
    // Asked with truncation, the same text is answered, and that answer is cached.
    let truncated = v1::EmbedRequest { truncate: true, ..request(&long) };
    let (_, cache) = replica.embed(truncated.clone()).await.unwrap();
    assert_eq!(cache.as_deref(), Some("miss"));
    let (_, cache) = replica.embed(truncated).await.unwrap();
    assert_eq!(cache.as_deref(), Some("hit"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(stored().await - stored_before, 2.0, "only the two answers were stored, no refusal");
}

/// A caller cannot plant an answer: nothing a call sends (a cache header of its own, an answer
/// in its body) is stored, and texts that differ only slightly (a space, a case, a Unicode
/// normalization, a control character) are distinct entries. Every answer, hit or miss, is TEI's
/// vector for that exact text.
#[tokio::test]
async fn a_caller_cannot_poison_the_cache() {
    let sim = sim(|_| {}).await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, "64Mi")], &[]).await;
    let target = "the text an attacker wants to own";

    // Claims of its own: a request header saying hit, an answer in the body.
    let forged = vec![0.5f32; DIMENSIONS];
    let claims = [(CACHE_HEADER, "hit"), ("x-teifleet-cache-answer", "AAAA")];
    let body = json!({ "inputs": [target], "embeddings": [forged.clone()], "data": [{ "embedding": forged.clone() }] });
    let (status, _, answer) = http(replica.http, "/embed", &claims, body).await;
    if status == 200 {
        assert_eq!(vector(&answer[0]), embedding_for(target, DIMENSIONS), "TEI's vector, not the caller's");
    }
    let mut claimed = tonic::Request::new(request(target));
    claimed.metadata_mut().insert(CACHE_HEADER, "hit".parse().unwrap());
    claimed.metadata_mut().insert(teifleet_wire::headers::POOL, POOL_NAME.parse().unwrap());
    let answer = v1::embed_client::EmbedClient::new(replica.channel()).embed(claimed).await.unwrap();
    assert_eq!(answer.get_ref().embeddings, embedding_for(target, DIMENSIONS));
    for round in 0..2 {
        let (answer, _) = replica.embed(request(target)).await.unwrap();
        assert_eq!(answer.embeddings, embedding_for(target, DIMENSIONS), "round {round}");
        let (_, _, answer) = http(replica.http, "/embed", &[], json!({ "inputs": target })).await;
        assert_eq!(vector(&answer[0]), embedding_for(target, DIMENSIONS), "round {round}");
    }

    // Near-duplicates: each its own entry, each TEI's own vector.
    let near = [
        "cafe\u{301} au lait",
        "caf\u{e9} au lait",
        "Caf\u{e9} au lait",
        "caf\u{e9} au lait ",
        "caf\u{e9}\u{0} au lait",
    ];
    let before = work(&sim);
    for round in 0..2 {
        for text in near {
            let (answer, cache) = replica.embed(request(text)).await.unwrap();
            let expected = if round == 0 { "miss" } else { "hit" };
            assert_eq!(cache.as_deref(), Some(expected), "round {round}: {text:?}");
            assert_eq!(answer.embeddings, embedding_for(text, DIMENSIONS), "round {round}: {text:?}");
        }
    }
    assert_eq!(work(&sim) - before, near.len() as u64, "TEI did each near-duplicate once");
}
