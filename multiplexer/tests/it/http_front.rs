//! The HTTP front over real HTTP/1.1 on loopback, in front of the TEI simulator: every route
//! answers what the gRPC path answers, batches over TEI's cap are split and put back in order,
//! and errors carry TEI's status codes and bodies.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use serde_json::{Value, json};
use teifleet_multiplexer::front::http::HttpSettings;
use teifleet_multiplexer::run::server::{Running, Settings};
use teifleet_proto::v1::{self, rerank_client::RerankClient};
use teifleet_tei_sim::{SimHandle, embedding_for};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const DIMENSIONS: usize = 384;

pub(crate) struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 exchange on its own connection: no client library between the test and the wire.
pub(crate) async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connects");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    // A server refusing a large body may close before reading all of it.
    let _ = stream.write_all(body).await;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw)).await.expect("answers").ok();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers =
        lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_owned())).collect();
    let body = &raw[split + 4..];
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into()))
    };
    Answer { status, headers, body }
}

pub(crate) async fn post(addr: SocketAddr, path: &str, body: Value) -> Answer {
    request(addr, "POST", path, &[], body.to_string().as_bytes()).await
}

pub(crate) async fn front(
    limits: teifleet_multiplexer::admission::Limits,
    sim: &SimHandle,
    http: HttpSettings,
) -> Running {
    let settings = Settings { http_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))), http, ..Settings::default() };
    mux_with(vec![spec("pool-a", sim.addr(), limits)], settings).await.0
}

fn vector(value: &Value) -> Vec<f32> {
    value.as_array().expect("a vector").iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
}

fn from_base64(text: &str) -> Vec<f32> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut bytes = Vec::new();
    for group in text.trim_end_matches('=').as_bytes().chunks(4) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, &c)| n | (u32::from(value(c)) << (18 - 6 * i)));
        bytes.extend_from_slice(&n.to_be_bytes()[1..group.len()]);
    }
    bytes.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[tokio::test]
