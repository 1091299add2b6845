//! `--input-format=openai-batch` end to end on loopback (issue 47): a worker reads OpenAI batch
//! request lines, sends each body to a real multiplexer's `/v1/embeddings` in front of the TEI
//! simulator (384 dimensions), and writes each shard's `part-NNNNNN.jsonl` and
//! `part-NNNNNN.errors.jsonl`. Every custom_id comes out exactly once, answered as the route
//! answers the same body directly, or in the errors file with the contract's code; a resumed run
//! redoes nothing and a redone shard writes the same ids; hostile lines are each their own error.

#[allow(dead_code)] // the support the other test files use too
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use teifleet_job::input::lines::MAX_LINE_BYTES;
use teifleet_job::openai_batch::{BatchClient, BatchSettings};
use teifleet_job::settings::InputFormat;
use teifleet_job::worker::{JobSettings, Summary, Worker};

use support::{MODEL, Pool, Scratch, worker};

/// One line of OpenAI batch input.
fn request(custom_id: &str, body: Value) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}).to_string()
}

/// A worker over `input`, writing to `output`, in shards of `shard_bytes`.
fn batch_worker(pool: &Pool, scratch: &Scratch, shard_bytes: u64, batch: BatchSettings) -> Worker {
    let settings = JobSettings { format: InputFormat::OpenaiBatch, shard_bytes, ..JobSettings::default() };
    let worker = worker(settings, pool.settings(), &scratch.url("in/batch.jsonl"), &scratch.url("out/"));
    worker.with_batch_client(BatchClient::new(batch).expect("batch client"))
}

async fn run(worker: &Worker) -> Summary {
    worker.run(&()).await.expect("the run finishes")
}

/// The shard files of `directory`: (output parts, errors parts), each by name.
fn part_files(directory: &Path) -> (Vec<std::path::PathBuf>, Vec<std::path::PathBuf>) {
    let mut names: Vec<_> = std::fs::read_dir(directory).unwrap().map(|entry| entry.unwrap().path()).collect();
    names.sort();
    let name = |path: &std::path::PathBuf| path.file_name().unwrap().to_string_lossy().into_owned();
    let errors = names.iter().filter(|p| name(p).ends_with(".errors.jsonl")).cloned().collect();
    let outputs = names.iter().filter(|p| name(p).ends_with(".jsonl") && !name(p).ends_with(".errors.jsonl")).cloned();
    (outputs.collect(), errors)
}

/// Every line of the given files, parsed, in file order.
fn lines_of(files: &[std::path::PathBuf]) -> Vec<Value> {
    let mut lines = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "{}: whole lines", file.display());
        lines.extend(text.lines().map(|line| serde_json::from_str::<Value>(line).expect("each line is JSON")));
    }
    lines
}

/// What the multiplexer's `/v1/embeddings` answers `body` directly: status and JSON.
async fn post_directly(pool: &Pool, body: &Value) -> (u16, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = http::Request::post(format!("{}/v1/embeddings", pool.http_url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.expect("the route answers");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).expect("a JSON answer"))
}

/// A corpus of `count` good lines (strings and arrays, base64 and float, some with
/// `dimensions`), with blank lines among them, 3 malformed lines and 1 for another model.
/// Returns the file and each good line's body by custom_id.
fn corpus(count: usize) -> (String, BTreeMap<String, Value>) {
    let mut content = String::new();
    let mut bodies = BTreeMap::new();
    for i in 0..count {
        let input = match i % 3 {
            0 => json!(format!("document {i} about topic {}", i % 11)),
            1 => json!((0..=(i % 4)).map(|j| format!("item {j} of request {i}")).collect::<Vec<_>>()),
            _ => json!([format!("single item array {i}")]),
        };
        let mut body = json!({"model": MODEL, "input": input});
        if i % 5 == 0 {
            body["encoding_format"] = json!("base64");
        }
        if i % 7 == 0 {
            body["dimensions"] = json!(128);
        }
        if i % 13 == 0 {
            body["user"] = json!("tenant-user");
        }
        let custom_id = format!("request-{i}");
        content.push_str(&request(&custom_id, body.clone()));
        content.push('\n');
        bodies.insert(custom_id, body);
        if i % 50 == 25 {
            content.push_str("  \r\n");
        }
        match i {
            40 => content.push_str("this line is not json\n"),
            90 => {
                let line = json!({"custom_id": "bad-url", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "input": "x"}});
                content.push_str(&format!("{line}\n"));
            }
            150 => content.push_str(&format!("{}\n", request("no-input", json!({"model": MODEL})))),
            210 => content.push_str(&format!("{}\n", request("other-model", json!({"model": "gpt-x", "input": "hi"})))),
            _ => {}
        }
    }
    (content, bodies)
}

