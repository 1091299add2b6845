//! The Batches API over real HTTP against an in-memory cluster: a batch becomes the EmbeddingJob
//! the contract names, reads back as OpenAI's Batch as the job moves, cancels, and serves its
//! output and error files from the parts its workers write.

mod support;

use hyper::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};
use support::{KEY_A, KEY_B, TestServer, request_line};
use teifleet_batch::server::Limits;
use teifleet_crds::{EmbeddingJobStatus, InputFormat};

const POOLS: [(&str, &str); 2] = [("bge", "BAAI/bge-small-en-v1.5"), ("e5", "intfloat/e5-small-v2")];

async fn upload(server: &TestServer, key: &str, lines: &[String]) -> String {
    let content = lines.join("\n") + "\n";
    let answer = server.upload(key, "batch", content.as_bytes()).await;
    assert_eq!(answer.status, StatusCode::OK);
    answer.json()["id"].as_str().unwrap().to_owned()
}

fn create_body(file: &str) -> Value {
    json!({ "input_file_id": file, "endpoint": "/v1/embeddings", "completion_window": "24h", "metadata": { "run": "nightly" } })
}

fn condition(kind: &str, status: &str, reason: &str) -> Condition {
    Condition {
        type_: kind.into(),
        status: status.into(),
        reason: reason.into(),
        message: format!("{reason}."),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: None,
    }
}