async fn every_route_answers_what_grpc_answers() {
    let sim = sim(|_| {}).await;
    let mux = front(limits(16, 64), &sim, HttpSettings::default()).await;
    let http = mux.http_addr.expect("the HTTP front listens");

    // /embed: a string or a list, always a list of vectors, equal to the gRPC path's.
    let one = post(http, "/embed", json!({"inputs": "hello world"})).await;
    assert_eq!(one.status, 200, "{}", one.body);
    let mut grpc = embed_client(mux.grpc_addr).await;
    let grpc_vector = grpc.embed(embed_request("hello world")).await.unwrap().into_inner().embeddings;
    assert!(close(&vector(&one.body[0]), &grpc_vector));
    assert!(close(&grpc_vector, &embedding_for("hello world", DIMENSIONS)));
    let many = post(http, "/embed", json!({"inputs": ["a", "b", "c"], "normalize": true})).await;
    assert_eq!(many.body.as_array().unwrap().len(), 3);
    for (i, text) in ["a", "b", "c"].iter().enumerate() {
        assert!(close(&vector(&many.body[i]), &embedding_for(text, DIMENSIONS)), "input {i} in order");
    }
    let small = post(http, "/embed", json!({"inputs": "a", "dimensions": 8})).await;
    assert!(close(&vector(&small.body[0]), &embedding_for("a", 8)));

    // /embed_sparse and /embed_all, equal to their gRPC calls.
    let mut client = v1::embed_client::EmbedClient::new(channel(mux.grpc_addr).await);
    let sparse = post(http, "/embed_sparse", json!({"inputs": ["sparse text"]})).await;
    assert_eq!(sparse.status, 200, "{}", sparse.body);
    let want = client
        .embed_sparse(v1::EmbedSparseRequest { inputs: "sparse text".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let got = sparse.body[0].as_array().unwrap();
    assert_eq!(got.len(), want.sparse_embeddings.len());
    assert_eq!(got[0]["index"], json!(want.sparse_embeddings[0].index));
    let all = post(http, "/embed_all", json!({"inputs": "two words"})).await;
    assert_eq!(all.status, 200, "{}", all.body);
    let want = client
        .embed_all(v1::EmbedAllRequest { inputs: "two words".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.body[0].as_array().unwrap().len(), want.token_embeddings.len());
    assert!(close(&vector(&all.body[0][0]), &want.token_embeddings[0].embeddings));

    // /predict: one text, one pair, a batch.
    let single = post(http, "/predict", json!({"inputs": "great"})).await;
    assert_eq!(single.status, 200, "{}", single.body);
    assert!(single.body[0]["label"].is_string() && single.body[0]["score"].is_number(), "{}", single.body);
    let pair = post(http, "/predict", json!({"inputs": ["a question", "an answer"]})).await;
    assert!(pair.body[0]["label"].is_string(), "{}", pair.body);
    let batch = post(http, "/predict", json!({"inputs": ["one", "two", "three"]})).await;
    assert_eq!(batch.body.as_array().unwrap().len(), 3, "{}", batch.body);
    assert!(batch.body[0][0]["label"].is_string());

    // /rerank, equal to gRPC's, and over the cap (the simulator refuses 33 texts in one call).
    let texts: Vec<String> = (0..40).map(|i| format!("text {i} about cats")).collect();
    let ranked = post(http, "/rerank", json!({"query": "cats", "texts": texts[..3], "return_text": true})).await;
    assert_eq!(ranked.status, 200, "{}", ranked.body);
    let want = RerankClient::new(channel(mux.grpc_addr).await)
        .rerank(v1::RerankRequest {
            query: "cats".into(),
            texts: texts[..3].to_vec(),
            return_text: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for (got, want) in ranked.body.as_array().unwrap().iter().zip(&want.ranks) {
        assert_eq!(got["index"], json!(want.index));
        assert_eq!(got["text"], json!(want.text));
    }
    let wide = post(http, "/rerank", json!({"query": "cats", "texts": texts})).await;
    assert_eq!(wide.status, 200, "{}", wide.body);
    let ranks = wide.body.as_array().unwrap();
    let mut indices: Vec<u64> = ranks.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert!(ranks.windows(2).all(|w| w[0]["score"].as_f64() >= w[1]["score"].as_f64()), "sorted by score");
    assert!(ranks[0].get("text").is_none(), "no text unless asked");
    indices.sort_unstable();
    assert_eq!(indices, (0..40).collect::<Vec<u64>>());

    // /tokenize and /decode.
    let tokens = post(http, "/tokenize", json!({"inputs": ["hello world", "x"]})).await;
    assert_eq!(tokens.status, 200, "{}", tokens.body);
    assert_eq!(tokens.body.as_array().unwrap().len(), 2);
    let ids: Vec<Value> = tokens.body[0].as_array().unwrap().iter().map(|t| t["id"].clone()).collect();
    let decoded = post(http, "/decode", json!({"ids": ids})).await;
    assert_eq!(decoded.status, 200, "{}", decoded.body);
    assert!(decoded.body[0].is_string());

    // /info, /health, and POST / dispatched by the model type (an embedding model).
    let info = request(http, "GET", "/info", &[], b"").await;
    assert_eq!(info.body["model_id"], json!(MODEL), "{}", info.body);
    assert_eq!(info.body["max_client_batch_size"], json!(32));
    until("ready", Duration::from_secs(5), || mux.readiness.ready().is_ok()).await;
    assert_eq!(request(http, "GET", "/health", &[], b"").await.status, 200);
    let root = post(http, "/", json!({"inputs": "hello world"})).await;
    assert!(close(&vector(&root.body[0]), &grpc_vector));

    // OpenAI, on both paths, float and base64, with TEI's token counts.
    for path in ["/v1/embeddings", "/embeddings"] {
        let float = post(http, path, json!({"input": ["a", "b"], "model": "m"})).await;
        assert_eq!(float.status, 200, "{}", float.body);
        assert_eq!(float.body["object"], "list");
        assert_eq!(float.body["model"], "m");
        assert_eq!(float.body["data"][1]["index"], 1);
        assert!(close(&vector(&float.body["data"][1]["embedding"]), &embedding_for("b", DIMENSIONS)));
        assert!(float.body["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{}", float.body);
        let b64 = post(http, path, json!({"input": "a", "encoding_format": "base64"})).await;
        assert_eq!(b64.body["model"], json!(MODEL), "the model TEI serves when none is named");
        assert!(close(
            &from_base64(b64.body["data"][0]["embedding"].as_str().unwrap()),
            &embedding_for("a", DIMENSIONS)
        ));
    }
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_thousand_texts_over_a_cap_of_32_are_split_and_kept_in_order() {
    let sim = sim(|_| {}).await;
    let mux = front(limits(64, 64), &sim, HttpSettings::default()).await;
    let texts: Vec<String> = (0..1000).map(|i| format!("text number {i}")).collect();
    let answer = post(mux.http_addr.unwrap(), "/embed", json!({"inputs": texts})).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let vectors = answer.body.as_array().unwrap();
    assert_eq!(vectors.len(), 1000);
    for (i, text) in texts.iter().enumerate() {
        assert!(close(&vector(&vectors[i]), &embedding_for(text, DIMENSIONS)), "input {i} in its place");
    }
    let text = metrics_text(&mux);
    assert_eq!(
        metric(
            &text,
            r#"teifleet_requests_total{code="Ok",outcome="ok",pool="pool-a",priority="standard",protocol="http",rpc="Embed"}"#
        ),
        Some(1.0),
        "one request, however many chunks"
    );
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test]
async fn similarity_is_the_cosine_of_the_embeddings_and_one_admitted_request() {
    let sim = sim(|_| {}).await;
    let mux = front(limits(16, 64), &sim, HttpSettings::default()).await;
    let http = mux.http_addr.unwrap();
    // More sentences than one TEI call takes: split like an /embed batch, scores in order.
    let sentences: Vec<String> = (0..40).map(|i| format!("sentence {i}")).collect();
    let mut all = vec!["the source".to_owned()];
    all.extend(sentences.iter().cloned());
    all.push("the source".into());
    let answer =
        post(http, "/similarity", json!({"inputs": {"source_sentence": "the source", "sentences": all[1..]}})).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let scores = vector(&answer.body);
    assert_eq!(scores.len(), 41);
    let source = embedding_for("the source", DIMENSIONS);
    for (i, text) in sentences.iter().enumerate() {
        let want = dot(&source, &embedding_for(text, DIMENSIONS));
        assert!((scores[i] - want).abs() < 1e-5, "sentence {i}: {} vs {want}", scores[i]);
    }
    assert!((scores[40] - 1.0).abs() < 1e-5, "the source against itself: {}", scores[40]);

    // TEI's parameters are accepted; POST / takes the same body (huggingface_hub's
    // sentence_similarity posts it there) and still embeds a plain one.
    let body = json!({
        "inputs": {"source_sentence": "a", "sentences": ["b"]},
        "parameters": {"truncate": true, "truncation_direction": "Left", "prompt_name": null}
    });
    let with_parameters = post(http, "/similarity", body.clone()).await;
    assert_eq!(with_parameters.status, 200, "{}", with_parameters.body);
    let want = dot(&embedding_for("a", DIMENSIONS), &embedding_for("b", DIMENSIONS));
    assert!((vector(&with_parameters.body)[0] - want).abs() < 1e-5);
    let root = post(http, "/", body).await;
    assert_eq!((root.status, vector(&root.body).len()), (200, 1), "{}", root.body);
    assert_eq!(post(http, "/", json!({"inputs": "a"})).await.body.as_array().map(Vec::len), Some(1));

    // TEI's refusals: no sentences, an empty text, the wrong shape.
    let none = post(http, "/similarity", json!({"inputs": {"source_sentence": "a", "sentences": []}})).await;
    assert_eq!((none.status, none.body["error_type"].as_str()), (400, Some("Empty")), "{}", none.body);
    assert!(none.body["error"].as_str().unwrap().contains("`inputs.sentences` cannot be empty"));
    let blank = post(http, "/similarity", json!({"inputs": {"source_sentence": "", "sentences": ["b"]}})).await;
    assert_eq!(blank.status, 400, "{}", blank.body);
    let wrong = post(http, "/similarity", json!({"inputs": ["a", "b"]})).await;
    assert_eq!((wrong.status, wrong.body["error_type"].as_str()), (422, Some("Validation")), "{}", wrong.body);

    // Counted as Embed requests on the HTTP front, beside gRPC's own series.
    embed_client(mux.grpc_addr).await.embed(embed_request("over gRPC")).await.unwrap();
    let text = metrics_text(&mux);
    let series = |protocol: &str| {
        format!(
            "teifleet_requests_total{{code=\"Ok\",outcome=\"ok\",pool=\"pool-a\",priority=\"standard\",protocol=\"{protocol}\",rpc=\"Embed\"}}"
        )
    };
    assert_eq!(metric(&text, &series("http")), Some(4.0), "three /similarity and one embed through /: {text}");
    assert_eq!(metric(&text, &series("grpc")), Some(1.0), "{text}");
    let whole = "teifleet_request_duration_seconds_count{pool=\"pool-a\",priority=\"standard\",protocol=\"http\"}";
    assert!(metric(&text, whole).unwrap_or(0.0) >= 4.0, "{text}");
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn errors_have_tei_codes_and_bodies() {
    let sim = sim(|_| {}).await;
    let http = HttpSettings { payload_limit: 10_000, ..HttpSettings::default() };
    let mux = front(limits(16, 64), &sim, http).await;
    let http = mux.http_addr.unwrap();

    for empty in [json!({"inputs": ""}), json!({"inputs": []}), json!({"inputs": ["a", ""]})] {
        let answer = post(http, "/embed", empty).await;
        assert_eq!(answer.status, 400, "{}", answer.body);
        assert_eq!(answer.body["error_type"], "Empty");
        assert_eq!(answer.body["error"], "Input validation error: `inputs` cannot be empty");
    }
    let answer = post(http, "/rerank", json!({"query": "q", "texts": []})).await;
    assert_eq!((answer.status, answer.body["error_type"].as_str()), (400, Some("Empty")));

    for wrong in [json!({"inputs": 5}), json!({"texts": ["a"]}), json!({"inputs": "a", "normalize": "yes"})] {
        let answer = post(http, "/embed", wrong).await;
        assert_eq!(answer.status, 422, "{}", answer.body);
        assert_eq!(answer.body["error_type"], "Validation");
    }
    // Not JSON at all: 400, as TEI's axum answers a syntax error.
    let answer = request(http, "POST", "/embed", &[], b"{not json").await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body["error"].as_str().unwrap().starts_with("Failed to parse the request body as JSON"));

    let big = json!({"inputs": "x".repeat(20_000)});
    let answer = post(http, "/embed", big).await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert_eq!(answer.body["error_type"], "Validation");

    // Validation upstream (the simulator's dimension check) is TEI's 422.
    let answer = post(http, "/embed", json!({"inputs": "a", "dimensions": 100000})).await;
    assert_eq!(answer.status, 422, "{}", answer.body);

    // Routing and priority headers, as on gRPC.
    let body = json!({"inputs": "a"}).to_string();
    let answer = request(http, "POST", "/embed", &[("x-teifleet-priority", "urgent")], body.as_bytes()).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    let answer = request(http, "POST", "/embed", &[("x-teifleet-pool", "nope")], body.as_bytes()).await;
    assert_eq!(answer.status, 404, "{}", answer.body);
    let answer = request(http, "POST", "/embed", &[("x-teifleet-timeout-ms", "soon")], body.as_bytes()).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    let answer = request(http, "POST", "/embed", &[("x-teifleet-priority", "critical")], body.as_bytes()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    // OpenAI's route answers in its own shape.
    let answer = post(http, "/v1/embeddings", json!({"input": []})).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.body["type"], "Empty");
    assert_eq!(answer.body["code"], 400);
    assert!(answer.body["message"].is_string());
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn overload_is_429_with_retry_after_and_a_deadline_is_kept() {
    let sim = sim(|c| c.fixed_latency = Duration::from_millis(600)).await;
    let mux = front(limits(1, 0), &sim, HttpSettings::default()).await;
    let http = mux.http_addr.unwrap();
    let busy = tokio::spawn(async move { post(http, "/embed", json!({"inputs": "slow"})).await.status });
    until("the first call holds the permit", Duration::from_secs(5), || sim.stats().in_flight == 1).await;

    // A request with a short deadline is told at once (one without would wait at the door).
    let hurried = [("x-teifleet-timeout-ms", "100")];
    let turned_away = json!({"inputs": "turned away"}).to_string();
    let refused = request(http, "POST", "/embed", &hurried, turned_away.as_bytes()).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["error_type"], "Overloaded");
    let seconds: u64 = refused.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!(seconds >= 1);
    assert!(refused.header("grpc-retry-pushback-ms").is_some());
    let openai_body = json!({"input": "turned away"}).to_string();
    let openai = request(http, "POST", "/v1/embeddings", &hurried, openai_body.as_bytes()).await;
    assert_eq!((openai.status, openai.body["type"].as_str()), (429, Some("Overloaded")));
    assert!(openai.header("retry-after").is_some());
    assert_eq!(busy.await.unwrap(), 200);

    // A timeout shorter than TEI's answer: the multiplexer answers in time, never hangs.
    let started = std::time::Instant::now();
    let body = json!({"inputs": "slow again"}).to_string();
    let late = request(http, "POST", "/embed", &[("x-teifleet-timeout-ms", "200")], body.as_bytes()).await;
    assert_eq!(late.status, 504, "{}", late.body);
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    mux.shutdown().await.unwrap();
    sim.shutdown().await;
}