#[tokio::test]
async fn every_line_is_answered_once_as_the_route_answers_it() {
    let pool = Pool::start(|_| {}).await;
    let scratch = Scratch::new("openai-batch");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let (content, bodies) = corpus(300);
    std::fs::write(scratch.path("in/batch.jsonl"), &content).unwrap();

    let worker = batch_worker(&pool, &scratch, 8 << 10, BatchSettings::new(pool.http_url(), MODEL));
    // Spawned, as the binary's runtime may run it: the run's future is Send.
    let summary = tokio::spawn(async move { worker.run(&()).await }).await.unwrap().expect("the run finishes");
    assert!(summary.shards > 3, "several shards: {summary}");
    assert_eq!((summary.rows, summary.failed, summary.resumed), (304, 4, 0), "{summary}");

    let (outputs, errors) = part_files(&scratch.path("out"));
    assert_eq!(outputs.len(), summary.shards as usize);
    assert_eq!(errors.len(), summary.shards as usize, "an errors file for every shard, empty or not");
    let answered = lines_of(&outputs);
    let failed = lines_of(&errors);

    // Every custom_id exactly once across both, every id distinct and of the contract's shape.
    let mut seen = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for line in answered.iter().chain(&failed) {
        let id = line["id"].as_str().unwrap();
        assert!(id.starts_with("batch_req_") && id.len() == 34, "{id}");
        assert!(ids.insert(id.to_owned()), "id {id} twice");
        if let Some(custom_id) = line["custom_id"].as_str() {
            assert!(seen.insert(custom_id.to_owned()), "{custom_id} twice");
        }
    }
    let expected: BTreeSet<String> =
        bodies.keys().cloned().chain(["bad-url", "no-input", "other-model"].map(String::from)).collect();
    assert_eq!(seen, expected);

    // In input order within the output files (numbered requests only there).
    let order: Vec<usize> = answered
        .iter()
        .map(|line| line["custom_id"].as_str().unwrap().trim_start_matches("request-").parse().unwrap())
        .collect();
    assert!(order.windows(2).all(|pair| pair[0] < pair[1]), "in input order");

    // The bad lines, with the contract's codes.
    let codes: BTreeMap<Option<String>, (String, String)> = failed
        .iter()
        .map(|line| {
            assert!(line["response"].is_null(), "{line}");
            let error = &line["error"];
            let key = line["custom_id"].as_str().map(String::from);
            (key, (error["code"].as_str().unwrap().to_owned(), error["message"].as_str().unwrap().to_owned()))
        })
        .collect();
    assert_eq!(codes.len(), 4, "{codes:?}");
    assert_eq!(codes[&None].0, "invalid_request", "not JSON: no custom_id");
    let at = content.find("this line is not json").unwrap();
    let place = format!("(the line at byte {at} of {})", scratch.url("in/batch.jsonl"));
    assert!(codes[&None].1.ends_with(&place), "where it is: {}", codes[&None].1);
    assert_eq!(codes[&Some("bad-url".into())].0, "invalid_request");
    assert!(codes[&Some("bad-url".into())].1.contains("/v1/chat/completions"));
    assert_eq!(codes[&Some("no-input".into())].0, "invalid_request");
    assert!(codes[&Some("no-input".into())].1.contains("input"));
    assert_eq!(codes[&Some("other-model".into())].0, "model_not_found");

    // Each answer is the route's own for the same body, with its usage.
    for line in &answered {
        assert!(line["error"].is_null());
        let response = &line["response"];
        assert_eq!(response["status_code"], 200);
        assert_eq!(response["request_id"].as_str().unwrap().len(), 32);
        let body = &bodies[line["custom_id"].as_str().unwrap()];
        let (status, direct) = post_directly(&pool, body).await;
        assert_eq!(status, 200);
        assert_eq!(response["body"]["data"], direct["data"], "{}", line["custom_id"]);
        assert_eq!(response["body"]["model"], direct["model"]);
        assert!(response["body"]["usage"]["prompt_tokens"].as_u64().is_some(), "usage: {}", response["body"]);
        let inputs = body["input"].as_array().map_or(1, Vec::len);
        assert_eq!(direct["data"].as_array().unwrap().len(), inputs);
        if body["encoding_format"] == "base64" {
            assert!(direct["data"][0]["embedding"].is_string());
        } else {
            let size = if body["dimensions"] == 128 { 128 } else { 384 };
            assert_eq!(direct["data"][0]["embedding"].as_array().unwrap().len(), size);
        }
    }
}