#[tokio::test]
async fn a_batch_is_an_embedding_job_and_reads_back_as_it_runs() {
    let server = TestServer::start(Limits::default(), &POOLS).await;
    let lines = vec![
        request_line("a", "BAAI/bge-small-en-v1.5", "one"),
        request_line("b", "BAAI/bge-small-en-v1.5", "two"),
        request_line("c", "intfloat/e5-small-v2", "three"),
        "not json".to_owned(),
    ];
    let file = upload(&server, KEY_A, &lines).await;
    let created = server.post_json("/v1/batches", KEY_A, &create_body(&file)).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.body);
    let batch = created.json();
    let id = batch["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("batch_") && id.len() == 30, "{id}");
    assert_eq!((batch["object"].as_str(), batch["status"].as_str()), (Some("batch"), Some("in_progress")));
    assert_eq!(
        (batch["input_file_id"].as_str(), batch["endpoint"].as_str()),
        (Some(file.as_str()), Some("/v1/embeddings"))
    );
    assert_eq!(batch["request_counts"], json!({ "total": 4, "completed": 0, "failed": 0 }));
    assert_eq!(batch["metadata"], json!({ "run": "nightly" }));
    assert_eq!(batch["expires_at"].as_i64().unwrap() - batch["created_at"].as_i64().unwrap(), 86_400);
    assert!(batch["output_file_id"].is_null() && batch["error_file_id"].is_null());

    // The job: the most common model's pool, the file in the server's store, the contract's
    // labels and annotations.
    let job_name = format!("batch-{}", &id["batch_".len()..]);
    let job = server.cluster.job(&job_name).expect("the job was created");
    assert_eq!(job.spec.pool_ref.name, "bge");
    assert_eq!(job.spec.input.format, InputFormat::OpenaiBatch);
    assert_eq!(job.spec.input.path.as_deref(), Some(format!("files/{file}/content").as_str()));
    assert_eq!(job.spec.input.store.pvc.as_ref().unwrap().path, "api");
    assert_eq!(job.spec.output.store.pvc.as_ref().unwrap().path, format!("api/batches/{id}/"));
    assert_eq!((job.spec.deadline.as_deref(), job.spec.workers, job.spec.suspend), (Some("24h"), 2, false));
    let labels = job.metadata.labels.clone().unwrap();
    assert_eq!((labels["teifleet.dev/batch"].as_str(), labels["teifleet.dev/tenant"].as_str()), (id.as_str(), "a"));
    let annotations = job.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["teifleet.dev/batch-input-file"], file);
    assert_eq!(annotations["teifleet.dev/batch-requests"], "4");
    assert_eq!(annotations["teifleet.dev/batch-metadata"], r#"{"run":"nightly"}"#);

    assert_eq!(server.get(&format!("/v1/batches/{id}"), KEY_A).await.json(), batch);
    let list = server.get("/v1/batches", KEY_A).await.json();
    assert_eq!(
        (list["object"].as_str(), list["first_id"].as_str(), list["has_more"].as_bool()),
        (Some("list"), Some(id.as_str()), Some(false))
    );

    // Another tenant: not found, as a batch that does not exist.
    let theirs = server.get(&format!("/v1/batches/{id}"), KEY_B).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    assert_eq!(theirs.error().0, format!("No batch found with id '{id}'."));
    assert_eq!(server.get("/v1/batches/batch_000000000000000000000000", KEY_B).await.status, StatusCode::NOT_FOUND);
    assert_eq!(server.get("/v1/batches", KEY_B).await.json()["data"], json!([]));
    assert_eq!(
        server.post_json(&format!("/v1/batches/{id}/cancel"), KEY_B, &json!({})).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(server.get(&format!("/v1/files/{id}-output/content"), KEY_B).await.status, StatusCode::NOT_FOUND);

    // The workers write their parts; the operator says the job completed.
    let out = server.dir.path().join(format!("batches/{id}"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("part-000000.errors.jsonl"), "e0\n").unwrap();
    std::fs::write(out.join("part-000000.jsonl"), "o0a\no0b\n").unwrap();
    std::fs::write(out.join("part-000001.errors.jsonl"), "").unwrap();
    std::fs::write(out.join("part-000001.jsonl"), "o1\n").unwrap();
    std::fs::write(out.join("part-000002.errors.jsonl"), "unfinished shard\n").unwrap();
    server.cluster.set_status(
        &job_name,
        EmbeddingJobStatus {
            rows_done: 4,
            rows_failed: 1,
            conditions: vec![condition("Running", "False", "Completed"), condition("Complete", "True", "Completed")],
            ..EmbeddingJobStatus::default()
        },
    );
    let done = server.get(&format!("/v1/batches/{id}"), KEY_A).await.json();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["request_counts"], json!({ "total": 4, "completed": 3, "failed": 1 }));
    assert_eq!(done["output_file_id"], format!("{id}-output"));
    assert_eq!(done["error_file_id"], format!("{id}-errors"));
    let output = server.get(&format!("/v1/files/{id}-output/content"), KEY_A).await;
    assert_eq!((output.status, &output.body[..]), (StatusCode::OK, &b"o0a\no0b\no1\n"[..]));
    let errors = server.get(&format!("/v1/files/{id}-errors/content"), KEY_A).await;
    assert_eq!(&errors.body[..], b"e0\n", "only finished shards' errors, in order");
    let output_file = server.get(&format!("/v1/files/{id}-output"), KEY_A).await.json();
    assert_eq!((output_file["bytes"].as_u64(), output_file["purpose"].as_str()), (Some(11), Some("batch_output")));

    let cancel = server.post_json(&format!("/v1/batches/{id}/cancel"), KEY_A, &json!({})).await;
    assert_eq!(cancel.status, StatusCode::CONFLICT);
    assert_eq!(cancel.error().0, "Cannot cancel a batch with status 'completed'.");
}

#[tokio::test]
async fn cancel_suspends_the_job_once_and_reads_cancelled_when_workers_stop() {
    let server = TestServer::start(Limits::default(), &POOLS).await;
    let file = upload(&server, KEY_A, &[request_line("a", "intfloat/e5-small-v2", "x")]).await;
    let id =
        server.post_json("/v1/batches", KEY_A, &create_body(&file)).await.json()["id"].as_str().unwrap().to_owned();
    let job_name = format!("batch-{}", &id["batch_".len()..]);
    assert_eq!(server.cluster.job(&job_name).unwrap().spec.pool_ref.name, "e5");

    let cancelling = server.post_json(&format!("/v1/batches/{id}/cancel"), KEY_A, &json!({})).await.json();
    assert_eq!(cancelling["status"], "cancelling");
    let at = cancelling["cancelling_at"].as_i64().unwrap();
    let job = server.cluster.job(&job_name).unwrap();
    assert!(job.spec.suspend);
    assert_eq!(job.metadata.annotations.unwrap()["teifleet.dev/batch-cancelling-at"], at.to_string());
    let again = server.post_json(&format!("/v1/batches/{id}/cancel"), KEY_A, &json!({})).await.json();
    assert_eq!(
        (again["status"].as_str(), again["cancelling_at"].as_i64()),
        (Some("cancelling"), Some(at)),
        "idempotent"
    );

    server.cluster.set_status(
        &job_name,
        EmbeddingJobStatus {
            rows_done: 0,
            conditions: vec![condition("Running", "False", "Suspended")],
            ..EmbeddingJobStatus::default()
        },
    );
    let cancelled = server.get(&format!("/v1/batches/{id}"), KEY_A).await.json();
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["cancelled_at"].as_i64().unwrap() >= at);
    assert_eq!(cancelled["output_file_id"], format!("{id}-output"));
    let output = server.get(&format!("/v1/files/{id}-output/content"), KEY_A).await;
    assert_eq!((output.status, output.body.len()), (StatusCode::OK, 0), "no part yet: an empty file");
}