#[tokio::test]
async fn a_resumed_run_redoes_nothing_and_a_redone_shard_writes_the_same_ids() {
    let pool = Pool::start(|_| {}).await;
    let scratch = Scratch::new("openai-batch-resume");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let (content, _) = corpus(120);
    std::fs::write(scratch.path("in/batch.jsonl"), &content).unwrap();
    let settings = || BatchSettings::new(pool.http_url(), MODEL);

    let first = run(&batch_worker(&pool, &scratch, 4 << 10, settings())).await;
    assert!(first.shards > 2, "{first}");
    let snapshot = |scratch: &Scratch| {
        let (outputs, errors) = part_files(&scratch.path("out"));
        outputs.iter().chain(&errors).map(|path| (path.clone(), std::fs::read(path).unwrap())).collect::<Vec<_>>()
    };
    let written = snapshot(&scratch);

    // Every part there: nothing is sent, and the counts come back the same.
    let again = run(&batch_worker(&pool, &scratch, 4 << 10, settings())).await;
    assert_eq!((again.resumed, again.calls, again.rows_this_run), (first.shards, 0, 0), "{again}");
    assert_eq!((again.rows, again.failed), (first.rows, first.failed));

    // One shard's output gone (its errors file left, as a run stopped between the two leaves
    // it): that shard alone is redone, into the same bytes, ids included.
    std::fs::remove_file(scratch.path("out/part-000001.jsonl")).unwrap();
    let redone = run(&batch_worker(&pool, &scratch, 4 << 10, settings())).await;
    assert_eq!(redone.resumed, first.shards - 1, "{redone}");
    assert!(redone.calls > 0);
    assert_eq!((redone.rows, redone.failed), (first.rows, first.failed));
    assert_eq!(snapshot(&scratch), written, "the redone shard's files are the same, byte for byte");
}