#[tokio::test]
async fn batches_are_refused_as_openai_refuses_them() {
    let server = TestServer::start(Limits::default(), &POOLS).await;
    let good = upload(&server, KEY_A, &[request_line("a", "BAAI/bge-small-en-v1.5", "x")]).await;
    let duplicate = upload(
        &server,
        KEY_A,
        &[
            request_line("same", "BAAI/bge-small-en-v1.5", "x"),
            request_line("other", "BAAI/bge-small-en-v1.5", "y"),
            request_line("same", "BAAI/bge-small-en-v1.5", "z"),
        ],
    )
    .await;
    let unknown = upload(&server, KEY_A, &[request_line("a", "no/such-model", "x")]).await;
    let theirs = upload(&server, KEY_B, &[request_line("a", "BAAI/bge-small-en-v1.5", "x")]).await;
    let nothing = upload(&server, KEY_A, &["{\"custom_id\":\"a\"}".to_owned()]).await;

    let refused = |body: Value| {
        let server = &server;
        async move {
            let answer = server.post_json("/v1/batches", KEY_A, &body).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {:?}", answer.body);
            answer.error()
        }
    };
    let (message, param, code) = refused(create_body(&duplicate)).await;
    assert!(message.contains("'same'") && message.contains("lines 1 and 3"), "{message}");
    assert_eq!((param, code), (json!("input_file_id"), json!("duplicate_custom_id")));
    let (message, _, code) = refused(create_body(&unknown)).await;
    assert_eq!(message, "The model `no/such-model` does not exist or you do not have access to it.");
    assert_eq!(code, "model_not_found");
    let (missing_message, ..) = refused(create_body("file-000000000000000000000000")).await;
    let (their_message, ..) = refused(create_body(&theirs)).await;
    assert_eq!(their_message.replace(&theirs, "ID"), missing_message.replace("file-000000000000000000000000", "ID"));
    assert!(refused(create_body("file-../../x")).await.0.starts_with("Cannot find file"));
    assert!(refused(create_body(&nothing)).await.0.contains("names a model"));

    let mut wrong_endpoint = create_body(&good);
    wrong_endpoint["endpoint"] = json!("/v1/chat/completions");
    assert_eq!(
        refused(wrong_endpoint).await.0,
        "Invalid value: '/v1/chat/completions'. Supported values are: '/v1/embeddings'."
    );
    let mut wrong_window = create_body(&good);
    wrong_window["completion_window"] = json!("1h");
    assert_eq!(refused(wrong_window).await.1, "completion_window");
    let mut too_much = create_body(&good);
    too_much["metadata"] = Value::Object((0..17).map(|n| (format!("k{n}"), json!("v"))).collect());
    assert_eq!(refused(too_much).await.2, "object_above_max_properties");
    let mut no_file = create_body(&good);
    no_file.as_object_mut().unwrap().remove("input_file_id");
    assert_eq!(refused(no_file).await.0, "Missing required parameter: 'input_file_id'.");
    let not_json = server
        .send(hyper::Method::POST, "/v1/batches", Some(KEY_A), Some("application/json"), support::full("{".into()))
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);

    assert!(server.cluster.jobs.lock().unwrap().is_empty(), "no refused batch made a job");
    assert_eq!(server.post_json("/v1/batches", KEY_A, &create_body(&good)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn batches_page_newest_first() {
    let server = TestServer::start(Limits::default(), &POOLS).await;
    let file = upload(&server, KEY_A, &[request_line("a", "BAAI/bge-small-en-v1.5", "x")]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            server.post_json("/v1/batches", KEY_A, &create_body(&file)).await.json()["id"].as_str().unwrap().to_owned(),
        );
    }
    let first = server.get("/v1/batches?limit=2", KEY_A).await.json();
    assert_eq!((first["data"].as_array().unwrap().len(), first["has_more"].as_bool()), (2, Some(true)));
    let after = first["last_id"].as_str().unwrap();
    let second = server.get(&format!("/v1/batches?limit=2&after={after}"), KEY_A).await.json();
    assert_eq!((second["data"].as_array().unwrap().len(), second["has_more"].as_bool()), (1, Some(false)));
    let mut seen: Vec<String> = first["data"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["data"].as_array().unwrap())
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect();
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids);
    assert_eq!(server.get("/v1/batches?limit=101", KEY_A).await.status, StatusCode::BAD_REQUEST);
}