#[tokio::test]
async fn hostile_lines_are_each_their_own_error() {
    let pool = Pool::start(|_| {}).await;
    let scratch = Scratch::new("openai-batch-hostile");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let mut content = String::new();
    content.push_str(&request("good-1", json!({"model": MODEL, "input": "a good line"})));
    content.push('\n');
    // A line over the line bound: never held, its own error (its custom_id unread).
    let long_input = "a".repeat(MAX_LINE_BYTES as usize + (1 << 20));
    content.push_str(&request("too-long", json!({"model": MODEL, "input": long_input})));
    content.push('\n');
    // More inputs than the pool takes in one request: the pool's 413 is the line's answer.
    let many: Vec<String> = (0..2049).map(|i| format!("t{i}")).collect();
    content.push_str(&request("too-many", json!({"model": MODEL, "input": many})));
    content.push('\n');
    // An answer over the worker's bound (set to 1 MiB here; 400 vectors of 384 floats are more).
    let large: Vec<String> = (0..400).map(|i| format!("text {i}")).collect();
    content.push_str(&request("large-answer", json!({"model": MODEL, "input": large})));
    content.push('\n');
    content.push_str(&request("good-2", json!({"model": MODEL, "input": ["b", "c"]})));
    content.push('\n');
    std::fs::write(scratch.path("in/batch.jsonl"), &content).unwrap();

    let settings = BatchSettings { max_answer_bytes: 1 << 20, ..BatchSettings::new(pool.http_url(), MODEL) };
    let summary = run(&batch_worker(&pool, &scratch, 8 << 20, settings)).await;
    assert_eq!((summary.rows, summary.failed), (5, 3), "{summary}");

    let (outputs, errors) = part_files(&scratch.path("out"));
    let answered: Vec<String> =
        lines_of(&outputs).iter().map(|line| line["custom_id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(answered, ["good-1", "good-2"]);
    let failed = lines_of(&errors);
    assert_eq!(failed.len(), 3, "{failed:?}");

    assert!(failed[0]["custom_id"].is_null(), "the long line's id is never read");
    assert_eq!(failed[0]["error"]["code"], "invalid_request");
    assert!(failed[0]["error"]["message"].as_str().unwrap().contains("over the"), "{}", failed[0]);

    assert_eq!(failed[1]["custom_id"], "too-many");
    assert!(failed[1]["error"].is_null());
    assert_eq!(failed[1]["response"]["status_code"], 413, "{}", failed[1]);
    assert!(failed[1]["response"]["body"].is_object(), "the pool's error JSON: {}", failed[1]);

    assert_eq!(failed[2]["custom_id"], "large-answer");
    assert_eq!(failed[2]["error"]["code"], "response_too_large", "{}", failed[2]);
}

/// A sink that keeps the last progress and asks the worker to stop once a shard is recorded, as
/// SIGTERM does when a batch is cancelled.
struct StopAfterFirstShard {
    stop: tokio_util::sync::CancellationToken,
    last: std::sync::Mutex<Option<(u32, u64)>>,
}

impl teifleet_job::progress::ProgressSink for StopAfterFirstShard {
    async fn report(&self, progress: &teifleet_job::progress::WorkerProgress) -> teifleet_job::Result<()> {
        *self.last.lock().unwrap() = Some((progress.shards_done, progress.rows));
        if progress.shards_done >= 1 {
            self.stop.cancel();
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_stopped_worker_begins_no_shard_and_every_part_written_is_recorded() {
    let pool = Pool::start(|_| {}).await;
    let scratch = Scratch::new("openai-batch-stop");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let (content, _) = corpus(120);
    std::fs::write(scratch.path("in/batch.jsonl"), &content).unwrap();
    let total = content.lines().filter(|line| !line.trim().is_empty()).count() as u64;
    let worker = batch_worker(&pool, &scratch, 4 << 10, BatchSettings::new(pool.http_url(), MODEL));
    let sink = StopAfterFirstShard { stop: tokio_util::sync::CancellationToken::new(), last: Default::default() };

    let error = worker.run_until(&sink, &sink.stop).await.expect_err("stopped before its end");
    assert!(matches!(error, teifleet_job::Error::Stopped { .. }), "{error}");
    let (shards_done, rows) = sink.last.lock().unwrap().expect("progress reported");
    let (outputs, _) = part_files(&scratch.path("out"));
    assert_eq!(outputs.len() as u32, shards_done, "the parts on the store are the shards recorded, no more");
    assert_eq!(lines_of(&outputs).len() as u64 + lines_of(&part_files(&scratch.path("out")).1).len() as u64, rows);
    assert!(rows < total, "it stopped before the end");

    // The next run finishes the rest.
    let rest = run(&batch_worker(&pool, &scratch, 4 << 10, BatchSettings::new(pool.http_url(), MODEL))).await;
    assert_eq!((rest.resumed, rest.rows), (shards_done, total), "{rest}");
}
